// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Mean over the middle axis of a tensor viewed as [outer, mid, inner]:
// `forward` sums mid positions [begin, end) for each (outer, inner) pair,
// scales, and may add to what is there (llvmpipe ends loops after 65,535
// iterations, so a long axis is split across dispatches). `backward` spreads
// each gradient back over the axis: dx[o, m, i] = scale * g[o, i].
struct Params {
    outer: u32, mid: u32, inner: u32, scale: f32,
    begin: u32, end: u32, accumulate: u32, _p: u32,
}

// src is of any element type (ELEM); forward's dst is f32 (a 16-bit mean
// is rounded once, by a cast, after all its partial dispatches); backward's
// dst is ELEM, one invocation per pair of elements.
@group(0) @binding(0) var<storage, read_write> src: array<{{T}}>;
#if BACKWARD
@group(0) @binding(1) var<storage, read_write> dst: array<{{T}}>;
#else
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
#endif
@group(0) @binding(2) var<uniform> p: Params;
#if BACKWARD
#accessors src dst
#else
#accessors src dst:f32
#endif

fn index(wid: vec3<u32>, nwg: vec3<u32>, lidx: u32) -> u32 {
    return flat_index(wid, nwg, lidx);
}

#include prelude

@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lidx: u32) {
    let t = index(wid, nwg, lidx);
    if (t >= p.outer * p.inner) { return; }
    let o = t / p.inner;
    let i = t % p.inner;
    // Blocked summation (blocks of 64): rounding error grows with n/64 + 64.
    var acc = 0.0;
    var part = 0.0;
    for (var m = p.begin; m < p.end; m++) {
        part += ld_src((o * p.mid + m) * p.inner + i);
        if ((m - p.begin) % 64u == 63u) { acc += part; part = 0.0; }
    }
    acc += part;
    acc = acc * p.scale;
    if (p.accumulate != 0u) { acc += ld_dst(t); }
    st_dst(t, acc);
}

@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lidx: u32) {
    let w = index(wid, nwg, lidx);
    let n = p.outer * p.mid * p.inner;
    let t = 2u * w;
    if (t >= n) { return; }
    let u = min(t + 1u, n - 1u);
    let g = vec2<f32>(ld_src((t / (p.mid * p.inner)) * p.inner + t % p.inner),
                      ld_src((u / (p.mid * p.inner)) * p.inner + u % p.inner));
    st2_dst(w, p.scale * g, n);
}
