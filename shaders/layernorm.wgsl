// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// LayerNorm over the last axis of a rows × cols matrix, f32, as PyTorch's
// native_layer_norm: y = (x - mean) * rstd * w + b with rstd = 1/sqrt(var + eps)
// (biased variance), and mean and rstd kept per row for backward (PyTorch
// saves exactly these two [rows] tensors beside the input).
// `forward` and `backward_input` run one thread per row; `backward_params`
// one thread per column over the rows r0..r0+nr (chunks under llvmpipe's
// loop limit, accumulating into dw and db after the first).
struct Params { rows: u32, cols: u32, eps: f32, r0: u32, nr: u32, accumulate: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;
#include prelude

// Sums in blocks of 64 so rounding grows with cols/64 + 64, not with cols.
@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let r = flat_index(wid, nwg, lidx);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    var s = 0.0;
    var part = 0.0;
    for (var j = 0u; j < p.cols; j++) {
        part += rd_x(base + j);
        if ((j & 63u) == 63u) { s += part; part = 0.0; }
    }
    let m = (s + part) / f32(p.cols);
    s = 0.0;
    part = 0.0;
    for (var j = 0u; j < p.cols; j++) {
        let d = rd_x(base + j) - m;
        part += d * d;
        if ((j & 63u) == 63u) { s += part; part = 0.0; }
    }
    let rs = inverseSqrt((s + part) / f32(p.cols) + p.eps);
    for (var j = 0u; j < p.cols; j++) {
        wr_y(base + j, (rd_x(base + j) - m) * rs * rd_w(j) + rd_b(j));
    }
    wr_mean(r, m);
    wr_rstd(r, rs);
}

// Bindings: x, w, g (upstream gradient, in b), dx (in y), mean, rstd.
// dx = rstd * (g·w - mean(g·w) - x̂ · mean(g·w·x̂)), x̂ = (x - mean) * rstd.
@compute @workgroup_size(256)
fn backward_input(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lidx: u32) {
    let r = flat_index(wid, nwg, lidx);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    let m = rd_mean(r);
    let rs = rd_rstd(r);
    var s1 = 0.0;
    var s2 = 0.0;
    var p1 = 0.0;
    var p2 = 0.0;
    for (var j = 0u; j < p.cols; j++) {
        let gw = rd_b(base + j) * rd_w(j);
        p1 += gw;
        p2 += gw * (rd_x(base + j) - m) * rs;
        if ((j & 63u) == 63u) { s1 += p1; s2 += p2; p1 = 0.0; p2 = 0.0; }
    }
    let c1 = (s1 + p1) / f32(p.cols);
    let c2 = (s2 + p2) / f32(p.cols);
    for (var j = 0u; j < p.cols; j++) {
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
