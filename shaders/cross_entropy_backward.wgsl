// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// d(mean cross-entropy)/dx = (softmax(x) - onehot(label)) * dloss / rows.
// One workgroup a row (row_reduce).
struct Params { rows: u32, classes: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> labels: array<f32>;
@group(0) @binding(2) var<storage, read_write> dloss: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
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
    s = row_sum(t, s);
    // softmax = exp(x - max) / sum: x - max is exact, unlike x - logsumexp.
    let label = u32(rd_labels(r));
    let g = rd_dloss(0) / f32(p.rows);
    for (var c = t; c < p.classes; c += 256u) {
        var d = exp(rd_x(base + c) - m) / s;
        if (c == label) { d -= 1.0; }
        wr_dx(base + c, d * g);
    }
}
