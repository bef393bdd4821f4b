//! Gradient accumulation (`train --accumulate K`, claim C19): K micro-batches
//! give the gradients of one batch of their total size (losses are means,
//! scaled by 1/K), while the peak is a micro-batch's.

use crate::common;
use common::*;
use vramlab::nn::ParamStore;
use vramlab::tensor::Tensor;
use vramlab::train::{Batch, OptimizerConfig, OptimizerKind, Trainer};

fn batch(e: &vramlab::tensor::Engine, x: &[f32], y: &[i64], shape: &[usize]) -> Batch {
    let labels: Vec<f32> = y.iter().map(|&v| v as f32).collect();
    Batch {
        x: Tensor::from_slice(e, x, shape, "input").unwrap(),
        labels: Tensor::from_slice(e, &labels, &[labels.len()], "labels").unwrap(),
        label_values: y.to_vec(),
    }
}

#[test]
fn micro_batches_give_the_full_batch_gradients_at_a_lower_peak() {
    for name in ["mlp", "resnet-mini"] {
        let spec = small(name);
        let per: usize = spec.input_shape().iter().product();
        let (n, k) = (8, 4);
        let mut rng = Rng::new(5);
        let x = rng.vec(n * per);
        let y: Vec<i64> = (0..n)
            .map(|_| rng.below(spec.classes() as u64) as i64)
            .collect();
        let mut grads = Vec::new();
        let mut peaks = Vec::new();
        for micro in [1, k] {
            let e = engine();
            let mut store = ParamStore::new();
            let model = spec.build(&e, &mut store, &mut Rng::new(1)).unwrap();
            let opt = OptimizerConfig::new(OptimizerKind::Sgd, Some(0.1), Some(0.0), None);
            let mut t = Trainer::new(e.clone(), model, store, opt.build(), false);
            let m = n / micro;
            let batches: Vec<Batch> = (0..micro)
                .map(|i| {
                    let mut shape = vec![m];
                    shape.extend(spec.input_shape());
                    batch(
                        &e,
                        &x[i * m * per..(i + 1) * m * per],
                        &y[i * m..(i + 1) * m],
                        &shape,
                    )
                })
                .collect();
            let r = t.step_accumulated(&batches).unwrap();
            peaks.push(r.peak_allocated_bytes);
            grads.push(
                t.store
                    .iter()
                    .map(|p| p.grad.as_ref().unwrap().to_vec().unwrap())
                    .collect::<Vec<_>>(),
            );
        }
        for (a, b) in grads[0].iter().zip(&grads[1]) {
            let err = max_rel_err(b, &to_f64(a));
            assert!(err < 1e-5, "{name}: accumulated gradient differs by {err}");
        }
        // Lower where activations dominate; where the gradients do (the
        // small mlp), accumulation holds them through every micro-batch and
        // peaks higher — as in PyTorch.
        eprintln!(
            "{name}: peak {} accumulated vs {} at once",
            peaks[1], peaks[0]
        );
        if name == "resnet-mini" {
            assert!(
                peaks[1] < peaks[0],
                "{name}: peak {} vs {}",
                peaks[1],
                peaks[0]
            );
        }
    }
}

/// `train --accumulate K` reports the batch as given, cut into K
/// micro-batches, in text and JSON.
#[test]
fn accumulated_batches_are_reported_whole() {
    let v = common::vramlab_json([
        "train",
        "--model",
        "mlp",
        "--batch",
        "4",
        "--accumulate",
        "2",
        "--steps",
        "1",
        "--json",
    ]);
    assert_eq!(
        (
            v["batch"].as_u64(),
            v["accumulate"].as_u64(),
            v["micro_batch"].as_u64()
        ),
        (Some(4), Some(2), Some(2)),
        "{v}"
    );
}
