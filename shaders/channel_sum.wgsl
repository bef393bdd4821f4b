// First stage of a channel sum over a tensor viewed as [outer, channels,
// inner] (the bias gradient): workgroup w takes channel w % channels and
// positions [g·per_group, (g+1)·per_group) of the outer·inner ones, g = w /
// channels; each of its 256 threads sums every 256th of those (at most 64,
// a block of the blocked summation), then a tree in workgroup memory adds
// the 256 and parts[g·channels + c] receives the total. sum_partials.wgsl
// adds the groups up. Many workgroups per channel fill a GPU, where one
// thread per channel over N·H·W positions left it idle.
// CENTRED sums a term about a per-channel centre instead (BatchNorm's
// two-pass statistics, which E[x²] − E[x]² would cancel away):
//   CENTRED == 1: (t − mean[c])²        CENTRED == 2: g·(t − mean[c])
struct Params {
    outer: u32, channels: u32, inner: u32, total: u32,
    per_group: u32, groups: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<storage, read_write> t: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> parts: array<f32>;
#if CENTRED
@group(0) @binding(2) var<storage, read_write> mean: array<f32>;
#if CENTRED == 2
@group(0) @binding(3) var<storage, read_write> g: array<{{T}}>;
#accessors t g
@group(0) @binding(4) var<uniform> p: Params;
#else
#accessors t
@group(0) @binding(3) var<uniform> p: Params;
#endif
#else
#accessors t
@group(0) @binding(2) var<uniform> p: Params;
#endif

// The summed term at element `at` of channel `c`.
fn term(at: u32, c: u32) -> f32 {
#if CENTRED
    let d = ld_t(at) - rd_mean(c);
#if CENTRED == 2
    return ld_g(at) * d;
#else
    return d * d;
#endif
#else
    return ld_t(at);
#endif
}

var<workgroup> sums: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    // Workgroups beyond the last (grid_for rounds up) do no work but must
    // still reach every barrier, as all threads of a group must.
    let w = wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y;
    let live = w < p.channels * p.groups;
    let c = w % p.channels;
    let g = w / p.channels;
    let begin = g * p.per_group;
    let end = select(begin, min(begin + p.per_group, p.total), live);
    var acc = 0.0;
    let j0 = begin + lidx;
    if (p.inner >= 256u) {
        // Step (o, i) along with j: a step of 256 wraps i at most once, and
        // there is no per-element division (scalar code on CPU adapters,
        // which have no vector integer divide).
        var o = j0 / p.inner;
        var i = j0 - o * p.inner;
        for (var j = j0; j < end; j += 256u) {
            acc += term((o * p.channels + c) * p.inner + i, c);
            i += 256u;
            if (i >= p.inner) { i -= p.inner; o += 1u; }
        }
    } else {
        for (var j = j0; j < end; j += 256u) {
            let o = j / p.inner;
            let i = j - o * p.inner;
            acc += term((o * p.channels + c) * p.inner + i, c);
        }
    }
    sums[lidx] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lidx < s) { sums[lidx] += sums[lidx + s]; }
        workgroupBarrier();
    }
    if (lidx == 0u && live) { wr_parts(g * p.channels + c, sums[0]); }
}
