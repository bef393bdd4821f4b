//! The ops attention, residual nets and regression need — softmax, mean over
//! an axis (global average pooling, sequence mean), MSE, residual add,
//! batched matmul with transposes — forward and backward on the GPU against
//! f64 references on odd sizes, each reference's gradient checked by finite
//! differences.

use crate::common;
use common::*;
use vramlab::autograd::{functions as f, Tape, Value};
use vramlab::nn::ParamStore;
use vramlab::ops::mean::{global_avg_pool, mean_axis, mean_axis_backward, Axis};
use vramlab::ops::mse::{mse, mse_backward};
use vramlab::ops::softmax::{softmax, softmax_backward};
use vramlab::tensor::Tensor;

const TOL: f64 = 1e-4;

fn dot(y: &[f64], r: &[f64]) -> f64 {
    y.iter().zip(r).map(|(a, b)| a * b).sum()
}

fn softmax_ref(x: &[f64], cols: usize, scale: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(cols).zip(y.chunks_mut(cols)) {
        let m = row.iter().fold(f64::MIN, |m, v| m.max(scale * v));
        let s: f64 = row.iter().map(|v| (scale * v - m).exp()).sum();
        for (o, v) in out.iter_mut().zip(row) {
            *o = (scale * v - m).exp() / s;
        }
    }
    y
}

#[test]
fn softmax_forward_and_backward_match_f64() {
    let e = engine();
    let mut rng = Rng::new(21);
    for (rows, cols, scale) in [(1, 1, 1.0), (7, 13, 0.125), (33, 257, 1.0), (3, 1000, 0.5)] {
        let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| 6.0 * v).collect();
        let xf = to_f64(&x);
        let tx = Tensor::from_slice(&e, &x, &[rows, cols], "x").unwrap();
        let y = softmax(&tx, scale as f32).unwrap();
        let want = softmax_ref(&xf, cols, scale);
        assert!(
            max_rel_err(&y.to_vec().unwrap(), &want) < TOL,
            "{rows}x{cols}"
        );
        let r = rng.vec(rows * cols);
        let rf = to_f64(&r);
        let g = Tensor::from_slice(&e, &r, &[rows, cols], "g").unwrap();
        let dx = softmax_backward(&y, &g, scale as f32).unwrap();
        let num = numeric_grad(&xf, |v| dot(&softmax_ref(v, cols, scale), &rf));
        let err = max_rel_err(&dx.to_vec().unwrap(), &num);
        assert!(err < TOL, "softmax backward {rows}x{cols}: {err}");
    }
    // A long row (past 21,845 columns, where one invocation a row ran out
    // of llvmpipe's loop budget), backward against its closed form.
    let (rows, cols, scale) = (2, 70_001, 0.25);
    let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| 6.0 * v).collect();
    let want = softmax_ref(&to_f64(&x), cols, scale);
    let tx = Tensor::from_slice(&e, &x, &[rows, cols], "x").unwrap();
    let y = softmax(&tx, scale as f32).unwrap();
    assert!(
        max_rel_err(&y.to_vec().unwrap(), &want) < TOL,
        "{rows}x{cols}"
    );
    let r = rng.vec(rows * cols);
    let g = Tensor::from_slice(&e, &r, &[rows, cols], "g").unwrap();
    let dx = softmax_backward(&y, &g, scale as f32).unwrap();
    let mut closed = Vec::with_capacity(rows * cols);
    for (yr, gr) in want.chunks(cols).zip(r.chunks(cols)) {
        let s: f64 = yr.iter().zip(gr).map(|(y, g)| y * *g as f64).sum();
        closed.extend(yr.iter().zip(gr).map(|(y, g)| scale * y * (*g as f64 - s)));
    }
    let err = max_rel_err(&dx.to_vec().unwrap(), &closed);
    assert!(err < TOL, "softmax backward {rows}x{cols}: {err}");
    // Large logits do not overflow: the row maximum is subtracted.
    let tx = Tensor::from_slice(&e, &[1000.0, 999.0, -1000.0], &[1, 3], "x").unwrap();
    let y = softmax(&tx, 1.0).unwrap().to_vec().unwrap();
    assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
    assert!((y[0] - 0.7310586).abs() < 1e-6, "{y:?}");
}

#[test]
fn mean_over_any_axis_and_its_backward_match_f64() {
    let e = engine();
    let mut rng = Rng::new(22);
    // (outer, mid, inner): a sequence mean, a pool, a whole-tensor mean long
    // enough to need several dispatches on llvmpipe.
    for (o, m, i) in [(2, 5, 3), (7, 33, 1), (1, 40_000, 1), (3, 1, 4)] {
        let x = rng.vec(o * m * i);
        let xf = to_f64(&x);
        let reference = |v: &[f64]| -> Vec<f64> {
            let mut y = vec![0.0; o * i];
            for a in 0..o {
                for b in 0..m {
                    for c in 0..i {
                        y[a * i + c] += v[(a * m + b) * i + c] / m as f64;
                    }
                }
            }
            y
        };
        let tx = Tensor::from_slice(&e, &x, &[o, m, i], "x").unwrap();
        let axis = Axis::of(&[o, m, i], 1);
        let y = mean_axis(&tx, axis, &[o, i], "y").unwrap();
        assert!(max_rel_err(&y.to_vec().unwrap(), &reference(&xf)) < TOL);
        if o * m * i > 5000 {
            continue; // finite differences over 40,000 inputs add nothing
        }
        let r = rng.vec(o * i);
        let rf = to_f64(&r);
        let g = Tensor::from_slice(&e, &r, &[o, i], "g").unwrap();
        let dx = mean_axis_backward(&g, axis, &[o, m, i]).unwrap();
        let num = numeric_grad(&xf, |v| dot(&reference(v), &rf));
        assert!(max_rel_err(&dx.to_vec().unwrap(), &num) < TOL);
    }
    let x = rng.vec(2 * 3 * 5 * 7);
    let tx = Tensor::from_slice(&e, &x, &[2, 3, 5, 7], "x").unwrap();
    let p = global_avg_pool(&tx).unwrap();
    assert_eq!(p.shape(), &[2, 3]);
    let want: Vec<f64> = x
        .chunks(35)
        .map(|c| c.iter().map(|&v| v as f64).sum::<f64>() / 35.0)
        .collect();
    assert!(max_rel_err(&p.to_vec().unwrap(), &want) < TOL);
    assert!(global_avg_pool(&Tensor::from_slice(&e, &x, &[6, 35], "x").unwrap()).is_err());
}

#[test]
fn mse_and_its_backward_match_f64() {
    let e = engine();
    let mut rng = Rng::new(23);
    for n in [1, 7, 1025] {
        let (p, t) = (rng.vec(n), rng.vec(n));
        let (pf, tf) = (to_f64(&p), to_f64(&t));
        let reference = |v: &[f64]| {
            v.iter()
                .zip(&tf)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
                / n as f64
        };
        let tp = Tensor::from_slice(&e, &p, &[n], "p").unwrap();
        let tt = Tensor::from_slice(&e, &t, &[n], "t").unwrap();
        let loss = mse(&tp, &tt).unwrap().to_vec().unwrap();
        assert!(max_rel_err(&loss, &[reference(&pf)]) < TOL);
        let dl = Tensor::from_slice(&e, &[0.5], &[1], "dl").unwrap();
        let dx = mse_backward(&tp, &tt, &dl).unwrap();
        let num: Vec<f64> = numeric_grad(&pf, reference)
            .iter()
            .map(|g| 0.5 * g)
            .collect();
        assert!(max_rel_err(&dx.to_vec().unwrap(), &num) < TOL);
    }
    let a = Tensor::from_slice(&e, &[1.0, 2.0], &[2], "a").unwrap();
    let b = Tensor::from_slice(&e, &[1.0, 2.0], &[1, 2], "b").unwrap();
    let err = mse(&a, &b).unwrap_err().to_string();
    assert!(err.contains("[2]") && err.contains("[1, 2]"), "{err}");
}

/// Batched C = op(A)·op(B) through the tape: both input gradients, for all
/// four transpose combinations, against finite differences.
#[test]
fn batched_matmul_backward_for_every_transpose() {
    let e = engine();
    let mut rng = Rng::new(24);
    let (batch, m, k, n) = (3, 5, 7, 4);
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a_shape = if ta { [batch, k, m] } else { [batch, m, k] };
        let b_shape = if tb { [batch, n, k] } else { [batch, k, n] };
        let (a, b) = (rng.vec(batch * m * k), rng.vec(batch * k * n));
        let r = rng.vec(batch * m * n);
        let rf = to_f64(&r);
        let reference = |av: &[f64], bv: &[f64]| -> f64 {
            let mut total = 0.0;
            for z in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let mut c = 0.0;
                        for p in 0..k {
                            let x = if ta {
                                av[z * k * m + p * m + i]
                            } else {
                                av[z * m * k + i * k + p]
                            };
                            let y = if tb {
                                bv[z * n * k + j * k + p]
                            } else {
                                bv[z * k * n + p * n + j]
                            };
                            c += x * y;
                        }
                        total += c * rf[z * m * n + i * n + j];
                    }
                }
            }
            total
        };
        let (af, bf) = (to_f64(&a), to_f64(&b));
        let want_a = numeric_grad(&af, |v| reference(v, &bf));
        let want_b = numeric_grad(&bf, |v| reference(&af, v));
        for wrt_a in [true, false] {
            let tape = Tape::new();
            let ta_t = Tensor::from_slice(&e, &a, &a_shape, "a").unwrap();
            let tb_t = Tensor::from_slice(&e, &b, &b_shape, "b").unwrap();
            let (va, vb) = if wrt_a {
                (tape.leaf(ta_t), Value::constant(tb_t))
            } else {
                (Value::constant(ta_t), tape.leaf(tb_t))
            };
            let c = f::matmul(&tape, &va, &vb, ta, tb).unwrap();
            assert_eq!(c.tensor().shape(), &[batch, m, n]);
            let g = Tensor::from_slice(&e, &r, &[batch, m, n], "g").unwrap();
            let leaf = if wrt_a { &va } else { &vb };
            let got = tape
                .backward_from(&c, g, &mut ParamStore::new(), Some(leaf))
                .unwrap()
                .unwrap();
            let want = if wrt_a { &want_a } else { &want_b };
            let err = max_rel_err(&got.to_vec().unwrap(), want);
            assert!(err < TOL, "ta {ta} tb {tb} wrt_a {wrt_a}: {err}");
        }
    }
    let tape = Tape::new();
    let x = tape.leaf(Tensor::from_slice(&e, &[0.0; 6], &[2, 1, 3], "x").unwrap());
    let y = Value::constant(Tensor::from_slice(&e, &[0.0; 6], &[3, 2], "y").unwrap());
    let err = f::matmul(&tape, &x, &y, false, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[2, 1, 3]") && err.contains("[3, 2]"), "{err}");
}

#[test]
fn residual_add_passes_the_gradient_to_both_inputs() {
    let e = engine();
    let tape = Tape::new();
    let a = tape.leaf(Tensor::from_slice(&e, &[1.0, 2.0, 3.0], &[3], "a").unwrap());
    let sum = f::add(&tape, &a, &a).unwrap();
    let g = Tensor::from_slice(&e, &[0.5, -1.0, 2.0], &[3], "g").unwrap();
    let da = tape
        .backward_from(&sum, g, &mut ParamStore::new(), Some(&a))
        .unwrap()
        .unwrap();
    // y = a + a: both paths deliver g, so da = 2g.
    assert_eq!(da.to_vec().unwrap(), vec![1.0, -2.0, 4.0]);
}

#[test]
fn partials_summed_spread_over_blocks_give_the_bits_of_one_thread_an_output() {
    // Generated sums (long and short, offsets, accumulating or not, a
    // column bias, 16-bit outputs): eight threads an output, adding blocks
    // of 8 that one thread then adds in order, give the bits of one thread
    // adding every partial in turn; both within 1e-4 of f64; nothing
    // outside the output's range written. Auto spreads from 32 partials.
    use vramlab::ops::cast::cast;
    use vramlab::ops::partials::{sum_partials, Spread};
    use vramlab::tensor::DType;
    let e = engine();
    e.start_timing().expect("a GPU engine can time");
    let mut rng = Rng::new(77);
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    // Case i runs in f32 where i % 3 == 0: among those, sums of several
    // rounds (512 partials a round) with a partial last block, and one of
    // exactly one round.
    let mut cases = vec![
        (640, 128),
        (864, 128),
        (33, 520),
        (40, 1029),
        (1, 1),
        (3, 0),
        (70, 8),
        (65, 31),
        (9, 7),
        (5, 513),
        (7, 600),
        (11, 40),
        (6, 512),
    ];
    for _ in 0..10 {
        cases.push((1 + pick(300), pick(700)));
    }
    let mut rng = Rng::new(78);
    for (case, &(len, count)) in cases.iter().enumerate() {
        let dtype = [DType::F32, DType::F16, DType::Bf16][case % 3];
        let wide = dtype == DType::F32;
        let start = case % 5;
        let off = 2 * (case % 4);
        let accumulate = case % 2 == 1;
        let with_bias = case % 4 == 0;
        let cols = 1 + case % 7;
        // One more than read, so an empty sum still binds a buffer.
        let partials: Vec<f32> = rng.vec(start + count * len + 1);
        let before: Vec<f32> = rng.vec(off + len + 3);
        let parts = Tensor::from_slice(&e, &partials, &[partials.len()], "parts").unwrap();
        // The bias in the output's type (its values as rounded there).
        let bias = Tensor::from_slice(&e, &rng.vec(cols), &[cols], "bias").unwrap();
        let bias = if wide {
            bias
        } else {
            cast(&bias, dtype, "bias").unwrap()
        };
        let bias_v = bias.to_vec().unwrap();
        let what = format!("len {len}, count {count}, {dtype}, start {start}, off {off}, accumulate {accumulate}, bias {with_bias}");
        let mut results = Vec::new();
        for spread in [Spread::Outputs, Spread::Blocks, Spread::Auto] {
            let out32 = Tensor::from_slice(&e, &before, &[before.len()], "out").unwrap();
            let out = if wide {
                out32
            } else {
                cast(&out32, dtype, "out").unwrap()
            };
            let initial = out.to_vec().unwrap();
            e.take_dispatch_times().unwrap();
            sum_partials(
                &parts,
                &out,
                start,
                count,
                len,
                off,
                accumulate,
                with_bias.then_some(&bias),
                spread,
            )
            .unwrap();
            let (_, times) = e.take_dispatch_times().unwrap().unwrap();
            let spread_ran = times.iter().any(|t| t.kernel.ends_with(" spread]"));
            let want_spread = match spread {
                Spread::Outputs => false,
                Spread::Blocks => true,
                Spread::Auto => count >= 32,
            };
            assert_eq!(spread_ran, want_spread, "{what}, {spread:?}: {times:?}");
            let got = out.to_vec().unwrap();
            // A packed 16-bit word is written whole: the half past the
            // end shares its word with the last output.
            let shared_half = !wide && (off + len) % 2 == 1;
            let written = off..off + len + usize::from(shared_half);
            for (j, (g, i)) in got.iter().zip(&initial).enumerate() {
                if !written.contains(&j) {
                    assert_eq!(g.to_bits(), i.to_bits(), "{what}, {spread:?}: {j} written");
                }
            }
            let want: Vec<f64> = (0..len)
                .map(|i| {
                    let sum: f64 = (0..count)
                        .map(|z| partials[start + z * len + i] as f64)
                        .sum();
                    sum + if accumulate {
                        initial[off + i] as f64
                    } else {
                        0.0
                    } + if with_bias {
                        bias_v[i % cols] as f64
                    } else {
                        0.0
                    }
                })
                .collect();
            let tol = match dtype {
                DType::F32 => TOL,
                DType::F16 => 2f64.powi(-10),
                _ => 2f64.powi(-7),
            };
            // Against f64 relative to the sum's scale (a sum of ±1 values
            // can cancel to near zero).
            let scale = (count as f64).sqrt().max(1.0);
            for (i, w) in want.iter().enumerate() {
                let err = (got[off + i] as f64 - w).abs() / w.abs().max(scale);
                assert!(err < tol, "{what}, {spread:?}: output {i} err {err}");
            }
            results.push(got);
        }
        for r in &results[1..] {
            assert!(
                r.iter()
                    .zip(&results[0])
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "{what}: the spread sum changed bits"
            );
        }
    }
}
