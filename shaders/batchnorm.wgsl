// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// BatchNorm2d over x viewed as [outer = N, channels = C, inner = H·W], f32,
// as PyTorch's native_batch_norm: batch statistics in training (biased
// variance to normalise; the unbiased one, n/(n-1), into the running
// variance, with momentum), running statistics in eval.
//   The per-channel sums come from channel_sum.wgsl: Σx and Σg plain, and
//     Σ(x − mean)² and Σg·(x − mean) centred on the channel mean (so the
//     variance is two-pass, not E[x²] − E[x]², which cancels).
//   mean_of (a thread per channel): mean = Σx / n (Σx from channel_sum).
//   finish (a thread per channel): 1/σ and the running statistics.
//   eval_stats (a thread per channel): mean and 1/σ from the running ones.
//   normalize: y = (x − mean[c])·invstd[c]·w[c] + b[c]
//   dx: training  w·invstd·(g − Σg/n − x̂·invstd·Σg(x−mean)/n)
//       eval      w·invstd·g
//   dweight (a thread per channel): Σ g·x̂ = invstd·Σ g(x − mean).
struct Params {
    outer: u32, channels: u32, inner: u32, total: u32,
    train: u32, eps: f32, momentum: f32, _p0: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> s: array<f32>;
@group(0) @binding(3) var<storage, read_write> u: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;
#include prelude

// s = Σx; writes a = mean.
@compute @workgroup_size(256)
fn mean_of(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let c = flat_index(wid, nwg, lidx);
    if (c >= p.channels) { return; }
    wr_a(c, rd_s(c) / f32(p.total));
    if (p._p0 == 0xffffffffu) { wr_out(0, rd_b(0) + rd_u(0) + rd_v(0)); }
}

// a = stats [mean | invstd] (2C), the mean written; u = Σ(x − mean)²;
// writes the invstd half, v = running mean, out = running var (both
// updated with momentum).
@compute @workgroup_size(256)
fn finish(@builtin(workgroup_id) wid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lidx: u32) {
    let c = flat_index(wid, nwg, lidx);
    if (c >= p.channels) { return; }
    let n = f32(p.total);
    let mean = rd_a(c);
    let var_b = rd_u(c) / n;
    wr_a(p.channels + c, inverseSqrt(var_b + p.eps));
    if (p._p0 == 0xffffffffu) { wr_s(0, rd_b(0)); }
    wr_v(c, (1.0 - p.momentum) * rd_v(c) + p.momentum * mean);
    wr_out(c, (1.0 - p.momentum) * rd_out(c) + p.momentum * var_b * n / (n - 1.0));
}

// v = running mean, out = running var; writes a = stats [mean | invstd].
@compute @workgroup_size(256)
fn eval_stats(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lidx: u32) {
    let c = flat_index(wid, nwg, lidx);
    if (c >= p.channels) { return; }
    wr_a(c, rd_v(c));
    wr_a(p.channels + c, inverseSqrt(rd_out(c) + p.eps));
    if (p._p0 == 0xffffffffu) { wr_s(0, rd_u(0) + rd_b(0)); }
}

fn channel_of(i: u32) -> u32 {
    return (i / p.inner) % p.channels;
}

// a = x, s = stats [mean | invstd], v = weight, b = bias; out = y.
@compute @workgroup_size(256)
fn normalize(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.outer * p.channels * p.inner) { return; }
    let c = channel_of(i);
    wr_out(i, (rd_a(i) - rd_s(c)) * rd_s(p.channels + c) * rd_v(c) + rd_b(c));
    if (p._p0 == 0xffffffffu) { wr_out(0, rd_u(0)); }
}

// a = x, b = g, s = [mean | invstd] (2C), u = [Σg | Σg(x−mean)] (2C),
// v = weight; out = dx.
@compute @workgroup_size(256)
fn dx(@builtin(workgroup_id) wid: vec3<u32>,
      @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.outer * p.channels * p.inner) { return; }
    let c = channel_of(i);
    let mean = rd_s(c);
    let inv = rd_s(p.channels + c);
    var g = rd_b(i);
    if (p.train != 0u) {
        let n = f32(p.total);
        let xh = (rd_a(i) - mean) * inv;
        g = g - rd_u(c) / n - xh * inv * rd_u(p.channels + c) / n;
    }
    wr_out(i, rd_v(c) * inv * g);
}

// s = [mean | invstd], u = [Σg | Σg(x−mean)]; out = dweight.
@compute @workgroup_size(256)
fn dweight(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let c = flat_index(wid, nwg, lidx);
    if (c >= p.channels) { return; }
    wr_out(c, rd_s(p.channels + c) * rd_u(p.channels + c));
    if (p._p0 == 0xffffffffu) { wr_out(0, rd_a(0) + rd_b(0) + rd_v(0)); }
}
