// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Dropout, f32, as CUDA's native_dropout: element i is kept with
// probability 1 − p, kept elements scaled by 1/(1 − p), and the decision
// kept as one byte per element (four to a word; a word has one writer),
// which is what backward reads — 1 byte an element, as PyTorch keeps its
// bool mask on a GPU. The random numbers are a hash of (seed, i): no state,
// the same mask whenever the same seed is given (checkpoint recomputation).
struct Params { n: u32, seed_lo: u32, seed_hi: u32, threshold: u32, scale: f32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> mask: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#include prelude

// PCG-style integer hash (Jarzynski & Olano 2020).
fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

fn keep(i: u32) -> bool {
    // Uniform in [0, 2^32); kept when at or above p·2^32.
    return pcg(pcg(i ^ p.seed_lo) + p.seed_hi) >= p.threshold;
}

// a = x; out = y, mask; one invocation per word of four elements.
@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    if (4u * w >= p.n) { return; }
    var bits = 0u;
    for (var k = 0u; k < 4u; k++) {
        let i = 4u * w + k;
        if (i < p.n) {
            let kept = keep(i);
            wr_out(i, select(0.0, rd_a(i) * p.scale, kept));
            bits |= select(0u, 1u, kept) << (8u * k);
        }
    }
    wr_mask(w, bits);
}

// a = g; out = dx = g · mask · scale; one invocation per element.
@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    let kept = ((rd_mask(i / 4u) >> (8u * (i % 4u))) & 1u) != 0u;
    wr_out(i, select(0.0, rd_a(i) * p.scale, kept));
}
