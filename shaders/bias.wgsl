// Bias along a channel axis of a tensor viewed as [outer, channels, inner]:
// `add` adds b[c] in place (conv: [N, O, H*W]; linear: [N, O, 1]); the sum
// over outer and inner (the bias gradient, or a plain sum when channels = 1)
// is channel_sum.wgsl + sum_partials.wgsl; `scale` multiplies the finished
// sums.
struct Params { outer: u32, channels: u32, inner: u32, scale: f32 }

@group(0) @binding(0) var<storage, read_write> t: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

#include prelude

// Planes (inner ≥ 256, conv): x covers the inner positions 256 at a time,
// (y, z) the (outer, channel) planes, so the channel is one division per
// workgroup. Per element a division by a runtime value is scalar code on a
// CPU adapter (AVX2 has no vector integer divide): 4x slower there.
@compute @workgroup_size(256)
fn add_planes(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lidx: u32) {
    let pos = wid.x * 256u + lidx;
    let plane = wid.y + wid.z * nwg.y;
    if (pos >= p.inner || plane >= p.outer * p.channels) { return; }
    let i = plane * p.inner + pos;
    t[i] = t[i] + b[plane % p.channels];
}

// Flat (small inner, linear): one index per invocation.
@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.outer * p.channels * p.inner) { return; }
    t[i] = t[i] + b[(i / p.inner) % p.channels];
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
