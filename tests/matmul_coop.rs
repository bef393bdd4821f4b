//! f16 products on cooperative matrices (tensor cores) against f64, where
//! the adapter offers them: Mesa 26's lavapipe (8×8×8 f16→f32) in CI's
//! second pass, which sets VRAMLAB_EXPECT_TENSOR_CORES=1 so that a device
//! without them fails there instead of passing quietly. Elsewhere (bookworm's
//! lavapipe) the test checks that f16 products keep the plain kernels.

use crate::common;
use common::*;
use half::f16;
use vramlab::device::AdapterOptions;
use vramlab::memory::AllocatorConfig;
use vramlab::ops::matmul::{gemm_bias, plan_split, tensor_cores_for, Gemm, MatView, MatmulKernel};
use vramlab::tensor::{DType, Engine, Tensor};

/// One product: sizes, batch, A and B read transposed, offsets, C's
/// dtype, whether C accumulates, whether the batch's products are summed
/// into one C, whether a bias per row is added.
#[derive(Debug, Clone, Copy)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    ta: bool,
    tb: bool,
    off: usize,
    out: DType,
    accumulate: bool,
    reduce: bool,
    bias: bool,
}

/// What one product did: C, its f64 reference (of the f16 operands as
/// stored), the kernels that ran, whether K is cut into splits, and whether `tensor_cores_for` (what `bench`
/// labels) said tensor cores would run it.
struct Ran {
    got: Vec<f32>,
    want: Vec<f64>,
    kernels: Vec<String>,
    k_split: bool,
    said_cores: bool,
}

/// A and B stored [batch, m, k] and [batch, k, n] from `off` (or [batch,
/// k, m] and [batch, n, k] read transposed).
fn views(m: usize, n: usize, k: usize, off: usize, ta: bool, tb: bool) -> (MatView, MatView) {
    let view = |rows, cols, t| MatView {
        batch_stride: rows * cols,
        ..MatView::dense(off, rows, cols, t)
    };
    let a = if ta {
        view(k, m, true)
    } else {
        view(m, k, false)
    };
    let b = if tb {
        view(n, k, true)
    } else {
        view(k, n, false)
    };
    (a, b)
}

/// Entry `bi`'s product at (i, j) in f64, of operands stored as [`views`]
/// lays them out.
#[allow(clippy::too_many_arguments)]
fn dot(
    a: &[f16],
    b: &[f16],
    (m, n, k): (usize, usize, usize),
    off: usize,
    (ta, tb): (bool, bool),
    bi: usize,
    i: usize,
    j: usize,
) -> f64 {
    let at = |x: &[f16], i: usize| x[off + i].to_f64();
    (0..k)
        .map(|l| {
            let av = if ta {
                at(a, bi * m * k + l * m + i)
            } else {
                at(a, bi * m * k + i * k + l)
            };
            let bv = if tb {
                at(b, bi * k * n + j * k + l)
            } else {
                at(b, bi * k * n + l * n + j)
            };
            av * bv
        })
        .sum()
}

/// Runs `case` on the tiled kernel.
fn run(e: &Engine, case: Case, rng: &mut Rng) -> Ran {
    let Case {
        m,
        n,
        k,
        batch,
        ta,
        tb,
        off,
        out,
        accumulate,
        reduce,
        bias,
    } = case;
    let round = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    let a = round(rng.vec(off + batch * m * k));
    let b = round(rng.vec(off + batch * k * n));
    let c_batch = if reduce { 1 } else { batch };
    let c0 = rng.vec(c_batch * m * n);
    let bias_v = round(rng.vec(m));
    let (va, vb) = views(m, n, k, off, ta, tb);
    let g = Gemm {
        m,
        n,
        k,
        batch,
        a: va,
        b: vb,
        c_offset: 0,
        c_batch_stride: m * n,
        accumulate,
        reduce_batch: reduce,
        implicit_b: None,
    };
    let ta_ = Tensor::from_f16(e, &a, &[a.len()], "a").unwrap();
    let tb_ = Tensor::from_f16(e, &b, &[b.len()], "b").unwrap();
    let tc = match out {
        DType::F16 => Tensor::from_f16(e, &round(c0.clone()), &[c0.len()], "c").unwrap(),
        _ => Tensor::from_slice(e, &c0, &[c0.len()], "c").unwrap(),
    };
    let tbias = Tensor::from_f16(e, &bias_v, &[m], "bias").unwrap();
    e.start_timing();
    gemm_bias(
        &g,
        &ta_,
        &tb_,
        &tc,
        bias.then_some(&tbias),
        MatmulKernel::Tiled,
    )
    .unwrap();
    let kernels = e
        .take_dispatch_times()
        .unwrap()
        .map(|(_, t)| t.into_iter().map(|d| d.kernel).collect())
        .unwrap_or_default();
    e.stop_timing().unwrap();
    let mut want = vec![0.0; c_batch * m * n];
    for bi in 0..batch {
        for (i, bias_i) in bias_v.iter().enumerate() {
            for j in 0..n {
                let s = dot(&a, &b, (m, n, k), off, (ta, tb), bi, i, j);
                let o = if reduce {
                    i * n + j
                } else {
                    bi * m * n + i * n + j
                };
                let c_in = match out {
                    DType::F16 => f16::from_f32(c0[o]).to_f64(),
                    _ => c0[o] as f64,
                };
                let first = !reduce || bi == 0;
                let start = if first && accumulate {
                    c_in
                } else if first {
                    0.0
                } else {
                    want[o]
                };
                let b = if bias && first { bias_i.to_f64() } else { 0.0 };
                want[o] = start + s + b;
            }
        }
    }
    let said_cores = tensor_cores_for(
        &g,
        &ta_,
        &tb_,
        &tc,
        bias.then_some(&tbias),
        MatmulKernel::Tiled,
    )
    .is_some();
    Ran {
        got: tc.to_vec().unwrap(),
        want,
        kernels,
        k_split: plan_split(&g).splits > 1,
        said_cores,
    }
}

fn cases() -> Vec<Case> {
    let base = Case {
        m: 8,
        n: 8,
        k: 8,
        batch: 1,
        ta: false,
        tb: false,
        off: 0,
        out: DType::F32,
        accumulate: false,
        reduce: false,
        bias: false,
    };
    vec![
        base,
        Case {
            m: 13,
            n: 7,
            k: 29,
            ..base
        },
        Case {
            m: 1,
            n: 33,
            k: 5,
            ta: true,
            ..base
        },
        Case {
            m: 17,
            n: 9,
            k: 40,
            tb: true,
            off: 3,
            ..base
        },
        Case {
            m: 9,
            n: 10,
            k: 11,
            batch: 3,
            ta: true,
            tb: true,
            ..base
        },
        Case {
            m: 24,
            n: 16,
            k: 64,
            accumulate: true,
            ..base
        },
        Case {
            m: 11,
            n: 6,
            k: 19,
            out: DType::F16,
            ..base
        },
        Case {
            m: 5,
            n: 12,
            k: 8,
            batch: 2,
            out: DType::F16,
            accumulate: true,
            off: 1,
            ..base
        },
        // Blocks of whole tiles loaded straight from storage (aligned rows)
        // beside staged edges and a K tail, at both matrix sides (8: a
        // 32-wide block; 16: 64 and 128).
        Case {
            m: 160,
            n: 136,
            k: 72,
            ..base
        },
        Case {
            m: 96,
            n: 128,
            k: 48,
            batch: 2,
            ta: true,
            tb: true,
            off: 8,
            ..base
        },
        Case {
            m: 64,
            n: 72,
            k: 40,
            tb: true,
            accumulate: true,
            out: DType::F16,
            ..base
        },
        Case {
            m: 288,
            n: 256,
            k: 64,
            ta: true,
            ..base
        },
        // Summed batches (weight gradients) and a bias per row, on direct
        // and staged steps.
        Case {
            m: 40,
            n: 72,
            k: 24,
            batch: 3,
            tb: true,
            reduce: true,
            accumulate: true,
            ..base
        },
        Case {
            m: 13,
            n: 21,
            k: 9,
            batch: 4,
            reduce: true,
            ..base
        },
        // Past one workspace (840 KB of partials an entry, 4 MiB): summed
        // a group of entries a slot, in one product.
        Case {
            m: 300,
            n: 700,
            k: 16,
            batch: 7,
            tb: true,
            reduce: true,
            accumulate: true,
            ..base
        },
        Case {
            m: 64,
            n: 96,
            k: 40,
            bias: true,
            ..base
        },
        Case {
            m: 7,
            n: 30,
            k: 12,
            batch: 2,
            bias: true,
            out: DType::F16,
            ..base
        },
        // K cut into splits, each slice's partial product from the tensor
        // cores: a narrow output over a long K (the fc's forward), K not a
        // whole number of slices (the last ones run empty), a summed batch
        // split too (a weight gradient), a 16-bit C, a bias, aligned rows.
        Case {
            m: 16,
            n: 10,
            k: 6007,
            tb: true,
            ..base
        },
        Case {
            m: 9,
            n: 5,
            k: 2501,
            batch: 2,
            ta: true,
            off: 3,
            accumulate: true,
            ..base
        },
        Case {
            m: 24,
            n: 27,
            k: 900,
            batch: 5,
            tb: true,
            reduce: true,
            ..base
        },
        Case {
            m: 8,
            n: 12,
            k: 3000,
            out: DType::F16,
            bias: true,
            ..base
        },
        Case {
            m: 32,
            n: 16,
            k: 4096,
            batch: 2,
            off: 8,
            ..base
        },
        // 128 slices of 257 rounded up to whole steps (264): the last ones
        // start past K, run empty and must write zeros into their slots.
        // The case before fills the same size of workspace with 128 full
        // slices, so a slot left unwritten keeps a stale partial.
        Case {
            m: 8,
            n: 8,
            k: 33_792,
            ..base
        },
        Case {
            m: 8,
            n: 8,
            k: 32_896,
            ..base
        },
    ]
}

/// Whether both operands of `case` are laid out for direct tile loads:
/// offsets, leading strides and batch strides in whole 16-byte rows.
fn aligned(case: &Case) -> bool {
    let Case {
        m,
        n,
        k,
        batch,
        ta,
        tb,
        off,
        ..
    } = *case;
    // The stride between rows (or, read transposed, columns); a view whose
    // other stride is 1 as well is read by rows, one element apart.
    let lead = |t: bool, transposed_lead: usize, other: usize, plain_lead: usize| match (t, other) {
        (false, _) => plain_lead,
        (true, 1) => 1,
        (true, _) => transposed_lead,
    };
    let whole = |x: usize| x.is_multiple_of(8);
    whole(off)
        && whole(lead(ta, m, m, k))
        && whole(lead(tb, k, k, n))
        && (batch == 1 || (whole(m * k) && whole(k * n)))
}

#[test]
fn f16_products_on_tensor_cores_match_f64() {
    let e = engine();
    let expected = std::env::var("VRAMLAB_EXPECT_TENSOR_CORES").is_ok_and(|v| v == "1");
    let lanes = e.tensor_core_lanes();
    assert!(
        lanes.is_some() || !expected,
        "VRAMLAB_EXPECT_TENSOR_CORES=1 but this adapter ({}) gives vramlab no f16 cooperative matrices",
        e.device_name()
    );
    let off = engine_from(
        &AdapterOptions {
            without_cooperative_matrix: true,
            ..adapter_options()
        },
        AllocatorConfig::default(),
    );
    assert_eq!(off.tensor_core_lanes(), None, "--no-tensor-cores");
    let mut rng = Rng::new(21);
    for case in cases() {
        for (name, engine, cores) in [
            ("default", &e, lanes.is_some()),
            ("--no-tensor-cores", &off, false),
        ] {
            let Ran {
                got,
                want,
                kernels,
                k_split,
                said_cores,
            } = run(engine, case, &mut rng);
            // Every f16 product, split K or not.
            if cores && case.k >= 2000 {
                assert!(k_split, "{case:?} was meant to split K");
            }
            // f16 operands multiply exactly in f32; only the sums round
            // (and an f16 C to 2⁻¹¹).
            let tol = if case.out == DType::F16 { 2e-3 } else { 1e-5 };
            let err = normwise(&got, &want);
            assert!(err < tol, "{name} {case:?}: {err}");
            let coop_runs = kernels
                .iter()
                .filter(|k| k.starts_with("matmul_coop"))
                .count();
            let on_cores = coop_runs > 0;
            assert_eq!(on_cores, cores, "{name} {case:?}: ran {kernels:?}");
            // What `bench` labels a product: the route it takes, summed
            // batches past a workspace included.
            assert_eq!(said_cores, on_cores, "{name} {case:?}: ran {kernels:?}");
            // One product however many workspaces' worth the batch sums.
            assert!(coop_runs <= 1, "{name} {case:?}: ran {kernels:?}");
            // Aligned products read whole tiles from storage; others stage.
            let direct = kernels
                .iter()
                .any(|k| k.contains(", direct") || k.contains(", wide"));
            use vramlab::ops::matmul::coop::{staging_from_env, Loads};
            let st = staging_from_env().unwrap();
            let allowed = st.loads != Loads::Staged;
            assert_eq!(
                direct,
                cores && allowed && aligned(&case),
                "{name} {case:?}: ran {kernels:?}"
            );
            // Wide steps prefetch the next one unless turned off, into a
            // second copy of workgroup memory where asked.
            let wide = direct && st.loads == Loads::Wide;
            let has = |flag: &str| kernels.iter().any(|k| k.contains(flag));
            assert_eq!(
                has(", prefetch"),
                wide && st.prefetch,
                "{name} {case:?}: ran {kernels:?}"
            );
            assert_eq!(
                has(", two copies"),
                wide && st.prefetch && st.buffers == 2,
                "{name} {case:?}: ran {kernels:?}"
            );
            assert_eq!(
                has(", halves"),
                wide && st.halves,
                "{name} {case:?}: ran {kernels:?}"
            );
        }
    }
}

/// Every block layout the tuner may pick gives the fixed layout's bits
/// (each entry's K steps are added in the same order) and matches f64:
/// odd sizes staged, aligned ones on wide loads, a summed batch that
/// accumulates into C, transposes, f16 and f32 C, a bias per row, and a
/// summed batch in slots of two entries with K cut in three slices (each
/// slot's slices then sum to its entries' products).
#[test]
fn every_layout_the_tuner_may_pick_gives_the_same_bits() {
    use vramlab::ops::matmul::coop::{candidate_layouts, gemm_on_layout};
    let e = engine();
    let expected = std::env::var("VRAMLAB_EXPECT_TENSOR_CORES").is_ok_and(|v| v == "1");
    assert!(
        e.tensor_core_lanes().is_some() || !expected,
        "no tensor cores"
    );
    let mut rng = Rng::new(33);
    let round = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    // m, n, k, batch, A and B transposed, summed batch, accumulate, C's
    // type, a bias per row, entries a slot, K slices.
    #[rustfmt::skip]
    let cases = [
        (37, 45, 29, 2, false, true, false, false, DType::F32, false, 2, 1),
        (64, 96, 64, 1, false, false, false, false, DType::F32, false, 1, 1),
        (40, 24, 53, 3, true, false, true, true, DType::F32, false, 3, 1),
        (48, 72, 40, 2, false, false, false, false, DType::F16, true, 2, 1),
        (24, 40, 61, 5, false, true, true, false, DType::F32, false, 2, 3),
    ];
    for (m, n, k, batch, ta, tb, reduce, accumulate, out, bias, group, splits) in cases {
        let a = round(rng.vec(batch * m * k));
        let b = round(rng.vec(batch * k * n));
        let bias_v = round(rng.vec(m));
        let slots = if reduce { batch.div_ceil(group) } else { batch };
        // C's entries: slot q's K slice s at q·splits + s.
        let entries = slots * splits;
        let c0 = round(rng.vec(entries * m * n));
        let (va, vb) = views(m, n, k, 0, ta, tb);
        let g = Gemm {
            m,
            n,
            k,
            batch,
            a: va,
            b: vb,
            c_offset: 0,
            c_batch_stride: if entries == 1 { 0 } else { m * n },
            accumulate,
            reduce_batch: reduce,
            implicit_b: None,
        };
        // Each slot's product with its slices summed: the slot's entries
        // (one entry unsummed) over all of K, plus C where it accumulates
        // (into its first slice) and the bias.
        let mut want = vec![0.0f64; slots * m * n];
        for bi in 0..batch {
            let q = if reduce { bi / group } else { bi };
            for i in 0..m {
                for j in 0..n {
                    want[q * m * n + i * n + j] += dot(&a, &b, (m, n, k), 0, (ta, tb), bi, i, j);
                }
            }
        }
        for q in 0..slots {
            for i in 0..m {
                for j in 0..n {
                    let o = q * m * n + i * n + j;
                    if accumulate {
                        want[o] += c0[q * splits * m * n + i * n + j].to_f64();
                    }
                    if bias {
                        want[o] += bias_v[i].to_f64();
                    }
                }
            }
        }
        let layouts = candidate_layouts(&g, &e);
        let (ta_, tb_) = (
            Tensor::from_f16(&e, &a, &[a.len()], "a").unwrap(),
            Tensor::from_f16(&e, &b, &[b.len()], "b").unwrap(),
        );
        let tbias = Tensor::from_f16(&e, &bias_v, &[m], "bias").unwrap();
        let split = (splits, k.div_ceil(splits));
        let run = |layout| {
            let tc = match out {
                DType::F16 => Tensor::from_f16(&e, &c0, &[c0.len()], "c").unwrap(),
                _ => {
                    let v: Vec<f32> = c0.iter().map(|x| x.to_f32()).collect();
                    Tensor::from_slice(&e, &v, &[v.len()], "c").unwrap()
                }
            };
            let bias_t = bias.then_some(&tbias);
            gemm_on_layout(&g, [&ta_, &tb_, &tc], bias_t, group, split, layout).map(|()| tc)
        };
        if e.tensor_core_lanes().is_none() {
            // Without tensor cores there is nothing to tune, and a layout
            // asked for is refused, not run on something else.
            assert!(layouts.is_empty(), "{layouts:?}");
            let err = run(None).unwrap_err();
            assert!(err.to_string().contains("cooperative matrices"), "{err}");
            continue;
        }
        assert!(layouts.len() >= 4, "{layouts:?}");
        let mut first: Option<Vec<u32>> = None;
        for layout in layouts {
            let got = run(Some(layout)).unwrap().to_vec().unwrap();
            // Slot q's slices summed.
            let summed: Vec<f32> = (0..slots * m * n)
                .map(|o| {
                    let (q, r) = (o / (m * n), o % (m * n));
                    (0..splits).map(|s| got[(q * splits + s) * m * n + r]).sum()
                })
                .collect();
            let tol = if out == DType::F16 { 2e-3 } else { 1e-5 };
            let err = normwise(&summed, &want);
            let what = format!(
                "{m}×{n}·K{k} ×{batch} {out:?} bias {bias} group {group} splits {splits} in {}",
                layout.describe()
            );
            assert!(err < tol, "{what}: {err}");
            let bits: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
            match &first {
                None => first = Some(bits),
                Some(f) => assert!(f == &bits, "{what}: other bits than the fixed layout"),
            }
        }
    }
}

/// Convolutions in f16 read B as the im2col in place (forward, the input
/// gradient's flipped kernel, the weight gradient's im2colᵀ over a summed
/// batch) and add the bias in the epilogue: on tensor cores where they run,
/// against f64.
#[test]
fn f16_convolutions_on_tensor_cores_match_f64() {
    use vramlab::ops::conv2d::{conv2d, conv2d_backward, Conv2dConfig};
    let e = engine();
    let mut rng = Rng::new(23);
    let half =
        |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect() };
    let upload = |v: &[f32], shape: &[usize]| {
        let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        Tensor::from_f16(&e, &h, shape, "t").unwrap()
    };
    let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    for ((n, c, h, w), (o, kh, kw), stride, pad) in [
        ((2, 3, 9, 7), (8, 3, 3), 1, 1),
        ((3, 4, 8, 8), (16, 3, 3), 2, 0),
        ((1, 8, 10, 10), (16, 3, 3), 1, 1),
    ] {
        let x = half(rng.vec(n * c * h * w));
        let wt = half(rng.vec(o * c * kh * kw));
        let b = half(rng.vec(o));
        let cfg = Conv2dConfig {
            stride,
            padding: pad,
        };
        let (tx, tw, tb) = (
            upload(&x, &[n, c, h, w]),
            upload(&wt, &[o, c, kh, kw]),
            upload(&b, &[o]),
        );
        e.start_timing();
        let y = conv2d(&tx, &tw, Some(&tb), cfg).unwrap();
        let (ho, wo) = (
            (h + 2 * pad - kh) / stride + 1,
            (w + 2 * pad - kw) / stride + 1,
        );
        let dy = half(rng.vec(n * o * ho * wo));
        let (dx, dw, _) =
            conv2d_backward(&tx, &tw, &upload(&dy, &[n, o, ho, wo]), cfg, true).unwrap();
        let kernels: Vec<String> = e
            .take_dispatch_times()
            .unwrap()
            .map(|(_, t)| t.into_iter().map(|d| d.kernel).collect())
            .unwrap_or_default();
        e.stop_timing().unwrap();
        let what = format!("{n}x{c}x{h}x{w} * {o}x{kh}x{kw} s{stride} p{pad}");
        let (xf, wf, bf) = (f64s(&x), f64s(&wt), f64s(&b));
        let (yf, _, _) = conv2d_ref(&xf, &wf, &bf, (n, c, h, w), (o, kh, kw), stride, pad);
        // f16 products are exact in f32; the sums and the f16 outputs round.
        let err = normwise(&y.to_vec().unwrap(), &yf);
        assert!(err < 4e-3, "{what} forward: {err:.2e}");
        let dyf = f64s(&dy);
        let loss = |yy: Vec<f64>| yy.iter().zip(&dyf).map(|(a, b)| a * b).sum::<f64>();
        let f = |xx: &[f64], ww: &[f64]| {
            conv2d_ref(xx, ww, &bf, (n, c, h, w), (o, kh, kw), stride, pad).0
        };
        let gx = numeric_grad(&xf, |v| loss(f(v, &wf)));
        let gw = numeric_grad(&wf, |v| loss(f(&xf, v)));
        for (name, got, want) in [("dx", dx.unwrap(), gx), ("dw", dw, gw)] {
            let err = normwise(&got.to_vec().unwrap(), &want);
            assert!(err < 4e-3, "{what} {name}: {err:.2e}");
        }
        if e.tensor_core_lanes().is_some() {
            assert!(
                kernels.iter().any(|k| k.starts_with("matmul_coop")
                    && k.contains("implicit im2col")
                    && k.contains("+bias")),
                "{what}: the forward ran {kernels:?}"
            );
        }
    }
}
