// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Gradient of mean((pred - target)²) with respect to pred:
// dx = (2 / n) * dloss * (pred - target).
struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> pred: array<f32>;
@group(0) @binding(1) var<storage, read_write> tgt: array<f32>;
@group(0) @binding(2) var<storage, read_write> dloss: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    wr_dx(i, 2.0 / f32(p.n) * rd_dloss(0) * (rd_pred(i) - rd_tgt(i)));
}
