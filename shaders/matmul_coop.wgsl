// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// f16 products on cooperative matrices (tensor cores): C (f32 or f16) (+)=
// A · B for each batch entry, A and B f16, accumulated in f32.
// A workgroup of WM×WN subgroups ({{SG}} lanes each) owns a BM×BN block of
// C; each subgroup owns TM×TN tiles of {{S}}×{{S}}, held as cooperative
// matrices for the whole K loop.
// Each {{S}}-deep step of K reads A and B one of two ways, chosen for the
// whole workgroup (so barriers stay in uniform control flow):
// - DIRECT, where the block and the step lie inside A, B and C: each
//   subgroup loads its tiles straight from storage (the dispatch checked
//   that rows start 16-byte aligned, as cooperative loads require);
// - staged otherwise: the workgroup copies A's BM×S and B's S×BN slices into
//   workgroup memory with zeros past the edges, so any size, stride,
//   offset, batch and window layout runs.
// The tiles go back through workgroup memory, one at a time, to be written
// inside C (plus a bias per row or per column, added to C when the product
// accumulates, converted for f16). B may be a convolution's im2col read in place
// (matmul_common's loader, staged steps only), and REDUCE sums the batch's
// products into one C (a weight gradient) in the same accumulators: a
// group of p.group entries for each z into slot z of C.
// naga 30 needs coopStoreT's operands bound with `let` (docs/tensor_cores.md).
enable wgpu_cooperative_matrix;

#if WIDE
// WIDE: A and B read 16 bytes (8 halves) an item, where the dispatch found
// every row start, leading stride and batch stride in whole 8-half units
// and each binding in whole 16 bytes: one 16-byte load unpacked to halves,
// or with HALVES two 8-byte loads of halves, stored as they are.
#if HALVES
alias Item = mat2x4<f16>;
@group(0) @binding(0) var<storage, read_write> a: array<vec4<f16>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<f16>>;
fn item_a(j: u32) -> Item { return Item(a[2u * j], a[2u * j + 1u]); }
fn item_b(j: u32) -> Item { return Item(b[2u * j], b[2u * j + 1u]); }
#else
alias Item = vec4<u32>;
@group(0) @binding(0) var<storage, read_write> a: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<u32>>;
fn item_a(j: u32) -> Item { return a[j]; }
fn item_b(j: u32) -> Item { return b[j]; }
#endif
// Halves 2t and 2t+1 of an item.
#for t in 0..4
fn pair_{{t}}(v: Item) -> vec2<f16> {
#if HALVES
    return vec2<f16>(v[{{t/2}}][{{2*t-t/2*4}}], v[{{t/2}}][{{2*t-t/2*4+1}}]);
#else
    return vec2<f16>(unpack2x16float(v[{{t}}]));
#endif
}
#endfor
#else
@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
#accessors a
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
#accessors b
#endif
@group(0) @binding(2) var<storage, read_write> c: array<{{TC}}>;
#accessors c:ELEM_C
#include matmul_common

// Staged rows are padded by 8 halves: strides stay multiples of 16 bytes
// (cooperative loads need it) and rows fall on different banks.
const BM: u32 = {{WM*TM*S}}u;
const BN: u32 = {{WN*TN*S}}u;
const NT: u32 = {{WM*WN*SG}}u;
// Staged steps take KS·S of K at a time (fewer barriers a step).
const KD: u32 = {{KS*S}}u;
const LA: u32 = {{KS*S+8}}u;
const LB: u32 = {{WN*TN*S+8}}u;
// BUF copies of each: with two, a step fills one while the tensor cores
// read the other (one barrier a step).
const SA_N: u32 = {{WM*TM*S*KS*S+WM*TM*S*8}}u;
const SB_N: u32 = {{KS*S*WN*TN*S+KS*S*8}}u;
var<workgroup> sa: array<f16, {{WM*TM*S*KS*S*BUF+WM*TM*S*8*BUF}}>;
var<workgroup> sb: array<f16, {{KS*S*WN*TN*S*BUF+KS*S*8*BUF}}>;
var<workgroup> sc: array<f32, {{WM*WN*S*S}}>;

#if WIDE
// Item i of a staged step is 8 halves along the operand's unit stride:
// fetch_* reads it from storage (starts clamped to whole 8-half units
// inside the operand, so any k0 reads in bounds), put_* writes it to
// workgroup memory at `at` with zeros past the edges (no checks where the
// whole step lies inside: `full`). Apart, so that PREFETCH reads the next
// step into registers while the tensor cores run this one.
const CA: u32 = {{WM*TM*S*KS*S/8}}u;
const CB: u32 = {{KS*S*WN*TN*S/8}}u;
fn fetch_a(i: u32, k0: u32, row0: u32, a_base: u32) -> Item {
#if A_COL
    let r = (i % (BM / 8u)) * 8u;
    let q = i / (BM / 8u);
    let m8 = ((p.m - 1u) / 8u) * 8u;
    return item_a((a_base + min(row0 + r, m8) + min(k0 + q, p.k - 1u) * p.a_cs) / 8u);
#else
    let r = i / (KD / 8u);
    let q = (i % (KD / 8u)) * 8u;
    let k8 = ((p.k - 1u) / 8u) * 8u;
    return item_a((a_base + min(row0 + r, p.m - 1u) * p.a_rs + min(k0 + q, k8)) / 8u);
#endif
}
fn put_a(v: Item, i: u32, k0: u32, ke: u32, row0: u32, full: bool, at: u32) {
#if A_COL
    let r = (i % (BM / 8u)) * 8u;
    let q = i / (BM / 8u);
#for t in 0..4
    let h{{t}} = pair_{{t}}(v);
    sa[at + (r + {{2*t}}u) * LA + q] = select(f16(0.0), h{{t}}.x, full || (row0 + r + {{2*t}}u < p.m && k0 + q < ke));
    sa[at + (r + {{2*t+1}}u) * LA + q] = select(f16(0.0), h{{t}}.y, full || (row0 + r + {{2*t+1}}u < p.m && k0 + q < ke));
#endfor
#else
    let r = i / (KD / 8u);
    let q = (i % (KD / 8u)) * 8u;
#for t in 0..4
    let h{{t}} = pair_{{t}}(v);
    sa[at + r * LA + q + {{2*t}}u] = select(f16(0.0), h{{t}}.x, full || (row0 + r < p.m && k0 + q + {{2*t}}u < ke));
    sa[at + r * LA + q + {{2*t+1}}u] = select(f16(0.0), h{{t}}.y, full || (row0 + r < p.m && k0 + q + {{2*t+1}}u < ke));
#endfor
#endif
}
fn fetch_b(i: u32, k0: u32, col0: u32, b_base: u32) -> Item {
#if B_COL
    let r = (i % (KD / 8u)) * 8u;
    let q = i / (KD / 8u);
    let k8 = ((p.k - 1u) / 8u) * 8u;
    return item_b((b_base + min(k0 + r, k8) + min(col0 + q, p.n - 1u) * p.b_cs) / 8u);
#else
    let r = i / (BN / 8u);
    let q = (i % (BN / 8u)) * 8u;
    let n8 = ((p.n - 1u) / 8u) * 8u;
    return item_b((b_base + min(k0 + r, p.k - 1u) * p.b_rs + min(col0 + q, n8)) / 8u);
#endif
}
fn put_b(v: Item, i: u32, k0: u32, ke: u32, col0: u32, full: bool, at: u32) {
#if B_COL
    let r = (i % (KD / 8u)) * 8u;
    let q = i / (KD / 8u);
#for t in 0..4
    let h{{t}} = pair_{{t}}(v);
    sb[at + (r + {{2*t}}u) * LB + q] = select(f16(0.0), h{{t}}.x, full || (k0 + r + {{2*t}}u < ke && col0 + q < p.n));
    sb[at + (r + {{2*t+1}}u) * LB + q] = select(f16(0.0), h{{t}}.y, full || (k0 + r + {{2*t+1}}u < ke && col0 + q < p.n));
#endfor
#else
    let r = i / (BN / 8u);
    let q = (i % (BN / 8u)) * 8u;
#for t in 0..4
    let h{{t}} = pair_{{t}}(v);
    sb[at + r * LB + q + {{2*t}}u] = select(f16(0.0), h{{t}}.x, full || (k0 + r < ke && col0 + q + {{2*t}}u < p.n));
    sb[at + r * LB + q + {{2*t+1}}u] = select(f16(0.0), h{{t}}.y, full || (k0 + r < ke && col0 + q + {{2*t+1}}u < p.n));
#endfor
#endif
}
#endif

@compute @workgroup_size({{WM*WN*SG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let sg = lidx / {{SG}}u;
    let lane = lidx % {{SG}}u;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let sr = (sg / {{WN}}u) * {{TM*S}}u;
    let scol = (sg % {{WN}}u) * {{TN*S}}u;
    let own = sg * {{S*S}}u;
    for (var i = lidx; i < {{WM*WN*S*S}}u; i += NT) { sc[i] = 0.0; }
    workgroupBarrier();
#for i in 0..TM
#for j in 0..TN
    var acc_{{i}}_{{j}} = coopLoadT<coop_mat{{S}}x{{S}}<f32, C>>(&sc[own], {{S}}u);
#endfor
#endfor
    // The steps read straight from storage come first (none unless the
    // block lies inside C); the rest (edges, a K tail) are staged. Loop
    // bounds rather than branches choose, as naga wants cooperative
    // operations in control flow it can prove uniform.
    // Workgroup z is K split z % splits of entry (or summed slot) z / splits:
    // K range [kb, ke), empty for a split past K (it writes zeros). One
    // split (k_chunk = K) is the whole product.
    let zs = wid.z / p.splits;
    let kb = min((wid.z % p.splits) * p.k_chunk, p.k);
    let ke = min(kb + p.k_chunk, p.k);
#if REDUCE
    let first = zs * p.group;
    for (var bz = first; bz < min(first + p.group, p.batch); bz += 1u) {
    let a_base = p.a_off + bz * p.a_bs;
    let b_base = p.b_off + bz * p.b_bs;
#else
    {
    let a_base = p.a_off + zs * p.a_bs;
    let b_base = p.b_off + zs * p.b_bs;
#endif
#if DIRECT
    let inside = row0 + BM <= p.m && col0 + BN <= p.n;
    let k_direct = select(kb, kb + ((ke - kb) / {{S}}u) * {{S}}u, inside);
    for (var k0 = kb; k0 < k_direct; k0 += {{S}}u) {
#for i in 0..TM
#if A_COL
        let fa_{{i}} = coopLoad<coop_mat{{S}}x{{S}}<f16, A>>(&a[a_base + row0 + sr + {{i*S}}u + k0 * p.a_cs], p.a_cs);
#else
        let fa_{{i}} = coopLoadT<coop_mat{{S}}x{{S}}<f16, A>>(&a[a_base + (row0 + sr + {{i*S}}u) * p.a_rs + k0], p.a_rs);
#endif
#endfor
#for j in 0..TN
#if B_COL
        let fb_{{j}} = coopLoad<coop_mat{{S}}x{{S}}<f16, B>>(&b[b_base + k0 + (col0 + scol + {{j*S}}u) * p.b_cs], p.b_cs);
#else
        let fb_{{j}} = coopLoadT<coop_mat{{S}}x{{S}}<f16, B>>(&b[b_base + k0 * p.b_rs + col0 + scol + {{j*S}}u], p.b_rs);
#endif
#endfor
#for i in 0..TM
#for j in 0..TN
        acc_{{i}}_{{j}} = coopMultiplyAdd(fa_{{i}}, fb_{{j}}, acc_{{i}}_{{j}});
#endfor
#endfor
    }
#else
    let k_direct = kb;
#endif
#if WIDE
#if !DIRECT
    let inside = row0 + BM <= p.m && col0 + BN <= p.n;
#endif
#for t in 0..PA
    var va{{t}} = fetch_a(min(lidx + {{t*WM*WN*SG}}u, CA - 1u), k_direct, row0, a_base);
#endfor
#for t in 0..PB
    var vb{{t}} = fetch_b(min(lidx + {{t*WM*WN*SG}}u, CB - 1u), k_direct, col0, b_base);
#endfor
#if BUF == 2
    {
        let full = inside && k_direct + KD <= ke;
#for t in 0..PA
        if (lidx + {{t*WM*WN*SG}}u < CA) { put_a(va{{t}}, lidx + {{t*WM*WN*SG}}u, k_direct, ke, row0, full, 0u); }
#endfor
#for t in 0..PB
        if (lidx + {{t*WM*WN*SG}}u < CB) { put_b(vb{{t}}, lidx + {{t*WM*WN*SG}}u, k_direct, ke, col0, full, 0u); }
#endfor
    }
    workgroupBarrier();
#endif
#endif
    for (var k0 = k_direct; k0 < ke; k0 += KD) {
#if BUF == 2
        // This step's slices are in copy `cur`, filled by the last step.
        let cur = ((k0 - k_direct) / KD) % 2u;
        let at_a = cur * SA_N;
        let at_b = cur * SB_N;
#else
        let at_a = 0u;
        let at_b = 0u;
        // Consecutive invocations read consecutive addresses: along K for a
        // row-major A, along M for a column-major one (likewise for B).
#if WIDE
#if !PREFETCH
#for t in 0..PA
        va{{t}} = fetch_a(min(lidx + {{t*WM*WN*SG}}u, CA - 1u), k0, row0, a_base);
#endfor
#for t in 0..PB
        vb{{t}} = fetch_b(min(lidx + {{t*WM*WN*SG}}u, CB - 1u), k0, col0, b_base);
#endfor
#endif
        let full = inside && k0 + KD <= ke;
#for t in 0..PA
        if (lidx + {{t*WM*WN*SG}}u < CA) { put_a(va{{t}}, lidx + {{t*WM*WN*SG}}u, k0, ke, row0, full, 0u); }
#endfor
#for t in 0..PB
        if (lidx + {{t*WM*WN*SG}}u < CB) { put_b(vb{{t}}, lidx + {{t*WM*WN*SG}}u, k0, ke, col0, full, 0u); }
#endfor
#else
        for (var i = lidx; i < BM * KD; i += NT) {
#if A_COL
            let r = i % BM;
            let q = i / BM;
#else
            let r = i / KD;
            let q = i % KD;
#endif
            let ok = row0 + r < p.m && k0 + q < ke;
            let v = ld_a(a_base + min(row0 + r, p.m - 1u) * p.a_rs + min(k0 + q, p.k - 1u) * p.a_cs);
            sa[r * LA + q] = f16(select(0.0, v, ok));
        }
        for (var i = lidx; i < BN * KD; i += NT) {
#if B_COL
            let r = i % KD;
            let q = i / KD;
#else
            let r = i / BN;
            let q = i % BN;
#endif
            let ok = k0 + r < ke && col0 + q < p.n;
#if IMPLICIT_B
            // The im2col in place: past the edge reads nothing (im_load).
#if IMPLICIT_BT
            let v = im_load(b_base, im_pos(k0 + r), im_tap(col0 + q), ok);
#else
            let v = im_load(b_base, im_pos(col0 + q), im_tap(k0 + r), ok);
#endif
            sb[r * LB + q] = f16(v);
#else
            let v = ld_b_at(b_base, min(k0 + r, p.k - 1u), min(col0 + q, p.n - 1u), p.b_rs, p.b_cs);
            sb[r * LB + q] = f16(select(0.0, v, ok));
#endif
        }
#endif
        workgroupBarrier();
#endif
#if PREFETCH
        // The next step's slices travel while the tensor cores work on
        // this one (past the last step the reads are clamped and unused).
#for t in 0..PA
        va{{t}} = fetch_a(min(lidx + {{t*WM*WN*SG}}u, CA - 1u), k0 + KD, row0, a_base);
#endfor
#for t in 0..PB
        vb{{t}} = fetch_b(min(lidx + {{t*WM*WN*SG}}u, CB - 1u), k0 + KD, col0, b_base);
#endfor
#endif
#for h in 0..KS
#for i in 0..TM
        let ga{{h}}_{{i}} = coopLoadT<coop_mat{{S}}x{{S}}<f16, A>>(&sa[at_a + (sr + {{i*S}}u) * LA + {{h*S}}u], LA);
#endfor
#for j in 0..TN
        let gb{{h}}_{{j}} = coopLoadT<coop_mat{{S}}x{{S}}<f16, B>>(&sb[at_b + {{h*S}}u * LB + scol + {{j*S}}u], LB);
#endfor
#for i in 0..TM
#for j in 0..TN
        acc_{{i}}_{{j}} = coopMultiplyAdd(ga{{h}}_{{i}}, gb{{h}}_{{j}}, acc_{{i}}_{{j}});
#endfor
#endfor
#endfor
#if BUF == 2
        // The next step's slices go to the other copy, read last step:
        // every invocation passed the barrier that ended it.
        let kn = k0 + KD;
        let full = inside && kn + KD <= ke;
#for t in 0..PA
        if (lidx + {{t*WM*WN*SG}}u < CA) { put_a(va{{t}}, lidx + {{t*WM*WN*SG}}u, kn, ke, row0, full, SA_N - at_a); }
#endfor
#for t in 0..PB
        if (lidx + {{t*WM*WN*SG}}u < CB) { put_b(vb{{t}}, lidx + {{t*WM*WN*SG}}u, kn, ke, col0, full, SB_N - at_b); }
#endfor
#endif
        workgroupBarrier();
    }
    }
    // Each split writes its own slot of partials (c_bs apart).
    let c_base = p.c_off + wid.z * p.c_bs;
    let stride = {{S}}u;
#for i in 0..TM
#for j in 0..TN
    let res_{{i}}_{{j}} = acc_{{i}}_{{j}};
    coopStoreT(res_{{i}}_{{j}}, &sc[own], stride);
    workgroupBarrier();
    for (var e = lane; e < {{S*S}}u; e += {{SG}}u) {
        let row = row0 + sr + {{i*S}}u + e / {{S}}u;
        let col = col0 + scol + {{j*S}}u + e % {{S}}u;
        if (row < p.m && col < p.n) {
            let ci = c_base + row * p.c_rs + col * p.c_cs;
            var v = sc[own + e];
#if BIAS_ROWS
            v += ld_bias(row);
#endif
#if BIAS_COLS
            v += ld_bias(col);
#endif
            if (p.accumulate != 0u) { v += ld_c(ci); }
            st_c(ci, v);
        }
    }
    workgroupBarrier();
#endfor
#endfor
}
