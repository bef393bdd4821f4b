//! The tape end to end: gradients through a chain of ops against f64 finite
//! differences, Adam against torch's formula in f64, PyTorch's memory
//! semantics (grads persist until zero_grad and accumulate; no_grad saves
//! nothing), and SimpleConvNet learning on a fixed batch.

use crate::common;
use common::*;
use vramlab::autograd::{functions as f, Tape, Value};
use vramlab::nn::init::Rng as ModelRng;
use vramlab::nn::simple_cnn::{CLASSES, INPUT};
use vramlab::nn::Model;
use vramlab::nn::{ParamStore, SimpleConvNet};
use vramlab::ops::conv2d::Conv2dConfig;
use vramlab::optim::Adam;
use vramlab::optim::Optimizer;
use vramlab::tensor::Tensor;

const TOL: f64 = 1e-4;

/// conv(3x3, pad 1) → relu → flatten → linear → cross-entropy, in f64.
#[allow(clippy::too_many_arguments)]
fn small_net_loss(
    x: &[f64],
    cw: &[f64],
    cb: &[f64],
    lw: &[f64],
    lb: &[f64],
    labels: &[usize],
    dims: (usize, usize, usize, usize, usize),
) -> f64 {
    let (n, c, h, o, classes) = dims;
    let (y, ho, wo) = conv2d_ref(x, cw, cb, (n, c, h, h), (o, 3, 3), 1, 1);
    let y: Vec<f64> = y.iter().map(|v| v.max(0.0)).collect();
    let feat = o * ho * wo;
    let mut logits = vec![0.0; n * classes];
    for r in 0..n {
        for k in 0..classes {
            logits[r * classes + k] = lb[k]
                + (0..feat)
                    .map(|i| y[r * feat + i] * lw[k * feat + i])
                    .sum::<f64>();
        }
    }
    cross_entropy_ref(&logits, labels, classes)
}

#[test]
fn gradients_through_a_chain_match_finite_differences() {
    let e = engine();
    let mut rng = Rng::new(21);
    let (n, c, h, o, classes) = (3, 2, 5, 4, 7);
    let feat = o * h * h;
    let x = rng.vec(n * c * h * h);
    let params = [
        rng.vec(o * c * 9),
        rng.vec(o),
        rng.vec(classes * feat),
        rng.vec(classes),
    ];
    let labels: Vec<usize> = (0..n).map(|i| (i * 5) % classes).collect();
    let mut store = ParamStore::new();
    let shapes: [&[usize]; 4] = [&[o, c, 3, 3], &[o], &[classes, feat], &[classes]];
    let ids: Vec<_> = params
        .iter()
        .zip(shapes)
        .enumerate()
        .map(|(i, (p, s))| store.add(&format!("p{i}"), Tensor::from_slice(&e, p, s, "p").unwrap()))
        .collect();
    let tape = Tape::new();
    let xv = Value::constant(Tensor::from_slice(&e, &x, &[n, c, h, h], "x").unwrap());
    let p = |i: usize| tape.param(&store, ids[i]);
    let hdn = f::conv2d(
        &tape,
        &xv,
        &p(0),
        &p(1),
        Conv2dConfig {
            stride: 1,
            padding: 1,
        },
    )
    .unwrap();
    let hdn = f::relu(&tape, &hdn).unwrap();
    let hdn = f::flatten(&tape, &hdn).unwrap();
    let logits = f::linear(&tape, &hdn, &p(2), Some(&p(3))).unwrap();
    let lt = Tensor::from_slice(
        &e,
        &labels.iter().map(|&l| l as f32).collect::<Vec<_>>(),
        &[n],
        "y",
    )
    .unwrap();
    let loss = f::cross_entropy(&tape, &logits, &lt).unwrap();
    let pf: Vec<Vec<f64>> = params.iter().map(|p| to_f64(p)).collect();
    let xf = to_f64(&x);
    let dims = (n, c, h, o, classes);
    let want_loss = small_net_loss(&xf, &pf[0], &pf[1], &pf[2], &pf[3], &labels, dims);
    assert!(max_rel_err(&loss.tensor().to_vec().unwrap(), &[want_loss]) < TOL);
    drop((hdn, logits));
    tape.backward(&loss, &mut store).unwrap();
    assert!(tape.is_empty(), "backward consumes the recording");
    for k in 0..4 {
        let num = numeric_grad(&pf[k], |v| {
            let mut q = pf.clone();
            q[k] = v.to_vec();
            small_net_loss(&xf, &q[0], &q[1], &q[2], &q[3], &labels, dims)
        });
        let got = store
            .get(ids[k])
            .grad
            .as_ref()
            .expect("every parameter gets a gradient")
            .to_vec()
            .unwrap();
        let err = max_rel_err(&got, &num);
        assert!(err < TOL, "parameter {k}: {err}");
    }
}

#[test]
fn adam_matches_torch_formula_and_allocates_state_lazily() {
    let e = engine();
    let mut rng = Rng::new(22);
    let n = 37;
    let w0 = rng.vec(n);
    let mut store = ParamStore::new();
    let id = store.add("w", Tensor::from_slice(&e, &w0, &[n], "w").unwrap());
    let mut adam = Adam::new(0.01);
    adam.weight_decay = 0.1;
    assert_eq!(adam.state_bytes(), 0);
    let (mut w, mut m, mut v) = (to_f64(&w0), vec![0.0; n], vec![0.0; n]);
    let (b1, b2, eps, lr, wd) = (0.9f64, 0.999f64, 1e-8f64, 0.01f64, 0.1f64);
    for t in 1..=3 {
        let g = rng.vec(n);
        store.get_mut(id).grad = Some(Tensor::from_slice(&e, &g, &[n], "g").unwrap());
        adam.step(&mut store).unwrap();
        assert_eq!(adam.state_bytes(), 2 * n * 4, "exp_avg and exp_avg_sq");
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for i in 0..n {
            let gi = g[i] as f64 + wd * w[i];
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            w[i] -= lr / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + eps);
        }
    }
    let got = store.get(id).value.to_vec().unwrap();
    assert!(max_rel_err(&got, &w) < TOL);
}

fn simple_cnn_batch(e: &vramlab::tensor::Engine, batch: usize, seed: u64) -> (Tensor, Tensor) {
    let mut rng = ModelRng::new(seed);
    let n: usize = batch * INPUT.iter().product::<usize>();
    let x = Tensor::from_slice(
        e,
        &rng.normal(n),
        &[batch, INPUT[0], INPUT[1], INPUT[2]],
        "input",
    )
    .unwrap();
    let labels: Vec<f32> = (0..batch)
        .map(|_| rng.below(CLASSES as u64) as f32)
        .collect();
    (
        x,
        Tensor::from_slice(e, &labels, &[batch], "labels").unwrap(),
    )
}

#[test]
fn grads_persist_after_backward_and_accumulate_until_zero_grad() {
    let e = engine();
    let mut store = ParamStore::new();
    let model = SimpleConvNet::new(&e, &mut store, &mut ModelRng::new(1)).unwrap();
    let (x, y) = simple_cnn_batch(&e, 2, 2);
    let run = |store: &mut ParamStore| {
        let tape = Tape::new();
        let logits = model
            .forward(&tape, store, &Value::constant(x.clone()))
            .unwrap();
        let loss = f::cross_entropy(&tape, &logits, &y).unwrap();
        drop(logits);
        tape.backward(&loss, store).unwrap();
    };
    run(&mut store);
    let once: Vec<Vec<f32>> = store
        .iter()
        .map(|p| p.grad.as_ref().unwrap().to_vec().unwrap())
        .collect();
    let param_bytes = store.numel() as u64 * 4;
    // Gradients stay allocated after backward (the articles' C03 says otherwise).
    let after_backward = e.allocator().memory_allocated();
    assert!(
        after_backward >= 2 * param_bytes,
        "{after_backward} < 2 x {param_bytes}"
    );
    run(&mut store);
    for (p, g1) in store.iter().zip(&once) {
        let twice = p.grad.as_ref().unwrap().to_vec().unwrap();
        let want: Vec<f64> = g1.iter().map(|v| 2.0 * *v as f64).collect();
        assert!(max_rel_err(&twice, &want) < TOL, "{} accumulates", p.name);
    }
    store.zero_grad();
    let after_zero = e.allocator().memory_allocated();
    assert!(
        after_backward - after_zero >= param_bytes,
        "zero_grad frees the gradients"
    );
}

#[test]
fn no_grad_forward_peaks_lower_by_the_saved_activations() {
    let e = engine();
    let mut store = ParamStore::new();
    let model = SimpleConvNet::new(&e, &mut store, &mut ModelRng::new(3)).unwrap();
    let batch = 64;
    let (x, _) = simple_cnn_batch(&e, batch, 4);
    let peak_of = |grad: bool| {
        e.synchronize().unwrap();
        let base = e.allocator().memory_allocated();
        e.allocator().reset_peak_memory_stats();
        let tape = Tape::new();
        let run = || {
            model
                .forward(&tape, &store, &Value::constant(x.clone()))
                .unwrap()
        };
        let logits = if grad { run() } else { tape.no_grad(run) };
        let held_after = e.allocator().memory_allocated() - base;
        drop(logits);
        let peak = e.allocator().max_memory_allocated() - base;
        (peak, held_after, tape.len())
    };
    let (train_peak, train_held, recorded) = peak_of(true);
    let (eval_peak, eval_held, eval_recorded) = peak_of(false);
    assert_eq!(eval_recorded, 0, "no_grad records nothing");
    assert!(recorded > 0);
    // Saved for backward and nothing else: relu1's output (conv2's input) and
    // relu2's output (also fc's input), 14.06 + 24.5 MiB at batch 64.
    let relu1 = (batch * 64 * 30 * 30 * 4) as u64;
    let relu2 = (batch * 128 * 28 * 28 * 4) as u64;
    assert!(
        train_held - eval_held >= relu1 + relu2,
        "held {train_held} vs {eval_held}"
    );
    // At the training peak (relu2 running) relu1's output is alive only
    // because backward needs it; without grad it was freed after conv2.
    assert!(
        train_peak - eval_peak >= relu1,
        "peak {train_peak} vs {eval_peak}"
    );
}

#[test]
fn simple_cnn_loss_goes_down_on_a_fixed_batch() {
    let e = engine();
    let mut store = ParamStore::new();
    let model = SimpleConvNet::new(&e, &mut store, &mut ModelRng::new(5)).unwrap();
    let (x, y) = simple_cnn_batch(&e, 2, 6);
    // lr 1e-4: at 1e-3 Adam's sign-like first steps move each of fc's 100,352
    // inputs per class by 1e-3 and the logits of a 2-sample batch jump around.
    let mut adam = Adam::new(1e-4);
    let mut losses = Vec::new();
    for _ in 0..20 {
        store.zero_grad();
        let tape = Tape::new();
        let logits = model
            .forward(&tape, &store, &Value::constant(x.clone()))
            .unwrap();
        let loss = f::cross_entropy(&tape, &logits, &y).unwrap();
        drop(logits);
        tape.backward(&loss, &mut store).unwrap();
        adam.step(&mut store).unwrap();
        losses.push(loss.tensor().to_vec().unwrap()[0]);
    }
    assert!(losses[19] < 0.5 * losses[0], "losses {losses:?}");
    assert!(
        losses.windows(5).all(|w| w[4] < w[0]),
        "steady decrease: {losses:?}"
    );
}
