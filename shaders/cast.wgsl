// out[i] = x[i] converted from ELEM to ELEM_OUT (PyTorch's `.to(dtype)`):
// loads widen to f32, stores round to nearest even. One invocation per pair
// of elements, so a packed bf16 word is written by one invocation only.
struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{T_OUT}}>;
@group(0) @binding(2) var<uniform> p: Params;
#accessors x out:ELEM_OUT
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
    let hi = ld_x(min(i + 1u, p.n - 1u));
    st2_out(w, vec2<f32>(ld_x(i), hi), p.n);
}
