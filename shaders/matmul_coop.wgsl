// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// f16 products on cooperative matrices (tensor cores): C (f32 or f16) (+)=
// A · B for each batch entry, A and B f16, accumulated in f32. One subgroup
// ({{SG}} lanes) per workgroup and 8×8 tile of C: the lanes stage A's and
// B's 8×8 tiles in workgroup memory (zeros past the edges, so any M, N, K,
// strides, transposes and offsets work), the subgroup multiplies them, and
// the tile goes back through workgroup memory to be written inside C.
// naga 30 needs coopStoreT's operands bound with `let` (docs/tensor_cores.md).
enable wgpu_cooperative_matrix;

struct Params {
    m: u32, n: u32, k: u32, batch: u32,
    a_rs: u32, a_cs: u32, b_rs: u32, b_cs: u32,
    a_bs: u32, b_bs: u32, c_bs: u32, accumulate: u32,
    a_off: u32, b_off: u32, c_off: u32, splits: u32,
    k_chunk: u32, c_rs: u32, c_cs: u32, _p2: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
#accessors a
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
#accessors b
@group(0) @binding(2) var<storage, read_write> c: array<{{TC}}>;
#accessors c:ELEM_C
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> ta: array<f16, 64>;
var<workgroup> tb: array<f16, 64>;
var<workgroup> tc: array<f32, 64>;

@compute @workgroup_size({{SG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
    let col0 = wid.x * 8u;
    let row0 = wid.y * 8u;
    let a_base = p.a_off + wid.z * p.a_bs;
    let b_base = p.b_off + wid.z * p.b_bs;
    for (var i = lane; i < 64u; i += {{SG}}u) { tc[i] = 0.0; }
    workgroupBarrier();
    var acc = coopLoadT<coop_mat8x8<f32, C>>(&tc[0], 8u);
    for (var k0 = 0u; k0 < p.k; k0 += 8u) {
        for (var i = lane; i < 64u; i += {{SG}}u) {
            let r = i / 8u;
            let q = i % 8u;
            var va = 0.0;
            if (row0 + r < p.m && k0 + q < p.k) {
                va = ld_a(a_base + (row0 + r) * p.a_rs + (k0 + q) * p.a_cs);
            }
            ta[i] = f16(va);
            var vb = 0.0;
            if (k0 + r < p.k && col0 + q < p.n) {
                vb = ld_b(b_base + (k0 + r) * p.b_rs + (col0 + q) * p.b_cs);
            }
            tb[i] = f16(vb);
        }
        workgroupBarrier();
        let ma = coopLoadT<coop_mat8x8<f16, A>>(&ta[0], 8u);
        let mb = coopLoadT<coop_mat8x8<f16, B>>(&tb[0], 8u);
        acc = coopMultiplyAdd(ma, mb, acc);
        workgroupBarrier();
    }
    let result = acc;
    let stride = 8u;
    coopStoreT(result, &tc[0], stride);
    workgroupBarrier();
    for (var i = lane; i < 64u; i += {{SG}}u) {
        let r = i / 8u;
        let q = i % 8u;
        if (row0 + r < p.m && col0 + q < p.n) {
            let ci = p.c_off + wid.z * p.c_bs + (row0 + r) * p.c_rs + (col0 + q) * p.c_cs;
            var v = tc[i];
            if (p.accumulate != 0u) { v += ld_c(ci); }
            st_c(ci, v);
        }
    }
}
