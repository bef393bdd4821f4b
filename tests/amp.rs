//! Mixed precision: autocast steps of every zoo model, the estimator exact
//! to the byte under autocast, autocast results against f32, and
//! GradScaler's scale sequence and overflow handling.

use crate::common;
use common::*;
use vramlab::estimate::run::estimate;
use vramlab::estimate::{analyze, run_step, Plan};
use vramlab::memory::AllocatorConfig;
use vramlab::nn::ParamStore;
use vramlab::optim::GradScaler;
use vramlab::tensor::{DType, Engine, Tensor};
use vramlab::train::{Mode, OptimizerConfig, OptimizerKind};

const MODELS: [(&str, usize); 4] = [
    ("mlp", 7),
    ("resnet-mini", 3),
    ("attention", 5),
    ("simple-cnn", 2),
];

fn amp_dtypes(_: &Engine) -> Vec<DType> {
    vec![DType::Bf16, DType::F16]
}

fn plan(name: &str, batch: usize, mode: Mode, amp: Option<DType>) -> Plan {
    Plan {
        model: small(name),
        batch,
        optimizer: OptimizerConfig::new(OptimizerKind::Adam, None, None, None),
        mode,
        amp,
        dtype: DType::F32,
        loss: Default::default(),
        config: AllocatorConfig::default(),
    }
}

/// `model.half()` / `.to(bf16)`: training (two steps, so the 16-bit Adam
/// state is alive) and inference, predicted to the byte. (Not always below
/// f32 at these tiny sizes: converting a parameter briefly holds both
/// copies, as `model.half()` does in PyTorch.)
#[test]
fn half_models_are_estimated_exactly() {
    let e = engine();
    for (name, batch) in MODELS {
        for d in amp_dtypes(&e) {
            for mode in [Mode::Train, Mode::Inference] {
                let p = Plan {
                    dtype: d,
                    loss: Default::default(),
                    ..plan(name, batch, mode, None)
                };
                let sim = vramlab::estimate::run::run_steps(
                    Engine::simulated(AllocatorConfig::default(), None),
                    &p,
                    0,
                    2,
                )
                .unwrap();
                let real = vramlab::estimate::run::run_steps(engine(), &p, 0, 2).unwrap();
                let (a, b) = (
                    analyze(&sim.events, &sim.layer_outputs),
                    analyze(&real.events, &real.layer_outputs),
                );
                let what = format!("{name} batch {batch} {d} {mode:?}");
                assert_eq!(a.peak_allocated_bytes, b.peak_allocated_bytes, "{what}");
                assert_eq!(a.by_category, b.by_category, "{what}");
            }
        }
    }
}

#[test]
fn autocast_estimates_are_exact_to_the_byte_and_below_f32() {
    let e = engine();
    // gpt too: its f32-only ops (LayerNorm, GELU, head copies) take
    // widened inputs under autocast, and the estimate must see those casts.
    // (Not resnet50: under f16 its first scaled gradients overflow, the
    // GradScaler skips the step and allocates no Adam state, which a
    // simulated device, holding no values, cannot foresee.)
    for &(name, batch) in MODELS.iter().chain(&[("gpt", 3)]) {
        for d in amp_dtypes(&e) {
            for mode in [Mode::Train, Mode::Inference] {
                let p = plan(name, batch, mode, Some(d));
                let est = estimate(&p).unwrap();
                let measured = run_step(engine(), &p, 0).unwrap();
                let (a, b) = (
                    analyze(&est.events, &est.layer_outputs),
                    analyze(&measured.events, &measured.layer_outputs),
                );
                let what = format!("{name} batch {batch} amp {d} {mode:?}");
                assert_eq!(a.peak_allocated_bytes, b.peak_allocated_bytes, "{what}");
                assert_eq!(a.by_category, b.by_category, "{what}");
                assert_eq!(a.layers, b.layers, "{what}");
                let f32_peak = {
                    let p = estimate(&plan(name, batch, mode, None)).unwrap();
                    analyze(&p.events, &p.layer_outputs).peak_allocated_bytes
                };
                // Weights, their gradients and Adam's state stay f32 and the
                // weight casts come on top; only activations halve. Never half
                // of f32's peak (at these small batches, where parameters
                // dominate, inference can even peak above f32: the casts).
                assert!(
                    2 * b.peak_allocated_bytes > f32_peak,
                    "{what}: {} vs f32 {f32_peak}",
                    b.peak_allocated_bytes
                );
            }
        }
    }
}

/// The article's worked example: SimpleConvNet, batch 64, Adam. Autocast
/// saves about 40% of the peak, not "about half" (C06/C28).
#[test]
fn simple_cnn_autocast_saves_less_than_half() {
    for d in [DType::F16, DType::Bf16] {
        let peak = |amp| {
            let p = estimate(&plan("simple-cnn", 64, Mode::Train, amp)).unwrap();
            analyze(&p.events, &p.layer_outputs).peak_allocated_bytes as f64
        };
        let ratio = peak(Some(d)) / peak(None);
        assert!(ratio > 0.5 && ratio < 0.7, "amp {d}: {ratio}");
    }
}

/// Autocast against f32 on the same weights and batch: the first step's
/// logits and loss (before any update). A 16-bit step rounds inputs and
/// weights once and each product's output once: over the L ≤ 6 layers of
/// these models about 2L + 1 = 13 roundings of relative size u, which sums
/// of random-signed terms amplify by Σ|a·b| / |Σ a·b| (about 2–3 here), so
/// the bound is 32u: 1.6e-2 for f16 (u = 2^-11) and 0.125 for bf16
/// (u = 2^-8), relative to the largest logit. The f32 run itself is within
/// 1e-4 of f64 (tests/torch_fixtures.rs).
#[test]
fn autocast_logits_and_loss_track_f32_within_the_dtype() {
    let e = engine();
    for (name, batch) in MODELS {
        let run = |amp| {
            let (mut t, b) = plan(name, batch, Mode::Train, amp).trainer(&e, 3).unwrap();
            let r = t.step(&b).unwrap();
            let out = t.outputs().unwrap();
            // The last linear runs in the autocast dtype, so the logits are
            // 16-bit (as in PyTorch); the loss widens them to f32.
            assert_eq!(out.logits.dtype(), amp.unwrap_or(DType::F32), "{name}");
            assert_eq!(out.loss.dtype(), DType::F32, "{name}");
            (r.loss as f64, out.logits.to_vec().unwrap())
        };
        let (loss32, logits32) = run(None);
        let want: Vec<f64> = logits32.iter().map(|&v| v as f64).collect();
        for d in amp_dtypes(&e) {
            let (loss, logits) = run(Some(d));
            let tol = match d {
                DType::F16 => 32.0 * 2f64.powi(-11),
                _ => 32.0 * 2f64.powi(-8),
            };
            let err = max_rel_err(&logits, &want);
            assert!(
                err < tol,
                "{name} amp {d}: logits off by {err} (tolerance {tol})"
            );
            let lerr = (loss - loss32).abs() / loss32.abs();
            assert!(lerr < tol, "{name} amp {d}: loss {loss} vs {loss32}");
            assert!(
                err > 0.0,
                "{name} amp {d}: identical to f32, so nothing ran in {d}"
            );
        }
    }
}

/// An autocast f16 step with f16 packed in words (no native f16) computes
/// the very same numbers: both round each f32 result to f16 once. (Native
/// f16 on tensor cores sums its products in another order: that kernel is
/// checked against f64 in tests/matmul_coop.rs, so it is left out here.)
#[test]
fn packed_f16_autocast_equals_native() {
    let run = |e: &Engine| {
        let (mut t, b) = plan("simple-cnn", 2, Mode::Train, Some(DType::F16))
            .trainer(e, 5)
            .unwrap();
        let r = t.step(&b).unwrap();
        let out = t.outputs().unwrap();
        let grads: Vec<Vec<f32>> = t
            .store
            .iter()
            .map(|p| p.grad.as_ref().unwrap().to_vec().unwrap())
            .collect();
        (r.loss, out.logits.to_vec().unwrap(), grads)
    };
    let plain = vramlab::device::AdapterOptions {
        without_cooperative_matrix: true,
        ..adapter_options()
    };
    let native = run(&engine_from(&plain, AllocatorConfig::default()));
    let packed = run(&engine_without_native_f16());
    assert_eq!(native, packed);
}

#[test]
fn grad_scaler_follows_torchs_scale_sequence() {
    // torch.amp.GradScaler(): 65536; an overflow halves it and resets the
    // count; growth_interval clean steps in a row double it.
    let mut s = GradScaler::default();
    assert_eq!((s.scale, s.growth_interval), (65536.0, 2000));
    s.update(true);
    assert_eq!(s.scale, 32768.0);
    for _ in 0..1999 {
        s.update(false);
    }
    assert_eq!(s.scale, 32768.0, "not yet: 1999 clean steps");
    s.update(false);
    assert_eq!(s.scale, 65536.0);
    for _ in 0..2000 {
        s.update(false);
    }
    assert_eq!(
        s.scale, 131072.0,
        "2 × growth_interval clean steps double it twice"
    );
    s.update(false);
    s.update(true);
    assert_eq!((s.scale, s.growth_tracker), (65536.0, 0));
}

/// A fixture `scripts/torch_reference.py amp` wrote.
fn torch_amp_json(name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch-amp")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn bools(v: &serde_json::Value) -> Vec<bool> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect()
}

/// torch.amp.GradScaler's own scale sequence (`scripts/torch_reference.py
/// amp` → grad_scaler.json: growth_interval 3, overflows at steps 1, 8 and
/// 9), reproduced through the unscale kernel and `update`.
#[test]
fn grad_scaler_reproduces_torchs_recorded_sequence() {
    let f = torch_amp_json("grad_scaler.json");
    let overflow = bools(&f["overflow"]);
    let want: Vec<f32> = f["scales"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let mut s = GradScaler {
        growth_interval: f["growth_interval"].as_u64().unwrap() as u32,
        scale: f["init_scale"].as_f64().unwrap() as f32,
        ..GradScaler::default()
    };
    let e = engine();
    let mut store = ParamStore::new();
    let id = store.add("p", Tensor::from_slice(&e, &[0.0; 3], &[3], "p").unwrap());
    let mut got = Vec::new();
    for bad in overflow {
        let g = [1.0, if bad { f32::INFINITY } else { 2.0 }, 3.0];
        store.get_mut(id).grad = Some(Tensor::from_slice(&e, &g, &[3], "g").unwrap());
        let found = s.unscale(&mut store).unwrap();
        assert_eq!(found, bad);
        s.update(found);
        got.push(s.scale);
    }
    assert_eq!(got, want);
}

#[test]
fn unscale_divides_gradients_and_finds_overflow() {
    let e = engine();
    let mut store = ParamStore::new();
    let w = Tensor::from_slice(&e, &[1.0; 5], &[5], "w").unwrap();
    let id = store.add("w", w);
    let s = GradScaler::default();
    let grads = [65536.0, -131072.0, 32768.0, 0.0, 6.5536];
    store.get_mut(id).grad = Some(Tensor::from_slice(&e, &grads, &[5], "g").unwrap());
    assert!(!s.unscale(&mut store).unwrap());
    let got = store.get(id).grad.as_ref().unwrap().to_vec().unwrap();
    assert_eq!(got, vec![1.0, -2.0, 0.5, 0.0, 6.5536 / 65536.0]);
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let g = [1.0, bad, 2.0, 3.0, 4.0];
        store.get_mut(id).grad = Some(Tensor::from_slice(&e, &g, &[5], "g").unwrap());
        assert!(s.unscale(&mut store).unwrap(), "{bad} not found");
    }
}

/// Unscales `sizes` gradients on `e` with an inf or NaN at `bad`
/// (gradient, element), checking every element against `v · (1/scale)`
/// and the overflow flag; returns the unscale dispatches.
fn unscale_lists(e: &Engine, sizes: &[usize], bad: Option<(usize, usize, f32)>) -> usize {
    let mut rng = Rng::new(sizes.len() as u64);
    let mut store = ParamStore::new();
    let mut want = Vec::new();
    let s = GradScaler::default();
    let inv = 1.0 / s.scale;
    for (t, &n) in sizes.iter().enumerate() {
        let mut g: Vec<f32> = rng.vec(n).iter().map(|v| v * s.scale).collect();
        if let Some((bt, bi, v)) = bad {
            if bt == t {
                g[bi] = v;
            }
        }
        want.push(g.iter().map(|v| v * inv).collect::<Vec<f32>>());
        let w = Tensor::from_slice(e, &vec![0.0; n], &[n], "w").unwrap();
        let id = store.add(&format!("p{t}"), w);
        store.get_mut(id).grad = Some(Tensor::from_slice(e, &g, &[n], "g").unwrap());
    }
    e.start_timing();
    let found = s.unscale(&mut store).unwrap();
    let (_, times) = e.take_dispatch_times().unwrap().expect("timing is on");
    e.stop_timing().unwrap();
    assert_eq!(found, bad.is_some(), "sizes {sizes:?}, bad {bad:?}");
    for (t, (p, w)) in store.iter().zip(&want).enumerate() {
        let got = p.grad.as_ref().unwrap().to_vec().unwrap();
        for (i, (a, b)) in got.iter().zip(w).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "gradient {t} of {sizes:?}, element {i}: {a}, want {b}"
            );
        }
    }
    times
        .iter()
        .filter(|t| t.kernel.starts_with("unscale"))
        .count()
}

#[test]
fn unscale_takes_gradients_in_lists_of_one_dispatch() {
    // PyTorch unscales a device's gradients in one multi-tensor launch;
    // vramlab in one dispatch per list of up to 8 (bindings allowing; on
    // CPU adapters only when asked).
    let e = engine();
    e.gpu().unwrap().set_list_ops(true);
    let limit = e.gpu().unwrap().limits.max_storage_buffers_per_shader_stage as usize;
    let most = (limit - 1).min(8);
    let sizes = [1, 3, 257, 1000, 5, 255, 256, 2, 7, 31, 4099, 1, 17];
    let n = unscale_lists(&e, &sizes, None);
    assert_eq!(n, sizes.len().div_ceil(most), "{most} gradients a list");
    assert_eq!(unscale_lists(&e, &sizes[..6], None), 1);
    // An overflow anywhere in any list is found, and the rest unscaled.
    for (t, i) in [(0, 0), (3, 999), (7, 1), (12, 16), (10, 2048)] {
        for v in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            unscale_lists(&e, &sizes, Some((t, i, v)));
        }
    }
}

#[test]
fn unscale_sends_a_gradient_past_one_window_alone() {
    // 1 KiB windows: the 1000-element gradient needs four, so it runs in
    // ranges of its own while the others share lists.
    let small = vramlab::device::AdapterOptions {
        binding_limit: Some(1024),
        ..adapter_options()
    };
    let e = engine_from(&small, AllocatorConfig::default());
    e.gpu().unwrap().set_list_ops(true);
    let sizes = [3, 1000, 5, 255, 2];
    let n = unscale_lists(&e, &sizes, None);
    assert!(n >= 2, "the windowed gradient apart from the list: {n}");
    unscale_lists(&e, &sizes, Some((1, 999, f32::NAN)));
    unscale_lists(&e, &sizes, Some((4, 1, f32::INFINITY)));
}

#[test]
fn an_overflowing_step_is_skipped_and_halves_the_scale() {
    let e = engine();
    // A scale so large that the f16 gradients overflow: the step must be
    // skipped (parameters unchanged) and the scale halved, as torch does.
    let (mut t, b) = plan("mlp", 7, Mode::Train, Some(DType::F16))
        .trainer(&e, 4)
        .unwrap();
    t.scaler.as_mut().unwrap().scale = 1e30;
    let before: Vec<Vec<f32>> = t.store.iter().map(|p| p.value.to_vec().unwrap()).collect();
    let r = t.step(&b).unwrap();
    assert!(r.skipped);
    assert_eq!(t.scaler.as_ref().unwrap().scale, 5e29);
    let after: Vec<Vec<f32>> = t.store.iter().map(|p| p.value.to_vec().unwrap()).collect();
    assert_eq!(before, after, "a skipped step must not move the weights");
    // At the default scale the same step is clean and moves them.
    t.scaler.as_mut().unwrap().scale = 65536.0;
    let r = t.step(&b).unwrap();
    assert!(!r.skipped);
    let moved: Vec<Vec<f32>> = t.store.iter().map(|p| p.value.to_vec().unwrap()).collect();
    assert_ne!(after, moved);
}

/// One step of `opt` as the trainer runs it under GradScaler: unscale, the
/// update (skipped on the device by a fused optimizer, by the host
/// otherwise), the flag read, `update`. Returns whether it skipped.
fn scaled_step(
    s: &mut GradScaler,
    opt: &mut dyn vramlab::optim::Optimizer,
    store: &mut ParamStore,
) -> bool {
    if opt.takes_found_inf() {
        let found = s.unscale_on_device(store).unwrap().unwrap();
        opt.step_unless_found(store, &found).unwrap();
        let skipped = GradScaler::found(&found.to_vec().unwrap());
        s.update(skipped);
        if skipped {
            opt.was_skipped().unwrap();
        }
        skipped
    } else {
        let skipped = s.unscale(store).unwrap();
        s.update(skipped);
        if !skipped {
            opt.step(store).unwrap();
        }
        skipped
    }
}

/// PyTorch's optimizers under GradScaler through an overflow pattern that
/// starts with one (`scripts/torch_reference.py amp` →
/// grad_scaler_fused.json). Fused Adam and AdamW take the flag on the
/// device: state made on the skipped first step, its step count back at 0,
/// later values as PyTorch's. The for-loop ones are skipped by the host
/// and make no state then. Fused SGD is held to PyTorch's unfused values:
/// PyTorch's own reads the unfilled buffers of a skipped first step.
#[test]
fn optimizers_skip_overflowing_steps_as_torchs_do() {
    use vramlab::optim::OptimizerImpl::{ForLoop, Fused};
    let f = torch_amp_json("grad_scaler_fused.json");
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let overflow = bools(&f["overflow"]);
    let grads: Vec<Vec<f32>> = f["grads"].as_array().unwrap().iter().map(floats).collect();
    let e = engine();
    for (run, kind, implementation, momentum) in [
        ("adam-fused", OptimizerKind::Adam, Fused, None),
        ("adamw-fused", OptimizerKind::Adamw, Fused, None),
        ("adam", OptimizerKind::Adam, ForLoop, None),
        ("sgd", OptimizerKind::Sgd, ForLoop, Some(0.9)),
        ("sgd", OptimizerKind::Sgd, Fused, Some(0.9)),
    ] {
        let mut opt = OptimizerConfig::new(kind, Some(0.1), momentum, None)
            .with_impl(implementation)
            .build();
        assert_eq!(opt.takes_found_inf(), implementation == Fused);
        let mut s = GradScaler::default();
        let mut store = ParamStore::new();
        let p = Tensor::from_slice(&e, &[0.5, -1.0, 2.0], &[3], "p").unwrap();
        let id = store.add("p", p);
        let want = f["runs"][run].as_array().unwrap();
        for (k, ((bad, g), w)) in overflow.iter().zip(&grads).zip(want).enumerate() {
            let mut scaled: Vec<f32> = g.iter().map(|v| v * s.scale).collect();
            if *bad {
                scaled[1] = f32::INFINITY;
            }
            store.get_mut(id).grad = Some(Tensor::from_slice(&e, &scaled, &[3], "g").unwrap());
            let skipped = scaled_step(&mut s, opt.as_mut(), &mut store);
            let at = format!("{run} ({implementation:?}) step {k}");
            assert_eq!(skipped, *bad, "{at}");
            assert_eq!(s.scale as f64, w["scale"].as_f64().unwrap(), "{at}");
            let got = store.get(id).value.to_vec().unwrap();
            for (a, b) in got.iter().zip(floats(&w["param"])) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{at}: {got:?} vs {b}"
                );
            }
            // State exists where PyTorch's does (sgd: PyTorch's fused SGD
            // makes it on the skipped first step too).
            let torch_state = !w["state"].as_array().unwrap().is_empty();
            let made = torch_state || (run == "sgd" && implementation == Fused);
            assert_eq!(opt.state_bytes() > 0, made, "{at}: state");
        }
    }
}

/// A fused optimizer under `--amp f16` skips on the device: an overflowing
/// step leaves the weights as they were, makes the same allocations as a
/// clean step (the state, as PyTorch's fused optimizers make it), so the
/// estimate holds whether the device skips or not.
#[test]
fn fused_optimizers_skip_on_the_device_with_the_memory_of_a_clean_step() {
    use vramlab::optim::OptimizerImpl;
    for kind in [OptimizerKind::Adam, OptimizerKind::Sgd] {
        let mut p = plan("mlp", 7, Mode::Train, Some(DType::F16));
        let momentum = (kind == OptimizerKind::Sgd).then_some(0.9);
        p.optimizer =
            OptimizerConfig::new(kind, None, momentum, None).with_impl(OptimizerImpl::Fused);
        let peaks = |scales: &[f32]| {
            let e = engine();
            let (mut t, b) = p.trainer(&e, 4).unwrap();
            let mut out = Vec::new();
            for &scale in scales {
                t.scaler.as_mut().unwrap().scale = scale;
                let before: Vec<Vec<f32>> =
                    t.store.iter().map(|p| p.value.to_vec().unwrap()).collect();
                let r = t.step(&b).unwrap();
                let after: Vec<Vec<f32>> =
                    t.store.iter().map(|p| p.value.to_vec().unwrap()).collect();
                assert_eq!(r.skipped, scale > 1e20, "{kind:?} at scale {scale}");
                assert_eq!(
                    r.skipped,
                    before == after,
                    "{kind:?}: weights moved iff not skipped"
                );
                out.push((
                    r.peak_allocated_bytes,
                    r.allocated_bytes,
                    t.optimizer.state_bytes(),
                ));
            }
            (out, t.scaler.as_ref().unwrap().scale)
        };
        let (clean, _) = peaks(&[65536.0, 65536.0, 65536.0]);
        let (skipping, last) = peaks(&[1e30, 65536.0, 1e30]);
        assert_eq!(last, 5e29, "{kind:?}: the third step backed off");
        assert_eq!(
            clean, skipping,
            "{kind:?}: (peak, allocated, state) by step"
        );
        // The estimate (one step, no values, so no skip) holds for the
        // skipped first step.
        let est = estimate(&p).unwrap();
        let est_peak = analyze(&est.events, &est.layer_outputs).peak_allocated_bytes;
        assert_eq!(est_peak, skipping[0].0, "{kind:?}");
    }
}

/// The amp f16 step waits for the device as often as the f32 step where
/// the optimizer is fused (the flag read with the loss), and once more
/// otherwise (GradScaler's flag read mid-step, as PyTorch's unfused
/// optimizers `.item()` it).
#[test]
fn a_fused_optimizer_spares_the_amp_step_its_mid_step_wait() {
    use vramlab::optim::OptimizerImpl;
    let waits = |amp: Option<DType>, implementation: OptimizerImpl| {
        let e = engine();
        let mut p = plan("mlp", 7, Mode::Train, amp);
        p.optimizer = p.optimizer.with_impl(implementation);
        let (mut t, b) = p.trainer(&e, 4).unwrap();
        t.step(&b).unwrap();
        let before = e.gpu().unwrap().host_waits();
        let r = t.step(&b).unwrap();
        assert!(!r.skipped);
        e.gpu().unwrap().host_waits() - before
    };
    for implementation in [
        OptimizerImpl::Fused,
        OptimizerImpl::Foreach,
        OptimizerImpl::ForLoop,
    ] {
        let f32_step = waits(None, implementation);
        let amp_step = waits(Some(DType::F16), implementation);
        let mid_step = (implementation != OptimizerImpl::Fused) as u64;
        assert_eq!(amp_step, f32_step + mid_step, "{implementation:?}");
    }
}

/// A fused SGD step with no gradient at all fills no momentum buffer: the
/// next step with gradients is the first (buffer = gradient), whatever the
/// memory its buffers are made in held, with the flag on the device or not.
#[test]
fn fused_sgd_fills_its_buffers_at_the_first_step_with_gradients() {
    use vramlab::optim::OptimizerImpl;
    for on_device in [false, true] {
        let e = engine();
        let mut opt = OptimizerConfig::new(OptimizerKind::Sgd, Some(0.1), Some(0.9), None)
            .with_impl(OptimizerImpl::Fused)
            .build();
        let mut store = ParamStore::new();
        let p = Tensor::from_slice(&e, &[0.5, -1.0, 2.0], &[3], "p").unwrap();
        let id = store.add("p", p);
        opt.step(&mut store).unwrap();
        assert_eq!(opt.state_bytes(), 0, "no gradient, no buffer");
        let g = Tensor::from_slice(&e, &[1.0, 2.0, 3.0], &[3], "g").unwrap();
        store.get_mut(id).grad = Some(g);
        // Freed blocks of the buffers' size, their bytes left for them (two:
        // GradScaler's flag may take one).
        let junk = |_| Tensor::from_slice(&e, &[1e6; 3], &[3], "junk").unwrap();
        drop((0..2).map(junk).collect::<Vec<_>>());
        if on_device {
            let s = GradScaler {
                scale: 1.0,
                ..GradScaler::default()
            };
            let found = s.unscale_on_device(&mut store).unwrap().unwrap();
            opt.step_unless_found(&mut store, &found).unwrap();
        } else {
            opt.step(&mut store).unwrap();
        }
        let got = store.get(id).value.to_vec().unwrap();
        let want = [0.5 - 0.1, -1.0 - 0.2, 2.0 - 0.3f32];
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "on device {on_device}: {got:?}");
        }
    }
}
