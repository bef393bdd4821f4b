// Bias along a channel axis of a tensor viewed as [outer, channels, inner]:
// `add` adds b[c] in place (conv: [N, O, H*W]; linear: [N, O, 1]); `reduce`
// sums over outer and inner (the bias gradient, or a plain sum when
// channels = 1). One `reduce` dispatch covers the flat (outer, inner)
// positions [begin, end) and may add to b, because llvmpipe ends loops after
// 65,535 iterations; `scale` multiplies the finished sums.
struct Params {
    outer: u32, channels: u32, inner: u32, scale: f32,
    begin: u32, end: u32, accumulate: u32, _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> t: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

#include prelude

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.outer * p.channels * p.inner) { return; }
    t[i] = t[i] + b[(i / p.inner) % p.channels];
}

@compute @workgroup_size(256)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lidx: u32) {
    let c = flat_index(wid, nwg, lidx);
    if (c >= p.channels) { return; }
    // Blocked summation (blocks of 64) keeps rounding error near PyTorch's
    // for sums over N·H·W positions.
    var acc = 0.0;
    var part = 0.0;
    for (var j = p.begin; j < p.end; j++) {
        part += t[((j / p.inner) * p.channels + c) * p.inner + j % p.inner];
        if ((j - p.begin) % 64u == 63u) { acc += part; part = 0.0; }
    }
    acc += part;
    if (p.accumulate != 0u) { acc += b[c]; }
    b[c] = acc;
}

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lidx: u32) {
    let c = flat_index(wid, nwg, lidx);
    if (c >= p.channels) { return; }
    // `t` is unused here but must stay in this entry point's layout.
    if (p.outer == 0xffffffffu) { b[c] = t[0]; return; }
    b[c] = b[c] * p.scale;
}
