//! Every op and backward in f16 and bf16 against f64, on random inputs of
//! odd sizes. The inputs are rounded to the dtype first and the f64
//! reference computes on those very values, so what is measured is the
//! kernels' own error.
//!
//! Tolerances, with u the unit roundoff (f16 2^-11 ≈ 4.9e-4, bf16 2^-8 ≈
//! 3.9e-3): an elementwise op computes in f32 and rounds once, so each
//! element is within u of the exact result (plus half the smallest f16
//! subnormal, 2^-25, where results are tiny). Products and reductions sum
//! in f32 and round once, but the input gradient of a strided convolution
//! passes through a 16-bit `grad_im2col` workspace and col2im sums up to
//! KH·KW of its rounded values (a stride-1 one over an even H·W is the
//! flipped kernel's convolution, rounded once), so those results are
//! judged norm-wise, within 4u.

use crate::common;
use common::*;
use vramlab::nn::ParamStore;
use vramlab::ops::bias::sum_channels;
use vramlab::ops::conv2d::{conv2d, conv2d_backward, Conv2dConfig};
use vramlab::ops::elementwise::{add, mul, sqdiff, sub};
use vramlab::ops::linear::{linear, linear_backward};
use vramlab::ops::mean::{mean_axis, mean_axis_backward, Axis};
use vramlab::ops::relu::{relu, relu_backward};
use vramlab::optim::{Adam, Optimizer, OptimizerImpl, Sgd};
use vramlab::tensor::{DType, Engine, Tensor};

fn unit(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-11),
        DType::Bf16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
    }
}

/// Every element within one rounding of the exact value.
fn assert_one_rounding(got: &[f32], want: &[f64], d: DType, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let bound = unit(d) * w.abs() + 2f64.powi(-25);
        assert!(
            (*g as f64 - w).abs() <= bound,
            "{what} [{i}]: {g} vs exact {w} (more than one {d} rounding off)"
        );
    }
}

/// Random values already representable in `d`, uploaded in `d`.
fn rounded(e: &Engine, rng: &mut Rng, shape: &[usize], d: DType) -> (Vec<f32>, Tensor) {
    let n = shape.iter().product();
    let v: Vec<f32> = rng.vec(n).iter().map(|&x| d.round(x)).collect();
    let t = Tensor::from_f32_as(e, &v, shape, d, "input").unwrap();
    (v, t)
}

const DTYPES: [DType; 2] = [DType::F16, DType::Bf16];

#[test]
fn elementwise_ops_round_once() {
    let e = engine();
    let mut rng = Rng::new(31);
    for d in DTYPES {
        for n in [1, 7, 257, 1001] {
            let (a, ta) = rounded(&e, &mut rng, &[n], d);
            let (b, tb) = rounded(&e, &mut rng, &[n], d);
            let exact = |f: fn(f64, f64) -> f64| -> Vec<f64> {
                a.iter()
                    .zip(&b)
                    .map(|(x, y)| f(*x as f64, *y as f64))
                    .collect()
            };
            for (name, got, want) in [
                ("add", add(&ta, &tb).unwrap(), exact(|x, y| x + y)),
                ("sub", sub(&ta, &tb).unwrap(), exact(|x, y| x - y)),
                ("mul", mul(&ta, &tb).unwrap(), exact(|x, y| x * y)),
                (
                    "sqdiff",
                    sqdiff(&ta, &tb).unwrap(),
                    exact(|x, y| (x - y) * (x - y)),
                ),
            ] {
                assert_eq!(got.dtype(), d);
                assert_one_rounding(
                    &got.to_vec().unwrap(),
                    &want,
                    d,
                    &format!("{name} {d} n={n}"),
                );
            }
            // ReLU and its backward select values: exact.
            let y = relu(&ta).unwrap();
            let want: Vec<f32> = a.iter().map(|v| v.max(0.0)).collect();
            assert_eq!(y.to_vec().unwrap(), want, "relu {d}");
            let dx = relu_backward(&y, &tb).unwrap().to_vec().unwrap();
            let want: Vec<f32> = a
                .iter()
                .zip(&b)
                .map(|(x, g)| if *x > 0.0 { *g } else { 0.0 })
                .collect();
            assert_eq!(dx, want, "relu backward {d}");
        }
    }
}

#[test]
fn conv2d_forward_and_backward_in_each_dtype() {
    let e = engine();
    let mut rng = Rng::new(32);
    let cases = [
        ((2, 3, 7, 5), (4, 3, 3), 1, 0),
        ((3, 2, 9, 8), (5, 3, 2), 2, 1),
        ((1, 5, 6, 7), (3, 1, 1), 1, 0),
        // Odd output widths and a long K: the 16-bit product is summed in
        // an f32 workspace over split K, where the 16-bit bias once failed
        // ("bias: operands are f32 and f16"; resnet-mini at resolution 9).
        ((1, 64, 5, 5), (3, 3, 3), 1, 1),
        ((2, 64, 3, 3), (5, 3, 3), 1, 1),
    ];
    for d in DTYPES {
        for ((n, c, h, w), (o, kh, kw), stride, pad) in cases {
            let (x, tx) = rounded(&e, &mut rng, &[n, c, h, w], d);
            let (wt, tw) = rounded(&e, &mut rng, &[o, c, kh, kw], d);
            let (b, tb) = rounded(&e, &mut rng, &[o], d);
            let cfg = Conv2dConfig {
                stride,
                padding: pad,
            };
            let (xf, wf, bf) = (to_f64(&x), to_f64(&wt), to_f64(&b));
            let f = |xx: &[f64], ww: &[f64], bb: &[f64]| {
                conv2d_ref(xx, ww, bb, (n, c, h, w), (o, kh, kw), stride, pad).0
            };
            let y = conv2d(&tx, &tw, Some(&tb), cfg).unwrap();
            assert_eq!(y.dtype(), d);
            let what = format!("conv2d {d} {n}x{c}x{h}x{w} * {o}x{kh}x{kw} s{stride} p{pad}");
            let err = normwise(&y.to_vec().unwrap(), &f(&xf, &wf, &bf));
            assert!(err <= 4.0 * unit(d), "{what} forward: {err:.2e}");
            let (r, tdy) = rounded(&e, &mut rng, y.shape(), d);
            let rf = to_f64(&r);
            let loss = |yy: Vec<f64>| yy.iter().zip(&rf).map(|(a, b)| a * b).sum::<f64>();
            let (dx, dw, db) = conv2d_backward(&tx, &tw, &tdy, cfg, true).unwrap();
            let gx = numeric_grad(&xf, |v| loss(f(v, &wf, &bf)));
            let gw = numeric_grad(&wf, |v| loss(f(&xf, v, &bf)));
            let gb = numeric_grad(&bf, |v| loss(f(&xf, &wf, v)));
            for (name, got, want) in [("dx", dx.unwrap(), gx), ("dw", dw, gw), ("db", db, gb)] {
                assert_eq!(got.dtype(), d, "{what} {name}");
                let err = normwise(&got.to_vec().unwrap(), &want);
                assert!(err <= 4.0 * unit(d), "{what} {name}: {err:.2e}");
            }
        }
    }
}

#[test]
fn swap_axes_copies_each_dtype_exactly() {
    // An odd count: the last 16-bit word holds one element.
    let e = engine();
    let mut rng = Rng::new(35);
    let (a, b, c, d) = (3, 3, 5, 7);
    for dt in DTYPES {
        let (x, tx) = rounded(&e, &mut rng, &[a, b, c, d], dt);
        let y = vramlab::ops::swap_axes::swap_axes_12(&tx, "y").unwrap();
        assert_eq!((y.shape(), y.dtype()), (&[a, c, b, d][..], dt));
        let yv = y.to_vec().unwrap();
        for i in 0..a {
            for j in 0..b {
                for k in 0..c {
                    for l in 0..d {
                        let (got, want) = (
                            yv[((i * c + k) * b + j) * d + l],
                            x[((i * b + j) * c + k) * d + l],
                        );
                        assert_eq!(got, want, "{dt} [{i},{j},{k},{l}]");
                    }
                }
            }
        }
    }
}

#[test]
fn linear_forward_and_backward_in_each_dtype() {
    let e = engine();
    let mut rng = Rng::new(33);
    for d in DTYPES {
        for (n, i, o) in [(1, 1, 1), (7, 33, 5), (65, 257, 10), (3, 1, 70)] {
            let (x, tx) = rounded(&e, &mut rng, &[n, i], d);
            let (w, tw) = rounded(&e, &mut rng, &[o, i], d);
            let (b, tb) = rounded(&e, &mut rng, &[o], d);
            let f = |xx: &[f64], ww: &[f64], bb: &[f64]| linear_ref(xx, ww, bb, n, i, o);
            let (xf, wf, bf) = (to_f64(&x), to_f64(&w), to_f64(&b));
            let what = format!("linear {d} {n}x{i}->{o}");
            let y = linear(&tx, &tw, Some(&tb)).unwrap();
            let err = normwise(&y.to_vec().unwrap(), &f(&xf, &wf, &bf));
            assert!(err <= 4.0 * unit(d), "{what} forward: {err:.2e}");
            let (r, tdy) = rounded(&e, &mut rng, &[n, o], d);
            let rf = to_f64(&r);
            let loss = |yy: Vec<f64>| yy.iter().zip(&rf).map(|(a, b)| a * b).sum::<f64>();
            let (dx, dw, db) = linear_backward(&tx, &tw, &tdy, true, true).unwrap();
            let gx = numeric_grad(&xf, |v| loss(f(v, &wf, &bf)));
            let gw = numeric_grad(&wf, |v| loss(f(&xf, v, &bf)));
            let gb = numeric_grad(&bf, |v| loss(f(&xf, &wf, v)));
            for (name, got, want) in [
                ("dx", dx.unwrap(), gx),
                ("dw", dw, gw),
                ("db", db.unwrap(), gb),
            ] {
                assert_eq!(got.dtype(), d, "{what} {name}");
                let err = normwise(&got.to_vec().unwrap(), &want);
                assert!(err <= 4.0 * unit(d), "{what} {name}: {err:.2e}");
            }
        }
    }
}

#[test]
fn reductions_in_each_dtype() {
    let e = engine();
    let mut rng = Rng::new(34);
    for d in DTYPES {
        // Channel sums (the bias gradient) and means over an axis, forward
        // and backward: summed in f32, rounded once.
        for (outer, ch, inner) in [(3, 5, 7), (2, 3, 300), (17, 1, 1)] {
            let (x, tx) = rounded(&e, &mut rng, &[outer, ch, inner], d);
            let sums = sum_channels(&tx, ch, inner, "s").unwrap();
            let want: Vec<f64> = (0..ch)
                .map(|c| {
                    (0..outer)
                        .flat_map(|o| (0..inner).map(move |i| (o, i)))
                        .map(|(o, i)| x[(o * ch + c) * inner + i] as f64)
                        .sum()
                })
                .collect();
            assert_one_rounding(
                &sums.to_vec().unwrap(),
                &want,
                d,
                &format!("channel sum {d}"),
            );
            let axis = Axis {
                outer,
                mid: ch,
                inner,
            };
            let m = mean_axis(&tx, axis, &[outer, inner], "m").unwrap();
            assert_eq!(m.dtype(), d);
            let want: Vec<f64> = (0..outer * inner)
                .map(|t| {
                    let (o, i) = (t / inner, t % inner);
                    (0..ch)
                        .map(|c| x[(o * ch + c) * inner + i] as f64)
                        .sum::<f64>()
                        / ch as f64
                })
                .collect();
            let err = normwise(&m.to_vec().unwrap(), &want);
            assert!(err <= 2.0 * unit(d), "mean {d}: {err:.2e}");
            let (g, tg) = rounded(&e, &mut rng, &[outer, inner], d);
            let dx = mean_axis_backward(&tg, axis, &[outer, ch, inner]).unwrap();
            let want: Vec<f64> = (0..outer * ch * inner)
                .map(|t| {
                    let (o, i) = (t / (ch * inner), t % inner);
                    g[o * inner + i] as f64 / ch as f64
                })
                .collect();
            assert_one_rounding(
                &dx.to_vec().unwrap(),
                &want,
                d,
                &format!("mean backward {d}"),
            );
        }
    }
}

#[test]
fn optimizers_step_16bit_parameters() {
    let e = engine();
    let mut rng = Rng::new(35);
    for d in DTYPES {
        for n in [1, 7, 1001] {
            let (w, tw) = rounded(&e, &mut rng, &[n], d);
            let (g, tg) = rounded(&e, &mut rng, &[n], d);
            // One step from zero state: Adam moves each weight by lr·sign(g)
            // (m̂ = g, v̂ = g²); SGD with momentum by lr·g. The fused kernels
            // compute in f32 and round once; foreach and for-loop round
            // their 16-bit temporaries too, as PyTorch's do.
            type Case = (&'static str, Box<dyn Optimizer>, fn(f64, f64) -> f64);
            let mut adam = Adam::new(0.01);
            adam.implementation = OptimizerImpl::Fused;
            let mut sgd = Sgd::new(0.01, 0.9);
            sgd.implementation = OptimizerImpl::Fused;
            let cases: [Case; 2] = [
                ("adam", Box::new(adam), |w, g| {
                    w - 0.01 * g / (g.abs() + 1e-8)
                }),
                ("sgd", Box::new(sgd), |w, g| w - 0.01 * g),
            ];
            for (name, mut opt, step) in cases {
                let mut store = ParamStore::new();
                let id = store.add("w", tw.clone());
                let copy = Tensor::from_f32_as(&e, &w, &[n], d, "w").unwrap();
                store.get_mut(id).value = copy;
                store.get_mut(id).grad = Some(tg.clone());
                opt.step(&mut store).unwrap();
                let got = store.get(id).value.to_vec().unwrap();
                assert_eq!(store.get(id).value.dtype(), d);
                let want: Vec<f64> = w
                    .iter()
                    .zip(&g)
                    .map(|(w, g)| step(*w as f64, *g as f64))
                    .collect();
                assert_one_rounding(&got, &want, d, &format!("{name} {d} n={n}"));
                assert!(
                    opt.state_bytes() <= 2 * n * 2 + 8,
                    "{name}: state is {d} too"
                );
            }
        }
    }
}
