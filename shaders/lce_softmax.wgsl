// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Chunked linear_cross_entropy, second pass over a chunk's shifted logits
// (one 256-wide workgroup per row): exp in place and the row's sum (PyTorch's
// `sumexp_`), then the row scaled to the softmax times the row's weight —
// the logits' gradient, made in the forward pass. PyTorch's weight w is
// negative (-1/rows for the mean) and it keeps softmax·w; this keeps
// softmax·(−w) = softmax/rows, so that the products after it accumulate
// (C += A·B) instead of subtracting. factor gets −w/sum (its `tmp`), denom
// log(sum) (its `softmax_denom.log_()`).
struct Params { rows: u32, classes: u32, start: u32, _p: u32 }

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> factor: array<f32>;
@group(0) @binding(3) var<storage, read_write> denom: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

#include row_reduce

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.classes;
    var s = 0.0;
    for (var c = t; c < p.classes; c += 256u) {
        let e = exp(rd_logits(base + c));
        wr_logits(base + c, e);
        s += e;
    }
    let total = row_sum(t, s);
    let f = -rd_weight(p.start + r) / total;
    // Each invocation rescales the entries it exponentiated itself.
    for (var c = t; c < p.classes; c += 256u) { wr_logits(base + c, rd_logits(base + c) * f); }
    if (t == 0u) {
        wr_factor(r, f);
        wr_denom(r, log(total));
    }
}
