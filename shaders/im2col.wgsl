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

// Grid: x covers the HO·WO output positions 256 at a time; (y, z) covers
// the (sample, row) pairs, so the row's channel and kernel offsets come from
// the workgroup id (the same for the whole group: llvmpipe computes them
// once, not per lane) and each element costs one division, not six (AVX2
// has no vector integer division; llvmpipe did them lane by lane).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let hw = p.ho * p.wo;
    let rows = p.c * p.kh * p.kw;
    let pos = wid.x * 256u + lidx;
    let rz = wid.y + wid.z * nwg.y;
    if (pos >= hw || rz >= rows * p.nb) { return; }
    let row = rz % rows;
    let b = rz / rows;
    let kx = row % p.kw;
    let ky = (row / p.kw) % p.kh;
    let c = row / (p.kw * p.kh);
    let oy = pos / p.wo;
    let ox = pos - oy * p.wo;
    let iy = i32(oy * p.stride + ky) - i32(p.pad);
    let ix = i32(ox * p.stride + kx) - i32(p.pad);
    var v = 0.0;
    if (iy >= 0 && ix >= 0 && iy < i32(p.h) && ix < i32(p.w)) {
        v = x[(((p.n0 + b) * p.c + c) * p.h + u32(iy)) * p.w + u32(ix)];
    }
    col[rz * hw + pos] = v;
}
