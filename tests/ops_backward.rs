//! Training ops (conv2d, linear, relu, cross-entropy) forward and backward on
//! the GPU against f64 CPU references on awkward sizes, and the references'
//! own gradients against finite differences in f64.

use crate::common;
use common::*;
use vramlab::ops::conv2d::{conv2d, conv2d_backward, Conv2dConfig};
use vramlab::ops::cross_entropy::{cross_entropy, cross_entropy_backward};
use vramlab::ops::linear::{linear, linear_backward};
use vramlab::ops::relu::{relu, relu_backward};
use vramlab::tensor::Tensor;

const TOL: f64 = 1e-4;

/// Loss = Σ y·r for a fixed random r, so dL/dy = r: checks any backward.
fn weighted_sum(y: &[f64], r: &[f64]) -> f64 {
    y.iter().zip(r).map(|(a, b)| a * b).sum()
}

#[test]
fn conv2d_forward_and_backward_match_f64() {
    let e = engine();
    let mut rng = Rng::new(10);
    // (n, c, h, w), (o, kh, kw), stride, pad
    let cases = [
        ((1, 1, 1, 1), (1, 1, 1), 1, 0),
        ((2, 3, 7, 5), (4, 3, 3), 1, 0),
        ((3, 2, 9, 8), (5, 3, 2), 2, 1),
        ((1, 7, 6, 6), (3, 1, 1), 1, 0),
        ((2, 3, 11, 11), (33, 5, 5), 3, 2),
        // K = 576 on one small image: the product splits K into partial
        // sums, so the bias is added after them rather than in the epilogue.
        ((1, 64, 5, 5), (3, 3, 3), 1, 1),
        // Stride 1, square kernels: dX is computed as a convolution of dY
        // with the flipped kernel (transposed padding KH−1−P = 2, 0, 4).
        ((2, 5, 9, 7), (6, 5, 5), 1, 2),
        ((3, 4, 8, 6), (7, 3, 3), 1, 2),
        ((2, 3, 6, 7), (4, 5, 5), 1, 0),
        // Stride 1 with a non-square kernel: the im2col route.
        ((2, 3, 6, 7), (4, 3, 2), 1, 1),
    ];
    for ((n, c, h, w), (o, kh, kw), stride, pad) in cases {
        let x = rng.vec(n * c * h * w);
        let wt = rng.vec(o * c * kh * kw);
        let b = rng.vec(o);
        let (want, ho, wo) = conv2d_ref(
            &to_f64(&x),
            &to_f64(&wt),
            &to_f64(&b),
            (n, c, h, w),
            (o, kh, kw),
            stride,
            pad,
        );
        let tx = Tensor::from_slice(&e, &x, &[n, c, h, w], "x").unwrap();
        let tw = Tensor::from_slice(&e, &wt, &[o, c, kh, kw], "w").unwrap();
        let tb = Tensor::from_slice(&e, &b, &[o], "b").unwrap();
        let cfg = Conv2dConfig {
            stride,
            padding: pad,
        };
        let y = conv2d(&tx, &tw, Some(&tb), cfg).unwrap();
        assert_eq!(y.shape(), &[n, o, ho, wo]);
        let err = max_rel_err(&y.to_vec().unwrap(), &want);
        assert!(err < TOL, "forward {n}x{c}x{h}x{w} * {o}x{kh}x{kw}: {err}");

        let r = rng.vec(y.numel());
        let rf = to_f64(&r);
        let dy = Tensor::from_slice(&e, &r, y.shape(), "dy").unwrap();
        let (dx, dw, db) = conv2d_backward(&tx, &tw, &dy, cfg, true).unwrap();
        let (xf, wf, bf) = (to_f64(&x), to_f64(&wt), to_f64(&b));
        let loss = |xx: &[f64], ww: &[f64], bb: &[f64]| {
            weighted_sum(
                &conv2d_ref(xx, ww, bb, (n, c, h, w), (o, kh, kw), stride, pad).0,
                &rf,
            )
        };
        let gx = numeric_grad(&xf, |v| loss(v, &wf, &bf));
        let gw = numeric_grad(&wf, |v| loss(&xf, v, &bf));
        let gb = numeric_grad(&bf, |v| loss(&xf, &wf, v));
        for (name, got, want) in [("dx", dx.unwrap(), gx), ("dw", dw, gw), ("db", db, gb)] {
            let err = max_rel_err(&got.to_vec().unwrap(), &want);
            assert!(
                err < TOL,
                "{name} for {n}x{c}x{h}x{w} * {o}x{kh}x{kw} s{stride} p{pad}: {err}"
            );
        }
    }
}

#[test]
fn linear_forward_and_backward_match_f64() {
    let e = engine();
    let mut rng = Rng::new(11);
    for (n, i, o) in [(1, 1, 1), (7, 33, 5), (65, 257, 10), (3, 1, 70)] {
        let (x, w, b) = (rng.vec(n * i), rng.vec(o * i), rng.vec(o));
        let f = |xx: &[f64], ww: &[f64], bb: &[f64]| linear_ref(xx, ww, bb, n, i, o);
        let (xf, wf, bf) = (to_f64(&x), to_f64(&w), to_f64(&b));
        let tx = Tensor::from_slice(&e, &x, &[n, i], "x").unwrap();
        let tw = Tensor::from_slice(&e, &w, &[o, i], "w").unwrap();
        let tb = Tensor::from_slice(&e, &b, &[o], "b").unwrap();
        let y = linear(&tx, &tw, Some(&tb)).unwrap();
        assert!(max_rel_err(&y.to_vec().unwrap(), &f(&xf, &wf, &bf)) < TOL);
        let r = rng.vec(n * o);
        let rf = to_f64(&r);
        let dy = Tensor::from_slice(&e, &r, &[n, o], "dy").unwrap();
        let (dx, dw, db) = linear_backward(&tx, &tw, &dy, true, true).unwrap();
        let gx = numeric_grad(&xf, |v| weighted_sum(&f(v, &wf, &bf), &rf));
        let gw = numeric_grad(&wf, |v| weighted_sum(&f(&xf, v, &bf), &rf));
        let gb = numeric_grad(&bf, |v| weighted_sum(&f(&xf, &wf, v), &rf));
        for (name, got, want) in [
            ("dx", dx.unwrap(), gx),
            ("dw", dw, gw),
            ("db", db.unwrap(), gb),
        ] {
            let err = max_rel_err(&got.to_vec().unwrap(), &want);
            assert!(err < TOL, "{name} {n}x{i}->{o}: {err}");
        }
    }
}

#[test]
fn relu_backward_masks_by_output() {
    let e = engine();
    let mut rng = Rng::new(12);
    // Multiples of 4 take the f32 vec4 variants, the others the pairwise ones.
    for n in [1, 7, 257, 1000, 4096, 4097] {
        let x = rng.vec(n);
        let r = rng.vec(n);
        let tx = Tensor::from_slice(&e, &x, &[n], "x").unwrap();
        let y = relu(&tx).unwrap();
        let dy = Tensor::from_slice(&e, &r, &[n], "dy").unwrap();
        let dx = relu_backward(&y, &dy).unwrap().to_vec().unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&r)
            .map(|(&a, &g)| if a > 0.0 { g as f64 } else { 0.0 })
            .collect();
        assert!(max_rel_err(&dx, &want) < TOL);
    }
}

#[test]
fn cross_entropy_matches_f64_and_is_stable() {
    let e = engine();
    let mut rng = Rng::new(13);
    for (n, c) in [(1, 1), (1, 7), (33, 10), (257, 3)] {
        let mut x = rng.vec(n * c);
        // Large logits: a naive exp would overflow f32.
        x.iter_mut().step_by(3).for_each(|v| *v *= 100.0);
        let labels: Vec<usize> = (0..n).map(|_| rng.below(c as u64) as usize).collect();
        let lf: Vec<f32> = labels.iter().map(|&l| l as f32).collect();
        let xf = to_f64(&x);
        let tx = Tensor::from_slice(&e, &x, &[n, c], "logits").unwrap();
        let tl = Tensor::from_slice(&e, &lf, &[n], "labels").unwrap();
        let loss = cross_entropy(&tx, &tl).unwrap().to_vec().unwrap();
        let want = cross_entropy_ref(&xf, &labels, c);
        assert!(
            max_rel_err(&loss, &[want]) < TOL,
            "{n}x{c}: {} vs {want}",
            loss[0]
        );
        let g = 0.7f32;
        let dl = Tensor::from_slice(&e, &[g], &[1], "dloss").unwrap();
        let dx = cross_entropy_backward(&tx, &tl, &dl)
            .unwrap()
            .to_vec()
            .unwrap();
        let num: Vec<f64> = numeric_grad(&xf, |v| cross_entropy_ref(v, &labels, c))
            .iter()
            .map(|v| v * g as f64)
            .collect();
        let err = max_rel_err(&dx, &num);
        assert!(err < TOL, "{n}x{c}: {err}");
    }
}

/// The loss family's row kernels (log_softmax and its backward, fused
/// cross-entropy forward and backward) against f64 on generated widths,
/// past 256 and past 65,535 classes: a row reduced by one invocation's loop
/// left a GPU idle, and llvmpipe ends any invocation's loops after 65,535
/// iterations in all, so GPT-2's 50,257-way loss read 1.93 instead of 10.8.
#[test]
fn loss_rows_match_f64_at_any_width() {
    use vramlab::ops::nll::{log_softmax, log_softmax_backward};
    let e = engine();
    let mut rng = Rng::new(29);
    let mut cases = vec![
        (1, 1),
        (3, 255),
        (2, 257),
        (5, 70_001),
        (1, 200_003),
        (300, 17),
    ];
    for _ in 0..4 {
        cases.push((1 + rng.below(40) as usize, 1 + rng.below(100_000) as usize));
    }
    for (n, c) in cases {
        let x: Vec<f32> = rng.vec(n * c).iter().map(|v| v * 8.0).collect();
        let gy = rng.vec(n * c);
        let labels: Vec<usize> = (0..n).map(|_| rng.below(c as u64) as usize).collect();
        let lf: Vec<f32> = labels.iter().map(|&l| l as f32).collect();
        let (mut want_y, mut want_dx, mut want_ce_dx) = (vec![], vec![], vec![]);
        let mut want_loss = 0.0;
        let g = 0.7f64;
        for r in 0..n {
            let row = &x[r * c..(r + 1) * c];
            let m = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
            let y: Vec<f64> = row.iter().map(|&v| v as f64 - m - s.ln()).collect();
            let gs: f64 = gy[r * c..(r + 1) * c].iter().map(|&v| v as f64).sum();
            for (j, yj) in y.iter().enumerate() {
                want_dx.push(gy[r * c + j] as f64 - yj.exp() * gs);
                let onehot = if j == labels[r] { 1.0 } else { 0.0 };
                want_ce_dx.push((yj.exp() - onehot) * g / n as f64);
            }
            want_loss -= y[labels[r]] / n as f64;
            want_y.extend(y);
        }
        let what = format!("{n}×{c}");
        let tx = Tensor::from_slice(&e, &x, &[n, c], "logits").unwrap();
        let tg = Tensor::from_slice(&e, &gy, &[n, c], "g").unwrap();
        let tl = Tensor::from_slice(&e, &lf, &[n], "labels").unwrap();
        let y = log_softmax(&tx).unwrap();
        let err = max_rel_err(&y.to_vec().unwrap(), &want_y);
        assert!(err < TOL, "log_softmax {what}: {err}");
        let dx = log_softmax_backward(&tg, &y).unwrap().to_vec().unwrap();
        let err = max_rel_err(&dx, &want_dx);
        assert!(err < TOL, "log_softmax backward {what}: {err}");
        let loss = cross_entropy(&tx, &tl).unwrap().to_vec().unwrap();
        let err = max_rel_err(&loss, &[want_loss]);
        assert!(
            err < TOL,
            "cross_entropy {what}: {} vs {want_loss}",
            loss[0]
        );
        let dl = Tensor::from_slice(&e, &[g as f32], &[1], "dloss").unwrap();
        let dx = cross_entropy_backward(&tx, &tl, &dl)
            .unwrap()
            .to_vec()
            .unwrap();
        let err = max_rel_err(&dx, &want_ce_dx);
        assert!(err < TOL, "cross_entropy backward {what}: {err}");
    }
    // Past the longest row a workgroup walks within llvmpipe's loop budget,
    // the loss kernels refuse, naming it, rather than return a cut row.
    let c = vramlab::ops::LONGEST_REDUCED_ROW + 1;
    let tx = Tensor::empty(&e, &[1, c], vramlab::tensor::DType::F32, "logits").unwrap();
    let tl = Tensor::from_slice(&e, &[0.0], &[1], "labels").unwrap();
    for err in [
        log_softmax(&tx).unwrap_err().to_string(),
        cross_entropy(&tx, &tl).unwrap_err().to_string(),
    ] {
        assert!(err.contains(&format!("1..={}", c - 1)), "{err}");
    }
}

/// `nll_loss` sums every row however many there are: one workgroup walks at
/// most 256 × 16,384 rows a dispatch (llvmpipe cut the sum short past about
/// 16.77M rows in one), so longer batches take several, each adding to the
/// loss. Values are quarters, so each invocation's sum is exact and only the
/// last few additions round.
#[test]
fn nll_loss_sums_rows_past_one_dispatch() {
    use vramlab::ops::nll::nll_loss;
    let e = engine();
    let step = 256 * vramlab::ops::MAX_LOOP_ITERATIONS;
    for (rows, classes) in [(5, 3), (step + 7, 2), (4 * step + 1_234_567, 1)] {
        let logp: Vec<f32> = (0..rows * classes)
            .map(|i| -(((i * 7 + i / 5) % 13) as f32) / 4.0 - 0.25)
            .collect();
        let labels: Vec<f32> = (0..rows).map(|r| (r * 3 % classes) as f32).collect();
        let want = -(0..rows)
            .map(|r| logp[r * classes + labels[r] as usize] as f64)
            .sum::<f64>()
            / rows as f64;
        let tx = Tensor::from_slice(&e, &logp, &[rows, classes], "logp").unwrap();
        let tl = Tensor::from_slice(&e, &labels, &[rows], "labels").unwrap();
        let (loss, total) = nll_loss(&tx, &tl).unwrap();
        let got = loss.to_vec().unwrap()[0];
        let err = max_rel_err(&[got], &[want]);
        assert!(err < 1e-6, "nll_loss {rows}×{classes}: {got} vs {want}");
        assert_eq!(total.to_vec().unwrap(), vec![rows as f32], "{rows}");
    }
}
