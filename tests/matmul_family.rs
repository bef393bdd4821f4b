//! The matmul family: every tile shape the planner can choose (CPU and GPU
//! tables), the baseline, and odd shapes, against an f64 reference on random
//! inputs of awkward sizes; the split-K and batch-reduced paths; outputs
//! poisoned with NaN first so an unwritten element fails; and per-dispatch
//! timing.

use crate::common;
use common::*;
use vramlab::ops::matmul::tiles_gpu::GpuLimits;
use vramlab::ops::matmul::{
    choose, choose_tile, gemm, gemm_bias, plan_split, ConvGeometry, Gemm, MatView, MatmulKernel,
    ShapeClass, Target, TileConfig, ROWS_OUTER_MAX_B,
};
use vramlab::tensor::Tensor;

const TOL: f64 = 1e-4;

fn tiles() -> Vec<TileConfig> {
    let mut v = Vec::new();
    for target in [Target::Gpu, Target::Cpu, Target::CpuSubgroup8] {
        for class in [
            ShapeClass::Square,
            ShapeClass::Narrow,
            ShapeClass::Short,
            ShapeClass::Shallow,
        ] {
            let t = choose_tile(class, target);
            // Subgroup tiles only where the adapter has 8-lane subgroups.
            if !t.subgroup_a || Target::of(&engine()) == Target::CpuSubgroup8 {
                v.push(t);
                // And the 64-row thread tiles `choose` fits to the rows.
                if target == Target::CpuSubgroup8 && class != ShapeClass::Short {
                    v.push(TileConfig { tm: 64, wy: 1, ..t });
                }
                // And short products' thread tiles of exactly their rows
                // (not a multiple of the 8 lanes).
                // And the 32×16 and 64×16 tiles of products shallower
                // than a K slice (rows outer where K·16 ≤ 256).
                if target == Target::CpuSubgroup8 && class == ShapeClass::Shallow {
                    for tm in [32, 64] {
                        v.push(TileConfig { tm, tn: 16, ..t });
                    }
                }
                if target == Target::CpuSubgroup8 && class == ShapeClass::Short {
                    v.push(TileConfig { tm: 10, ..t });
                    v.push(TileConfig {
                        tm: 10,
                        tn: 16,
                        ..t
                    });
                    v.push(TileConfig { tm: 3, ..t });
                }
            }
        }
    }
    // The GPU family beyond its table: every thread tile, K slices of 8
    // (one-slice and two-slice ranges on the shapes below), and 128×128
    // blocks where the adapter's workgroup memory holds them.
    let limits = engine()
        .gpu()
        .map_or(GpuLimits::DEFAULT, |g| GpuLimits::of(&g.limits));
    for t in [
        TileConfig::new(8, 8, 4, 4, 16, true),
        TileConfig::new(16, 8, 8, 4, 16, true),
        TileConfig::new(8, 16, 4, 8, 16, true),
        TileConfig::new(4, 16, 4, 4, 8, true),
        TileConfig::new(32, 4, 4, 4, 8, true),
        TileConfig::new(16, 16, 8, 8, 16, true),
    ] {
        if limits.fits(&t) && !v.contains(&t) {
            v.push(t);
        }
    }
    let mut strided_direct = TileConfig::new(8, 4, 3, 5, 7, false);
    strided_direct.strided_cols = true;
    v.extend([strided_direct, TileConfig::new(16, 16, 1, 1, 16, false)]);
    v
}

/// C (poisoned with NaN) = op(A)·op(B) for one product, checked; C sits at
/// `c_offset` with batch stride `c_batch_stride`, and what lies between
/// its matrices must come back untouched.
fn check(e: &vramlab::tensor::Engine, rng: &mut Rng, g: &Gemm, kernel: MatmulKernel, what: &str) {
    let batches = |shared: bool| if shared { 1 } else { g.batch };
    let na = batches(g.a.batch_stride == 0) * g.m * g.k;
    let nb = batches(g.b.batch_stride == 0) * g.k * g.n;
    let c_matrices = if g.reduce_batch { 1 } else { g.batch };
    let nc = g.c_offset + (c_matrices - 1) * g.c_batch_stride + g.m * g.n;
    let (a, b) = (rng.vec(na + g.a.offset), rng.vec(nb + g.b.offset));
    let ta = Tensor::from_slice(e, &a, &[a.len()], "a").unwrap();
    let tb = Tensor::from_slice(e, &b, &[b.len()], "b").unwrap();
    let start = if g.accumulate {
        rng.vec(nc)
    } else {
        vec![f32::NAN; nc]
    };
    let tc = Tensor::from_slice(e, &start, &[nc], "c").unwrap();
    gemm(g, &ta, &tb, &tc, kernel).unwrap();
    let got = tc.to_vec().unwrap();
    let at = |v: &MatView, data: &[f32], bt: usize, r: usize, c: usize| {
        data[v.offset + bt * v.batch_stride + r * v.row_stride + c * v.col_stride] as f64
    };
    let mut want: Vec<Option<f64>> = vec![None; nc];
    for bt in 0..g.batch {
        let cb = g.c_offset
            + if g.reduce_batch {
                0
            } else {
                bt * g.c_batch_stride
            };
        for i in 0..g.m {
            for j in 0..g.n {
                let s: f64 = (0..g.k)
                    .map(|kk| at(&g.a, &a, bt, i, kk) * at(&g.b, &b, bt, kk, j))
                    .sum();
                let w = want[cb + i * g.n + j].get_or_insert(if g.accumulate {
                    start[cb + i * g.n + j] as f64
                } else {
                    0.0
                });
                *w += s;
            }
        }
    }
    let (mut got_written, mut want_written) = (Vec::new(), Vec::new());
    for (i, w) in want.iter().enumerate() {
        match w {
            Some(w) => {
                got_written.push(got[i]);
                want_written.push(*w);
            }
            None => assert_eq!(
                got[i].to_bits(),
                start[i].to_bits(),
                "{what} {kernel:?}: element {i} lies outside C but was written"
            ),
        }
    }
    assert!(
        got_written.iter().all(|v| v.is_finite()),
        "{what} {kernel:?}: unwritten output"
    );
    let err = max_rel_err(&got_written, &want_written);
    assert!(err < TOL, "{what} {kernel:?}: rel err {err}");
}

fn plain(m: usize, n: usize, k: usize, ta: bool, tb: bool) -> Gemm {
    Gemm {
        m,
        n,
        k,
        batch: 1,
        a: if ta {
            MatView::dense(0, k, m, true)
        } else {
            MatView::dense(0, m, k, false)
        },
        b: if tb {
            MatView::dense(0, n, k, true)
        } else {
            MatView::dense(0, k, n, false)
        },
        c_offset: 0,
        c_batch_stride: m * n,
        accumulate: false,
        reduce_batch: false,
        implicit_b: None,
    }
}

#[test]
fn every_tile_matches_f64_on_odd_shapes_and_transposes() {
    let e = engine();
    let mut rng = Rng::new(11);
    let shapes = [
        (1, 1, 1),
        (7, 33, 5),
        (65, 3, 129),
        (130, 71, 17),
        (3, 200, 40),
    ];
    for t in tiles() {
        assert!(t.is_valid(), "{t:?}");
        for &(m, n, k) in &shapes {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let what = format!("{} {m}x{n}·K{k} ta={ta} tb={tb}", t.describe());
                check(
                    &e,
                    &mut rng,
                    &plain(m, n, k, ta, tb),
                    MatmulKernel::Fixed(t),
                    &what,
                );
            }
        }
    }
}

#[test]
fn split_k_and_batch_reduction_are_exact() {
    let e = engine();
    let mut rng = Rng::new(12);
    // fc forward's shape class: few outputs over a long K → split K.
    let fc = plain(9, 10, 20_011, false, true);
    let split = plan_split(&fc);
    assert!(split.splits > 1 && split.group > 0, "{split:?}");
    for kernel in [MatmulKernel::Tiled, MatmulKernel::Naive] {
        check(&e, &mut rng, &fc, kernel, "split K");
    }
    // conv weight gradient: dW += Σ_b dY[b] · col[b]ᵀ, accumulating.
    let (o, ckk, hw, nb) = (13, 27, 37, 5);
    let dw = Gemm {
        m: o,
        n: ckk,
        k: hw,
        batch: nb,
        a: MatView::dense(0, o, hw, false),
        b: MatView::dense(0, ckk, hw, true),
        c_offset: 0,
        c_batch_stride: 0,
        accumulate: true,
        reduce_batch: true,
        implicit_b: None,
    };
    assert!(plan_split(&dw).group > 0);
    check(&e, &mut rng, &dw, MatmulKernel::Tiled, "batch-reduced");
    // Batched (not reduced) with a split and a shared left operand.
    let mut batched = plain(5, 6, 3000, false, false);
    batched.batch = 3;
    batched.a = batched.a.shared();
    assert!(plan_split(&batched).splits > 1);
    check(&e, &mut rng, &batched, MatmulKernel::Tiled, "batched split");
}

#[test]
fn the_split_depends_on_shapes_only() {
    // SimpleConvNet's fc forward at batch 64: 64×10 outputs, K = 100,352.
    let fc = plain(64, 10, 100_352, false, true);
    let s = plan_split(&fc);
    assert!(s.splits >= 64, "{s:?}");
    assert!(s.k_chunk <= vramlab::ops::MAX_LOOP_ITERATIONS);
    // A square product with plenty of tiles is not split.
    assert_eq!(plan_split(&plain(1024, 1024, 1024, false, false)).group, 0);
}

/// A weight gradient summed past one workspace runs as one product whose
/// slots each sum several entries, while an invocation's loops stay inside
/// llvmpipe's budget; past it, rounds of one entry a slot. The audit
/// measured GPU tiles (BK 16) running 2 + K/16 iterations an entry and
/// going wrong for conv2 past a batch of 17,977 (65,535 / 51 entries a
/// slot): the route there must be rounds, with room to spare.
#[test]
fn summed_batches_keep_each_invocation_in_the_loop_budget() {
    use vramlab::ops::matmul::summed_per_slot;
    // SimpleConvNet's conv2 weight gradient: 128×576 over K = 784 a sample.
    let conv2 = |batch| Gemm {
        batch,
        reduce_batch: true,
        ..plain(128, 576, 784, false, true)
    };
    let gpu_tile = 2 + 784 / 16;
    let at =
        |batch, per_entry| summed_per_slot(&conv2(batch), &plan_split(&conv2(batch)), per_entry);
    let per = at(64, gpu_tile).expect("batch 64 is one product");
    assert!(per > 1, "{per}");
    let group = plan_split(&conv2(64)).group;
    // The measured failure and anything near it: rounds.
    let bad = 65_535 / gpu_tile * group;
    for batch in [bad * 4 / 5, bad, 17_977, 100_000] {
        assert_eq!(at(batch, gpu_tile), None, "batch {batch}");
    }
    // Costlier entries (the tensor cores' staged copies) fall back sooner,
    // and the route never returns to one product as the batch grows.
    assert!(at(2_000, gpu_tile).is_some() && at(2_000, 20 * gpu_tile).is_none());
    let mut rounds = false;
    for batch in (64..20_000).step_by(97) {
        match at(batch, gpu_tile) {
            Some(_) => assert!(!rounds, "batch {batch}: one product again after rounds"),
            None => rounds = true,
        }
    }
    // A product that is not a summed batch, or fits one workspace, has no slots.
    let single = plain(128, 576, 784, false, true);
    assert_eq!(summed_per_slot(&single, &plan_split(&single), 1), None);
    assert_eq!(at(group, gpu_tile), None);
}

#[test]
fn dispatches_are_timed_per_op() {
    let e = engine();
    let source = e.start_timing().expect("a GPU engine can time");
    let mut rng = Rng::new(13);
    let a = Tensor::from_slice(&e, &rng.vec(64 * 48), &[64, 48], "a").unwrap();
    let b = Tensor::from_slice(&e, &rng.vec(48 * 32), &[48, 32], "b").unwrap();
    {
        let _scope = e.scope(vramlab::memory::Category::Temporary, "my_op");
        let _ = vramlab::ops::matmul::matmul(&a, &b).unwrap();
    }
    let (got_source, times) = e.take_dispatch_times().unwrap().expect("timing is on");
    assert_eq!(got_source, source);
    let mm: Vec<_> = times
        .iter()
        .filter(|t| t.kernel.starts_with("matmul["))
        .collect();
    assert_eq!(mm.len(), 1, "{times:?}");
    assert_eq!(&*mm[0].op, "my_op");
    assert!(
        mm[0].seconds > 0.0 && mm[0].seconds < 10.0,
        "{}",
        mm[0].seconds
    );
    // Taken means gone.
    assert!(e.take_dispatch_times().unwrap().unwrap().1.is_empty());
}

#[test]
fn the_family_runs_on_f16_storage_with_f32_arithmetic() {
    let e = engine();
    let mut rng = Rng::new(14);
    // (m, n, k): a plain product and one that splits K into an f32 workspace.
    for &(m, n, k) in &[(33, 17, 65), (7, 10, 9000)] {
        let g = plain(m, n, k, false, true);
        let a: Vec<half::f16> = rng
            .vec(m * k)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let b: Vec<half::f16> = rng
            .vec(n * k)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let ta = Tensor::from_f16(&e, &a, &[m * k], "a").unwrap();
        let tb = Tensor::from_f16(&e, &b, &[n * k], "b").unwrap();
        let want: Vec<f64> = (0..m * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                (0..k)
                    .map(|kk| a[i * k + kk].to_f64() * b[j * k + kk].to_f64())
                    .sum()
            })
            .collect();
        // f32 output: the f16 inputs are exact, the sums are f32 → 1e-4.
        let c32 = Tensor::from_slice(&e, &vec![f32::NAN; m * n], &[m * n], "c").unwrap();
        gemm(&g, &ta, &tb, &c32, MatmulKernel::Tiled).unwrap();
        let err = max_rel_err(&c32.to_vec().unwrap(), &want);
        assert!(err < TOL, "f16→f32 {m}x{n}·K{k}: {err}");
        // f16 output: one final rounding to f16 (unit roundoff 2^-11 ≈ 4.9e-4)
        // on top, measured against the largest output as max_rel_err does.
        let nan = vec![half::f16::NAN; m * n];
        let c16 = Tensor::from_f16(&e, &nan, &[m * n], "c16").unwrap();
        gemm(&g, &ta, &tb, &c16, MatmulKernel::Tiled).unwrap();
        let err = max_rel_err(&c16.to_vec().unwrap(), &want);
        assert!(err < 1e-3, "f16→f16 {m}x{n}·K{k}: {err}");
    }
}

#[test]
fn the_wall_clock_fallback_times_each_kernel_alone() {
    // The path taken on adapters without timestamp queries: each dispatch
    // submitted and waited for alone, timed on the host.
    let e = engine();
    let source = e.start_wall_clock_timing().expect("a GPU engine can time");
    assert_eq!(source, vramlab::device::TimingSource::WallClockSyncPerOp);
    let mut rng = Rng::new(15);
    let a = Tensor::from_slice(&e, &rng.vec(40 * 30), &[40, 30], "a").unwrap();
    let b = Tensor::from_slice(&e, &rng.vec(30 * 20), &[30, 20], "b").unwrap();
    let c = {
        let _scope = e.scope(vramlab::memory::Category::Temporary, "timed_op");
        vramlab::ops::matmul::matmul(&a, &b).unwrap()
    };
    let (got, times) = e.take_dispatch_times().unwrap().expect("timing is on");
    assert_eq!(got, source);
    let mm: Vec<_> = times
        .iter()
        .filter(|t| t.kernel.starts_with("matmul["))
        .collect();
    assert_eq!(mm.len(), 1, "{times:?}");
    assert_eq!(&*mm[0].op, "timed_op");
    assert!(
        mm[0].seconds > 0.0 && mm[0].seconds < 10.0,
        "{}",
        mm[0].seconds
    );
    // Timing by syncs must not change results.
    let want = matmul_ref(&a.to_vec().unwrap(), &b.to_vec().unwrap(), 40, 30, 20);
    assert!(max_rel_err(&c.to_vec().unwrap(), &want) < TOL);
}

#[test]
fn eight_lane_tiles_fit_their_height_to_the_rows() {
    // (rows, columns, K) -> (thread-tile rows, workgroup rows): 64-row
    // thread tiles where they pad no more rows than 32-row ones, in
    // workgroups no taller than the product.
    let lane8 = |g: &Gemm| choose(g, Target::CpuSubgroup8, false, false);
    let height = |m: usize, n: usize, k: usize| {
        let t = lane8(&plain(m, n, k, false, false)).tile;
        (t.tm, t.wy)
    };
    assert_eq!(height(128, 784, 576), (64, 2), "conv2 forward");
    assert_eq!(height(64, 900, 1152), (64, 1), "conv2 input gradient");
    assert_eq!(height(1024, 1024, 1024), (64, 2), "square");
    assert_eq!(
        height(96, 500, 300),
        (32, 1),
        "96 rows: three 32-row tiles, no padding"
    );
    assert_eq!(
        height(160, 500, 300),
        (32, 1),
        "160 rows: five 32-row tiles"
    );
    assert_eq!(
        height(192, 500, 300),
        (64, 1),
        "192 rows: three 64-row tiles"
    );
    assert_eq!(height(64, 900, 27), (64, 1), "conv1 forward (shallow)");
    // A narrow product reading its im2col in place keeps its orientation.
    let mut wgrad = plain(64, 27, 900, false, false);
    wgrad.implicit_b = Some(ConvGeometry {
        c: 3,
        h: 32,
        w: 32,
        kh: 3,
        kw: 3,
        stride: 1,
        pad: 0,
        wo: 30,
        transposed: true,
        flipped: false,
    });
    let choice = lane8(&wgrad);
    assert!(!choice.transposed);
    assert_eq!(choice.class, ShapeClass::Narrow);
    assert_eq!(
        (choice.tile.tm, choice.tile.wy),
        (64, 1),
        "conv1 weight gradient"
    );
    assert_eq!(height(40, 900, 27), (64, 1), "40 rows pad to 64 either way");
    // Less than one K slice: 32×16 thread tiles.
    let fc_dx = lane8(&plain(64, 100_352, 10, false, false));
    assert_eq!(fc_dx.class, ShapeClass::Shallow);
    assert_eq!((fc_dx.tile.tm, fc_dx.tile.tn, fc_dx.tile.wy), (64, 16, 1));
    assert_eq!(fc_dx.tile.rows_outer(10), 10, "fc input gradient");
    assert_eq!(
        lane8(&plain(40, 100_352, 10, false, false)).tile.tm,
        64,
        "40 rows pad to 64 either way"
    );
    assert_eq!(
        lane8(&plain(96, 900, 10, false, false)).tile.tm,
        32,
        "96 rows: 96 in 32s, 128 in 64s"
    );
    assert_eq!(height(64, 900, 16), (64, 1), "one whole K slice: 64×8");
    assert_eq!(height(10, 500, 64), (10, 1), "short: exactly its rows");
    assert_eq!(height(31, 500, 64), (31, 1), "short: exactly its rows");
    // The fc forward (64×10) runs as Cᵀ: 10 rows.
    let fc = lane8(&plain(64, 10, 30_011, false, true));
    assert!(fc.transposed);
    assert_eq!((fc.tile.tm, fc.tile.wy), (10, 1), "fc forward as Cᵀ");
    // Short products take 16 columns a lane where that pads no more
    // columns: the fc weight gradient (10×100,352) does, 190 (192 against
    // 256) does not. As Cᵀ (the fc forward) each column is a row of X, its
    // own stream through memory: 4 a lane, strided.
    assert_eq!(
        (fc.tile.tn, fc.tile.strided_cols),
        (4, true),
        "fc forward as Cᵀ: 64 columns"
    );
    // Its long K ranges in 32-deep slices (an error bound no worse from
    // 512 on); a short K range and products run as they are keep 16.
    let simple_cnn_fc = plain(64, 10, 100_352, false, true);
    assert_eq!(plan_split(&simple_cnn_fc).k_chunk, 784);
    assert_eq!(lane8(&simple_cnn_fc).tile.bk, 32, "fc forward as Cᵀ");
    // K = 30,011 splits into ranges of 257.
    assert!(fc.transposed);
    assert_eq!(fc.tile.bk, 16, "fc-like, ranges of 257");
    let fc_dw = lane8(&plain(10, 100_352, 64, true, false));
    assert_eq!(
        (fc_dw.tile.tm, fc_dw.tile.tn, fc_dw.tile.bk),
        (10, 16, 16),
        "fc weight gradient"
    );
    assert_eq!(lane8(&plain(10, 190, 64, false, false)).tile.tn, 8);
    assert_eq!(lane8(&plain(10, 256, 64, false, false)).tile.tn, 16);
    // Other adapters keep their tables.
    for target in [Target::Gpu, Target::Cpu] {
        let g = plain(128, 784, 576, false, false);
        assert_eq!(
            choose(&g, target, false, false).tile,
            choose_tile(ShapeClass::Square, target)
        );
    }
}

#[test]
fn narrow_products_run_transposed_where_chosen_and_stay_exact() {
    // Few columns, many rows (the fc forward's class): on 8-lane CPU
    // adapters these run as Cᵀ = Bᵀ·Aᵀ written back through C's strides.
    let e = engine();
    let mut rng = Rng::new(13);
    let target = Target::of(&e);
    let fc = plain(64, 10, 30_011, false, true);
    let choice = choose(&fc, target, false, false);
    assert_eq!(
        choice.transposed,
        target == Target::CpuSubgroup8,
        "{choice:?}"
    );
    assert!(plan_split(&fc).splits > 1);
    check(&e, &mut rng, &fc, MatmulKernel::Tiled, "narrow, split K");
    // A given tile run as Cᵀ, on any adapter (the kernel's parts are
    // portable; only the choice is the 8-lane adapters').
    let wide = TileConfig::new(8, 2, 4, 8, 16, false).with_strided_cols();
    check(
        &e,
        &mut rng,
        &plain(37, 5, 45, true, true),
        MatmulKernel::FixedTransposed(wide),
        "narrow as Cᵀ, a given tile",
    );
    // A row bias needs the rows as they are: refused, not run wrong.
    let g = plain(6, 3, 5, false, false);
    let t = |n: usize| Tensor::from_slice(&e, &vec![1.0; n], &[n], "t").unwrap();
    let err = gemm_bias(
        &g,
        &t(30),
        &t(15),
        &t(18),
        Some(&t(6)),
        MatmulKernel::FixedTransposed(wide),
    )
    .unwrap_err();
    assert!(err.to_string().contains("untransposed"), "{err}");
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let g = plain(37, 3, 45, ta, tb);
        check(
            &e,
            &mut rng,
            &g,
            MatmulKernel::Tiled,
            &format!("narrow ta={ta} tb={tb}"),
        );
    }
    // Batched, accumulating into C at an offset, with a shared left operand.
    let mut g = plain(41, 7, 300, false, true);
    g.batch = 3;
    g.a = g.a.shared();
    g.accumulate = true;
    check(
        &e,
        &mut rng,
        &g,
        MatmulKernel::Tiled,
        "narrow batched accumulate",
    );
}

/// Runs and checks `g` with `tile` (timing on); the names of the matmul
/// variants it dispatched.
fn checked_kernels(
    e: &vramlab::tensor::Engine,
    rng: &mut Rng,
    g: &Gemm,
    tile: TileConfig,
    what: &str,
) -> Vec<String> {
    e.take_dispatch_times().unwrap();
    check(e, rng, g, MatmulKernel::Fixed(tile), what);
    let (_, times) = e.take_dispatch_times().unwrap().unwrap();
    times
        .into_iter()
        .filter(|t| t.kernel.starts_with("matmul["))
        .map(|t| t.kernel)
        .collect()
}

#[test]
fn narrow_subgroup_tiles_take_two_k_steps_where_the_ranges_are_even() {
    // conv1's weight gradient class: 64 rows, 4 columns a lane, long K, B
    // element by element. Even K ranges run two steps an iteration, each
    // sum taking both in a row; odd ones, 8-column tiles and vec4 B keep one.
    let e = engine();
    let mut rng = Rng::new(23);
    e.start_timing().expect("a GPU engine can time");
    let four = TileConfig::new(8, 1, 64, 4, 16, false).with_subgroup_a();
    let eight = TileConfig { tn: 8, ..four };
    let vec4 = four.with_vec4();
    assert!(four.k2() && !eight.k2());
    let cases = [
        (four, plain(70, 27, 452, false, false), true, "K = 452"),
        (four, plain(70, 27, 451, true, false), false, "K = 451"),
        (four, plain(70, 27, 452, true, true), true, "Aᵀ, Bᵀ"),
        (eight, plain(70, 27, 452, false, false), false, "8 columns"),
        (vec4, plain(70, 28, 452, false, false), false, "vec4 B"),
        (
            four,
            plain(64, 27, 2000, false, false),
            true,
            "split K, even ranges",
        ),
        (
            four,
            plain(64, 27, 2006, false, false),
            false,
            "split K, ranges of 287",
        ),
        (
            TileConfig { tm: 10, ..four },
            plain(70, 27, 10, false, false),
            true,
            "one slice (10 rows: not rows outer)",
        ),
    ];
    for (tile, g, k2, what) in cases {
        if tile.subgroup_a && Target::of(&e) != Target::CpuSubgroup8 {
            continue;
        }
        let kernels = checked_kernels(&e, &mut rng, &g, tile, what);
        assert_eq!(kernels[0].contains(" k2"), k2, "{what}: ran {kernels:?}");
    }
    assert_eq!(plan_split(&plain(64, 27, 2006, false, false)).k_chunk, 287);
}

#[test]
fn vec4_accesses_are_used_where_the_layout_allows_and_stay_exact() {
    // A tile asking for vec4 B loads and C stores gets them only where N,
    // the strides and the offsets are multiples of 4 and the operand is
    // dense along its rows; elsewhere the same tile runs scalar. Odd M and
    // K, and an N that is not a multiple of the tile's width, keep the
    // clamped edges in play. Reading along K also needs K slices of a
    // multiple of 4.
    let e = engine();
    let mut rng = Rng::new(17);
    e.start_timing().expect("a GPU engine can time");
    let strided = TileConfig::new(4, 3, 3, 8, 8, false)
        .with_strided_cols()
        .with_vec4();
    let contiguous = TileConfig::new(4, 3, 3, 8, 8, false).with_vec4();
    let mut cases: Vec<(Gemm, &str, &str)> = vec![
        (plain(37, 44, 29, false, false), "B and C", " vec4 B C]"),
        (plain(37, 44, 29, true, false), "Aᵀ, B and C", " vec4 B C]"),
        (plain(37, 44, 29, false, true), "Bᵀ: C only", " vec4 C]"),
        (plain(37, 42, 29, false, false), "N = 42: none", "]"),
        (
            plain(37, 44, 28, false, true),
            "A and Bᵀ along K",
            " vec4 K C]",
        ),
        (
            plain(37, 42, 28, false, true),
            "along K, N = 42",
            " vec4 K]",
        ),
        (
            plain(37, 44, 28, true, true),
            "Aᵀ is not along K",
            " vec4 C]",
        ),
    ];
    let mut acc = plain(5, 12, 9, false, false);
    acc.batch = 3;
    acc.c_offset = 4;
    acc.c_batch_stride = 5 * 12 + 4;
    acc.accumulate = true;
    cases.push((acc, "batched, accumulating at an offset", " vec4 B C]"));
    let mut odd_c = acc;
    odd_c.c_offset = 2;
    cases.push((odd_c, "C at an odd offset: B only", " vec4 B]"));
    let mut odd_b = plain(6, 8, 5, false, false);
    odd_b.b.offset = 2;
    cases.push((odd_b, "B at an odd offset: C only", " vec4 C]"));
    let mut shared_b = plain(9, 16, 11, false, false);
    shared_b.batch = 2;
    shared_b.b = shared_b.b.shared();
    shared_b.c_batch_stride = 9 * 16;
    cases.push((shared_b, "shared B", " vec4 B C]"));
    for tile in [strided, contiguous] {
        for (g, what, suffix) in &cases {
            let kernels = checked_kernels(&e, &mut rng, g, tile, what);
            assert_eq!(kernels.len(), 1, "{what}: {kernels:?}");
            let name = &kernels[0];
            assert!(
                name.ends_with(suffix) && (suffix.len() > 1 || !name.contains(" vec4 ")),
                "{what} with {}: ran {name}",
                tile.describe()
            );
        }
    }
    // Split K: the partial sums go through vec4 stores too, and the chosen
    // tile on this adapter still matches f64.
    let split = plain(9, 12, 20_011, false, false);
    assert!(plan_split(&split).splits > 1);
    check(
        &e,
        &mut rng,
        &split,
        MatmulKernel::Fixed(strided),
        "split K",
    );
    check(&e, &mut rng, &split, MatmulKernel::Tiled, "split K, chosen");
    // The fc forward's shape, split along K in chunks of a multiple of 4:
    // on 8-lane CPU adapters it runs as Cᵀ with A and B read along K.
    let fc = plain(64, 10, 100_352, false, true);
    let s = plan_split(&fc);
    assert!(s.splits > 1 && s.k_chunk.is_multiple_of(4), "{s:?}");
    e.take_dispatch_times().unwrap();
    check(
        &e,
        &mut rng,
        &fc,
        MatmulKernel::Tiled,
        "fc forward, split K",
    );
    let (_, times) = e.take_dispatch_times().unwrap().unwrap();
    let along_k = times.iter().any(|t| t.kernel.contains(" vec4 K"));
    assert_eq!(
        along_k,
        Target::of(&e) == Target::CpuSubgroup8,
        "{:?}",
        times.iter().map(|t| &t.kernel).collect::<Vec<_>>()
    );
}

#[test]
fn small_k_products_run_rows_outer_or_one_slice_exactly() {
    // Small K (the fc input gradient: K = 10; conv1's forward: 27): rows
    // outer, or where that does not apply and K fits the tile's slice, one
    // set of accumulators. One element deeper and the blocked summation's
    // two sets come back; all stay exact.
    let e = engine();
    let mut rng = Rng::new(19);
    e.start_timing().expect("a GPU engine can time");
    let direct = TileConfig::new(8, 1, 16, 16, 16, false)
        .with_subgroup_a()
        .with_strided_cols()
        .with_vec4();
    let staged = TileConfig::new(8, 8, 4, 4, 8, true);
    // Rows outer needs subgroup A (the rows shared over the lanes) and a
    // thread tile of whole 8-row groups; without them the one-slice loop.
    let plain_direct = TileConfig {
        subgroup_a: false,
        ..direct
    };
    let ragged = TileConfig { tm: 10, ..direct };
    // Direct subgroup-A tiles run rows outer, K compiled in, while B's range
    // (TN·K) fits 256 values a lane: past one slice too (K = 27: slices of
    // 16 and 11, K = 32: two whole ones), summed slice by slice.
    let narrow = TileConfig { tn: 8, ..direct };
    let cases = [
        (direct, 1, " rows outer k=1"),
        (direct, 10, " rows outer k=10"),
        (direct, 16, " rows outer k=16"),
        (direct, 17, ""),
        (narrow, 27, " rows outer k=27"),
        (narrow, 32, " rows outer k=32"),
        (narrow, 33, ""),
        (ragged, 10, " one slice"),
        (plain_direct, 10, " one slice"),
        (staged, 8, " one slice"),
        (staged, 9, ""),
    ];
    for (tile, k, variant) in cases {
        let outer = variant.starts_with(" rows outer");
        assert_eq!(tile.rows_outer(k) > 0, outer, "{} K = {k}", tile.describe());
        if !outer {
            assert_eq!(tile.one_slice(k), !variant.is_empty(), "K = {k}");
        }
        for (ta, tb) in [(false, false), (true, true)] {
            let g = plain(23, 140, k, ta, tb);
            let kernels = checked_kernels(&e, &mut rng, &g, tile, "one slice");
            assert_eq!(kernels.len(), 1, "K = {k}: {kernels:?}");
            let name = &kernels[0];
            for named in [" one slice", " rows outer"] {
                assert_eq!(
                    name.contains(named),
                    variant.starts_with(named),
                    "K = {k}: ran {name}"
                );
            }
            assert!(name.contains(variant), "K = {k}: ran {name}");
        }
    }
    assert_eq!(narrow.rows_outer(ROWS_OUTER_MAX_B / 8), 32);
    assert_eq!(narrow.rows_outer(ROWS_OUTER_MAX_B / 8 + 1), 0);
}

#[test]
fn gpu_tiles_stage_in_fours_where_the_layout_allows_and_stay_exact() {
    // The GPU family loads A along K, B along N and stores C as vec4 where
    // the operands are dense along them with sizes and offsets in fours;
    // otherwise element by element in the order that keeps neighbouring
    // threads on neighbouring addresses. Every case checked against f64.
    let e = engine();
    let mut rng = Rng::new(23);
    e.start_timing().expect("a GPU engine can time");
    let tile = TileConfig::new(8, 8, 4, 4, 16, true);
    let cases = [
        // (m, n, k, ta, tb, expected in the name, not expected)
        (
            37,
            200,
            40,
            false,
            false,
            vec![" vec4 A", " vec4 B", " vec4 C"],
            vec![],
        ),
        (
            37,
            200,
            40,
            true,
            false,
            vec![" vec4 B", " vec4 C", "A→M"],
            vec![" vec4 A"],
        ),
        (
            37,
            200,
            40,
            false,
            true,
            vec![" vec4 A", " vec4 C", "B→K"],
            vec![" vec4 B"],
        ),
        (37, 201, 42, false, false, vec!["A→K B→N"], vec![" vec4"]),
        (
            130,
            68,
            200,
            true,
            true,
            vec![" vec4 C", "A→M B→K"],
            vec![" vec4 A", " vec4 B"],
        ),
    ];
    for (m, n, k, ta, tb, want, not) in cases {
        let g = plain(m, n, k, ta, tb);
        let names = checked_kernels(&e, &mut rng, &g, tile, "gpu tile");
        assert_eq!(names.len(), 1, "{names:?}");
        for w in want {
            assert!(
                names[0].contains(w),
                "{m}x{n}·K{k} ta={ta} tb={tb}: {}",
                names[0]
            );
        }
        for w in not {
            assert!(
                !names[0].contains(w),
                "{m}x{n}·K{k} ta={ta} tb={tb}: {}",
                names[0]
            );
        }
    }
}

#[test]
fn a_summed_batch_past_one_workspace_is_one_product_on_gpu_tiles() {
    // 300×700 outputs an entry: 840 KB of partial products, so a 4 MiB
    // workspace holds 4 of the 7 entries. GPU tiles sum 2 entries a slot
    // (the last slot 1) in one product; direct tiles take a round a
    // workspace. Both exact, accumulating into C.
    let e = engine();
    e.start_timing();
    let mut rng = Rng::new(21);
    let (m, n, k, batch) = (300, 700, 19, 7);
    let g = Gemm {
        m,
        n,
        k,
        batch,
        a: MatView::dense(0, m, k, false),
        b: MatView::dense(0, n, k, true),
        c_offset: 0,
        c_batch_stride: 0,
        accumulate: true,
        reduce_batch: true,
        implicit_b: None,
    };
    let s = plan_split(&g);
    assert!(s.group > 1 && s.group < batch, "{s:?}");
    let rounds = batch.div_ceil(s.group);
    for (target, products) in [(Target::Gpu, 1), (Target::Cpu, rounds)] {
        let tile = choose_tile(ShapeClass::Square, target);
        let ks = checked_kernels(&e, &mut rng, &g, tile, &format!("summed batch, {target:?}"));
        assert_eq!(ks.len(), products, "{target:?}: {ks:?}");
    }
}

/// The im2col element B[kk, col] of `cv` (or, transposed, B[col, kk]) for
/// batch entry `bt` of `x`, from its definition: row kk = (c, ky, kx),
/// column = output position (oy, ox), the window rotated by 180° where
/// flipped, zero in the padding.
fn im2col_at(cv: &ConvGeometry, x: &[f32], bt: usize, kk: usize, col: usize) -> f64 {
    let (c, r) = (kk / (cv.kh * cv.kw), kk % (cv.kh * cv.kw));
    let (mut ky, mut kx) = (r / cv.kw, r % cv.kw);
    if cv.flipped {
        (ky, kx) = (cv.kh - 1 - ky, cv.kw - 1 - kx);
    }
    let (oy, ox) = (col / cv.wo, col % cv.wo);
    let iy = (oy * cv.stride + ky) as isize - cv.pad as isize;
    let ix = (ox * cv.stride + kx) as isize - cv.pad as isize;
    if iy < 0 || ix < 0 || iy >= cv.h as isize || ix >= cv.w as isize {
        return 0.0;
    }
    x[bt * cv.c * cv.h * cv.w + (c * cv.h + iy as usize) * cv.w + ix as usize] as f64
}

#[test]
fn implicit_convolutions_match_f64_on_every_kind_of_gpu_tile() {
    // B read as an im2col in place, forward (padding 0, 1, 2, stride 2, a
    // non-square window), flipped (the input gradient) and transposed (the
    // weight gradient, batch-summed or not), on GPU tiles staging B along N
    // and along K, where an element's column or K index is shared by the
    // thread's whole share and where it is not (8 threads, 256-wide blocks).
    let e = engine();
    let mut rng = Rng::new(31);
    let limits = e
        .gpu()
        .map_or(GpuLimits::DEFAULT, |g| GpuLimits::of(&g.limits));
    let tiles: Vec<TileConfig> = [
        TileConfig::new(16, 16, 4, 4, 16, true),
        TileConfig::new(16, 8, 8, 4, 16, true),
        TileConfig::new(32, 4, 4, 8, 16, true),
        TileConfig::new(8, 1, 4, 4, 16, true),
        TileConfig::new(4, 16, 4, 4, 8, true),
    ]
    .into_iter()
    .filter(|t| limits.fits(t))
    .collect();
    assert!(tiles.len() >= 4, "{tiles:?}");
    // (channels, h, w, kh, kw, stride, pad, flipped, transposed, summed)
    let cases = [
        (3, 11, 9, 3, 3, 1, 1, false, false, false),
        (5, 10, 13, 3, 2, 2, 1, false, false, false),
        (2, 12, 7, 5, 5, 1, 0, false, false, false),
        (4, 9, 9, 3, 3, 1, 2, true, false, false),
        (3, 11, 10, 3, 3, 1, 1, false, true, true),
        (2, 13, 9, 3, 3, 2, 0, false, true, false),
    ];
    let m = 13;
    let batch = 2;
    for (c, h, w, kh, kw, stride, pad, flipped, transposed, summed) in cases {
        let ho = (h + 2 * pad - kh) / stride + 1;
        let wo = (w + 2 * pad - kw) / stride + 1;
        let cv = ConvGeometry {
            c,
            h,
            w,
            kh,
            kw,
            stride,
            pad,
            wo,
            transposed,
            flipped,
        };
        let (taps, positions) = (c * kh * kw, ho * wo);
        // im2col: K over taps, N over positions; transposed the other way.
        let (n, k) = if transposed {
            (taps, positions)
        } else {
            (positions, taps)
        };
        let g = Gemm {
            m,
            n,
            k,
            batch,
            a: MatView::dense(0, m, k, false),
            b: MatView {
                offset: 0,
                row_stride: 0,
                col_stride: 0,
                batch_stride: c * h * w,
            },
            c_offset: 0,
            c_batch_stride: if summed { 0 } else { m * n },
            accumulate: false,
            reduce_batch: summed,
            implicit_b: Some(cv),
        };
        let a = rng.vec(batch * m * k);
        let x = rng.vec(batch * c * h * w);
        let mut want = vec![0.0f64; if summed { 1 } else { batch } * m * n];
        for bt in 0..batch {
            let cb = if summed { 0 } else { bt * m * n };
            for i in 0..m {
                for j in 0..n {
                    want[cb + i * n + j] += (0..k)
                        .map(|kk| {
                            let b = if transposed {
                                im2col_at(&cv, &x, bt, j, kk)
                            } else {
                                im2col_at(&cv, &x, bt, kk, j)
                            };
                            a[bt * m * k + i * k + kk] as f64 * b
                        })
                        .sum::<f64>();
                }
            }
        }
        let ta = Tensor::from_slice(&e, &a, &[a.len()], "a").unwrap();
        let tx = Tensor::from_slice(&e, &x, &[x.len()], "x").unwrap();
        for t in &tiles {
            let tc =
                Tensor::from_slice(&e, &vec![f32::NAN; want.len()], &[want.len()], "c").unwrap();
            gemm(&g, &ta, &tx, &tc, MatmulKernel::Fixed(*t)).unwrap();
            let got = tc.to_vec().unwrap();
            let err = max_rel_err(&got, &want);
            assert!(
                got.iter().all(|v| v.is_finite()) && err < TOL,
                "{} on {cv:?}, summed {summed}: rel err {err}",
                t.describe()
            );
        }
    }
}

#[test]
fn a_16bit_linear_rounds_once_after_its_bias_where_the_product_adds_it() {
    // linear(x, W, b) in f16 and bf16: where the product adds the bias (the
    // pass summing a split product's partials, a GPU tile's epilogue, the
    // tensor cores' epilogue where the adapter has them), it
    // adds it to the f32 sum and rounds once, as addmm rounds its f32 sum:
    // the bits of the product into f32, the bias added in f32, then one
    // cast. Direct tiles and odd widths (no whole 16-bit words: the f32
    // workspace) keep the bias pass. Every result against f64.
    use vramlab::ops::bias::add_bias;
    use vramlab::ops::cast::cast;
    use vramlab::ops::matmul::{gemm_col_bias, tensor_cores_for};
    use vramlab::tensor::DType;
    let e = engine();
    e.start_timing().expect("a GPU engine can time");
    let mut rng = Rng::new(43);
    let chosen = |g: &Gemm| choose(g, Target::of(&e), true, false).tile;
    let gpu_tile = TileConfig::new(16, 16, 4, 4, 16, true);
    let mut on_cores_once = 0;
    for dtype in [DType::F16, DType::Bf16] {
        for (n, i, o) in [
            (6, 3001, 10),
            (5, 2049, 7),
            (4, 4096, 2),
            (6, 40, 12),
            (7, 33, 9),
        ] {
            let g = plain(n, o, i, false, true);
            let split = plan_split(&g).group > 0;
            let half = |v: Vec<f32>, shape: &[usize]| {
                let t = Tensor::from_slice(&e, &v, shape, "t").unwrap();
                cast(&t, dtype, "t16").unwrap()
            };
            let (x, w, b) = (
                half(rng.vec(n * i), &[n, i]),
                half(rng.vec(o * i), &[o, i]),
                half(rng.vec(o), &[o]),
            );
            let (xv, wv, bv) = (
                x.to_vec().unwrap(),
                w.to_vec().unwrap(),
                b.to_vec().unwrap(),
            );
            let want = linear_ref(&to_f64(&xv), &to_f64(&wv), &to_f64(&bv), n, i, o);
            let probe = Tensor::empty(&e, &[n, o], dtype, "probe").unwrap();
            let cores = tensor_cores_for(&g, &x, &w, &probe, None, MatmulKernel::Tiled).is_some();
            for kernel in [
                MatmulKernel::Fixed(chosen(&g)),
                MatmulKernel::Fixed(gpu_tile),
                MatmulKernel::Tiled,
            ] {
                let (shared, on_cores) = match kernel {
                    MatmulKernel::Fixed(t) => (t.shared, false),
                    _ => (false, cores),
                };
                let what = format!("{dtype} {n}×{o}·K{i} with {kernel:?}");
                let y = Tensor::empty(&e, &[n, o], dtype, "y").unwrap();
                e.take_dispatch_times().unwrap();
                gemm_col_bias(&g, &x, &w, &y, &b, kernel).unwrap();
                let (_, times) = e.take_dispatch_times().unwrap().unwrap();
                let kernels: Vec<&str> = times.iter().map(|t| t.kernel.as_str()).collect();
                if matches!(kernel, MatmulKernel::Tiled) && !on_cores {
                    continue; // the tiles ran above
                }
                let once = o % 2 == 0 && (split || shared || on_cores);
                on_cores_once += usize::from(once && on_cores);
                assert_eq!(
                    kernels.iter().any(|k| k.starts_with("bias_add")),
                    !once,
                    "{what}: {kernels:?}"
                );
                let summed = format!("sum_partials[{dtype} +bias");
                assert_eq!(
                    kernels.iter().any(|k| k.starts_with(&summed)),
                    once && split,
                    "{what}: {kernels:?}"
                );
                assert_eq!(
                    kernels.iter().any(|k| k.contains(" +col bias")),
                    once && !split,
                    "{what}: {kernels:?}"
                );
                assert_eq!(
                    kernels.iter().any(|k| k.starts_with("matmul_coop")),
                    on_cores,
                    "{what}: {kernels:?}"
                );
                let got = y.to_vec().unwrap();
                if once {
                    // The product into f32, its bias widened and added, one cast.
                    let wide = Tensor::empty(&e, &[n, o], DType::F32, "wide").unwrap();
                    gemm(&g, &x, &w, &wide, kernel).unwrap();
                    add_bias(&wide, &cast(&b, DType::F32, "b32").unwrap(), o, 1).unwrap();
                    let one = cast(&wide, dtype, "once").unwrap().to_vec().unwrap();
                    assert!(
                        got.iter()
                            .zip(&one)
                            .all(|(p, q)| p.to_bits() == q.to_bits()),
                        "{what}: not the bits of one rounding after the bias"
                    );
                }
                let err = normwise(&got, &want);
                let tol = if dtype == DType::F16 { 2e-3 } else { 1.6e-2 };
                assert!(err < tol, "{what}: distance {err}");
            }
        }
    }
    // Where the adapter has f16 tensor cores (Mesa 26, NVIDIA), their
    // epilogue added a bias.
    assert_eq!(on_cores_once > 0, e.tensor_core_lanes().is_some());
}

#[test]
fn a_linear_bias_is_added_by_the_product_where_it_can() {
    // linear(x, W, b): the bias is added by the pass summing a split
    // product's partials, or by a GPU tile's epilogue (f32, bound whole),
    // with the bits of the product followed by a bias pass; the direct
    // tiles keep the pass. Odd and whole-vec4 widths; every result against
    // f64.
    use vramlab::ops::bias::add_bias;
    use vramlab::ops::matmul::gemm_col_bias;
    let e = engine();
    e.start_timing().expect("a GPU engine can time");
    let mut rng = Rng::new(41);
    let chosen = |g: &Gemm| choose(g, Target::of(&e), false, false).tile;
    for (n, i, o) in [(5, 3001, 7), (6, 40, 9), (70, 33, 12)] {
        let (xv, wv, bv) = (rng.vec(n * i), rng.vec(o * i), rng.vec(o));
        let x = Tensor::from_slice(&e, &xv, &[n, i], "x").unwrap();
        let w = Tensor::from_slice(&e, &wv, &[o, i], "w").unwrap();
        let b = Tensor::from_slice(&e, &bv, &[o], "b").unwrap();
        let g = plain(n, o, i, false, true);
        let split = plan_split(&g).group > 0;
        let want = linear_ref(&to_f64(&xv), &to_f64(&wv), &to_f64(&bv), n, i, o);
        for tile in [chosen(&g), TileConfig::new(16, 16, 4, 4, 16, true)] {
            let what = format!("{n}×{o}·K{i} on {}", tile.describe());
            let kernel = MatmulKernel::Fixed(tile);
            let y = Tensor::empty(&e, &[n, o], vramlab::tensor::DType::F32, "y").unwrap();
            e.take_dispatch_times().unwrap();
            gemm_col_bias(&g, &x, &w, &y, &b, kernel).unwrap();
            let fused = y.to_vec().unwrap();
            let (_, times) = e.take_dispatch_times().unwrap().unwrap();
            let kernels: Vec<&str> = times.iter().map(|t| t.kernel.as_str()).collect();
            let in_product = split || tile.shared;
            assert_eq!(
                kernels.iter().any(|k| k.starts_with("bias_add")),
                !in_product,
                "{what}: {kernels:?}"
            );
            assert_eq!(
                kernels.contains(&"sum_partials[f32 +bias]"),
                split,
                "{what}: {kernels:?}"
            );
            assert_eq!(
                kernels.iter().any(|k| k.contains(" +col bias")),
                !split && tile.shared,
                "{what}: {kernels:?}"
            );
            let apart = Tensor::empty(&e, &[n, o], vramlab::tensor::DType::F32, "y").unwrap();
            gemm(&g, &x, &w, &apart, kernel).unwrap();
            add_bias(&apart, &b, o, 1).unwrap();
            let apart = apart.to_vec().unwrap();
            assert!(
                fused
                    .iter()
                    .zip(&apart)
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "{what}: the fused bias changed bits"
            );
            let err = max_rel_err(&fused, &want);
            assert!(err < TOL, "{what}: rel err {err}");
        }
    }
    // linear takes the same route.
    let x = Tensor::from_slice(&e, &rng.vec(6 * 40), &[6, 40], "x").unwrap();
    let w = Tensor::from_slice(&e, &rng.vec(9 * 40), &[9, 40], "w").unwrap();
    let b = Tensor::from_slice(&e, &rng.vec(9), &[9], "b").unwrap();
    e.take_dispatch_times().unwrap();
    vramlab::ops::linear::linear(&x, &w, Some(&b)).unwrap();
    let (_, times) = e.take_dispatch_times().unwrap().unwrap();
    let gpu = chosen(&plain(6, 9, 40, false, true)).shared;
    assert_eq!(
        times.iter().any(|t| t.kernel.starts_with("bias_add")),
        !gpu,
        "{times:?}"
    );
}

/// A product whose grid of workgroups passes the device's 65,535 a
/// dimension (millions of rows, or of columns) runs in parts, as one past
/// the binding limit does; it failed with "needs a grid of 156250
/// workgroups ... split the work" (`train --model mlp --widths 4,3 --batch
/// 5000000`).
#[test]
fn products_past_the_workgroup_grid_run_in_parts() {
    let e = engine();
    let mut rng = Rng::new(61);
    for (m, n, k, ta, tb) in [
        (4_500_001, 3, 4, false, true),
        (4_500_001, 3, 4, true, false),
        (2, 4_200_007, 5, false, false),
    ] {
        let g = plain(m, n, k, ta, tb);
        check(
            &e,
            &mut rng,
            &g,
            MatmulKernel::Tiled,
            &format!("{m}x{n}x{k}"),
        );
    }
}
