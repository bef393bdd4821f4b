// The adjoint of im2col, as a gather (no atomics): for samples n0..n0+nb,
// dx[n0+b, c, y, x] = Σ over (ky, kx) whose window covers (y, x) of
// dcol[b, (c*KH + ky)*KW + kx, oy*WO + ox], with oy*S + ky - P = y.
// The geometry is compiled in as constants: with stride 1 the divisibility
// tests vanish, the (ky, kx) loops have constant bounds, and the remaining
// divisions become multiplies (runtime ones cost llvmpipe half its time here).
struct Params {
    n0: u32, nb: u32, _p0: u32, _p1: u32,
}

const C = {{C}}u;
const H = {{H}}u;
const W = {{W}}u;
const KH = {{KH}}u;
const KW = {{KW}}u;
const STRIDE = {{STRIDE}}u;
const PAD = {{PAD}}u;
const HO = {{HO}}u;
const WO = {{WO}}u;

@group(0) @binding(0) var<storage, read_write> dcol: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> dx: array<{{T}}>;
@group(0) @binding(2) var<uniform> p: Params;
#accessors dcol dx
#include prelude

// dx of sample b (of the chunk), channel c, position (y, x).
fn gather(b: u32, c: u32, y: u32, x: u32) -> f32 {
    let hw = HO * WO;
    let rows = C * KH * KW;
    var acc = 0.0;
    for (var ky = 0u; ky < KH; ky++) {
        let ty = i32(y + PAD) - i32(ky);
        if (ty < 0 || ty % i32(STRIDE) != 0) { continue; }
        let oy = u32(ty) / STRIDE;
        if (oy >= HO) { continue; }
        for (var kx = 0u; kx < KW; kx++) {
            let tx = i32(x + PAD) - i32(kx);
            if (tx < 0 || tx % i32(STRIDE) != 0) { continue; }
            let ox = u32(tx) / STRIDE;
            if (ox >= WO) { continue; }
            let row = (c * KH + ky) * KW + kx;
            acc += ld_dcol((b * rows + row) * hw + oy * WO + ox);
        }
    }
    return acc;
}

#if PAIRS
// Packed bf16: one invocation per word of dx overlapping this chunk's
// elements [lo, hi); each half inside the range is computed and stored
// (a half outside belongs to a neighbouring chunk, written by another
// dispatch, and is left as it is).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let chw = C * H * W;
    let lo = p.n0 * chw;
    let hi = lo + p.nb * chw;
    let word = lo / 2u + flat_index(wid, nwg, lidx);
    for (var h = 0u; h < 2u; h++) {
        let e = 2u * word + h;
        if (e < lo || e >= hi) { continue; }
        let r = e - lo;
        let b = r / chw;
        let c = (r - b * chw) / (H * W);
        let pos = r - b * chw - c * H * W;
        let y = pos / W;
        st_dx(e, gather(b, c, y, pos - y * W));
    }
}
#else
// Grid: x covers the H·W input positions 256 at a time (in strides of
// the grid where a plane is longer than its x reach, 65,535 × 256), (y, z)
// the (sample, channel) pairs, so per element only the position is divided.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let cz = wid.y + wid.z * nwg.y;
    if (cz >= C * p.nb) { return; }
    let c = cz % C;
    let b = cz / C;
    let step = nwg.x * 256u;
    var pos = wid.x * 256u + lidx;
    // Stops before a step would pass the plane (pos + step could wrap
    // past 2^32 on a plane near that long).
    loop {
        if (pos >= H * W) { break; }
        let y = pos / W;
        st_dx((p.n0 * C + cz) * H * W + pos, gather(b, c, y, pos - y * W));
        if (H * W - pos <= step) { break; }
        pos += step;
    }
}
#endif
