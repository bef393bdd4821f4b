// Bias along a channel axis of a tensor viewed as [outer, channels, inner],
// added in place (conv: [N, O, H*W]; linear: [N, O, 1]) where the product's
// epilogue could not (split products). The sum over outer and inner (the
// bias gradient) is channel_sum.wgsl + sum_partials.wgsl. t and b share the
// element type (ELEM); arithmetic in f32.
struct Params { outer: u32, channels: u32, inner: u32, _p: u32 }

@group(0) @binding(0) var<storage, read_write> t: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(2) var<uniform> p: Params;
#accessors t b
#include prelude

// Planes (inner ≥ 256, f32 and f16): x covers the inner positions 256 at a
// time, (y, z) the (outer, channel) planes, so the channel is one division
// per workgroup. Per element a division by a runtime value is scalar code
// on a CPU adapter (AVX2 has no vector integer divide): 4x slower there.
// Planes longer than the grid's x reach (65,535 × 256 positions) are
// walked in strides of it.
@compute @workgroup_size(256)
fn add_planes(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lidx: u32) {
    let plane = wid.y + wid.z * nwg.y;
    if (plane >= p.outer * p.channels) { return; }
    let bias = ld_b(plane % p.channels);
    let step = nwg.x * 256u;
    var pos = wid.x * 256u + lidx;
    // Stops before a step would pass the plane (pos + step could wrap
    // past 2^32 on a plane near that long).
    loop {
        if (pos >= p.inner) { break; }
        let i = plane * p.inner + pos;
        st_t(i, ld_t(i) + bias);
        if (p.inner - pos <= step) { break; }
        pos += step;
    }
}

// Flat: one invocation per pair of elements (packed bf16 words have one
// writer).
@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let n = p.outer * p.channels * p.inner;
    let i = 2u * w;
    if (i >= n) { return; }
    let j = min(i + 1u, n - 1u);
    let v = vec2<f32>(ld_t(i) + ld_b((i / p.inner) % p.channels),
                      ld_t(j) + ld_b((j / p.inner) % p.channels));
    st2_t(w, v, n);
}
