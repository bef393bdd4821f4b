// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// _log_softmax_backward_data: dx = g - exp(y) * sum(g) per row, from the
// saved output y = log_softmax(x). One workgroup a row (row_reduce).
struct Params { rows: u32, classes: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> g: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> dx: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#include prelude
#include row_reduce

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.classes;
    var s = 0.0;
    for (var c = t; c < p.classes; c += 256u) { s += rd_g(base + c); }
    s = row_sum(t, s);
    for (var c = t; c < p.classes; c += 256u) { wr_dx(base + c, rd_g(base + c) - exp(rd_y(base + c)) * s); }
}
