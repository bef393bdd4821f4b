// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// out[a, c, b, e] = x[a, b, c, e] for x [A, B, C, E]: multi-head attention's
// [N, S, H, hd] ↔ [N, H, S, hd], the contiguous copy PyTorch's matmul makes
// of a transposed view. Its own backward (with B and C exchanged).
struct Params { a: u32, b: u32, c: u32, e: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.a * p.b * p.c * p.e) { return; }
    // i indexes the output [A, C, B, E].
    let e = i % p.e;
    let r = i / p.e;
    let bb = r % p.b;
    let r2 = r / p.b;
    let cc = r2 % p.c;
    let aa = r2 / p.c;
    wr_out(i, rd_x(((aa * p.b + bb) * p.c + cc) * p.e + e));
}
