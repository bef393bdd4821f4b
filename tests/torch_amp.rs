//! Mixed precision against PyTorch: fixtures written by
//! `scripts/torch_reference.py amp` hold each zoo model's weights, a batch,
//! and what two Adam steps under `torch.autocast("cpu", dtype)` computed
//! (float16 with torch.amp.GradScaler's defaults): logits, loss, the
//! (unscaled) gradients and the updated parameters. vramlab trains the same
//! steps with `Trainer::with_amp` and must agree within tolerances that
//! follow from the formats (see `tolerance`). The tests read files only.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use vramlab::io::SafeTensors;
use vramlab::nn::{ModelSpec, ParamStore};
use vramlab::tensor::DType;
use vramlab::train::{Batch, OptimizerConfig, OptimizerKind, Trainer};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch-amp")
}

fn read(p: &Path) -> SafeTensors {
    SafeTensors::read(p)
        .unwrap_or_else(|e| panic!("{e} (regenerate with scripts/torch_reference.py amp)"))
}

/// Norm-wise tolerance per dtype: 8 unit roundoffs (f16 u = 2^-11 ≈ 4.9e-4,
/// bf16 u = 2^-8 ≈ 3.9e-3). Both sides round the same operands to the same
/// format, but not at the same places (PyTorch's CPU kernels may round a
/// bias before adding it, or block their sums differently), so each result
/// carries a few roundings the other does not; measured worst: 1.6u for f16
/// (mlp's layers.1 weight gradient) and 4.1u for bf16 (simple-cnn's conv1
/// bias gradient, a sum over 57,600 16-bit values).
fn tolerance(d: DType) -> f64 {
    match d {
        DType::F16 => 8.0 * 2f64.powi(-11),
        DType::Bf16 => 8.0 * 2f64.powi(-8),
        DType::F32 => 1e-4,
    }
}

struct Case {
    dtype: DType,
    /// (tensor, norm-wise error against PyTorch's autocast run).
    errors: Vec<(String, f64)>,
    logits: Vec<f32>,
}

fn run_case(dir: &Path) -> Case {
    let weights = read(&dir.join("weights.safetensors"));
    let data = read(&dir.join("batch.safetensors"));
    let expected = read(&dir.join("expected.safetensors"));
    let meta = |k: &str| expected.metadata[k].clone();
    let num = |k: &str| meta(k).parse::<f32>().unwrap();
    let dtype = DType::parse(&meta("amp")).unwrap();
    let mut spec = ModelSpec::default_for(&meta("model")).unwrap();
    spec.adapt_to_weights(&weights).unwrap();
    spec.adapt_to_input(&data.f32("x").unwrap().1).unwrap();
    let opt = OptimizerConfig::new(
        OptimizerKind::Adam,
        Some(num("lr")),
        None,
        Some(num("weight_decay")),
    );
    let e = engine();
    let mut store = ParamStore::new();
    let model = spec.build(&e, &mut store, &mut Rng::new(0)).unwrap();
    store.load(&weights).unwrap();
    let batch = Batch::from_safetensors(&e, &data, spec.classes(), spec.vocab()).unwrap();
    let mut trainer = Trainer::new(e, model, store, opt.build(), false).with_amp(Some(dtype));
    let mut last = None;
    for _ in 0..meta("steps").parse::<usize>().unwrap() {
        last = Some(trainer.step(&batch).unwrap());
    }
    let record = last.unwrap();
    let out = trainer.outputs().unwrap();
    let mut errors = Vec::new();
    let mut cmp = |name: &str, got: Vec<f32>| {
        let (want, _) = expected.f32(name).unwrap();
        errors.push((
            name.to_string(),
            normwise(&thin(&expected, name, &got), &to_f64(&want)),
        ));
    };
    let logits = out.logits.to_vec().unwrap();
    cmp("logits", logits.clone());
    cmp("loss", out.loss.to_vec().unwrap());
    let mut compared = 2;
    for p in trainer.store.iter() {
        let g = p.grad.as_ref().expect("every parameter has a gradient");
        cmp(&format!("grad.{}", p.name), g.to_vec().unwrap());
        cmp(&format!("param.{}", p.name), p.value.to_vec().unwrap());
        compared += 2;
    }
    if let Ok((scale, _)) = expected.f32("grad_scale") {
        // GradScaler: the same scale after the same clean steps.
        assert_eq!(Some(scale[0]), trainer.scaler.as_ref().map(|s| s.scale));
        assert!(!record.skipped);
        compared += 1;
    }
    assert_eq!(
        compared,
        expected.tensors.len(),
        "every expected tensor compared"
    );
    Case {
        dtype,
        errors,
        logits,
    }
}

fn run_model(model: &str) {
    for d in ["bf16", "f16"] {
        let case = run_case(&fixtures().join(format!("{model}-{d}")));
        let tol = tolerance(case.dtype);
        for (name, err) in &case.errors {
            assert!(
                *err <= tol,
                "{model} amp {d}: {name} is {err:.2e} from PyTorch (tolerance {tol:.2e})"
            );
        }
        let worst = case.errors.iter().map(|e| e.1).fold(0.0, f64::max);
        eprintln!("{model} amp {d}: worst norm-wise error {worst:.2e} (tolerance {tol:.2e})");
        if model == "simple-cnn" {
            // Where autocast moves the result well beyond the implementations'
            // differences, vramlab must land on PyTorch's autocast result, not
            // on its float32 one (the same weights and batch, fixtures/torch).
            let f32_case = read(&fixtures().join("../torch/simple-cnn-adam/expected.safetensors"));
            let (f32_logits, _) = f32_case.f32("logits").unwrap();
            let to_f32 = normwise(&case.logits, &to_f64(&f32_logits));
            let to_amp = case.errors[0].1;
            assert!(
                2.0 * to_amp < to_f32,
                "{model} amp {d}: logits {to_amp:.2e} from PyTorch's autocast, {to_f32:.2e} from its f32"
            );
        }
    }
}

#[test]
fn mlp_autocast_matches_pytorch() {
    run_model("mlp");
}

#[test]
fn simple_cnn_autocast_matches_pytorch() {
    run_model("simple-cnn");
}

#[test]
fn resnet_mini_autocast_matches_pytorch() {
    run_model("resnet-mini");
}

#[test]
fn attention_autocast_matches_pytorch() {
    run_model("attention");
}
