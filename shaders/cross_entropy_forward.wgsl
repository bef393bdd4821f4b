// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Cross-entropy over integer labels (stored as f32), numerically stable: each
// row's loss = logsumexp(x) - x[label]. The mean is a separate reduction.
struct Params { rows: u32, classes: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> labels: array<f32>;
@group(0) @binding(2) var<storage, read_write> losses: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= p.rows) { return; }
    let base = r * p.classes;
    var m = rd_x(base);
    for (var c = 1u; c < p.classes; c++) { m = max(m, rd_x(base + c)); }
    var s = 0.0;
    for (var c = 0u; c < p.classes; c++) { s += exp(rd_x(base + c) - m); }
    wr_losses(r, m + log(s) - rd_x(base + u32(rd_labels(r))));
}
