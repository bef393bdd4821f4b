//! Memory behaviour of training, measured by the allocator's statistics:
//! checkpointing a deep MLP lowers its peak as the √L argument predicts,
//! retain_graph kept across steps grows memory step after step, gradient
//! accumulation over k micro-batches gives the large-batch gradient, SGD's
//! momentum buffer appears lazily, and the zoo's declared parameter shapes
//! are the built models' shapes.

use crate::common;
use common::*;
use vramlab::autograd::{functions as f, Tape, Value};
use vramlab::nn::{ModelSpec, ParamStore, ZooEntry, ZOO};
use vramlab::optim::{Optimizer, Sgd};
use vramlab::tensor::Tensor;
use vramlab::train::{Batch, Trainer};

const WIDTH: usize = 64;
const LAYERS: usize = 16;
const BATCH: usize = 2048;

/// Peak allocated bytes of one forward+backward of a deep MLP (no optimizer
/// state: plain SGD), with runs of `k` layers checkpointed (0: none).
fn mlp_step_peak(k: usize) -> u64 {
    let e = engine();
    let mut widths = vec![WIDTH; LAYERS + 1];
    widths.push(10);
    let spec = ModelSpec::from(vramlab::nn::MlpSpec {
        widths,
        checkpoint_every: k,
    });
    let mut store = ParamStore::new();
    let model = spec.build(&e, &mut store, &mut Rng::new(1)).unwrap();
    let batch = Batch::random(&e, &mut Rng::new(2), BATCH, &[WIDTH], 10).unwrap();
    let mut t = Trainer::new(e, model, store, Box::new(Sgd::new(0.01, 0.0)), false);
    t.step(&batch).unwrap().peak_allocated_bytes
}

#[test]
fn checkpointing_a_deep_mlp_lowers_the_peak_as_theory_says() {
    let act = (BATCH * WIDTH * 4) as f64; // one activation tensor
    let plain = mlp_step_peak(0);
    let every4 = mlp_step_peak(4);
    let whole = mlp_step_peak(LAYERS + 1);
    eprintln!(
        "peak: plain {plain}, checkpoint every 4 {every4}, one segment {whole}; \
         one activation = {act} bytes"
    );
    // Without checkpointing all L layer outputs stay saved until backward
    // reaches them; with segments of k, only the L/k segment inputs stay and
    // one segment's k activations exist at a time: the saved set drops from
    // about L to about L/k + k activations (16 → 8 here).
    let saved = (plain - every4) as f64 / act;
    let theory = LAYERS as f64 - (LAYERS as f64 / 4.0 + 4.0);
    assert!(
        (saved - theory).abs() <= 2.0,
        "checkpointing every 4 layers saved {saved:.1} activations; theory says {theory}"
    );
    // One segment over the whole net keeps only its input, but recomputes
    // everything inside it at once during backward: no better than plain.
    assert!(whole + act as u64 > plain, "whole {whole} vs plain {plain}");
    assert!(every4 < whole);
}

#[test]
fn retain_graph_across_steps_grows_memory_every_step() {
    let e = engine();
    let spec = ModelSpec::from(vramlab::nn::MlpSpec {
        widths: vec![64, 128, 128, 10],
        checkpoint_every: 0,
    });
    let mut store = ParamStore::new();
    let model = spec.build(&e, &mut store, &mut Rng::new(3)).unwrap();
    let batch = Batch::random(&e, &mut Rng::new(4), 32, &[64], 10).unwrap();
    let mut t = Trainer::new(e, model, store, Box::new(Sgd::new(0.01, 0.0)), true);
    let allocated: Vec<u64> = (0..5)
        .map(|_| t.step(&batch).unwrap().allocated_bytes)
        .collect();
    let growth: Vec<i64> = allocated
        .windows(2)
        .map(|w| w[1] as i64 - w[0] as i64)
        .collect();
    eprintln!("allocated after each step {allocated:?}, growth {growth:?}");
    // Each step keeps its graph: the two ReLU outputs (32×128 floats, 16 KiB
    // each, also the next layer's saved input), the logits (1,280 bytes,
    // 1,536 in blocks) and the loss (512): 34,304 bytes. The batch itself is
    // the same tensor every step and is not counted again.
    for g in &growth {
        assert!(*g >= 32 * 1024, "step grew by only {g} bytes");
        assert_eq!(*g, growth[0], "every step keeps the same graph");
    }
    // Without retain_graph the same loop is flat.
    let e = engine();
    let mut store = ParamStore::new();
    let model = spec.build(&e, &mut store, &mut Rng::new(3)).unwrap();
    let batch = Batch::random(&e, &mut Rng::new(4), 32, &[64], 10).unwrap();
    let mut t = Trainer::new(e, model, store, Box::new(Sgd::new(0.01, 0.0)), false);
    let flat: Vec<u64> = (0..4)
        .map(|_| t.step(&batch).unwrap().allocated_bytes)
        .collect();
    assert!(flat.windows(2).all(|w| w[0] == w[1]), "{flat:?}");
}

#[test]
fn gradient_accumulation_over_micro_batches_gives_the_large_batch_gradient() {
    let e = engine();
    let (n, k, inputs) = (24, 4, 9);
    let spec = ModelSpec::from(vramlab::nn::MlpSpec {
        widths: vec![inputs, 13, 5],
        checkpoint_every: 0,
    });
    let mut store = ParamStore::new();
    let model = spec.build(&e, &mut store, &mut Rng::new(5)).unwrap();
    let mut rng = Rng::new(6);
    let x = rng.normal(n * inputs);
    let y: Vec<f32> = (0..n).map(|_| rng.below(5) as f32).collect();
    let loss_of = |store: &mut ParamStore, rows: std::ops::Range<usize>| {
        let tape = Tape::new();
        let m = rows.len();
        let xs = Tensor::from_slice(
            &e,
            &x[rows.start * inputs..rows.end * inputs],
            &[m, inputs],
            "x",
        )
        .unwrap();
        let ys = Tensor::from_slice(&e, &y[rows], &[m], "y").unwrap();
        let logits = model.forward(&tape, store, &Value::constant(xs)).unwrap();
        let loss = f::cross_entropy(&tape, &logits, &ys).unwrap();
        tape.backward(&loss, store).unwrap();
    };
    loss_of(&mut store, 0..n);
    let big: Vec<Vec<f32>> = store
        .iter()
        .map(|p| p.grad.as_ref().unwrap().to_vec().unwrap())
        .collect();
    store.zero_grad();
    let m = n / k;
    for i in 0..k {
        loss_of(&mut store, i * m..(i + 1) * m);
    }
    for (p, want) in store.iter().zip(&big) {
        // Each micro-batch loss is a mean over m = n/k rows, so the sum of k
        // gradients is k times the large batch's.
        let got: Vec<f32> = p
            .grad
            .as_ref()
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .map(|g| g / k as f32)
            .collect();
        let err = max_rel_err(&got, &to_f64(want));
        assert!(err < 1e-4, "{}: {err}", p.name);
    }
}

#[test]
fn sgd_momentum_buffer_is_allocated_at_the_first_step() {
    let e = engine();
    let spec = ModelSpec::from(vramlab::nn::MlpSpec {
        widths: vec![8, 16, 4],
        checkpoint_every: 0,
    });
    let mut store = ParamStore::new();
    let model = spec.build(&e, &mut store, &mut Rng::new(7)).unwrap();
    let n = store.numel();
    let batch = Batch::random(&e, &mut Rng::new(8), 4, &[8], 4).unwrap();
    let mut t = Trainer::new(e.clone(), model, store, Box::new(Sgd::new(0.1, 0.9)), false);
    assert_eq!(t.optimizer.state_bytes(), 0);
    let before = e.allocator().memory_allocated();
    let r = t.step(&batch).unwrap();
    assert_eq!(t.optimizer.state_bytes(), n * 4, "one buffer per parameter");
    // After the step: gradients (kept until zero_grad) and the buffers, plus
    // the returned logits and loss.
    assert!(r.allocated_bytes >= before + 2 * (n * 4) as u64);
    let mut plain = Sgd::new(0.1, 0.0);
    plain.step(&mut t.store).unwrap();
    assert_eq!(plain.state_bytes(), 0, "no momentum, no state");
}

#[test]
fn declared_parameter_shapes_are_the_built_models() {
    let e = engine();
    for &ZooEntry { name, .. } in ZOO {
        let spec = ModelSpec::default_for(name).unwrap();
        let mut store = ParamStore::new();
        spec.build(&e, &mut store, &mut Rng::new(0)).unwrap();
        let built: Vec<(String, Vec<usize>)> = store
            .iter()
            .map(|p| (p.name.clone(), p.value.shape().to_vec()))
            .collect();
        assert_eq!(built, spec.parameter_shapes(), "{name}");
    }
}
