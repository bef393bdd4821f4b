// out[off + i] (+)= Σ_z parts[start + z·len + i] for z in 0..count, in order: the
// second half of a split-K or batch-reduced matmul (matmul_cpu.wgsl and matmul_gpu.wgsl write one
// partial product per split and batch entry). A fixed order keeps results
// deterministic. Partials are f32 whatever the output's type (ELEM); each partial is itself a blocked sum, so the total is as
// accurate as one long blocked reduction.
// COL_BIAS (bias in the output's type): then + bias[i % cols], a linear
// layer's bias added where its split product is summed, as PyTorch's addmm
// adds it in the product, rather than in a pass of its own: a 16-bit output
// is rounded once, after the bias, as addmm's f32 sum is.
// SPREAD: the same additions in the same order, spread over more threads
// for a long sum over few outputs (SimpleConvNet's fc: 128 partials of 640
// outputs), where one thread an output leaves a GPU waiting on 128 loads in
// turn: eight threads an output each add blocks of 8, and one adds the
// blocks in order.
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

#if !SPREAD
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
#if PAIRS
    // Packed bf16 output (off even): one invocation per output word.
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.len) { return; }
    let i2 = min(i + 1u, p.len - 1u);
    finish2(i, i2, vec2<f32>(total_at(i), total_at(i2)));
#else
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.len) { return; }
    finish(i, total_at(i));
#endif
}
#else
// Blocks a round: 64 blocks of the workgroup's 32 outputs in workgroup
// memory (8 KiB), added in order before the next round overwrites them.
const ROUND: u32 = 64u;
var<workgroup> blocks: array<array<f32, 32>, 64>;
#if PAIRS
var<workgroup> totals: array<f32, 32>;
#endif

// Block b of output i: its (at most 8) partials added in turn from 0.0,
// as total_at adds them.
fn block_at(i: u32, b: u32) -> f32 {
    var block = 0.0;
    for (var zz = b * 8u; zz < min(b * 8u + 8u, p.count); zz++) {
        block += ld_parts(p.start + zz * p.len + i);
    }
    return block;
}

// Workgroup w takes outputs 32w .. 32w + 31 (x); its 8 rows (y) each add
// every 8th block of a round. Then row 0 adds the blocks in order: the full
// ones into the total one by one, the last partial block (or 0.0) added at
// the end, as total_at does, so the bits are the same.
@compute @workgroup_size(32, 8)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y) * 32u + lid.x;
    let live = i < p.len;
    let nb = (p.count + 7u) / 8u;
    let full = p.count / 8u;
    var total = 0.0;
    var tail = 0.0;
    for (var r = 0u; r < nb; r += ROUND) {
        for (var q = lid.y; q < ROUND; q += 8u) {
            if (live && r + q < nb) {
                blocks[q][lid.x] = block_at(i, r + q);
            }
        }
        workgroupBarrier();
        if (lid.y == 0u) {
            for (var q = 0u; q < min(ROUND, nb - r); q++) {
                if (r + q < full) {
                    total += blocks[q][lid.x];
                } else {
                    tail = blocks[q][lid.x];
                }
            }
        }
        workgroupBarrier();
    }
    total += tail;
#if PAIRS
    // Packed 16-bit output (off even, 32w even): lane 2j writes the word of
    // outputs 2j and 2j + 1, the second only inside len (st2).
    if (lid.y == 0u) {
        totals[lid.x] = total;
    }
    workgroupBarrier();
    if (lid.y == 0u && live && (lid.x & 1u) == 0u) {
        let i2 = min(i + 1u, p.len - 1u);
        finish2(i, i2, vec2<f32>(total, totals[lid.x + i2 - i]));
    }
#else
    if (lid.y == 0u && live) {
        finish(i, total);
    }
#endif
}
#endif

// How both ways end: what the output held (accumulate), the column's
// bias, the store; packed 16-bit outputs a word (outputs i and i2) at once.
#if PAIRS
fn finish2(i: u32, i2: u32, sums: vec2<f32>) {
    var v = sums;
    if (p.accumulate != 0u) {
        v += vec2<f32>(ld_out(p.off + i), ld_out(p.off + i2));
    }
#if COL_BIAS
    v += vec2<f32>(ld_bias(i % p.cols), ld_bias(i2 % p.cols));
#endif
    st2_out((p.off + i) / 2u, v, p.off + p.len);
}
#else
fn finish(i: u32, sum: f32) {
    var total = sum;
    if (p.accumulate != 0u) { total += ld_out(p.off + i); }
#if COL_BIAS
    total += ld_bias(i % p.cols);
#endif
    st_out(p.off + i, total);
}
#endif

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
