// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Chunked linear_cross_entropy's loss updates: out[0] += sign · Σ_r
// weight[start + r] · v[r] over a chunk's rows (PyTorch's `output.add_(dot)`
// with the picked logits, `output.sub_(dot)` with the log-sums). One
// workgroup: each invocation sums a stride of rows, a tree adds the 256.
struct Params { rows: u32, start: u32, sign: f32, _p: u32 }

@group(0) @binding(0) var<storage, read_write> weight: array<f32>;
@group(0) @binding(1) var<storage, read_write> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

#include row_reduce

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32) {
    var s = 0.0;
    for (var r = t; r < p.rows; r += 256u) { s += rd_weight(p.start + r) * rd_v(r); }
    let total = row_sum(t, s);
    if (t == 0u) { wr_out(0u, rd_out(0u) + p.sign * total); }
}
