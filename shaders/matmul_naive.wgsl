// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// The baseline: one output per thread, every operand read from global memory.
// Kept for the benchmark that measures what tiling buys.
struct Params {
    m: u32, n: u32, k: u32, batch: u32,
    a_rs: u32, a_cs: u32, b_rs: u32, b_cs: u32,
    a_bs: u32, b_bs: u32, c_bs: u32, accumulate: u32,
    a_off: u32, b_off: u32, c_off: u32, _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    let bt = gid.z;
    if (row >= p.m || col >= p.n) { return; }
    var acc = 0.0;
    for (var kk = 0u; kk < p.k; kk++) {
        acc = fma(a[p.a_off + bt * p.a_bs + row * p.a_rs + kk * p.a_cs],
                  b[p.b_off + bt * p.b_bs + kk * p.b_rs + col * p.b_cs], acc);
    }
    let ci = p.c_off + bt * p.c_bs + row * p.n + col;
    if (p.accumulate != 0u) { acc += c[ci]; }
    c[ci] = acc;
}
