// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// dx = dy where the saved output y is positive (PyTorch's threshold_backward
// on the output, which is why ReLU keeps its output alive for backward).
// One invocation per pair of elements; any ELEM. VEC4 (f32, n a multiple of
// 4): one per vec4, since llvmpipe pays per access.
struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

#if VEC4
@group(0) @binding(0) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dy: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dx: array<vec4<f32>>;
#else
@group(0) @binding(0) var<storage, read_write> y: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> dy: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> dx: array<{{T}}>;
#accessors y dy dx
#endif
@group(0) @binding(3) var<uniform> p: Params;
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
#if VEC4
    if (w >= p.n / 4u) { return; }
    wr_dx(w, select(vec4<f32>(0.0), rd_dy(w), rd_y(w) > vec4<f32>(0.0)));
#else
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    let g = vec2<f32>(select(0.0, ld_dy(i), ld_y(i) > 0.0), select(0.0, ld_dy(j), ld_y(j) > 0.0));
    st2_dx(w, g, p.n);
#endif
}
