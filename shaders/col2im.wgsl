// The adjoint of im2col, as a gather (no atomics): for samples n0..n0+nb,
// dx[n0+b, c, y, x] = Σ over (ky, kx) whose window covers (y, x) of
// dcol[b, (c*KH + ky)*KW + kx, oy*WO + ox], with oy*S + ky - P = y.
struct Params {
    c: u32, h: u32, w: u32, kh: u32,
    kw: u32, stride: u32, pad: u32, ho: u32,
    wo: u32, n0: u32, nb: u32, total: u32,
}

@group(0) @binding(0) var<storage, read_write> dcol: array<f32>;
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

// Grid as im2col's: x covers the H·W input positions 256 at a time, (y, z)
// the (sample, channel) pairs, so per element only the position is divided.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let pos = wid.x * 256u + lidx;
    let cz = wid.y + wid.z * nwg.y;
    if (pos >= p.h * p.w || cz >= p.c * p.nb) { return; }
    let c = cz % p.c;
    let b = cz / p.c;
    let y = pos / p.w;
    let x = pos - y * p.w;
    let hw = p.ho * p.wo;
    let rows = p.c * p.kh * p.kw;
    var acc = 0.0;
    for (var ky = 0u; ky < p.kh; ky++) {
        let ty = i32(y + p.pad) - i32(ky);
        if (ty < 0 || ty % i32(p.stride) != 0) { continue; }
        let oy = u32(ty) / p.stride;
        if (oy >= p.ho) { continue; }
        for (var kx = 0u; kx < p.kw; kx++) {
            let tx = i32(x + p.pad) - i32(kx);
            if (tx < 0 || tx % i32(p.stride) != 0) { continue; }
            let ox = u32(tx) / p.stride;
            if (ox >= p.wo) { continue; }
            let row = (c * p.kh + ky) * p.kw + kx;
            acc += dcol[(b * rows + row) * hw + oy * p.wo + ox];
        }
    }
    dx[(p.n0 * p.c + cz) * p.h * p.w + pos] = acc;
}
