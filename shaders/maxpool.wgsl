// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// 2-D max pooling (ResNet's 3×3 stride-2 pad-1 stem pool), f32, over
// planes of N·C, as PyTorch's max_pool2d_with_indices: padding never wins,
// a NaN wins (and propagates), and the first maximum in the window is the
// one whose index is kept. Indices are positions in the input plane
// (iy·W + ix) stored as f32 integers (exact below 2^24; the host checks).
//   forward:  a thread per output: y and its index.
//   backward: a thread per input position, gathering the gradients of the
//             (at most ⌈k/s⌉² ) windows that hold it and chose it — no
//             scatter, so no atomics and a fixed summation order.
struct Params {
    planes: u32, h: u32, w: u32, ho: u32,
    wo: u32, k: u32, stride: u32, pad: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> idx: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#include prelude

// By its bits: compilers may assume floats are never NaN and fold v != v.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// a = x [planes, h, w]; out = y [planes, ho, wo], idx the same shape.
@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let o = flat_index(wid, nwg, lidx);
    if (o >= p.planes * p.ho * p.wo) { return; }
    let plane = o / (p.ho * p.wo);
    let r = o - plane * p.ho * p.wo;
    let oy = r / p.wo;
    let ox = r - oy * p.wo;
    let base = plane * p.h * p.w;
    var best = 0.0;
    var at = 0u;
    var found = false;
    for (var ky = 0u; ky < p.k; ky++) {
        let iy = i32(oy * p.stride + ky) - i32(p.pad);
        if (iy < 0 || iy >= i32(p.h)) { continue; }
        for (var kx = 0u; kx < p.k; kx++) {
            let ix = i32(ox * p.stride + kx) - i32(p.pad);
            if (ix < 0 || ix >= i32(p.w)) { continue; }
            let pos = u32(iy) * p.w + u32(ix);
            let v = rd_a(base + pos);
            if (!found || v > best || (is_nan(v) && !is_nan(best))) {
                best = v;
                at = pos;
                found = true;
            }
        }
    }
    wr_out(o, best);
    wr_idx(o, f32(at));
}

// a = g [planes, ho, wo], idx from forward; out = dx [planes, h, w].
@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.planes * p.h * p.w) { return; }
    let plane = i / (p.h * p.w);
    let pos = i - plane * p.h * p.w;
    let iy = pos / p.w;
    let ix = pos - iy * p.w;
    // Windows oy with oy·s − pad ≤ iy ≤ oy·s − pad + k − 1.
    let y_lo = max(i32(iy + p.pad) - i32(p.k) + i32(p.stride), 0) / i32(p.stride);
    let y_hi = min(i32(iy + p.pad) / i32(p.stride), i32(p.ho) - 1);
    let x_lo = max(i32(ix + p.pad) - i32(p.k) + i32(p.stride), 0) / i32(p.stride);
    let x_hi = min(i32(ix + p.pad) / i32(p.stride), i32(p.wo) - 1);
    var s = 0.0;
    for (var oy = y_lo; oy <= y_hi; oy++) {
        for (var ox = x_lo; ox <= x_hi; ox++) {
            let o = plane * p.ho * p.wo + u32(oy) * p.wo + u32(ox);
            if (u32(rd_idx(o)) == pos) { s += rd_a(o); }
        }
    }
    wr_out(i, s);
}
