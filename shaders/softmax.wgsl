// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Row-wise softmax of `scale * x` over the last axis (rows × cols), one
// workgroup per row (row_reduce: neighbouring invocations read neighbouring
// columns), with the row maximum subtracted so exp never overflows.
// `backward`: dx = scale * y * (g - Σ_j g_j y_j), from the saved output y.
// causal = 1 (GPT's masked attention): rows are the query positions of
// cols × cols score matrices, and row i keeps columns 0..=i; the rest are
// exactly 0, as softmax gives a -inf-masked score. Backward needs no mask:
// y = 0 there makes dx = 0.
struct Params { rows: u32, cols: u32, scale: f32, causal: u32 }

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#include row_reduce

// a = x, out = y (b is unused but bound, to share one layout).
@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    var kept = p.cols;
    if (p.causal != 0u) { kept = r % p.cols + 1u; }
    var m = bitcast<f32>(0xff800000u);
    for (var j = t; j < kept; j += 256u) { m = max(m, p.scale * rd_a(base + j)); }
    m = row_max(t, m);
    var s = 0.0;
    for (var j = t; j < kept; j += 256u) {
        let e = exp(p.scale * rd_a(base + j) - m);
        wr_out(base + j, e);
        s += e;
    }
    // Each invocation rescales the entries it wrote itself.
    let inv = 1.0 / row_sum(t, s);
    for (var j = t; j < kept; j += 256u) { wr_out(base + j, rd_out(base + j) * inv); }
    for (var j = kept + t; j < p.cols; j += 256u) { wr_out(base + j, 0.0); }
    if (p.causal == 0xffffffffu) { wr_out(0, rd_b(0)); }
}

// a = y (saved output), b = g (upstream gradient), out = dx.
@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    var dot = 0.0;
    for (var j = t; j < p.cols; j += 256u) { dot += rd_a(base + j) * rd_b(base + j); }
    dot = row_sum(t, dot);
    for (var j = t; j < p.cols; j += 256u) {
        wr_out(base + j, p.scale * rd_a(base + j) * (rd_b(base + j) - dot));
    }
}
