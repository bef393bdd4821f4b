// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// log_softmax over each row of x, as PyTorch computes it: (x - max) - log(sum
// exp(x - max)); x - max is exact, so a row's largest entry loses nothing.
// One workgroup a row (row_reduce).
struct Params { rows: u32, classes: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
#include prelude
#include row_reduce

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.classes;
    var m = bitcast<f32>(0xff800000u);
    for (var c = t; c < p.classes; c += 256u) { m = max(m, rd_x(base + c)); }
    m = row_max(t, m);
    var s = 0.0;
    for (var c = t; c < p.classes; c += 256u) { s += exp(rd_x(base + c) - m); }
    let ls = log(row_sum(t, s));
    for (var c = t; c < p.classes; c += 256u) { wr_y(base + c, (rd_x(base + c) - m) - ls); }
}
