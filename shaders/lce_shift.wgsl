// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Chunked linear_cross_entropy, first pass over a chunk's logits (one
// 256-wide workgroup per row), as PyTorch's loop runs it: the row's max into
// rowmax (its `tmp`), the row shifted by it in place (`logits.sub_`), and the
// shifted target logit into picked (its `gather`). Labels are f32 class
// indices, clamped into the row as the embedding's are.
struct Params { rows: u32, classes: u32, start: u32, _p: u32 }

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> labels: array<f32>;
@group(0) @binding(2) var<storage, read_write> rowmax: array<f32>;
@group(0) @binding(3) var<storage, read_write> picked: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

#include row_reduce

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.classes;
    let y = min(u32(max(rd_labels(p.start + r), 0.0)), p.classes - 1u);
    var m = bitcast<f32>(0xff800000u);
    for (var c = t; c < p.classes; c += 256u) { m = max(m, rd_logits(base + c)); }
    let mx = row_max(t, m);
    // The invocation that shifts the target entry records it: reading it
    // elsewhere would race with that write (barriers order workgroup
    // memory, not storage).
    for (var c = t; c < p.classes; c += 256u) {
        let v = rd_logits(base + c) - mx;
        wr_logits(base + c, v);
        if (c == y) { wr_picked(r, v); }
    }
    if (t == 0u) { wr_rowmax(r, mx); }
}
