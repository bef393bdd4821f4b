// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// nll_loss_forward, mean reduction: out = -sum_r logp[r, label_r] / rows and
// total_weight = rows (no class weights, labels never ignore_index). One
// workgroup: each invocation sums a stride of rows, then a tree in
// workgroup memory adds the 256 partial sums, so the error grows with
// rows / 256 plus a logarithm, not with rows. A dispatch takes rows
// [begin, end): past 256 × 16,384 rows the caller issues several (llvmpipe
// ends an invocation's loops after 65,535 iterations), each adding its sum
// to `out`, the last dividing by rows.
struct Params { rows: u32, classes: u32, begin: u32, end: u32 }

@group(0) @binding(0) var<storage, read_write> logp: array<f32>;
@group(0) @binding(1) var<storage, read_write> labels: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> total_weight: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32) {
    var s = 0.0;
    for (var r = p.begin + t; r < p.end; r += 256u) {
        s += rd_logp(r * p.classes + u32(rd_labels(r)));
    }
    part[t] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (t < k) { part[t] += part[t + k]; }
        workgroupBarrier();
    }
    if (t == 0u) {
        let sum = select(0.0, rd_out(0u), p.begin > 0u) - part[0];
        if (p.end == p.rows) {
            wr_out(0u, sum / f32(p.rows));
            wr_total_weight(0u, f32(p.rows));
        } else {
            wr_out(0u, sum);
        }
    }
}
