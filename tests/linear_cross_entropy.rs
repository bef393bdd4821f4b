//! `--loss chunked`: PyTorch 2.15's chunked `F.linear_cross_entropy` — its
//! kernels against an f64 reference on odd sizes (partial last chunks, heads
//! narrower and wider than their input, tensors across binding windows),
//! against PyTorch's own values, and through a GPT step against the other
//! losses.

use crate::common;
use common::*;
use vramlab::device::AdapterOptions;
use vramlab::io::SafeTensors;
use vramlab::memory::AllocatorConfig;
use vramlab::nn::{ModelSpec, ParamStore};
use vramlab::ops::linear_cross_entropy::{chunk_rows, forward, scale_by};
use vramlab::tensor::{DType, Engine, Tensor};
use vramlab::train::{Batch, LossMode};

const TOL: f64 = 1e-4;

/// (loss, dh, dW) in f64 for a mean cross-entropy over `h · Wᵀ`.
fn reference(
    h: &[f64],
    w: &[f64],
    labels: &[usize],
    n: usize,
    d: usize,
    v: usize,
) -> (f64, Vec<f64>, Vec<f64>) {
    let (mut loss, mut dh, mut dw) = (0.0, vec![0.0; n * d], vec![0.0; v * d]);
    for r in 0..n {
        let z: Vec<f64> = (0..v)
            .map(|c| (0..d).map(|k| h[r * d + k] * w[c * d + k]).sum())
            .collect();
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = z.iter().map(|x| (x - m).exp()).sum();
        loss += (m + s.ln() - z[labels[r]]) / n as f64;
        for c in 0..v {
            let g = ((z[c] - m).exp() / s - (c == labels[r]) as u8 as f64) / n as f64;
            for k in 0..d {
                dh[r * d + k] += g * w[c * d + k];
                dw[c * d + k] += g * h[r * d + k];
            }
        }
    }
    (loss, dh, dw)
}

fn engines() -> Vec<(String, Engine)> {
    let windows = AdapterOptions {
        binding_limit: Some(4096),
        ..adapter_options()
    };
    vec![
        ("whole".into(), engine()),
        (
            "4 KiB windows".into(),
            engine_from(&windows, AllocatorConfig::default()),
        ),
    ]
}

#[test]
fn chunked_loss_and_gradients_match_f64() {
    for (name, e) in engines() {
        let mut rng = Rng::new(17);
        // (rows, features, classes, chunk): one row; a partial last chunk;
        // PyTorch's own chunk size; a chunk above N; a head narrower than
        // its input (h·w then gets its own buffer); many chunks.
        for (n, d, v, rows) in [
            (1, 1, 1, None),
            (7, 3, 11, Some(2)),
            (37, 16, 50, None),
            (37, 16, 50, Some(64)),
            (20, 24, 5, Some(3)),
            (65, 8, 300, Some(16)),
        ] {
            let mut h = rng.vec(n * d);
            // Large logits in some rows: a naive exp would overflow f32.
            h.iter_mut().take(d).for_each(|x| *x *= 60.0);
            let w = rng.vec(v * d);
            let labels: Vec<usize> = (0..n).map(|_| rng.below(v as u64) as usize).collect();
            let lf: Vec<f32> = labels.iter().map(|&l| l as f32).collect();
            let th = Tensor::from_slice(&e, &h, &[n, d], "h").unwrap();
            let tw = Tensor::from_slice(&e, &w, &[v, d], "w").unwrap();
            let tl = Tensor::from_slice(&e, &lf, &[n], "labels").unwrap();
            let chunk = chunk_rows(n, d, v, rows);
            let out = forward(&th, &tw, &tl, chunk, true, true).unwrap();
            assert_eq!(out.rows, chunk.min(n));
            // Backward's scaling by the loss's gradient.
            let g = 0.7f32;
            let tg = Tensor::from_slice(&e, &[g], &[1], "g").unwrap();
            let (gi, gw) = (out.grad_input.unwrap(), out.grad_weight.unwrap());
            scale_by(&gi, &tg).unwrap();
            scale_by(&gw, &tg).unwrap();
            let (loss, dh, dw) = reference(&to_f64(&h), &to_f64(&w), &labels, n, d, v);
            let scaled = |x: Vec<f64>| -> Vec<f64> { x.iter().map(|v| v * g as f64).collect() };
            let case = format!("{name}, N {n} D {d} V {v}, chunks of {chunk}");
            let got = out.loss.to_vec().unwrap();
            assert!(
                max_rel_err(&got, &[loss]) < TOL,
                "{case}: loss {} vs {loss}",
                got[0]
            );
            let err = normwise(&gi.to_vec().unwrap(), &scaled(dh));
            assert!(err < TOL, "{case}: dh {err}");
            let err = normwise(&gw.to_vec().unwrap(), &scaled(dw));
            assert!(err < TOL, "{case}: dW {err}");
        }
    }
}

#[test]
fn chunked_loss_matches_pytorchs_own() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/torch/gpt_lce.safetensors"
    );
    let f = SafeTensors::read(std::path::Path::new(path)).unwrap();
    let e = engine();
    let t = |name: &str| {
        let (v, s) = f.f32(name).unwrap();
        (Tensor::from_slice(&e, &v, &s, name).unwrap(), v)
    };
    for case in ["wide", "narrow"] {
        let (h, w, y) = (
            t(&format!("{case}.h")).0,
            t(&format!("{case}.w")).0,
            t(&format!("{case}.y")).0,
        );
        let rows: usize = f.metadata[&format!("{case}.rows")].parse().unwrap();
        let out = forward(&h, &w, &y, rows, true, true).unwrap();
        for (name, got) in [
            ("loss", out.loss),
            ("dh", out.grad_input.unwrap()),
            ("dw", out.grad_weight.unwrap()),
        ] {
            let want = to_f64(&t(&format!("{case}.{name}")).1);
            let err = normwise(&got.to_vec().unwrap(), &want);
            assert!(err < TOL, "{case}.{name}: {err} from PyTorch's");
        }
    }
}

#[test]
fn chunked_loss_refuses_what_it_cannot_take() {
    let e = engine();
    let h = Tensor::from_slice(&e, &[0.0; 6], &[2, 3], "h").unwrap();
    let w = Tensor::from_slice(&e, &[0.0; 12], &[4, 3], "w").unwrap();
    let y = Tensor::from_slice(&e, &[0.0; 2], &[2], "y").unwrap();
    let err = forward(&h, &w, &y, 0, true, true)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("1..="), "{err}");
    let narrow = Tensor::from_slice(&e, &[0.0; 8], &[4, 2], "w").unwrap();
    let err = forward(&h, &narrow, &y, 1, true, true)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("[V, D]"), "{err}");
    for (text, want) in [
        ("chunked:0", "0 rows"),
        ("chunked:x", "whole number"),
        ("chunky", "chunked[:ROWS]"),
    ] {
        let err = LossMode::parse(text).unwrap_err().to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
    assert_eq!(
        LossMode::parse("chunked:64"),
        Ok(LossMode::Chunked(Some(64)))
    );
    // A head the loss cannot run: refused before anything is built.
    let mlp = small("mlp");
    let err = LossMode::Chunked(None)
        .check_model(&mlp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bias-free linear head"), "{err}");
    assert!(LossMode::Chunked(None).check_model(&small("gpt")).is_ok());
}

/// The mean loss and every parameter's gradient after one forward and
/// backward of `spec` under `loss`.
fn step(
    e: &Engine,
    spec: &ModelSpec,
    loss: LossMode,
    checkpointed: bool,
    amp: Option<DType>,
) -> (f32, Vec<Vec<f32>>) {
    let mut rng = Rng::new(3);
    let mut store = ParamStore::new();
    let model = spec.build(e, &mut store, &mut rng).unwrap();
    let batch = Batch::random_for(e, &mut rng, spec, 3, DType::F32).unwrap();
    loss_and_grads(model.as_ref(), &mut store, &batch, checkpointed, amp, loss)
}

#[test]
fn a_gpt_step_under_chunked_equals_cross_entropy() {
    let e = engine();
    let spec = small("gpt");
    for amp in [None, Some(DType::Bf16)] {
        let (want_loss, want) = step(&e, &spec, LossMode::CrossEntropy, false, amp);
        for (loss, checkpointed) in [
            (LossMode::Chunked(None), false),
            (LossMode::Chunked(Some(4)), false),
            (LossMode::Chunked(Some(1)), true),
        ] {
            let (got_loss, got) = step(&e, &spec, loss, checkpointed, amp);
            let case = format!("{loss}, checkpointed {checkpointed}, amp {amp:?}");
            let loss_tol = if amp.is_some() { 1e-2 } else { 1e-5 };
            assert!(
                ((got_loss - want_loss) / want_loss).abs() < loss_tol,
                "{case}: loss {got_loss} vs {want_loss}"
            );
            // Under autocast the other losses take 16-bit logits; the
            // chunked head runs in f32, so only the f32 step is compared
            // to 1e-4.
            let tol = if amp.is_some() { 2e-2 } else { TOL };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // k_proj's bias has an exactly zero gradient (softmax ignores
                // a constant added to a row's scores): both sides are
                // rounding noise, compared absolutely.
                let w = to_f64(w);
                let norm = w.iter().map(|v| v * v).sum::<f64>().sqrt();
                let floor = if amp.is_some() { 1e-3 } else { 1e-5 };
                let err = normwise(g, &w) * norm / norm.max(floor);
                assert!(err < tol, "{case}: parameter {i}: {err}");
            }
        }
    }
}
