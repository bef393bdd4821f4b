// out[i] = value, for i < n. One thread per element; the 1-D index is rebuilt
// from a 2-D/3-D grid because one dimension holds at most 65,535 workgroups.
struct Params { n: u32, value: f32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    wr_out(i, p.value);
}
