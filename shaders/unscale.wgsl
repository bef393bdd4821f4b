// GradScaler's unscale (PyTorch's _amp_foreach_non_finite_check_and_unscale_):
// g[i] *= inv_scale in place, and found[0] becomes 1 if any g[i] is inf or
// NaN (checked on the scaled value, as PyTorch does). Gradients are f32
// (parameters' master gradients).
// LIST: one dispatch for COUNT (2..8) gradients, as PyTorch's one
// multi-tensor launch (`#include list_main`).
#if LIST
struct Params {
    n: u32, inv_scale: f32, _p0: u32, _p1: u32,
    ends: array<vec4<u32>, 4>, counts: array<vec4<u32>, 4>,
}

#for t in 0..COUNT
@group(0) @binding({{t}}) var<storage, read_write> g{{t}}: array<f32>;
#endfor
@group(0) @binding({{COUNT}}) var<storage, read_write> found: array<atomic<u32>>;
@group(0) @binding({{COUNT+1}}) var<uniform> p: Params;
#else
struct Params { n: u32, inv_scale: f32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> g: array<f32>;
@group(0) @binding(1) var<storage, read_write> found: array<atomic<u32>>;
@group(0) @binding(2) var<uniform> p: Params;
#endif

#include prelude

fn unscaled(v: f32) -> f32 {
    // Exponent all ones: inf or NaN (a bit test, immune to fast-math).
    if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) {
        atomicMax(&found[0], 1u);
    }
    return v * p.inv_scale;
}

#if LIST
// Elements an invocation (list_main).
const PER: u32 = 1u;

#for t in 0..COUNT
fn phase{{t}}(i: u32, n: u32) {
    wr_g{{t}}(i, unscaled(rd_g{{t}}(i)));
}
#endfor
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
#if LIST
#include list_main
#else
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    wr_g(i, unscaled(rd_g(i)));
#endif
}
