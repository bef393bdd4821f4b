//! GPT's ops (LayerNorm, GELU, embedding, positions, head split, causal
//! softmax) forward and backward on the GPU against f64 CPU references on
//! awkward sizes; each reference's backward is checked against finite
//! differences in f64 first, so the references themselves are right.

use crate::common;
use common::*;
use vramlab::ops::embedding::{
    add_positions, add_positions_backward, embedding, embedding_backward,
};
use vramlab::ops::gelu::{gelu, gelu_backward};
use vramlab::ops::layernorm::{layernorm, layernorm_backward};
use vramlab::ops::softmax::{softmax_backward, softmax_causal};
use vramlab::ops::swap_axes::swap_axes_12;
use vramlab::tensor::Tensor;

const TOL: f64 = 1e-4;

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn layernorm_ref(x: &[f64], w: &[f64], b: &[f64], cols: usize, eps: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let m = row.iter().sum::<f64>() / cols as f64;
        let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / cols as f64;
        let rs = 1.0 / (v + eps).sqrt();
        y.extend(
            row.iter()
                .enumerate()
                .map(|(j, a)| (a - m) * rs * w[j] + b[j]),
        );
    }
    y
}

/// (dx, dw, db) of Σ r·layernorm(x), analytically.
fn layernorm_grad_ref(
    x: &[f64],
    w: &[f64],
    r: &[f64],
    cols: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw, mut db) = (Vec::new(), vec![0.0; cols], vec![0.0; cols]);
    for (row, g) in x.chunks(cols).zip(r.chunks(cols)) {
        let m = row.iter().sum::<f64>() / cols as f64;
        let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / cols as f64;
        let rs = 1.0 / (v + eps).sqrt();
        let xh: Vec<f64> = row.iter().map(|a| (a - m) * rs).collect();
        let gw: Vec<f64> = (0..cols).map(|j| g[j] * w[j]).collect();
        let c1 = gw.iter().sum::<f64>() / cols as f64;
        let c2 = dot(&gw, &xh) / cols as f64;
        dx.extend((0..cols).map(|j| rs * (gw[j] - c1 - xh[j] * c2)));
        for j in 0..cols {
            dw[j] += g[j] * xh[j];
            db[j] += g[j];
        }
    }
    (dx, dw, db)
}

fn gelu_ref(v: f64) -> f64 {
    let k0 = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * v * (1.0 + (k0 * (v + 0.044715 * v * v * v)).tanh())
}

fn gelu_grad_ref(v: f64) -> f64 {
    let k0 = (2.0 / std::f64::consts::PI).sqrt();
    let t = (k0 * (v + 0.044715 * v * v * v)).tanh();
    0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k0 * (1.0 + 3.0 * 0.044715 * v * v)
}

/// Causal softmax of scale·x over [.., s, s].
fn causal_ref(x: &[f64], s: usize, scale: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (r, row) in x.chunks(s).enumerate() {
        let i = r % s;
        let m = row[..=i].iter().map(|v| v * scale).fold(f64::MIN, f64::max);
        let z: f64 = row[..=i].iter().map(|v| (v * scale - m).exp()).sum();
        for j in 0..=i {
            y[r * s + j] = (row[j] * scale - m).exp() / z;
        }
    }
    y
}

fn causal_grad_ref(y: &[f64], g: &[f64], s: usize, scale: f64) -> Vec<f64> {
    let mut dx = Vec::with_capacity(y.len());
    for (yr, gr) in y.chunks(s).zip(g.chunks(s)) {
        let d = dot(yr, gr);
        dx.extend((0..s).map(|j| scale * yr[j] * (gr[j] - d)));
    }
    dx
}

#[test]
fn references_match_finite_differences() {
    let mut rng = Rng::new(3);
    let (rows, cols, eps) = (3, 5, 1e-5);
    let x = to_f64(&rng.vec(rows * cols));
    let w = to_f64(&rng.vec(cols));
    let b = to_f64(&rng.vec(cols));
    let r = to_f64(&rng.vec(rows * cols));
    let (dx, dw, db) = layernorm_grad_ref(&x, &w, &r, cols, eps);
    let num = numeric_grad(&x, |x| dot(&layernorm_ref(x, &w, &b, cols, eps), &r));
    let numw = numeric_grad(&w, |w| dot(&layernorm_ref(&x, w, &b, cols, eps), &r));
    let numb = numeric_grad(&b, |b| dot(&layernorm_ref(&x, &w, b, cols, eps), &r));
    for (a, n) in [(&dx, &num), (&dw, &numw), (&db, &numb)] {
        for (p, q) in a.iter().zip(n.iter()) {
            assert!((p - q).abs() < 1e-6, "layernorm reference {p} vs {q}");
        }
    }
    for v in [-3.1, -0.4, 0.0, 0.7, 2.5] {
        let n = (gelu_ref(v + 1e-6) - gelu_ref(v - 1e-6)) / 2e-6;
        assert!((gelu_grad_ref(v) - n).abs() < 1e-7, "gelu reference at {v}");
    }
    let s = 4;
    let xs = to_f64(&rng.vec(2 * s * s));
    let g = to_f64(&rng.vec(2 * s * s));
    let y = causal_ref(&xs, s, 0.7);
    let num = numeric_grad(&xs, |x| dot(&causal_ref(x, s, 0.7), &g));
    for (p, q) in causal_grad_ref(&y, &g, s, 0.7).iter().zip(&num) {
        assert!((p - q).abs() < 1e-6, "causal softmax reference {p} vs {q}");
    }
}

#[test]
fn layernorm_matches_f64() {
    let e = engine();
    let mut rng = Rng::new(11);
    // (rows, cols): one row, one column, odd sizes, rows longer than a
    // workgroup's 256 invocations, many rows for the parameter gradients.
    for (rows, cols) in [
        (1, 1),
        (1, 7),
        (5, 3),
        (7, 129),
        (3, 769),
        (2, 70_001),
        (37, 64),
        (301, 13),
    ] {
        let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| 3.0 * v + 0.5).collect();
        let w = rng.vec(cols);
        let b = rng.vec(cols);
        let r = rng.vec(rows * cols);
        let tx = Tensor::from_slice(&e, &x, &[rows, cols], "x").unwrap();
        let tw = Tensor::from_slice(&e, &w, &[cols], "w").unwrap();
        let tb = Tensor::from_slice(&e, &b, &[cols], "b").unwrap();
        let out = layernorm(&tx, &tw, &tb, 1e-5).unwrap();
        let want = layernorm_ref(&to_f64(&x), &to_f64(&w), &to_f64(&b), cols, 1e-5);
        let err = max_rel_err(&out.y.to_vec().unwrap(), &want);
        assert!(err < TOL, "layernorm {rows}x{cols} forward: {err}");
        let g = Tensor::from_slice(&e, &r, &[rows, cols], "g").unwrap();
        let (dx, dw, db) = layernorm_backward(&tx, &tw, &out.mean, &out.rstd, &g).unwrap();
        let (wdx, wdw, wdb) = layernorm_grad_ref(&to_f64(&x), &to_f64(&w), &to_f64(&r), cols, 1e-5);
        if cols > 1 {
            // (With one column x̂ is 0 and dx is 0 up to rounding.)
            let err = max_rel_err(&dx.to_vec().unwrap(), &wdx);
            assert!(err < TOL, "layernorm {rows}x{cols} dx: {err}");
            let err = max_rel_err(&dw.to_vec().unwrap(), &wdw);
            assert!(err < TOL, "layernorm {rows}x{cols} dw: {err}");
        }
        let err = max_rel_err(&db.to_vec().unwrap(), &wdb);
        assert!(err < TOL, "layernorm {rows}x{cols} db: {err}");
    }
}

#[test]
fn layernorm_refuses_bad_shapes() {
    let e = engine();
    let x = Tensor::from_slice(&e, &[1.0; 6], &[2, 3], "x").unwrap();
    let w = Tensor::from_slice(&e, &[1.0; 2], &[2], "w").unwrap();
    let err = layernorm(&x, &w, &w, 1e-5)
        .err()
        .expect("a [2] weight for 3 columns");
    assert!(err.to_string().contains("layernorm"), "{err}");
}

#[test]
fn gelu_matches_f64() {
    let e = engine();
    let mut rng = Rng::new(12);
    for n in [1, 255, 257, 1000] {
        let mut x: Vec<f32> = rng.vec(n).iter().map(|v| 6.0 * v).collect();
        // Far tails: tanh saturates (and must not turn into NaN).
        if n > 1 {
            x[0] = -60.0;
            x[n - 1] = 60.0;
        }
        let r = rng.vec(n);
        let tx = Tensor::from_slice(&e, &x, &[n], "x").unwrap();
        let y = gelu(&tx).unwrap();
        let want: Vec<f64> = x.iter().map(|&v| gelu_ref(v as f64)).collect();
        let err = max_rel_err(&y.to_vec().unwrap(), &want);
        assert!(err < TOL, "gelu forward n={n}: {err}");
        let g = Tensor::from_slice(&e, &r, &[n], "g").unwrap();
        let dx = gelu_backward(&tx, &g).unwrap().to_vec().unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&r)
            .map(|(&v, &g)| gelu_grad_ref(v as f64) * g as f64)
            .collect();
        let err = max_rel_err(&dx, &want);
        assert!(err < TOL, "gelu backward n={n}: {err}");
    }
}

#[test]
fn embedding_and_positions_match_f64() {
    let e = engine();
    let mut rng = Rng::new(13);
    for (v, d, n, s) in [(1, 1, 1, 1), (7, 5, 3, 4), (96, 33, 5, 17)] {
        let table = rng.vec(v * d);
        // Repeated indices: their gradients must add up.
        let idx: Vec<f32> = (0..n * s).map(|_| rng.below(v as u64) as f32).collect();
        let tt = Tensor::from_slice(&e, &table, &[v, d], "table").unwrap();
        let ti = Tensor::from_slice(&e, &idx, &[n * s], "idx").unwrap();
        let y = embedding(&tt, &ti).unwrap();
        assert_eq!(y.shape(), &[n * s, d]);
        let want: Vec<f64> = idx
            .iter()
            .flat_map(|&t| table[t as usize * d..][..d].iter().map(|&a| a as f64))
            .collect();
        assert_eq!(
            max_rel_err(&y.to_vec().unwrap(), &want),
            0.0,
            "gather {v}x{d}"
        );
        let r = rng.vec(n * s * d);
        let g = Tensor::from_slice(&e, &r, &[n * s, d], "g").unwrap();
        let dt = embedding_backward(&ti, &g, v).unwrap();
        let mut want = vec![0.0f64; v * d];
        for (t, &i) in idx.iter().enumerate() {
            for k in 0..d {
                want[i as usize * d + k] += r[t * d + k] as f64;
            }
        }
        let err = max_rel_err(&dt.to_vec().unwrap(), &want);
        assert!(err < TOL, "embedding backward {v}x{d}: {err}");

        // Positions: a table of s + 2 rows, the last two unused.
        let p = s + 2;
        let pos = rng.vec(p * d);
        let tp = Tensor::from_slice(&e, &pos, &[p, d], "pos").unwrap();
        let x3 = y.reshape(&[n, s, d]).unwrap();
        let z = add_positions(&x3, &tp).unwrap().to_vec().unwrap();
        let yv = y.to_vec().unwrap();
        let want: Vec<f64> = (0..n * s * d)
            .map(|i| yv[i] as f64 + pos[i % (s * d)] as f64)
            .collect();
        let err = max_rel_err(&z, &want);
        assert!(err < TOL, "position add: {err}");
        let g3 = g.reshape(&[n, s, d]).unwrap();
        let dp = add_positions_backward(&g3, &tp).unwrap().to_vec().unwrap();
        let mut want = vec![0.0f64; p * d];
        for i in 0..n * s * d {
            want[i % (s * d)] += r[i] as f64;
        }
        let err = max_rel_err(&dp, &want);
        assert!(err < TOL, "position backward: {err}");
        assert!(
            dp[s * d..].iter().all(|&a| a == 0.0),
            "unused positions get 0"
        );
    }
}

#[test]
fn embedding_backward_over_the_loop_limit() {
    // More tokens than one kernel loop may walk on llvmpipe (16,384): the
    // scatter runs in chunks that accumulate.
    let e = engine();
    let (v, d, t) = (3, 2, 40_000);
    let idx: Vec<f32> = (0..t).map(|i| (i % v) as f32).collect();
    let ti = Tensor::from_slice(&e, &idx, &[t], "idx").unwrap();
    let g = Tensor::from_slice(&e, &vec![1.0; t * d], &[t, d], "g").unwrap();
    let dt = embedding_backward(&ti, &g, v).unwrap().to_vec().unwrap();
    let want: Vec<f64> = (0..v * d)
        .map(|i| ((t + v - 1 - i / d) / v) as f64)
        .collect();
    assert_eq!(max_rel_err(&dt, &want), 0.0, "{dt:?}");
}

#[test]
fn swap_axes_matches_transpose() {
    let e = engine();
    let mut rng = Rng::new(14);
    let (a, b, c, d) = (2, 3, 5, 7);
    let x = rng.vec(a * b * c * d);
    let t = Tensor::from_slice(&e, &x, &[a, b, c, d], "x").unwrap();
    let y = swap_axes_12(&t, "y").unwrap();
    assert_eq!(y.shape(), &[a, c, b, d]);
    let yv = y.to_vec().unwrap();
    for i in 0..a {
        for j in 0..b {
            for k in 0..c {
                for l in 0..d {
                    assert_eq!(
                        yv[((i * c + k) * b + j) * d + l],
                        x[((i * b + j) * c + k) * d + l]
                    );
                }
            }
        }
    }
    let back = swap_axes_12(&y, "back").unwrap().to_vec().unwrap();
    assert_eq!(back, x);
}

#[test]
fn causal_softmax_matches_f64() {
    let e = engine();
    let mut rng = Rng::new(15);
    for (batch, s, scale) in [
        (1, 1, 1.0),
        (3, 5, 0.5),
        (2, 33, 0.125),
        (1, 130, 1.0),
        (1, 300, 0.25),
    ] {
        let x: Vec<f32> = rng.vec(batch * s * s).iter().map(|v| 4.0 * v).collect();
        let tx = Tensor::from_slice(&e, &x, &[batch, s, s], "x").unwrap();
        let y = softmax_causal(&tx, scale).unwrap();
        let want = causal_ref(&to_f64(&x), s, scale as f64);
        let yv = y.to_vec().unwrap();
        let err = max_rel_err(&yv, &want);
        assert!(err < TOL, "causal softmax {batch}x{s}: {err}");
        for (i, (&g, &w)) in yv.iter().zip(&want).enumerate() {
            if w == 0.0 {
                assert_eq!(g, 0.0, "masked position {i} must be exactly 0");
            }
        }
        let r = rng.vec(batch * s * s);
        let g = Tensor::from_slice(&e, &r, &[batch, s, s], "g").unwrap();
        let dx = softmax_backward(&y, &g, scale).unwrap().to_vec().unwrap();
        let want = causal_grad_ref(&want, &to_f64(&r), s, scale as f64);
        let err = max_rel_err(&dx, &want);
        assert!(err < TOL, "causal softmax backward {batch}x{s}: {err}");
    }
    let x = Tensor::from_slice(&e, &[0.0; 6], &[2, 3], "x").unwrap();
    assert!(
        softmax_causal(&x, 1.0).is_err(),
        "non-square scores are refused"
    );
}

#[test]
fn dropout_keeps_one_byte_masks_and_replays_them() {
    use vramlab::ops::dropout::{dropout, dropout_backward};
    let e = engine();
    let mut rng = Rng::new(16);
    let n = 40_001;
    let x: Vec<f32> = rng.vec(n).iter().map(|v| v + 2.0).collect(); // never 0
    let tx = Tensor::from_slice(&e, &x, &[n], "x").unwrap();
    for p in [0.1f32, 0.5] {
        let (y, mask) = dropout(&tx, p, 7).unwrap();
        // One byte per element, four to a word.
        assert_eq!(mask.nbytes(), n.div_ceil(4) * 4);
        let yv = y.to_vec().unwrap();
        let kept = yv.iter().filter(|v| **v != 0.0).count();
        let rate = 1.0 - kept as f64 / n as f64;
        // Binomial: 5 standard deviations.
        let sd = (p as f64 * (1.0 - p as f64) / n as f64).sqrt();
        assert!((rate - p as f64).abs() < 5.0 * sd, "p {p}: dropped {rate}");
        for (a, b) in yv.iter().zip(&x) {
            assert!(
                *a == 0.0 || (*a - b / (1.0 - p)).abs() <= 1e-6 * a.abs(),
                "{a} vs {b}"
            );
        }
        // Backward: the same elements, the same scale.
        let g = Tensor::from_slice(&e, &x, &[n], "g").unwrap();
        let dx = dropout_backward(&g, &mask, p).unwrap().to_vec().unwrap();
        assert_eq!(dx, yv, "dx = g·mask/(1−p) with g = x equals y");
        // A seed gives its mask again; another seed another mask.
        let again = dropout(&tx, p, 7).unwrap().0.to_vec().unwrap();
        assert_eq!(again, yv);
        let other = dropout(&tx, p, 8).unwrap().0.to_vec().unwrap();
        assert_ne!(other, yv);
    }
    assert!(dropout(&tx, 1.0, 0).is_err(), "p = 1 is refused");
}

/// A checkpointed GPT with dropout recomputes its blocks with the masks of
/// the forward, so its gradients equal the plain run's.
#[test]
fn checkpointed_gpt_with_dropout_gives_the_plain_gradients() {
    use vramlab::nn::{ModelSpec, ParamStore};
    use vramlab::train::Batch;
    let e = engine();
    // The tests' small gpt, with dropout.
    let small = small("gpt");
    let vramlab::nn::GptSpec { config, seq, .. } = *small
        .get::<vramlab::nn::GptSpec>()
        .expect("small(\"gpt\") is a gpt");
    let spec = ModelSpec::from(vramlab::nn::GptSpec {
        config,
        seq,
        dropout: 0.3,
    });
    let mut grads = Vec::new();
    for checkpointed in [false, true] {
        let mut store = ParamStore::new();
        let model = spec.build(&e, &mut store, &mut Rng::new(1)).unwrap();
        let b =
            Batch::random_for(&e, &mut Rng::new(2), &spec, 3, vramlab::tensor::DType::F32).unwrap();
        grads.push(grads_of(model.as_ref(), &mut store, &b, checkpointed));
    }
    for (a, b) in grads[0].iter().zip(&grads[1]) {
        let err = max_rel_err(a, &to_f64(b));
        assert!(err < 1e-5, "checkpointed gradient differs: {err}");
    }
}
