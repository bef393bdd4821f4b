// The direct (CPU adapter) tile family: C[z] (+)= A[b] · B[b] over the K range of split s, for
// z = b * splits + s, with A (M×K) and B (K×N) read through strides, so
// transposed operands (backward passes) need no copies. One template for
// every element type (ELEM for A and B, ELEM_C for C; arithmetic in f32)
// and tile shape:
//   WX×WY threads per workgroup, each computing a TM×TN register tile
//   (written out as named scalars by #for, so no compiler keeps it in
//   memory); BM = WY·TM rows by BN = WX·TN columns per workgroup.
//   Operands are read straight from storage: on CPU adapters such as
//   llvmpipe workgroup memory is the same cache and barriers cost
//   coroutine switches (GPUs stage tiles: matmul_gpu.wgsl).
//   STRIDED_COLS: thread x owns columns x, x+WX, … (neighbouring threads
//   read neighbouring addresses) instead of a contiguous run of TN.
//   SUBGROUP_A (direct, WX = the subgroup size; CPU adapters): the WX
//   threads of a row share their TM rows of A, so lane x loads rows x,
//   x+WX, … (QA = ceil(TM/WX) loads: QA_FULL on every lane, and where WX
//   does not divide TM a last one on the A_REM lanes that hold rows) and
//   subgroupBroadcast hands each value to all: one gather of WX
//   distinct values where llvmpipe otherwise did WX gathers of one value
//   each.
//   VEC_B / VEC_C (direct tiles, f32, TN a multiple of 4, B or C dense
//   along its rows with N and every offset a multiple of 4): each thread's
//   columns come in runs of 4 (COLS4), B is loaded and C stored as vec4.
//   llvmpipe pays per access, not per byte, and the K = 10 fc product is
//   mostly stores.
//   VEC_K (direct tiles, f32, A and B both dense along K, K and the split
//   a multiple of 4: the fc forward run as Cᵀ): A and B are loaded as vec4
//   along K, four steps of K per load, summed in the same order. (Not A
//   alone, with B element by element or along N: a 32-row thread tile would
//   then hold 32 vec4s of A, which llvmpipe spills.)
// Rows and columns past the edge read a clamped in-range element and are
// never stored, so loads need no branch.
// ONE_SLICE (each workgroup's K range no deeper than BK): the slice's sums
// are the totals, so one set of TM×TN accumulators instead of two. On
// llvmpipe a 32×16 tile's two sets spill 32 KB of stack. The same bits:
// the one slice's sum was added to zero.
// K2 (direct subgroup-A tiles of at most 4 columns, B element by element,
// even K ranges): two steps of K an iteration (KSTEP), each sum taking both
// in a row (see the loop).
// ROWS_OUTER (direct subgroup-A tiles, one split, K = KC compiled in): B's
// K range is loaded whole, then each row is summed, slice by slice, and
// stored in turn, so only one row's TN sums are live (see the block below).
// C is written through strides (c_rs, c_cs), so a product can be run
// transposed, Cᵀ = Bᵀ·Aᵀ, and still land in C's row-major layout: a narrow
// product (the fc forward: 64×10) then spreads its long side over the lanes.
// Blocked summation: each BK slice of K is summed on its own, then added to
// the running total, so rounding error grows with K/BK + BK rather than with
// K (long reductions such as conv weight gradients stay as accurate as
// PyTorch's). With splits > 1 the partial results go to a workspace that
// sum_partials.wgsl adds up in a fixed order.
// Accumulating into C is a variant (ACCUMULATE), not a runtime test: on a
// CPU adapter a branch does not skip its body, so a runtime flag cost every
// output a masked load of C even when it was overwritten.

#if VEC_K
@group(0) @binding(0) var<storage, read_write> a: array<vec4<f32>>;
#else
@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
#accessors a
#endif
#if B4
@group(0) @binding(1) var<storage, read_write> b: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
#accessors b
#endif
#if VEC_C
@group(0) @binding(2) var<storage, read_write> c: array<vec4<f32>>;
#else
@group(0) @binding(2) var<storage, read_write> c: array<{{TC}}>;
#accessors c:ELEM_C
#endif
#include matmul_common


// Row `row` of A at step kk of K: one element, or with VEC_K the four from
// kk on (row and kk multiples of 4).
#if VEC_K
fn ld_a_at(row: u32, kk: u32, a_cs: u32) -> vec4<f32> { return rd_a((row + kk) / 4u); }
#else
fn ld_a_at(row: u32, kk: u32, a_cs: u32) -> f32 { return ld_a(row + kk * a_cs); }
#endif


@compute @workgroup_size({{WX}}, {{WY}}, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let at = place_of(wid.z);
    let k_begin = at.k_begin;
    let k_end = at.k_end;
    let a_base = at.a_base;
    let b_base = at.b_base;
    let c_base = at.c_base;
    let row_tile = wid.y * {{WY*TM}}u;
    let col_tile = wid.x * {{WX*TN}}u;
    // The parameters the loop and the stores use, read once here: llvmpipe
    // 22.3 turns each uniform read inside a loop or branch into an 8-lane
    // gather, so the copies make the code shorter and quicker to compile.
    let p_m = p.m;
    let p_n = p.n;
    let a_rs = p.a_rs;
    let a_cs = p.a_cs;
    let b_rs = p.b_rs;
    let b_cs = p.b_cs;
    let c_rs = p.c_rs;
    let c_cs = p.c_cs;
    let m_last = p_m - 1u;
    let n_last = p_n - 1u;

    // This thread's rows and columns (in tile coordinates, then global).
#for i in 0..TM
    let tr{{i}} = lid.y * {{TM}}u + {{i}}u;
    let r{{i}} = row_tile + tr{{i}};
#endfor
#for j in 0..TN
#if STRIDED_COLS
#if COLS4
    let tc{{j}} = (lid.x + {{j/4*WX}}u) * 4u + {{j-j/4*4}}u;
#else
    let tc{{j}} = lid.x + {{j*WX}}u;
#endif
#else
    let tc{{j}} = lid.x * {{TN}}u + {{j}}u;
#endif
    let c{{j}} = col_tile + tc{{j}};
#endfor
#if SUBGROUP_A
#for q in 0..QA
    let ra_lane{{q}} = a_base + min(row_tile + lid.y * {{TM}}u + {{q*WX}}u + lid.x, m_last) * a_rs;
#endfor
#else
#for i in 0..TM
    let ra{{i}} = a_base + min(r{{i}}, m_last) * a_rs;
#endfor
#endif
#if VEC_B
    // Each run of 4 columns as one vec4 index (N is a multiple of 4).
#for g in 0..TN/4
    let cg{{g}} = min(c{{4*g}}, n_last - 3u) / 4u;
#endfor
#else
#if VEC_K
    // Column j of B starts at cb_j and runs along K.
#for j in 0..TN
    let cb{{j}} = b_base + min(c{{j}}, n_last) * b_cs;
#endfor
#else
#for j in 0..TN
    let cc{{j}} = min(c{{j}}, n_last);
#endfor
#endif
#endif

#if ROWS_OUTER
    // B's whole K range (KC steps, a constant: KC·TN values a lane) loaded
    // once; then, below, a loop over the tile's groups of WX rows, each
    // row summed over it and stored before the next. Only one row's TN
    // sums are live, where the K loop keeps all TM×TN (two sets past one
    // slice) live across its steps and llvmpipe spills them to the stack
    // and back at every step; and the loop keeps the code to one group.
#for kk in 0..KC
#if VEC_B
#for g in 0..TN/4
    let bq{{kk}}_{{g}} = rd_b((b_base + (k_begin + {{kk}}u) * b_rs) / 4u + cg{{g}});
#endfor
#else
#for j in 0..TN
    let bv{{kk}}_{{j}} = ld_b_at(b_base, k_begin + {{kk}}u, cc{{j}}, b_rs, b_cs);
#endfor
#endif
#endfor
#else
#if ONE_SLICE
    // K fits in one slice (the fc input gradient: K = 10): the slice's sums
    // are the totals, so no second set of accumulators is kept live.
#for i in 0..TM
#for j in 0..TN
    var part{{i}}_{{j}} = 0.0;
#endfor
#endfor
    {
        let k0 = k_begin;
#else
#for i in 0..TM
#for j in 0..TN
    var acc{{i}}_{{j}} = 0.0;
#endfor
#endfor
    for (var k0 = k_begin; k0 < k_end; k0 += {{BK}}u) {
#endif
#if !ONE_SLICE
#for i in 0..TM
#for j in 0..TN
        var part{{i}}_{{j}} = 0.0;
#endfor
#endfor
#endif
        let k_stop = min(k0 + {{BK}}u, k_end);
        // K_ADVANCE steps of K an iteration: 4 with VEC_K (one vec4 of each
        // operand), KSTEP = 2 with K2 (even K ranges, subgroup-A tiles of
        // at most 4 columns, B element by element), else 1. Step e's
        // values are named _e.
        for (var kk = k0; kk < k_stop; kk += {{K_ADVANCE}}u) {
#for e in 0..KSTEP
#if SUBGROUP_A
#for q in 0..QA_FULL
            let a_mine{{q}}_{{e}} = ld_a_at(ra_lane{{q}}, kk + {{e}}u, a_cs);
#endfor
#if A_REM
            // The last rows fill A_REM of the WX lanes; the rest skip the
            // load (llvmpipe's per-lane load loop passes over masked-off
            // lanes), where they would reread a clamped row.
#if VEC_K
            var a_mine{{QA_FULL}}_{{e}} = vec4<f32>(0.0);
#else
            var a_mine{{QA_FULL}}_{{e}} = 0.0;
#endif
            if (lid.x < {{A_REM}}u) {
                a_mine{{QA_FULL}}_{{e}} = ld_a_at(ra_lane{{QA_FULL}}, kk + {{e}}u, a_cs);
            }
#endif
#for i in 0..TM
            let av{{i}}_{{e}} = subgroupBroadcast(a_mine{{i/WX}}_{{e}}, {{i-i/WX*WX}}u);
#endfor
#else
#for i in 0..TM
            let av{{i}}_{{e}} = ld_a_at(ra{{i}}, kk + {{e}}u, a_cs);
#endfor
#endif
#if VEC_K
#for j in 0..TN
            let bv{{j}}_{{e}} = rd_b((cb{{j}} + kk + {{e}}u) / 4u);
#endfor
#else
#if VEC_B
            let brow{{e}} = (b_base + (kk + {{e}}u) * b_rs) / 4u;
#for g in 0..TN/4
            let bq{{g}}_{{e}} = rd_b(brow{{e}} + cg{{g}});
#endfor
#for j in 0..TN
            let bv{{j}}_{{e}} = bq{{j/4}}_{{e}}[{{j-j/4*4}}];
#endfor
#else
#for j in 0..TN
            let bv{{j}}_{{e}} = ld_b_at(b_base, kk + {{e}}u, cc{{j}}, b_rs, b_cs);
#endfor
#endif
#endif
#endfor
        // Each sum takes its steps in a row (the four of a VEC_K vec4, the
        // KSTEP of an iteration), so where llvmpipe spills the sums each is
        // loaded and stored once per iteration rather than once per step;
        // the order of each one's additions is unchanged.
#for i in 0..TM
#for j in 0..TN
#if VEC_K
#for e in 0..4
            part{{i}}_{{j}} = fma(av{{i}}_0[{{e}}], bv{{j}}_0[{{e}}], part{{i}}_{{j}});
#endfor
#else
#for e in 0..KSTEP
            part{{i}}_{{j}} = fma(av{{i}}_{{e}}, bv{{j}}_{{e}}, part{{i}}_{{j}});
#endfor
#endif
#endfor
#endfor
        }
#if !ONE_SLICE
#for i in 0..TM
#for j in 0..TN
        acc{{i}}_{{j}} += part{{i}}_{{j}};
#endfor
#endfor
#endif
    }
#if ONE_SLICE
#for i in 0..TM
#for j in 0..TN
    let acc{{i}}_{{j}} = part{{i}}_{{j}};
#endfor
#endfor
#endif

#endif

#if ROWS_OUTER
    for (var q = 0u; q < {{TM/WX}}u; q++) {
    // Lane x loads row x of the group, for every step of K.
    let group_row = row_tile + lid.y * {{TM}}u + q * {{WX}}u;
    let ra_q = a_base + min(group_row + lid.x, m_last) * a_rs;
#for kk in 0..KC
    let a_mine_{{kk}} = ld_a_at(ra_q, k_begin + {{kk}}u, a_cs);
#endfor
#endif
#for i in 0..ROWS_EMIT
    {
#if ROWS_OUTER
    let row_ = group_row + {{i}}u;
#for kk in 0..KC
    let av_{{kk}} = subgroupBroadcast(a_mine_{{kk}}, {{i}}u);
#endfor
    // Each BK slice summed on its own and added to the total, as the K
    // loop does: the same order of additions, so the same bits.
#for j in 0..TN
    var o{{j}} = 0.0;
#for sl in 0..KC_SLICES
    {
        var part = 0.0;
#for kk in sl*BK..sl*BK+BK
#if kk < KC
#if VEC_B
        part = fma(av_{{kk}}, bq{{kk}}_{{j/4}}[{{j-j/4*4}}], part);
#else
        part = fma(av_{{kk}}, bv{{kk}}_{{j}}, part);
#endif
#endif
#endfor
        o{{j}} += part;
    }
#endfor
#endfor
#else
    let row_ = r{{i}};
#for j in 0..TN
    let o{{j}} = acc{{i}}_{{j}};
#endfor
#endif
    if (row_ < p_m) {
#if BIAS_ROWS
        let bias_row = ld_bias(row_);
#endif
#if VEC_C
#for g in 0..TN/4
        if (c{{4*g}} < p_n) {
            let ci = (c_base + row_ * c_rs + c{{4*g}}) / 4u;
            var v = vec4<f32>(o{{4*g}}, o{{4*g+1}}, o{{4*g+2}}, o{{4*g+3}});
#if BIAS_ROWS
            v += vec4<f32>(bias_row);
#endif
#if ACCUMULATE
            v += rd_c(ci);
#endif
            wr_c(ci, v);
        }
#endfor
#else
#if PAIR_STORE
        // Packed bf16 output: this thread owns column pairs (contiguous
        // columns, TN even, n and C's offsets even), so it writes whole words.
#for j in 0..TN/2
        if (c{{2*j}} < p_n) {
            let ci = c_base + row_ * c_rs + c{{2*j}};
            var v = vec2<f32>(o{{2*j}}, o{{2*j+1}});
#if BIAS_ROWS
            v += vec2<f32>(bias_row, bias_row);
#endif
#if ACCUMULATE
            v += vec2<f32>(ld_c(ci), ld_c(ci + 1u));
#endif
            st2_c(ci / 2u, v, ci + 2u);
        }
#endfor
#else
#for j in 0..TN
        if (c{{j}} < p_n) {
            let ci = c_base + row_ * c_rs + c{{j}} * c_cs;
            var v = o{{j}};
#if BIAS_ROWS
            v += bias_row;
#endif
#if ACCUMULATE
            v += ld_c(ci);
#endif
            st_c(ci, v);
        }
#endfor
#endif
#endif
    }
    }
#endfor
#if ROWS_OUTER
    }
#endif
}
