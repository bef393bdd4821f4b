// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// nll_loss_backward, mean reduction, into a zero-filled dx:
// dx[r, label_r] = -dloss / total_weight.
struct Params { rows: u32, classes: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> labels: array<f32>;
@group(0) @binding(1) var<storage, read_write> dloss: array<f32>;
@group(0) @binding(2) var<storage, read_write> total_weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let r = flat_index(wid, nwg, lidx);
    if (r >= p.rows) { return; }
    wr_dx(r * p.classes + u32(rd_labels(r)), -rd_dloss(0u) / rd_total_weight(0u));
}
