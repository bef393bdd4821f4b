//! ResNet's ops on the GPU against f64 CPU references on awkward sizes:
//! BatchNorm (training: batch statistics, running statistics updated with
//! momentum and the unbiased variance; eval: running statistics) forward and
//! backward, max pooling with overlapping windows, ties and NaN, and the
//! strided 7×7 stem convolution without a bias. The BatchNorm reference's
//! gradient is checked against finite differences first.

use crate::common;
use common::*;
use vramlab::ops::batchnorm::{batchnorm, batchnorm_backward, EPS, MOMENTUM};
use vramlab::ops::conv2d::{conv2d, conv2d_backward_ex, Conv2dConfig};
use vramlab::ops::maxpool::{max_pool2d, max_pool2d_backward, PoolConfig};
use vramlab::tensor::Tensor;

const TOL: f64 = 1e-4;

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Channel c's values of x [n, c, inner].
fn channel(x: &[f64], n: usize, c: usize, inner: usize, ch: usize) -> Vec<f64> {
    (0..n)
        .flat_map(|i| x[(i * c + ch) * inner..][..inner].to_vec())
        .collect()
}

/// Training-mode batch norm: y and per-channel (mean, biased var).
fn bn_ref(
    x: &[f64],
    w: &[f64],
    b: &[f64],
    n: usize,
    c: usize,
    inner: usize,
) -> (Vec<f64>, Vec<(f64, f64)>) {
    let mut y = vec![0.0; x.len()];
    let mut stats = Vec::new();
    for ch in 0..c {
        let v = channel(x, n, c, inner, ch);
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / v.len() as f64;
        let inv = 1.0 / (var + EPS as f64).sqrt();
        for i in 0..n {
            for k in 0..inner {
                let at = (i * c + ch) * inner + k;
                y[at] = (x[at] - m) * inv * w[ch] + b[ch];
            }
        }
        stats.push((m, var));
    }
    (y, stats)
}

#[test]
fn batchnorm_reference_matches_finite_differences() {
    let mut rng = Rng::new(21);
    let (n, c, inner) = (2, 3, 4);
    let x = to_f64(&rng.vec(n * c * inner));
    let w = to_f64(&rng.vec(c));
    let b = to_f64(&rng.vec(c));
    let r = to_f64(&rng.vec(n * c * inner));
    let num = numeric_grad(&x, |x| dot(&bn_ref(x, &w, &b, n, c, inner).0, &r));
    let (_, stats) = bn_ref(&x, &w, &b, n, c, inner);
    let got = bn_dx_ref(&x, &w, &r, &stats, n, c, inner);
    for (p, q) in got.iter().zip(&num) {
        assert!((p - q).abs() < 1e-6, "{p} vs {q}");
    }
}

/// Analytic training-mode dx.
fn bn_dx_ref(
    x: &[f64],
    w: &[f64],
    g: &[f64],
    stats: &[(f64, f64)],
    n: usize,
    c: usize,
    inner: usize,
) -> Vec<f64> {
    let mut dx = vec![0.0; x.len()];
    let cnt = (n * inner) as f64;
    for ch in 0..c {
        let (m, var) = stats[ch];
        let inv = 1.0 / (var + EPS as f64).sqrt();
        let xs = channel(x, n, c, inner, ch);
        let gs = channel(g, n, c, inner, ch);
        let sg: f64 = gs.iter().sum();
        let sgx: f64 = gs.iter().zip(&xs).map(|(g, x)| g * (x - m) * inv).sum();
        for i in 0..n {
            for k in 0..inner {
                let at = (i * c + ch) * inner + k;
                let xh = (x[at] - m) * inv;
                dx[at] = w[ch] * inv * (g[at] - sg / cnt - xh * sgx / cnt);
            }
        }
    }
    dx
}

#[test]
fn batchnorm_matches_f64_in_training_and_eval() {
    let e = engine();
    let mut rng = Rng::new(22);
    // (n, c, h·w): one value per sample (three: with two, dx is 0 exactly
    // and f32 noise has no scale to be judged against), odd planes, more positions than
    // one reduction workgroup takes (16,384), a 1-D [N, C] input.
    for (n, c, inner) in [(3, 1, 1), (3, 5, 7), (2, 3, 9000), (5, 2, 1)] {
        let x: Vec<f32> = rng
            .vec(n * c * inner)
            .iter()
            .map(|v| 2.0 * v + 0.7)
            .collect();
        let w = rng.vec(c);
        let b = rng.vec(c);
        let rm0 = rng.vec(c);
        let rv0: Vec<f32> = rng.vec(c).iter().map(|v| v.abs() + 0.5).collect();
        let shape = if inner == 1 {
            vec![n, c]
        } else {
            vec![n, c, inner]
        };
        let tx = Tensor::from_slice(&e, &x, &shape, "x").unwrap();
        let tw = Tensor::from_slice(&e, &w, &[c], "w").unwrap();
        let tb = Tensor::from_slice(&e, &b, &[c], "b").unwrap();
        let rm = Tensor::from_slice(&e, &rm0, &[c], "rm").unwrap();
        let rv = Tensor::from_slice(&e, &rv0, &[c], "rv").unwrap();
        let out = batchnorm(&tx, &tw, &tb, &rm, &rv, true).unwrap();
        let (want, stats) = bn_ref(&to_f64(&x), &to_f64(&w), &to_f64(&b), n, c, inner);
        let err = max_rel_err(&out.y.to_vec().unwrap(), &want);
        assert!(err < TOL, "train forward {n}x{c}x{inner}: {err}");
        // Running statistics: (1 − m)·old + m·batch, the variance unbiased.
        let cnt = (n * inner) as f64;
        let m = MOMENTUM as f64;
        let want_rm: Vec<f64> = (0..c)
            .map(|i| (1.0 - m) * rm0[i] as f64 + m * stats[i].0)
            .collect();
        let want_rv: Vec<f64> = (0..c)
            .map(|i| (1.0 - m) * rv0[i] as f64 + m * stats[i].1 * cnt / (cnt - 1.0))
            .collect();
        assert!(
            max_rel_err(&rm.to_vec().unwrap(), &want_rm) < TOL,
            "running mean"
        );
        assert!(
            max_rel_err(&rv.to_vec().unwrap(), &want_rv) < TOL,
            "running var"
        );
        // Backward (training).
        let r = rng.vec(n * c * inner);
        let g = Tensor::from_slice(&e, &r, &shape, "g").unwrap();
        let (dx, dw, db) = batchnorm_backward(&tx, &tw, &out.stats, &g, true, true).unwrap();
        let (xd, rd) = (to_f64(&x), to_f64(&r));
        let want_dx = bn_dx_ref(&xd, &to_f64(&w), &rd, &stats, n, c, inner);
        let err = max_rel_err(&dx.unwrap().to_vec().unwrap(), &want_dx);
        assert!(err < TOL, "train dx {n}x{c}x{inner}: {err}");
        let mut want_dw = vec![0.0; c];
        let mut want_db = vec![0.0; c];
        for ch in 0..c {
            let inv = 1.0 / (stats[ch].1 + EPS as f64).sqrt();
            let xs = channel(&xd, n, c, inner, ch);
            let gs = channel(&rd, n, c, inner, ch);
            want_db[ch] = gs.iter().sum();
            want_dw[ch] = gs
                .iter()
                .zip(&xs)
                .map(|(g, x)| g * (x - stats[ch].0) * inv)
                .sum();
        }
        assert!(
            max_rel_err(&dw.to_vec().unwrap(), &want_dw) < TOL,
            "dweight"
        );
        assert!(max_rel_err(&db.to_vec().unwrap(), &want_db) < TOL, "dbias");

        // Eval: the (updated) running statistics, left unchanged.
        let (rm1, rv1) = (rm.to_vec().unwrap(), rv.to_vec().unwrap());
        let ev = batchnorm(&tx, &tw, &tb, &rm, &rv, false).unwrap();
        let want: Vec<f64> = (0..x.len())
            .map(|at| {
                let ch = (at / inner) % c;
                let inv = 1.0 / (rv1[ch] as f64 + EPS as f64).sqrt();
                (x[at] as f64 - rm1[ch] as f64) * inv * w[ch] as f64 + b[ch] as f64
            })
            .collect();
        let err = max_rel_err(&ev.y.to_vec().unwrap(), &want);
        assert!(err < TOL, "eval forward: {err}");
        assert_eq!(rm.to_vec().unwrap(), rm1, "eval leaves the running mean");
        assert_eq!(rv.to_vec().unwrap(), rv1, "eval leaves the running var");
        let (dx, _, _) = batchnorm_backward(&tx, &tw, &ev.stats, &g, false, true).unwrap();
        let want: Vec<f64> = (0..x.len())
            .map(|at| {
                let ch = (at / inner) % c;
                w[ch] as f64 / (rv1[ch] as f64 + EPS as f64).sqrt() * r[at] as f64
            })
            .collect();
        let err = max_rel_err(&dx.unwrap().to_vec().unwrap(), &want);
        assert!(err < TOL, "eval dx: {err}");
    }
    // One value per channel cannot be normalised in training.
    let x = Tensor::from_slice(&e, &[1.0, 2.0], &[1, 2], "x").unwrap();
    let w = Tensor::from_slice(&e, &[1.0, 1.0], &[2], "w").unwrap();
    let err = batchnorm(&x, &w, &w, &w, &w, true).err().expect("refused");
    assert!(err.to_string().contains("more than one value"), "{err}");
}

fn pool_ref(
    x: &[f32],
    planes: usize,
    h: usize,
    w: usize,
    cfg: PoolConfig,
) -> (Vec<f32>, Vec<usize>, usize, usize) {
    let (k, s, p) = (cfg.kernel, cfg.stride, cfg.padding);
    let (ho, wo) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
    let (mut y, mut idx) = (Vec::new(), Vec::new());
    for pl in 0..planes {
        for oy in 0..ho {
            for ox in 0..wo {
                let mut best: Option<(f32, usize)> = None;
                for ky in 0..k {
                    for kx in 0..k {
                        let (iy, ix) = (
                            (oy * s + ky) as isize - p as isize,
                            (ox * s + kx) as isize - p as isize,
                        );
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        let pos = iy as usize * w + ix as usize;
                        let v = x[pl * h * w + pos];
                        let better = match best {
                            None => true,
                            Some((m, _)) => v > m || (v.is_nan() && !m.is_nan()),
                        };
                        if better {
                            best = Some((v, pos));
                        }
                    }
                }
                let (v, pos) = best.unwrap();
                y.push(v);
                idx.push(pos);
            }
        }
    }
    (y, idx, ho, wo)
}

#[test]
fn max_pool_matches_the_reference() {
    let e = engine();
    let mut rng = Rng::new(23);
    for ((n, c, h, w), (k, s, p)) in [
        ((1, 1, 1, 1), (1, 1, 0)),
        ((2, 3, 7, 9), (3, 2, 1)),
        ((1, 2, 8, 8), (2, 2, 0)),
        ((2, 1, 11, 6), (3, 1, 1)),
        ((1, 1, 5, 5), (5, 3, 2)),
    ] {
        let cfg = PoolConfig {
            kernel: k,
            stride: s,
            padding: p,
        };
        // Values from a small set, so windows hold ties.
        let mut x: Vec<f32> = (0..n * c * h * w).map(|_| rng.below(4) as f32).collect();
        if x.len() > 5 {
            x[5] = f32::NAN;
        }
        let tx = Tensor::from_slice(&e, &x, &[n, c, h, w], "x").unwrap();
        let (y, idx) = max_pool2d(&tx, cfg).unwrap();
        let (want, want_idx, ho, wo) = pool_ref(&x, n * c, h, w, cfg);
        assert_eq!(y.shape(), &[n, c, ho, wo]);
        let got = y.to_vec().unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w || (g.is_nan() && w.is_nan()), "pool {i}: {g} vs {w}");
        }
        let gi: Vec<usize> = idx.to_vec().unwrap().iter().map(|&v| v as usize).collect();
        assert_eq!(gi, want_idx, "indices (the first maximum wins)");
        let r = rng.vec(got.len());
        let g = Tensor::from_slice(&e, &r, y.shape(), "g").unwrap();
        let dx = max_pool2d_backward(&tx, &idx, &g, cfg)
            .unwrap()
            .to_vec()
            .unwrap();
        let mut want = vec![0.0f64; x.len()];
        for (o, &pos) in want_idx.iter().enumerate() {
            let plane = o / (ho * wo);
            want[plane * h * w + pos] += r[o] as f64;
        }
        let err = max_rel_err(&dx, &want);
        assert!(err < TOL, "pool backward {k}/{s}/{p}: {err}");
    }
    let x = Tensor::from_slice(&e, &[0.0; 16], &[1, 1, 4, 4], "x").unwrap();
    let bad = PoolConfig {
        kernel: 2,
        stride: 1,
        padding: 2,
    };
    assert!(
        max_pool2d(&x, bad).is_err(),
        "padding above half the kernel"
    );
    // The widest window one invocation walks (128×128 taps, and as many
    // windows holding a middle position in backward: 255 = 2·128 − 1 at
    // stride 1) pools right; a wider one is refused, naming the bound,
    // rather than cut short on llvmpipe.
    let (h, k) = (255, 128);
    let xs: Vec<f32> = (0..h * h).map(|i| ((i * 37) % 1009) as f32).collect();
    let x = Tensor::from_slice(&e, &xs, &[1, 1, h, h], "x").unwrap();
    let cfg = PoolConfig {
        kernel: k,
        stride: 1,
        padding: 0,
    };
    let (y, idx) = max_pool2d(&x, cfg).unwrap();
    let ho = h - k + 1;
    let (y, idx) = (y.to_vec().unwrap(), idx.to_vec().unwrap());
    // The window maxima separably: along rows, then down columns.
    let rows: Vec<f32> = (0..h * ho)
        .map(|i| {
            let (r, c) = (i / ho, i % ho);
            xs[r * h + c..r * h + c + k]
                .iter()
                .copied()
                .fold(f32::MIN, f32::max)
        })
        .collect();
    for (o, (&got, &at)) in y.iter().zip(&idx).enumerate() {
        let (oy, ox) = (o / ho, o % ho);
        let want = (oy..oy + k)
            .map(|r| rows[r * ho + ox])
            .fold(f32::MIN, f32::max);
        assert_eq!(got, want, "{k}×{k} window at {o}");
        assert_eq!(xs[at as usize], want, "index at {o}");
        let (iy, ix) = (at as usize / h, at as usize % h);
        assert!(
            (oy..oy + k).contains(&iy) && (ox..ox + k).contains(&ix),
            "index at {o}"
        );
    }
    let ones = Tensor::from_slice(&e, &vec![1.0; y.len()], &[1, 1, ho, ho], "g").unwrap();
    let tidx = Tensor::from_slice(&e, &idx, &[1, 1, ho, ho], "idx").unwrap();
    let dx = max_pool2d_backward(&x, &tidx, &ones, cfg)
        .unwrap()
        .to_vec()
        .unwrap();
    let mut want = vec![0.0f32; h * h];
    for &at in &idx {
        want[at as usize] += 1.0;
    }
    assert_eq!(dx, want, "{k}×{k} window backward");
    let err = max_pool2d(
        &x,
        PoolConfig {
            kernel: k + 1,
            ..cfg
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("129×129") && err.contains("up to 128×128"),
        "{err}"
    );
}

#[test]
fn strided_7x7_stem_convolution_without_bias_matches_f64() {
    let e = engine();
    let mut rng = Rng::new(24);
    let (n, c, h, w, o, k) = (2, 3, 19, 17, 5, 7);
    let cfg = Conv2dConfig {
        stride: 2,
        padding: 3,
    };
    let x = rng.vec(n * c * h * w);
    let wt = rng.vec(o * c * k * k);
    let (want, ho, wo) = conv2d_ref(
        &to_f64(&x),
        &to_f64(&wt),
        &vec![0.0; o],
        (n, c, h, w),
        (o, k, k),
        2,
        3,
    );
    let tx = Tensor::from_slice(&e, &x, &[n, c, h, w], "x").unwrap();
    let tw = Tensor::from_slice(&e, &wt, &[o, c, k, k], "w").unwrap();
    let y = conv2d(&tx, &tw, None, cfg).unwrap();
    assert_eq!(y.shape(), &[n, o, ho, wo]);
    let err = max_rel_err(&y.to_vec().unwrap(), &want);
    assert!(err < TOL, "forward: {err}");
    let r = rng.vec(y.numel());
    let dy = Tensor::from_slice(&e, &r, y.shape(), "dy").unwrap();
    let (dx, dw, db) = conv2d_backward_ex(&tx, &tw, &dy, cfg, true, false).unwrap();
    assert!(db.is_none(), "no bias, no bias gradient");
    let (xd, wd, rd) = (to_f64(&x), to_f64(&wt), to_f64(&r));
    let loss = |xv: &[f64], wv: &[f64]| {
        dot(
            &conv2d_ref(xv, wv, &vec![0.0; o], (n, c, h, w), (o, k, k), 2, 3).0,
            &rd,
        )
    };
    // Finite differences on a few entries (the loss is linear in each).
    let (gx, gw) = (dx.unwrap().to_vec().unwrap(), dw.to_vec().unwrap());
    for i in [0, 17, 400, xd.len() - 1] {
        let mut xp = xd.clone();
        xp[i] += 1.0;
        let want = loss(&xp, &wd) - loss(&xd, &wd);
        assert!(
            (gx[i] as f64 - want).abs() < 1e-4 * want.abs().max(1.0),
            "dx[{i}]"
        );
    }
    for i in [0, 33, wd.len() - 1] {
        let mut wp = wd.clone();
        wp[i] += 1.0;
        let want = loss(&xd, &wp) - loss(&xd, &wd);
        assert!(
            (gw[i] as f64 - want).abs() < 1e-4 * want.abs().max(1.0),
            "dw[{i}]"
        );
    }
}
