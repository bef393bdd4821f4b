// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// GPT's input embedding, f32: token rows gathered from a [V, D] table by
// index (indices stored as f32 integers, like the cross-entropy labels, and
// clamped into the table so a bad index cannot read out of bounds — the host
// checks them first), plus learned positions broadcast over the batch.
//   gather:       out[t, d] = table[idx[t], d]
//   scatter:      dtable[v, d] (+)= Σ_{t in t0..t0+nt, idx[t] = v} g[t, d]
//                 one thread per (v, d), the tokens in chunks under
//                 llvmpipe's loop limit; deterministic (no atomics), and
//                 neighbouring threads read the same index.
//   add_pos:      out[n, s, d] = x[n, s, d] + pos[s, d]
//   pos_backward: dpos[s, d] = Σ_n g[n, s, d] for s < S, 0 for the table's
//                 later rows (what PyTorch's embedding backward gives
//                 positions the batch never used).
struct Params { rows: u32, dim: u32, count: u32, t0: u32, nt: u32, accumulate: u32, seq: u32, _p: u32 }

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#include prelude

fn row_of(v: f32) -> u32 {
    return min(u32(max(v, 0.0)), p.rows - 1u);
}

// a = table [rows, dim], b = idx [count], out = [count, dim].
@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.count * p.dim) { return; }
    let t = i / p.dim;
    let d = i - t * p.dim;
    wr_out(i, rd_a(row_of(rd_b(t)) * p.dim + d));
}

// a = g [count, dim], b = idx [count], out = dtable [rows, dim].
@compute @workgroup_size(256)
fn scatter(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.rows * p.dim) { return; }
    let v = i / p.dim;
    let d = i - v * p.dim;
    var s = 0.0;
    for (var k = 0u; k < p.nt; k++) {
        let t = p.t0 + k;
        if (row_of(rd_b(t)) == v) { s += rd_a(t * p.dim + d); }
    }
    if (p.accumulate != 0u) { s += rd_out(i); }
    wr_out(i, s);
}

// a = x [count = n·seq, dim], b = pos [rows, dim], out = [count, dim].
@compute @workgroup_size(256)
fn add_pos(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.count * p.dim) { return; }
    let sd = i % (p.seq * p.dim);
    wr_out(i, rd_a(i) + rd_b(sd));
}

// a = g [count = n·seq, dim], out = dpos [rows, dim]; nt = n (samples).
@compute @workgroup_size(256)
fn pos_backward(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.rows * p.dim) { return; }
    var s = 0.0;
    if (i < p.seq * p.dim) {
        for (var n = p.t0; n < p.t0 + p.nt; n++) { s += rd_a(n * p.seq * p.dim + i); }
    }
    if (p.accumulate != 0u) { s += rd_out(i); }
    wr_out(i, s);
    if (p._p == 0xffffffffu) { wr_out(0, rd_b(0)); }
}
