// GradScaler's unscale (PyTorch's _amp_foreach_non_finite_check_and_unscale_):
// g[i] *= inv_scale in place, and found[0] becomes 1 if any g[i] is inf or
// NaN (checked on the scaled value, as PyTorch does). Gradients are f32
// (parameters' master gradients).
struct Params { n: u32, inv_scale: f32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> g: array<f32>;
@group(0) @binding(1) var<storage, read_write> found: array<atomic<u32>>;
@group(0) @binding(2) var<uniform> p: Params;

#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    let v = rd_g(i);
    // Exponent all ones: inf or NaN (a bit test, immune to fast-math).
    if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) {
        atomicMax(&found[0], 1u);
    }
    wr_g(i, v * p.inv_scale);
}
