// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// out[a, c, b, e] = x[a, b, c, e] for x [A, B, C, E]: multi-head attention's
// [N, S, H, hd] ↔ [N, H, S, hd], the contiguous copy PyTorch's matmul makes
// of a transposed view. Its own backward (with B and C exchanged).
// Two output elements an invocation, so a 16-bit word has one writer.
struct Params { a: u32, b: u32, c: u32, e: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(2) var<uniform> p: Params;
#accessors x out
#include prelude

// Where output element i ([A, C, B, E] order) is read from in x.
fn source_of(i: u32) -> u32 {
    let e = i % p.e;
    let r = i / p.e;
    let bb = r % p.b;
    let r2 = r / p.b;
    let cc = r2 % p.c;
    let aa = r2 / p.c;
    return ((aa * p.b + bb) * p.c + cc) * p.e + e;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let n = p.a * p.b * p.c * p.e;
    let i = 2u * w;
    if (i >= n) { return; }
    let j = min(i + 1u, n - 1u);
    st2_out(w, vec2<f32>(ld_x(source_of(i)), ld_x(source_of(j))), n);
}
