// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// out[i] = max(x[i], 0), NaN kept. A non-inplace ReLU allocates its output: the articles'
// "ReLU adds no memory" is measured against this. One invocation per pair
// of elements (a packed bf16 word has one writer); any ELEM. VEC4 (f32, n a
// multiple of 4): one invocation per vec4, since llvmpipe pays per access.
struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

#if VEC4
@group(0) @binding(0) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
#else
@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{T}}>;
#accessors x out
#endif
@group(0) @binding(2) var<uniform> p: Params;
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    // select, not max: max(NaN, 0) may be 0, and a NaN must reach the loss
    // (as in PyTorch) instead of training on silently.
#if VEC4
    if (w >= p.n / 4u) { return; }
    let v = rd_x(w);
    wr_out(w, select(v, vec4<f32>(0.0), v < vec4<f32>(0.0)));
#else
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    let v = vec2<f32>(ld_x(i), ld_x(j));
    st2_out(w, select(v, vec2<f32>(0.0), v < vec2<f32>(0.0)), p.n);
#endif
}
