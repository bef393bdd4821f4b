// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Chunked linear_cross_entropy's `grad_W.index_add_(0, target, src)`:
// gw[label(start + b), d] += src[b, d] for rows b0..b0+nb of a chunk. One
// invocation per column d walks the rows in order, so rows with the same
// label add without a race (WGSL has no float atomics) and deterministically.
struct Params { dim: u32, start: u32, b0: u32, nb: u32, classes: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> gw: array<f32>;
@group(0) @binding(1) var<storage, read_write> labels: array<f32>;
@group(0) @binding(2) var<storage, read_write> src: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let d = flat_index(wid, nwg, lidx);
    if (d >= p.dim) { return; }
    for (var b = p.b0; b < p.b0 + p.nb; b++) {
        let y = min(u32(max(rd_labels(p.start + b), 0.0)), p.classes - 1u);
        let at = y * p.dim + d;
        wr_gw(at, rd_gw(at) + rd_src(b * p.dim + d));
    }
}
