// GradScaler's unscale (PyTorch's _amp_foreach_non_finite_check_and_unscale_):
// g[i] *= inv_scale in place, and found[0] becomes 1 if any g[i] is inf or
// NaN (checked on the scaled value, as PyTorch does). Gradients are f32
// (parameters' master gradients).
// LIST (a count of 2..8): one dispatch for that many gradients, as PyTorch's
// one multi-tensor launch. Each gradient has whole workgroups (ends[t]: where
// they end) so a workgroup takes one branch: a CPU adapter runs a divergent
// branch's every side masked.
#if LIST
struct Params { n: u32, inv_scale: f32, _p0: u32, _p1: u32, ends: array<vec4<u32>, 2>, counts: array<vec4<u32>, 2> }

#for t in 0..LIST
@group(0) @binding({{t}}) var<storage, read_write> g{{t}}: array<f32>;
#endfor
@group(0) @binding({{LIST}}) var<storage, read_write> found: array<atomic<u32>>;
@group(0) @binding({{LIST+1}}) var<uniform> p: Params;
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
#if LIST
    let g = flat_index(wid, nwg, 0u) / 256u;
    var start = 0u;
#for t in 0..LIST
    let end{{t}} = p.ends[{{t/4}}][{{t-t/4*4}}];
    if (g < end{{t}}) {
        let i = (g - start) * 256u + lidx;
        if (i < p.counts[{{t/4}}][{{t-t/4*4}}]) { wr_g{{t}}(i, unscaled(rd_g{{t}}(i))); }
        return;
    }
    start = end{{t}};
#endfor
#else
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    wr_g(i, unscaled(rd_g(i)));
#endif
}
