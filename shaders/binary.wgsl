// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Elementwise binary ops on same-shaped tensors: out[i] = a[i] (op) b[i],
// in f32 registers whatever the storage type (ELEM); one invocation per pair
// of elements.
struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(3) var<uniform> p: Params;
#accessors a b out
#include prelude

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    let x = vec2<f32>(ld_a(i), ld_a(j));
    let y = vec2<f32>(ld_b(i), ld_b(j));
    st2_out(w, x + y, p.n);
}

@compute @workgroup_size(256)
fn mul(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    let x = vec2<f32>(ld_a(i), ld_a(j));
    let y = vec2<f32>(ld_b(i), ld_b(j));
    st2_out(w, x * y, p.n);
}

@compute @workgroup_size(256)
fn sub(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    let x = vec2<f32>(ld_a(i), ld_a(j));
    let y = vec2<f32>(ld_b(i), ld_b(j));
    st2_out(w, x - y, p.n);
}

// (a - b)², MSE's per-element term.
@compute @workgroup_size(256)
fn sqdiff(@builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    let x = vec2<f32>(ld_a(i), ld_a(j));
    let y = vec2<f32>(ld_b(i), ld_b(j));
    st2_out(w, (x - y) * (x - y), p.n);
}
