// The GPU tile family: C[z] (+)= A[b] · B[b] over the K range of split s,
// for z = b * splits + s (the same contract as matmul_cpu.wgsl; the
// parameters and B's loader are matmul_common.wgsl's).
//   WX×WY threads per workgroup, each computing TM×TN outputs (TM and TN
//   multiples of 4), BM = WY·TM rows by BN = WX·TN columns per workgroup.
//   A thread owns rows (y + g·WY)·4 + e and columns (x + h·WX)·4 + f
//   (g < TM/4, h < TN/4, e, f < 4): its operands are whole vec4s of the
//   staged tiles, and the threads of a row read neighbouring vec4s of B's
//   tile (no bank conflicts) while all read one vec4 of A's (a broadcast).
//   BK-deep slices of A (transposed: a_tile[k][row]) and B (b_tile[k][col])
//   are staged in workgroup memory, double-buffered: slice s+1 is loaded
//   into one half while slice s is summed from the other, one barrier a
//   slice.
//   Staging reads global memory in the order that keeps neighbouring
//   threads on neighbouring addresses (A_ALONG_K where A is dense along K,
//   B_ALONG_N where B is along N), as vec4 where the dispatch found the
//   layout in fours (VEC_A along K, VEC_B along N; f32 only); C is stored
//   as vec4 (VEC_C) or as 16-bit pairs (PAIR_STORE) likewise.
// Every global index is clamped into range (an im2col element past the
// edge reads its batch entry's first element instead) and the value past
// the edge replaced by 0 (select, no branch); every workgroup index is formed from
// constants and local ids below their bounds, so no access leaves its
// array. Blocked summation exactly as matmul_cpu.wgsl (each BK slice summed
// on its own, then added to the total): the same additions in the same
// order, so the same bits whatever the tile.

#if VEC_A
@group(0) @binding(0) var<storage, read_write> a: array<vec4<f32>>;
#else
@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
#accessors a
#endif
#if VEC_B
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

// Two halves of BK rows each: A's tile transposed (BM/4 vec4s a row of K),
// B's as it is (BN/4 vec4s a row).
var<workgroup> a_tile: array<vec4<f32>, {{2*BK*BM/4}}>;
var<workgroup> b_tile: array<vec4<f32>, {{2*BK*BN/4}}>;

// Slice [k0, k0 + BK) of A's rows and B's columns into half `half`.
fn stage(hf: u32, tid: u32, k0: u32, k_end: u32, row_tile: u32, col_tile: u32,
         a_base: u32, b_base: u32) {
    let p_m = p.m;
    let p_n = p.n;
    let k_last = k_end - 1u;
    let a_half = hf * {{BK*BM/4}}u;
    let b_half = hf * {{BK*BN/4}}u;
#if VEC_A
    // Four steps of K a load (A dense along K; K, the split and the
    // offsets in fours, so a vec4 is wholly inside or wholly past k_end).
#for l in 0..BK*BM/4/THREADS
    {
        let e = tid + {{l*THREADS}}u;
        let kq = e % {{BK/4}}u;
        let rr = e / {{BK/4}}u;
        let gr = row_tile + rr;
        let gk = k0 + kq * 4u;
        let inside = gr < p_m && gk < k_end;
        let v = select(vec4<f32>(0.0), rd_a((a_base + min(gr, p_m - 1u) * p.a_rs + min(gk, k_last - 3u)) / 4u), inside);
#for q in 0..4
        a_tile[a_half + (kq * 4u + {{q}}u) * {{BM/4}}u + rr / 4u][rr % 4u] = v[{{q}}];
#endfor
    }
#endfor
#else
#for l in 0..BK*BM/THREADS
    {
        let e = tid + {{l*THREADS}}u;
#if A_ALONG_K
        let kk = e % {{BK}}u;
        let rr = e / {{BK}}u;
#else
        let rr = e % {{BM}}u;
        let kk = e / {{BM}}u;
#endif
        let gr = row_tile + rr;
        let gk = k0 + kk;
        let inside = gr < p_m && gk < k_end;
        let v = ld_a(a_base + min(gr, p_m - 1u) * p.a_rs + min(gk, k_last) * p.a_cs);
        a_tile[a_half + kk * {{BM/4}}u + rr / 4u][rr % 4u] = select(0.0, v, inside);
    }
#endfor
#endif
#if VEC_B
#for l in 0..BK*BN/4/THREADS
    {
        let e = tid + {{l*THREADS}}u;
        let cq = e % {{BN/4}}u;
        let kk = e / {{BN/4}}u;
        let gc = col_tile + cq * 4u;
        let gk = k0 + kk;
        let inside = gc < p_n && gk < k_end;
        let v = rd_b((b_base + min(gk, k_last) * p.b_rs + min(gc, p_n - 4u)) / 4u);
        b_tile[b_half + kk * {{BN/4}}u + cq] = select(vec4<f32>(0.0), v, inside);
    }
#endfor
#else
#if IMPLICIT_B
    // The im2col read in place. Element l is e = tid + l·THREADS of the
    // slice, split so that what every l shares (the column, or the K
    // index, where THREADS is a multiple of BN or BK) is one expression the
    // compiler works out once; past the edge reads nothing.
#for l in 0..BK*BN/THREADS
    {
#if B_ALONG_N
        let cc = (tid + {{l*THREADS-l*THREADS/BN*BN}}u) % {{BN}}u;
        let kk = (tid + {{l*THREADS-l*THREADS/BN*BN}}u) / {{BN}}u + {{l*THREADS/BN}}u;
#else
        let kk = (tid + {{l*THREADS-l*THREADS/BK*BK}}u) % {{BK}}u;
        let cc = (tid + {{l*THREADS-l*THREADS/BK*BK}}u) / {{BK}}u + {{l*THREADS/BK}}u;
#endif
        let gc = col_tile + cc;
        let gk = k0 + kk;
        let ok = gc < p_n && gk < k_end;
#if IMPLICIT_BT
        let v = im_load(b_base, im_pos(gk), im_tap(gc), ok);
#else
        let v = im_load(b_base, im_pos(gc), im_tap(gk), ok);
#endif
        b_tile[b_half + kk * {{BN/4}}u + cc / 4u][cc % 4u] = v;
    }
#endfor
#else
#for l in 0..BK*BN/THREADS
    {
        let e = tid + {{l*THREADS}}u;
#if B_ALONG_N
        let cc = e % {{BN}}u;
        let kk = e / {{BN}}u;
#else
        let kk = e % {{BK}}u;
        let cc = e / {{BK}}u;
#endif
        let gc = col_tile + cc;
        let gk = k0 + kk;
        let inside = gc < p_n && gk < k_end;
        let v = ld_b_at(b_base, min(gk, k_last), min(gc, p_n - 1u), p.b_rs, p.b_cs);
        b_tile[b_half + kk * {{BN/4}}u + cc / 4u][cc % 4u] = select(0.0, v, inside);
    }
#endfor
#endif
#endif
}

@compute @workgroup_size({{WX}}, {{WY}}, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let at = place_of(wid.z);
    let k_begin = at.k_begin;
    let k_end = at.k_end;
    let c_base = at.c_base;
    let row_tile = wid.y * {{BM}}u;
    let col_tile = wid.x * {{BN}}u;
    let tid = lid.y * {{WX}}u + lid.x;
    let slices = (max(k_end, k_begin) - k_begin + {{BK-1}}u) / {{BK}}u;

#for i in 0..TM
#for j in 0..TN
#if ONE_SLICE
    var part{{i}}_{{j}} = 0.0;
#else
    var acc{{i}}_{{j}} = 0.0;
#endif
#endfor
#endfor
    // The entries of a group (one unless the dispatch sums several into
    // this slot): their slices one after another into the same sums.
    for (var en = 0u; en < at.entries; en++) {
    let a_base = at.a_base + en * p.a_bs;
    let b_base = at.b_base + en * p.b_bs;
    if (slices > 0u) {
        stage(0u, tid, k_begin, k_end, row_tile, col_tile, a_base, b_base);
    }
    workgroupBarrier();
    for (var sl = 0u; sl < slices; sl++) {
        let hf = sl & 1u;
        if (sl + 1u < slices) {
            stage(1u - hf, tid, k_begin + (sl + 1u) * {{BK}}u, k_end, row_tile, col_tile,
                  a_base, b_base);
        }
#if !ONE_SLICE
#for i in 0..TM
#for j in 0..TN
        var part{{i}}_{{j}} = 0.0;
#endfor
#endfor
#endif
        let a_at = hf * {{BK*BM/4}}u + lid.y;
        let b_at = hf * {{BK*BN/4}}u + lid.x;
        for (var kk = 0u; kk < {{BK}}u; kk++) {
#for g in 0..TM/4
            let av{{g}} = a_tile[a_at + kk * {{BM/4}}u + {{g*WY}}u];
#endfor
#for h in 0..TN/4
            let bv{{h}} = b_tile[b_at + kk * {{BN/4}}u + {{h*WX}}u];
#endfor
#for i in 0..TM
#for j in 0..TN
            part{{i}}_{{j}} = fma(av{{i/4}}[{{i-i/4*4}}], bv{{j/4}}[{{j-j/4*4}}], part{{i}}_{{j}});
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
        workgroupBarrier();
    }
    }

    let p_m = p.m;
    let p_n = p.n;
    let c_rs = p.c_rs;
    let c_cs = p.c_cs;
#for i in 0..TM
    {
        let row_ = row_tile + (lid.y + {{i/4*WY}}u) * 4u + {{i-i/4*4}}u;
        if (row_ < p_m) {
#if BIAS_ROWS
            let bias_row = ld_bias(row_);
#endif
#for h in 0..TN/4
            {
                let col_ = col_tile + (lid.x + {{h*WX}}u) * 4u;
#if ONE_SLICE
                var v = vec4<f32>(part{{i}}_{{4*h}}, part{{i}}_{{4*h+1}}, part{{i}}_{{4*h+2}}, part{{i}}_{{4*h+3}});
#else
                var v = vec4<f32>(acc{{i}}_{{4*h}}, acc{{i}}_{{4*h+1}}, acc{{i}}_{{4*h+2}}, acc{{i}}_{{4*h+3}});
#endif
#if BIAS_ROWS
                v += vec4<f32>(bias_row);
#endif
#if BIAS_COLS
                // Columns past the edge read the last bias and are not stored.
                v += vec4<f32>(ld_bias(min(col_, p_n - 1u)), ld_bias(min(col_ + 1u, p_n - 1u)),
                               ld_bias(min(col_ + 2u, p_n - 1u)), ld_bias(min(col_ + 3u, p_n - 1u)));
#endif
                let ci = c_base + row_ * c_rs + col_ * c_cs;
#if VEC_C
                if (col_ < p_n) {
#if ACCUMULATE
                    v += rd_c(ci / 4u);
#endif
                    wr_c(ci / 4u, v);
                }
#else
#if PAIR_STORE
                // Whole 16-bit words: n and C's offsets even.
#for f in 0..2
                if (col_ + {{2*f}}u < p_n) {
                    var w = vec2<f32>(v[{{2*f}}], v[{{2*f+1}}]);
#if ACCUMULATE
                    w += vec2<f32>(ld_c(ci + {{2*f}}u), ld_c(ci + {{2*f+1}}u));
#endif
                    st2_c((ci + {{2*f}}u) / 2u, w, ci + {{2*f+2}}u);
                }
#endfor
#else
#for f in 0..4
                if (col_ + {{f}}u < p_n) {
                    let cf = ci + {{f}}u * c_cs;
#if ACCUMULATE
                    st_c(cf, v[{{f}}] + ld_c(cf));
#else
                    st_c(cf, v[{{f}}]);
#endif
                }
#endfor
#endif
#endif
            }
#endfor
        }
    }
#endfor
}
