// What the matmul kernels share (#include matmul_common, after the A, B
// and C bindings, since storage bindings are numbered in order): the
// parameters, the convolution constants, the bias and parameter bindings,
// where a workgroup's product lies, and B's element loader (a strided
// element, or the im2col element read in place).
// Inputs are bound read_write: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
struct Params {
    m: u32, n: u32, k: u32, batch: u32,
    a_rs: u32, a_cs: u32, b_rs: u32, b_cs: u32,
    a_bs: u32, b_bs: u32, c_bs: u32, accumulate: u32,
    a_off: u32, b_off: u32, c_off: u32, splits: u32,
    k_chunk: u32, c_rs: u32, c_cs: u32, group: u32,
}

#if IMPLICIT_B
// The convolution whose im2col B is: C×H×W input per batch entry, KH×KW
// kernel, stride, padding, output width. Constants, so the divisions below
// compile to multiplies.
const CV_C = {{CV_C}}u;
const CV_H = {{CV_H}}u;
const CV_W = {{CV_W}}u;
const CV_KH = {{CV_KH}}u;
const CV_KW = {{CV_KW}}u;
const CV_STRIDE = {{CV_STRIDE}}u;
const CV_PAD = {{CV_PAD}}u;
const CV_WO = {{CV_WO}}u;
#endif

#if BIAS_ROWS
// Epilogue: C[r, col] = product + bias[r] (conv: a bias per output
// channel), fused so the output is written once instead of written, read
// and written again by a separate bias pass.
// (Storage bindings come first, the uniform after them.)
@group(0) @binding(3) var<storage, read_write> bias: array<{{T}}>;
@group(0) @binding(4) var<uniform> p: Params;
#accessors bias
#else
#if BIAS_COLS
// Epilogue: C[r, col] = product + bias[col] (a linear layer's, per output
// feature; GPU tiles, f32 C), as PyTorch's addmm adds it.
@group(0) @binding(3) var<storage, read_write> bias: array<{{T}}>;
@group(0) @binding(4) var<uniform> p: Params;
#accessors bias
#else
@group(0) @binding(3) var<uniform> p: Params;
#endif
#endif

// Where workgroup z's product lies: batch entry z / splits and K split
// z % splits (K range [k_begin, k_end)), with A's, B's and C's bases there
// (C's per z: each split writes its own partial product). With a group of
// G > 1 (GPU tiles only), slot z / splits sums the G entries from
// (z / splits)·G on (fewer in the last slot), one after another.
struct Place { k_begin: u32, k_end: u32, a_base: u32, b_base: u32, c_base: u32, entries: u32 }

fn place_of(z: u32) -> Place {
    let g = max(p.group, 1u);
    let first = (z / p.splits) * g;
    let k_begin = (z % p.splits) * p.k_chunk;
    return Place(k_begin, min(k_begin + p.k_chunk, p.k), p.a_off + first * p.a_bs,
                 p.b_off + first * p.b_bs, p.c_off + z * p.c_bs,
                 min(g, max(p.batch, first + 1u) - first));
}

#if IMPLICIT_B
// The im2col element's input index as two parts that add: an output
// position's (oy·S, ox·S) and a kernel tap's (c·H·W, ky − PAD, kx − PAD,
// wrapping below zero), so a loader whose elements share a position or a
// tap works that part out once, and padding is one unsigned compare a
// dimension (a row or column above the image wraps past H or W).
fn im_pos(col: u32) -> vec2<u32> {
    let oy = col / CV_WO;
    return vec2<u32>(oy * CV_STRIDE, (col - oy * CV_WO) * CV_STRIDE);
}

// Tap kk = (c, ky, kx) of the kernel; CONV_FLIP reads it rotated by 180°
// (a stride-1 convolution's input gradient is the convolution of dY with
// the flipped kernel): (KH−1−ky, KW−1−kx) is tap KH·KW−1−r of the channel.
fn im_tap(kk: u32) -> vec3<u32> {
    let kk2 = CV_KH * CV_KW;
    let c = kk / kk2;
#if CONV_FLIP
    let r = kk2 - 1u - (kk - c * kk2);
#else
    let r = kk - c * kk2;
#endif
    let ky = r / CV_KW;
    return vec3<u32>(c * CV_H * CV_W, ky - CV_PAD, r - ky * CV_KW - CV_PAD);
}

// The input at a position and tap: zero in the padding and where `ok` is
// false (an element past the product's edge), which then reads `base`.
fn im_load(base: u32, pos: vec2<u32>, tap: vec3<u32>, ok: bool) -> f32 {
    let y = pos.x + tap.y;
    let x = pos.y + tap.z;
#if CONV_PAD0
    // No padding: every window of an in-range position lies in the image.
    let inside = ok;
#else
    let inside = ok && y < CV_H && x < CV_W;
#endif
    return select(0.0, ld_b(base + select(0u, tap.x + y * CV_W + x, inside)), inside);
}
#endif

// B[kk, col] at batch base `base` (indices in range): a strided element,
// or with IMPLICIT_B the im2col element of the input (row kk = (c, ky,
// kx), column col = output position (oy, ox); zero in the padding) read
// straight from the input, so no im2col buffer is written and read back.
#if !B4
fn ld_b_at(base: u32, k_index: u32, n_index: u32, b_rs: u32, b_cs: u32) -> f32 {
#if IMPLICIT_B
    // B = im2col (K runs over its rows) or, IMPLICIT_BT, im2colᵀ (the
    // weight gradient dW = dY · im2colᵀ: K runs over output positions).
#if IMPLICIT_BT
    return im_load(base, im_pos(k_index), im_tap(n_index), true);
#else
    return im_load(base, im_pos(n_index), im_tap(k_index), true);
#endif
#else
    return ld_b(base + k_index * b_rs + n_index * b_cs);
#endif
}
#endif
