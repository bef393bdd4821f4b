// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// t[i] *= s[0] in place (PyTorch's `t.mul_(scalar_tensor)`), f32.
struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> t: array<f32>;
@group(0) @binding(1) var<storage, read_write> s: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    wr_t(i, rd_t(i) * rd_s(0u));
}
