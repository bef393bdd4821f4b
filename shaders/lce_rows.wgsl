// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Chunked linear_cross_entropy's row copies, one invocation per element of a
// chunk's [rows, dim] block:
//   dst[dst_off + b·dim + d] = src[row(b)·dim + d] · (scale ? weight[start + b] : 1)
// with row(b) = the label of row start + b (gather: PyTorch's
// `index_select(W, 0, target)`) or src_row + b (the input's rows).
struct Params { rows: u32, dim: u32, start: u32, src_row: u32,
                dst_off: u32, gather: u32, scale: u32, classes: u32 }

@group(0) @binding(0) var<storage, read_write> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> labels: array<f32>;
@group(0) @binding(2) var<storage, read_write> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.rows * p.dim) { return; }
    let b = i / p.dim;
    let d = i - b * p.dim;
    var row = p.src_row + b;
    if (p.gather != 0u) {
        row = min(u32(max(rd_labels(p.start + b), 0.0)), p.classes - 1u);
    }
    var v = rd_src(row * p.dim + d);
    if (p.scale != 0u) { v *= rd_weight(p.start + b); }
    wr_dst(p.dst_off + i, v);
}
