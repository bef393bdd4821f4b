// The matmul family: C[z] (+)= A[b] · B[b] over the K range of split s, for
// z = b * splits + s, with A (M×K) and B (K×N) read through strides, so
// transposed operands (backward passes) need no copies. One template for
// every element type (ELEM for A and B, ELEM_C for C; arithmetic in f32)
// and tile shape:
//   WX×WY threads per workgroup, each computing a TM×TN register tile
//   (written out as named scalars by #for, so no compiler keeps it in
//   memory); BM = WY·TM rows by BN = WX·TN columns per workgroup.
//   SHARED: stage BK-deep slices of A and B in workgroup memory (GPUs,
//   where that memory is on chip); otherwise read straight from storage
//   (CPU adapters such as llvmpipe, where it is the same cache and the
//   barriers cost coroutine switches).
//   STRIDED_COLS: thread x owns columns x, x+WX, … (neighbouring threads
//   read neighbouring addresses) instead of a contiguous run of TN.
//   SUBGROUP_A (direct, WX = the subgroup size, TM a multiple of it; CPU
//   adapters): the WX threads of a row share their TM rows of A, so lane x
//   loads rows x, x+WX, … and subgroupBroadcast hands each value to all:
//   one gather of WX distinct values where llvmpipe otherwise did WX
//   gathers of one value each.
// Rows and columns past the edge read a clamped in-range element and are
// never stored, so loads need no branch.
// Blocked summation: each BK slice of K is summed on its own, then added to
// the running total, so rounding error grows with K/BK + BK rather than with
// K (long reductions such as conv weight gradients stay as accurate as
// PyTorch's). With splits > 1 the partial results go to a workspace that
// sum_partials.wgsl adds up in a fixed order.
// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
struct Params {
    m: u32, n: u32, k: u32, batch: u32,
    a_rs: u32, a_cs: u32, b_rs: u32, b_cs: u32,
    a_bs: u32, b_bs: u32, c_bs: u32, accumulate: u32,
    a_off: u32, b_off: u32, c_off: u32, splits: u32,
    k_chunk: u32, _p0: u32, _p1: u32, _p2: u32,
    // IMPLICIT_B: the convolution B is the im2col of (C×H×W input per
    // batch entry, KH×KW kernel, stride, padding, output width).
    cv_c: u32, cv_h: u32, cv_w: u32, cv_kh: u32,
    cv_kw: u32, cv_stride: u32, cv_pad: u32, cv_wo: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> c: array<{{TC}}>;
@group(0) @binding(3) var<uniform> p: Params;
#accessors a b c:ELEM_C

// B[kk, col] at batch base `base`: a strided element, or with IMPLICIT_B
// the im2col element of the input (row kk = (c, ky, kx), column col = output
// position (oy, ox); zero in the padding) read straight from the input, so
// no im2col buffer is written and read back.
fn ld_b_at(base: u32, k_index: u32, n_index: u32) -> f32 {
#if IMPLICIT_B
    // B = im2col (K runs over its rows) or, IMPLICIT_BT, im2colᵀ (the
    // weight gradient dW = dY · im2colᵀ: K runs over output positions).
#if IMPLICIT_BT
    let kk = n_index;
    let col = k_index;
#else
    let kk = k_index;
    let col = n_index;
#endif
    let kk2 = p.cv_kh * p.cv_kw;
    let c = kk / kk2;
    let r = kk - c * kk2;
    let ky = r / p.cv_kw;
    let kx = r - ky * p.cv_kw;
    let oy = col / p.cv_wo;
    let ox = col - oy * p.cv_wo;
#if CONV_PAD0
    // No padding: every window lies inside the image.
    return ld_b(base + (c * p.cv_h + oy * p.cv_stride + ky) * p.cv_w + ox * p.cv_stride + kx);
#else
    let iy = i32(oy * p.cv_stride + ky) - i32(p.cv_pad);
    let ix = i32(ox * p.cv_stride + kx) - i32(p.cv_pad);
    let inside = iy >= 0 && ix >= 0 && iy < i32(p.cv_h) && ix < i32(p.cv_w);
    let at = select(0u, (c * p.cv_h + u32(iy)) * p.cv_w + u32(ix), inside);
    return select(0.0, ld_b(base + at), inside);
#endif
#else
    return ld_b(base + k_index * p.b_rs + n_index * p.b_cs);
#endif
}

#if SHARED
var<workgroup> a_tile: array<f32, {{BK*WY*TM}}>;
var<workgroup> b_tile: array<f32, {{BK*WX*TN}}>;
#endif

@compute @workgroup_size({{WX}}, {{WY}}, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let z = wid.z;
    let bt = z / p.splits;
    let s = z % p.splits;
    let k_begin = s * p.k_chunk;
    let k_end = min(k_begin + p.k_chunk, p.k);
    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    let c_base = p.c_off + z * p.c_bs;
    let row_tile = wid.y * {{WY*TM}}u;
    let col_tile = wid.x * {{WX*TN}}u;
    let m_last = p.m - 1u;
    let n_last = p.n - 1u;

    // This thread's rows and columns (in tile coordinates, then global).
#for i in 0..TM
    let tr{{i}} = lid.y * {{TM}}u + {{i}}u;
    let r{{i}} = row_tile + tr{{i}};
#endfor
#for j in 0..TN
#if STRIDED_COLS
    let tc{{j}} = lid.x + {{j*WX}}u;
#else
    let tc{{j}} = lid.x * {{TN}}u + {{j}}u;
#endif
    let c{{j}} = col_tile + tc{{j}};
#endfor
#if !SHARED
#if SUBGROUP_A
#for q in 0..TM/WX
    let ra_lane{{q}} = a_base + min(row_tile + lid.y * {{TM}}u + {{q*WX}}u + lid.x, m_last) * p.a_rs;
#endfor
#else
#for i in 0..TM
    let ra{{i}} = a_base + min(r{{i}}, m_last) * p.a_rs;
#endfor
#endif
#for j in 0..TN
    let cc{{j}} = min(c{{j}}, n_last);
#endfor
#endif

#for i in 0..TM
#for j in 0..TN
    var acc{{i}}_{{j}} = 0.0;
#endfor
#endfor

#if SHARED
    let tid = lid.y * {{WX}}u + lid.x;
#endif
    for (var k0 = k_begin; k0 < k_end; k0 += {{BK}}u) {
#if SHARED
        // Stage A[rows, k0..k0+BK) and B[k0..k0+BK, cols); past the edge, 0.
#for l in 0..BK*WY*TM/THREADS
        {
            let e = tid + {{l*WX*WY}}u;
            let kk = e % {{BK}}u;
            let rr = e / {{BK}}u;
            let gr = row_tile + rr;
            let gk = k0 + kk;
            var v = 0.0;
            if (gr < p.m && gk < k_end) { v = ld_a(a_base + gr * p.a_rs + gk * p.a_cs); }
            a_tile[kk * {{WY*TM}}u + rr] = v;
        }
#endfor
#for l in 0..BK*WX*TN/THREADS
        {
            let e = tid + {{l*WX*WY}}u;
            let cc = e % {{WX*TN}}u;
            let kk = e / {{WX*TN}}u;
            let gc = col_tile + cc;
            let gk = k0 + kk;
            var v = 0.0;
            if (gc < p.n && gk < k_end) { v = ld_b_at(b_base, gk, gc); }
            b_tile[kk * {{WX*TN}}u + cc] = v;
        }
#endfor
        workgroupBarrier();
#endif
#for i in 0..TM
#for j in 0..TN
        var part{{i}}_{{j}} = 0.0;
#endfor
#endfor
#if SHARED
        for (var kk = 0u; kk < {{BK}}u; kk++) {
#for i in 0..TM
            let av{{i}} = a_tile[kk * {{WY*TM}}u + tr{{i}}];
#endfor
#for j in 0..TN
            let bv{{j}} = b_tile[kk * {{WX*TN}}u + tc{{j}}];
#endfor
#else
        let k_stop = min(k0 + {{BK}}u, k_end);
        for (var kk = k0; kk < k_stop; kk++) {
#if SUBGROUP_A
#for q in 0..TM/WX
            let a_mine{{q}} = ld_a(ra_lane{{q}} + kk * p.a_cs);
#endfor
#for i in 0..TM
            let av{{i}} = subgroupBroadcast(a_mine{{i/WX}}, {{i-i/WX*WX}}u);
#endfor
#else
#for i in 0..TM
            let av{{i}} = ld_a(ra{{i}} + kk * p.a_cs);
#endfor
#endif
#for j in 0..TN
            let bv{{j}} = ld_b_at(b_base, kk, cc{{j}});
#endfor
#endif
#for i in 0..TM
#for j in 0..TN
            part{{i}}_{{j}} = fma(av{{i}}, bv{{j}}, part{{i}}_{{j}});
#endfor
#endfor
        }
#for i in 0..TM
#for j in 0..TN
        acc{{i}}_{{j}} += part{{i}}_{{j}};
#endfor
#endfor
#if SHARED
        workgroupBarrier();
#endif
    }

#for i in 0..TM
    if (r{{i}} < p.m) {
#for j in 0..TN
        if (c{{j}} < p.n) {
            let ci = c_base + r{{i}} * p.n + c{{j}};
            var v = acc{{i}}_{{j}};
            if (p.accumulate != 0u) { v += ld_c(ci); }
            st_c(ci, v);
        }
#endfor
    }
#endfor
}
