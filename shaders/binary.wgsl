// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Elementwise binary ops on same-shaped tensors: out[i] = a[i] (op) b[i].
struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

fn index(wid: vec3<u32>, nwg: vec3<u32>, lidx: u32) -> u32 {
    return flat_index(wid, nwg, lidx);
}

#include prelude

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let i = index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    out[i] = a[i] + b[i];
}

@compute @workgroup_size(256)
fn mul(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let i = index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    out[i] = a[i] * b[i];
}

@compute @workgroup_size(256)
fn sub(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let i = index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    out[i] = a[i] - b[i];
}

// (a - b)², MSE's per-element term.
@compute @workgroup_size(256)
fn sqdiff(@builtin(workgroup_id) wid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lidx: u32) {
    let i = index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    let d = a[i] - b[i];
    out[i] = d * d;
}
