// im2col for conv2d: for samples n0..n0+nb of x [N, C, H, W], writes
// col[b, (c*KH + ky)*KW + kx, oy*WO + ox] = x[n0+b, c, oy*S + ky - P, ox*S + kx - P]
// (0 outside the image). A convolution is then one batched matmul W · col.
struct Params {
    c: u32, h: u32, w: u32, kh: u32,
    kw: u32, stride: u32, pad: u32, ho: u32,
    wo: u32, n0: u32, nb: u32, total: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> col: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.total) { return; }
    let hw = p.ho * p.wo;
    let rows = p.c * p.kh * p.kw;
    let pos = i % hw;
    let row = (i / hw) % rows;
    let b = i / (hw * rows);
    let ox = pos % p.wo;
    let oy = pos / p.wo;
    let kx = row % p.kw;
    let ky = (row / p.kw) % p.kh;
    let c = row / (p.kw * p.kh);
    let iy = i32(oy * p.stride + ky) - i32(p.pad);
    let ix = i32(ox * p.stride + kx) - i32(p.pad);
    var v = 0.0;
    if (iy >= 0 && ix >= 0 && iy < i32(p.h) && ix < i32(p.w)) {
        v = x[(((p.n0 + b) * p.c + c) * p.h + u32(iy)) * p.w + u32(ix)];
    }
    col[i] = v;
}
