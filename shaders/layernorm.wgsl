// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// LayerNorm over the last axis of a rows × cols matrix, f32, as PyTorch's
// native_layer_norm: y = (x - mean) * rstd * w + b with rstd = 1/sqrt(var + eps)
// (biased variance), and mean and rstd kept per row for backward (PyTorch
// saves exactly these two [rows] tensors beside the input).
// `forward` and `backward_input` run one workgroup per row (row_reduce);
// `backward_params` one thread per column over the rows r0..r0+nr (chunks
// under llvmpipe's loop limit, accumulating into dw and db after the first).
struct Params { rows: u32, cols: u32, eps: f32, r0: u32, nr: u32, accumulate: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;
#include prelude
#include row_reduce

// Each invocation sums its columns (256 apart), then the workgroup adds the
// 256 partials in a tree: rounding grows with cols/256 + 8, not with cols.
@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    var s = 0.0;
    for (var j = t; j < p.cols; j += 256u) { s += rd_x(base + j); }
    let m = row_sum(t, s) / f32(p.cols);
    s = 0.0;
    for (var j = t; j < p.cols; j += 256u) {
        let d = rd_x(base + j) - m;
        s += d * d;
    }
    let rs = inverseSqrt(row_sum(t, s) / f32(p.cols) + p.eps);
    for (var j = t; j < p.cols; j += 256u) {
        wr_y(base + j, (rd_x(base + j) - m) * rs * rd_w(j) + rd_b(j));
    }
    if (t == 0u) {
        wr_mean(r, m);
        wr_rstd(r, rs);
    }
}

// Bindings: x, w, g (upstream gradient, in b), dx (in y), mean, rstd.
// dx = rstd * (g·w - mean(g·w) - x̂ · mean(g·w·x̂)), x̂ = (x - mean) * rstd.
@compute @workgroup_size(256)
fn backward_input(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    let m = rd_mean(r);
    let rs = rd_rstd(r);
    var p1 = 0.0;
    var p2 = 0.0;
    for (var j = t; j < p.cols; j += 256u) {
        let gw = rd_b(base + j) * rd_w(j);
        p1 += gw;
        p2 += gw * (rd_x(base + j) - m) * rs;
    }
    let c1 = row_sum(t, p1) / f32(p.cols);
    let c2 = row_sum(t, p2) / f32(p.cols);
    for (var j = t; j < p.cols; j += 256u) {
        let xh = (rd_x(base + j) - m) * rs;
        wr_y(base + j, rs * (rd_b(base + j) * rd_w(j) - c1 - xh * c2));
    }
}

// Bindings: x, dw (in w), db (in b), g (in y), mean, rstd.
// dw[j] = Σ_r g[r, j] x̂[r, j], db[j] = Σ_r g[r, j].
@compute @workgroup_size(256)
fn backward_params(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lidx: u32) {
    let j = flat_index(wid, nwg, lidx);
    if (j >= p.cols) { return; }
    var sw = 0.0;
    var sb = 0.0;
    var pw = 0.0;
    var pb = 0.0;
    for (var i = 0u; i < p.nr; i++) {
        let r = p.r0 + i;
        let g = rd_y(r * p.cols + j);
        pw += g * (rd_x(r * p.cols + j) - rd_mean(r)) * rd_rstd(r);
        pb += g;
        if ((i & 63u) == 63u) { sw += pw; sb += pb; pw = 0.0; pb = 0.0; }
    }
    sw += pw;
    sb += pb;
    if (p.accumulate != 0u) { sw += rd_w(j); sb += rd_b(j); }
    wr_w(j, sw);
    wr_b(j, sb);
}
