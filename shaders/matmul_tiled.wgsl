// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// C[b] (+)= A[b] · B[b], with A (M×K) and B (K×N) read through strides, so
// transposed operands (backward passes) need no copies.
//
// Each 16×16 workgroup computes a 64×64 tile of C; each thread a 4×4 block held
// in registers. A and B tiles (64×16 and 16×64) are staged in workgroup memory
// as vec4s, so the inner loop does 4 vec4 FMAs (16 multiply-adds) per two loads
// instead of one multiply-add per two global loads.
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

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

// [BK][BM/4]: at k, rows 4q..4q+3 of the A tile.
var<workgroup> a_tile: array<vec4<f32>, 256>;
// [BK][BN/4]: at k, columns 4q..4q+3 of the B tile.
var<workgroup> b_tile: array<vec4<f32>, 256>;

fn load_a(base: u32, r: u32, kk: u32) -> f32 {
    if (r < p.m && kk < p.k) { return a[base + r * p.a_rs + kk * p.a_cs]; }
    return 0.0;
}

fn load_b(base: u32, kk: u32, col: u32) -> f32 {
    if (kk < p.k && col < p.n) { return b[base + kk * p.b_rs + col * p.b_cs]; }
    return 0.0;
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let bt = wid.z;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let tid = lid.y * 16u + lid.x;
    let a_base = p.a_off + bt * p.a_bs;
    let b_base = p.b_off + bt * p.b_bs;
    let c_base = p.c_off + bt * p.c_bs;

    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    // Which vec4 this thread stages: k offset and quad index.
    let sk = tid / 16u;
    let sq = tid % 16u;

    let k_tiles = (p.k + BK - 1u) / BK;
    for (var t = 0u; t < k_tiles; t++) {
        let k0 = t * BK;
        let ar = row0 + sq * 4u;
        a_tile[sk * 16u + sq] = vec4<f32>(
            load_a(a_base, ar, k0 + sk),
            load_a(a_base, ar + 1u, k0 + sk),
            load_a(a_base, ar + 2u, k0 + sk),
            load_a(a_base, ar + 3u, k0 + sk));
        let bc = col0 + sq * 4u;
        b_tile[sk * 16u + sq] = vec4<f32>(
            load_b(b_base, k0 + sk, bc),
            load_b(b_base, k0 + sk, bc + 1u),
            load_b(b_base, k0 + sk, bc + 2u),
            load_b(b_base, k0 + sk, bc + 3u));
        workgroupBarrier();
        // Blocked summation: each K tile is summed on its own, then added to
        // the running total, so rounding error grows with K/16 + 16 rather
        // than with K (long reductions such as conv weight gradients over
        // N·H·W positions stay as accurate as PyTorch's).
        var part0 = vec4<f32>(0.0);
        var part1 = vec4<f32>(0.0);
        var part2 = vec4<f32>(0.0);
        var part3 = vec4<f32>(0.0);
        for (var kk = 0u; kk < BK; kk++) {
            let av = a_tile[kk * 16u + lid.y];
            let bv = b_tile[kk * 16u + lid.x];
            part0 = fma(vec4<f32>(av.x), bv, part0);
            part1 = fma(vec4<f32>(av.y), bv, part1);
            part2 = fma(vec4<f32>(av.z), bv, part2);
            part3 = fma(vec4<f32>(av.w), bv, part3);
        }
        acc0 += part0;
        acc1 += part1;
        acc2 += part2;
        acc3 += part3;
        workgroupBarrier();
    }

    let r0 = row0 + lid.y * 4u;
    let c0 = col0 + lid.x * 4u;
    var rows = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var i = 0u; i < 4u; i++) {
        let r = r0 + i;
        if (r >= p.m) { break; }
        let v = rows[i];
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < p.n) {
                let ci = c_base + r * p.n + c0 + j;
                if (p.accumulate != 0u) { c[ci] = c[ci] + v[j]; } else { c[ci] = v[j]; }
            }
        }
    }
}
