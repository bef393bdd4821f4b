// Bias along a channel axis of a tensor viewed as [outer, channels, inner]:
// `add` adds b[c] in place (conv: [N, O, H*W]; linear: [N, O, 1]); `reduce`
// sums over outer and inner (the bias gradient, or a plain sum when
// channels = 1), times `scale`.
struct Params { outer: u32, channels: u32, inner: u32, scale: f32 }

@group(0) @binding(0) var<storage, read_write> t: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let i = (wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y) * 256u + lidx;
    if (i >= p.outer * p.channels * p.inner) { return; }
    t[i] = t[i] + b[(i / p.inner) % p.channels];
}

@compute @workgroup_size(256)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lidx: u32) {
    let c = (wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y) * 256u + lidx;
    if (c >= p.channels) { return; }
    var acc = 0.0;
    for (var o = 0u; o < p.outer; o++) {
        let base = (o * p.channels + c) * p.inner;
        for (var i = 0u; i < p.inner; i++) {
            acc += t[base + i];
        }
    }
    b[c] = acc * p.scale;
}
