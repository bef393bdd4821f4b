// out[off + i] (+)= Σ_z parts[start + z·len + i] for z in 0..count, in order: the
// second half of a split-K or batch-reduced matmul (matmul_cpu.wgsl and matmul_gpu.wgsl write one
// partial product per split and batch entry). A fixed order keeps results
// deterministic. Partials are f32 whatever the output's type (ELEM); each partial is itself a blocked sum, so the total is as
// accurate as one long blocked reduction.
// COL_BIAS (f32 out): then + bias[i % cols], a linear layer's bias added
// where its split product is summed, as PyTorch's addmm adds it in the
// product, rather than in a pass of its own.
struct Params {
    len: u32, count: u32, off: u32, accumulate: u32,
    start: u32, cols: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<storage, read_write> parts: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<{{T}}>;
#if COL_BIAS
@group(0) @binding(2) var<storage, read_write> bias: array<{{T}}>;
@group(0) @binding(3) var<uniform> p: Params;
#accessors parts:f32 out bias
#else
@group(0) @binding(2) var<uniform> p: Params;
#accessors parts:f32 out
#endif
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
#if PAIRS
    // Packed bf16 output (off even): one invocation per output word.
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.len) { return; }
    var v = vec2<f32>(total_at(i), total_at(min(i + 1u, p.len - 1u)));
    if (p.accumulate != 0u) {
        v += vec2<f32>(ld_out(p.off + i), ld_out(p.off + min(i + 1u, p.len - 1u)));
    }
    st2_out((p.off + i) / 2u, v, p.off + p.len);
#else
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.len) { return; }
    var total = total_at(i);
    if (p.accumulate != 0u) { total += ld_out(p.off + i); }
#if COL_BIAS
    total += ld_bias(i % p.cols);
#endif
    st_out(p.off + i, total);
#endif
}

// Blocked too: partials are added in blocks of 8, then the blocks, so 128
// partials (conv1's weight gradient over 64 samples × 2 splits) cost 16 + 8
// roundings, not 128.
fn total_at(i: u32) -> f32 {
    var total = 0.0;
    var block = 0.0;
    for (var zz = 0u; zz < p.count; zz++) {
        block += ld_parts(p.start + zz * p.len + i);
        if ((zz & 7u) == 7u) { total += block; block = 0.0; }
    }
    return total + block;
}
