//! The estimator predicts, on a simulated device, exactly what the real
//! device's allocator records: peak allocated to the byte, bytes per
//! category at the peak, reserved memory — for every zoo model, in train,
//! inference and checkpoint modes, at several batch sizes. And a
//! checkpointed forward gives the same gradients as the plain one.

use crate::common;
use crate::common::cli::{stderr, stdout, succeeds, vramlab};
use common::*;
use vramlab::estimate::run::estimate;
use vramlab::estimate::{analyze, run_step, Plan};
use vramlab::memory::AllocatorConfig;
use vramlab::nn::ModelSpec;
use vramlab::train::{Mode, OptimizerConfig, OptimizerKind};

#[test]
fn estimate_equals_measurement_to_the_byte() {
    let cases: [(&str, &[usize]); 6] = [
        ("mlp", &[1, 7, 32]),
        ("resnet-mini", &[1, 3]),
        ("attention", &[1, 5]),
        ("simple-cnn", &[2]),
        ("gpt", &[1, 3]),
        ("resnet50", &[2]),
    ];
    for (name, batches) in cases {
        for &batch in batches {
            for mode in [Mode::Train, Mode::Inference, Mode::Checkpoint] {
                for opt in [OptimizerKind::Adam, OptimizerKind::Sgd] {
                    let plan = Plan {
                        model: small(name),
                        batch,
                        optimizer: OptimizerConfig::new(opt, None, Some(0.0), None),
                        mode,
                        amp: None,
                        dtype: vramlab::tensor::DType::F32,
                        loss: Default::default(),
                        config: AllocatorConfig::default(),
                    };
                    let est = estimate(&plan).unwrap();
                    let measured = run_step(engine(), &plan, 0).unwrap();
                    let (e, m) = (
                        analyze(&est.events, &est.layer_outputs),
                        analyze(&measured.events, &measured.layer_outputs),
                    );
                    let what = format!("{name} batch {batch} {mode:?} {opt:?}");
                    assert!(e.peak_allocated_bytes > 0, "{what}");
                    assert_eq!(e.peak_allocated_bytes, m.peak_allocated_bytes, "{what}");
                    assert_eq!(e.by_category, m.by_category, "{what}");
                    assert_eq!(e.phases, m.phases, "{what}");
                    let reserved_gap = e.peak_reserved_bytes.abs_diff(m.peak_reserved_bytes);
                    assert!(
                        reserved_gap * 100 <= m.peak_reserved_bytes,
                        "{what}: reserved"
                    );
                    assert_eq!(e.layers, m.layers, "{what}");
                }
            }
        }
    }
}

/// Under the vramlab strategy's options too (lifetime pools place by the
/// categories the engine knows): the estimate's reserved memory is the
/// device's, and simple-cnn's Adam state no longer costs a segment.
#[test]
fn estimate_equals_measurement_under_the_vramlab_options() {
    for (name, batch) in [("simple-cnn", 8), ("mlp", 32), ("resnet-mini", 3)] {
        let mut reserved = Vec::new();
        for config in [
            AllocatorConfig::default(),
            vramlab::lab::strategies::vramlab::config(),
        ] {
            let plan = Plan {
                model: small(name),
                batch,
                optimizer: OptimizerConfig::new(OptimizerKind::Adam, None, None, None),
                mode: Mode::Train,
                amp: None,
                dtype: vramlab::tensor::DType::F32,
                loss: Default::default(),
                config: config.clone(),
            };
            let est = estimate(&plan).unwrap();
            let measured = run_step(engine_with(config), &plan, 0).unwrap();
            let (e, m) = (
                analyze(&est.events, &est.layer_outputs),
                analyze(&measured.events, &measured.layer_outputs),
            );
            assert_eq!(e.peak_allocated_bytes, m.peak_allocated_bytes, "{name}");
            assert_eq!(e.peak_reserved_bytes, m.peak_reserved_bytes, "{name}");
            reserved.push(m.peak_reserved_bytes);
        }
        assert!(reserved[1] <= reserved[0], "{name}: {reserved:?}");
    }
}

#[test]
fn inference_peaks_lower_and_checkpoint_keeps_fewer_activations() {
    let plan = |mode| Plan {
        model: ModelSpec::from(vramlab::nn::MlpSpec {
            widths: vec![64; 17].into_iter().chain([10]).collect(),
            checkpoint_every: 0,
        }),
        batch: 512,
        optimizer: OptimizerConfig::new(OptimizerKind::Sgd, None, None, None),
        mode,
        amp: None,
        dtype: vramlab::tensor::DType::F32,
        loss: Default::default(),
        config: AllocatorConfig::default(),
    };
    let peak = |mode| {
        let p = estimate(&plan(mode)).unwrap();
        analyze(&p.events, &p.layer_outputs)
    };
    let (train, infer, ckpt) = (
        peak(Mode::Train),
        peak(Mode::Inference),
        peak(Mode::Checkpoint),
    );
    let saved = |a: &vramlab::estimate::Analysis| {
        a.phases
            .iter()
            .find(|p| p.phase == "backward")
            .and_then(|p| p.by_category_at_start.get("activation").copied())
            .unwrap_or(0)
    };
    // 17 layers: plain keeps ~17 activations through forward; √17 → segments
    // of 5 keep 4 segment inputs.
    assert!(
        saved(&ckpt) * 3 < saved(&train),
        "{} vs {}",
        saved(&ckpt),
        saved(&train)
    );
    assert!(ckpt.peak_allocated_bytes < train.peak_allocated_bytes);
    assert!(infer.peak_allocated_bytes < ckpt.peak_allocated_bytes);
    assert_eq!(saved(&infer), 0);
}

#[test]
fn checkpointed_forward_gives_the_plain_gradients() {
    use vramlab::nn::ParamStore;
    use vramlab::train::Batch;
    for name in [
        "mlp",
        "resnet-mini",
        "attention",
        "simple-cnn",
        "gpt",
        "resnet50",
    ] {
        let e = engine();
        let spec = small(name);
        let mut store = ParamStore::new();
        let model = spec.build(&e, &mut store, &mut Rng::new(1)).unwrap();
        let batch =
            Batch::random_for(&e, &mut Rng::new(2), &spec, 2, vramlab::tensor::DType::F32).unwrap();
        let grads: Vec<_> = [false, true]
            .into_iter()
            .map(|ck| grads_of(model.as_ref(), &mut store, &batch, ck))
            .collect();
        for (a, b) in grads[0].iter().zip(&grads[1]) {
            assert!(max_rel_err(b, &to_f64(a)) < 1e-5, "{name}");
        }
    }
}

/// PyTorch's checkpoint re-runs a segment under the autocast state of the
/// forward that called it. vramlab's ran it without autocast, so an f16
/// activation met f32 weights: resnet-mini's checkpoint mode failed under
/// `--amp` (and `estimate --mode checkpoint`, whose precision table runs
/// amp rows). Under autocast, checkpointed gradients are the plain ones.
#[test]
fn checkpointed_forward_under_autocast_gives_the_plain_gradients() {
    use vramlab::nn::ParamStore;
    use vramlab::tensor::DType;
    use vramlab::train::Batch;
    for name in ["resnet-mini", "mlp", "attention", "gpt", "simple-cnn"] {
        for amp in [DType::F16, DType::Bf16] {
            let e = engine();
            let spec = small(name);
            let mut store = ParamStore::new();
            let model = spec.build(&e, &mut store, &mut Rng::new(1)).unwrap();
            let batch = Batch::random_for(&e, &mut Rng::new(2), &spec, 2, DType::F32).unwrap();
            let grads: Vec<_> = [false, true]
                .into_iter()
                .map(|ck| grads_under(model.as_ref(), &mut store, &batch, ck, Some(amp)))
                .collect();
            for (a, b) in grads[0].iter().zip(&grads[1]) {
                assert!(max_rel_err(b, &to_f64(a)) < 1e-5, "{name} {amp:?}");
            }
        }
    }
}

/// `model.half()` holds both copies of the weights for a moment before the
/// first step: the phases say so with a "setup" row at the peak, which a
/// model built in its own dtype does not get.
#[test]
fn a_half_model_peaks_in_setup_and_says_so() {
    let phases = |dtype: &str| {
        let v = vramlab_json([
            "estimate",
            "--model",
            "mlp",
            "--batch",
            "2",
            "--mode",
            "inference",
            "--dtype",
            dtype,
            "--json",
        ]);
        let e = &v["estimate"];
        let rows: Vec<(String, u64)> = e["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["phase"].as_str().unwrap().to_string(),
                    p["peak_allocated"].as_u64().unwrap(),
                )
            })
            .collect();
        (rows, e["peak_allocated_bytes"].as_u64().unwrap())
    };
    let (half, peak) = phases("f16");
    assert_eq!(half[0].0, "setup", "{half:?}");
    assert_eq!(half[0].1, peak, "the conversion is the peak: {half:?}");
    assert!(half[1..].iter().all(|(_, p)| *p < peak), "{half:?}");
    let (f32_rows, _) = phases("f32");
    assert_eq!(f32_rows[0].0, "forward", "{f32_rows:?}");
}

/// Under `--memory-limit`, a precision mode that runs out of memory is a
/// row saying so; the estimate of the step asked for still answers (mlp
/// batch 16 reserves 6 MiB in f32 and 8 MiB under amp f16, so a 7.6 MiB
/// limit failed the whole command on the amp row).
#[test]
fn a_precision_mode_past_the_limit_is_a_row_not_a_failure() {
    let args = [
        "estimate",
        "--model",
        "mlp",
        "--batch",
        "16",
        "--memory-limit",
        "7.6MiB",
    ];
    let v = vramlab_json(args.iter().chain(&["--json"]));
    let modes = v["precision_modes"].as_array().unwrap();
    assert!(modes[0]["peak_allocated_bytes"].as_u64().is_some(), "{v}");
    assert_eq!(modes[0]["out_of_memory"], false, "{v}");
    let oom: Vec<_> = modes
        .iter()
        .filter(|m| m["out_of_memory"] == true)
        .collect();
    assert!(!oom.is_empty(), "{v}");
    assert!(
        oom.iter().all(|m| m["peak_allocated_bytes"].is_null()),
        "{v}"
    );
    let out = vramlab(args);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("amp f16           out of memory under the memory limit"),
        "{text}"
    );
}

/// `train` peaks where `estimate --steps` says each step does, to the byte,
/// at every step, and ends holding what the estimate's end holds: both
/// keep a step's `logits` and `loss` bound until the next step rebinds them,
/// as a Python loop's names are (docs/commands.md). Over generated models,
/// batches, optimizers, losses and precisions.
#[test]
fn train_peaks_where_estimate_says_at_every_step() {
    let mut rng = Rng::new(0x7e57_ca5e);
    let mut pick = |n: u64| rng.below(n) as usize;
    for case in 0..8 {
        let model = ["gpt", "mlp", "attention", "resnet-mini"][if case < 2 { 0 } else { pick(4) }];
        let batch = (1 + pick(6)).to_string();
        let steps = (2 + pick(3)).to_string();
        let mut flags = vec!["--model", model, "--batch", &batch, "--steps", &steps];
        flags.extend(["--optimizer", ["adam", "sgd"][pick(2)]]);
        match pick(3) {
            1 => flags.extend(["--amp", "f16"]),
            // The others run in f32 only (LayerNorm, BatchNorm, embedding).
            2 if model == "mlp" => flags.extend(["--dtype", "bf16"]),
            _ => {}
        }
        if model == "gpt" && pick(2) == 1 {
            flags.extend(["--loss", ["fused", "chunked"][pick(2)]]);
        }
        let trained = vramlab_json([&["train", "--json"][..], &flags].concat());
        let est = &vramlab_json([&["estimate", "--json"][..], &flags].concat())["estimate"];
        // Phases: forward, backward and optimizer a step, between a
        // 16-bit model's setup and the end.
        let phases: Vec<_> = est["phases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["phase"] != "setup" && p["phase"] != "end")
            .collect();
        let steps = trained["steps"].as_array().unwrap();
        for (k, step) in steps.iter().enumerate() {
            let predicted = phases[3 * k..3 * k + 3]
                .iter()
                .map(|p| p["peak_allocated"].as_u64().unwrap())
                .max()
                .unwrap();
            assert_eq!(
                step["peak_allocated_bytes"].as_u64().unwrap(),
                predicted,
                "{flags:?} step {}",
                k + 1
            );
        }
        assert_eq!(
            steps.last().unwrap()["allocated_bytes"],
            est["allocated_after_bytes"],
            "{flags:?}"
        );
    }
}

/// A step's `logits` and `loss` are released where a Python loop rebinds
/// them: the last forward's logits once the model's forward has made the
/// new ones (before the loss), its loss once the new loss exists (before
/// backward). Read from the recorded allocation trace of two steps, and of
/// two steps of two accumulated micro-batches (each micro-batch's forward
/// rebinds the names, as `for mb in micro: logits = model(x); ...` does).
#[test]
fn the_last_steps_outputs_are_freed_where_python_rebinds_them() {
    let dir = std::env::temp_dir().join(format!("vramlab-rebind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.jsonl");
    for (accumulate, forwards) in [("1", 2), ("2", 4)] {
        succeeds([
            "train",
            "--model",
            "mlp",
            "--batch",
            "4",
            "--steps",
            "2",
            "--accumulate",
            accumulate,
            "--record-trace",
            trace.to_str().unwrap(),
        ]);
        let events: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let alloc_of = |label: &str| -> Vec<(usize, u64)> {
            events
                .iter()
                .enumerate()
                .filter(|(_, e)| e["op"] == "alloc" && e["label"] == label)
                .map(|(i, e)| (i, e["id"].as_u64().unwrap()))
                .collect()
        };
        let free_of = |id: u64| {
            events
                .iter()
                .position(|e| e["op"] == "free" && e["id"] == id)
        };
        // The logits are the last linear's output, made right before
        // log_softmax's.
        let softmax = alloc_of("log_softmax.out");
        let linear = alloc_of("linear.out");
        let logits: Vec<(usize, u64)> = softmax
            .iter()
            .map(|&(at, _)| *linear.iter().rev().find(|(i, _)| *i < at).unwrap())
            .collect();
        let losses = alloc_of("loss");
        let backward = alloc_of("loss.grad");
        let what = format!("--accumulate {accumulate}");
        assert_eq!(
            (logits.len(), losses.len(), backward.len()),
            (forwards, forwards, forwards),
            "{what}"
        );
        for k in 0..forwards - 1 {
            let freed = free_of(logits[k].1).expect("a forward's logits are freed by the next");
            assert!(
                logits[k + 1].0 < freed && freed < softmax[k + 1].0,
                "{what}: forward {k}'s logits freed at event {freed}: after the next forward's logits ({}) and before its loss ({})",
                logits[k + 1].0,
                softmax[k + 1].0
            );
            let freed = free_of(losses[k].1).expect("a forward's loss is freed by the next");
            assert!(
                losses[k + 1].0 < freed && freed < backward[k + 1].0,
                "{what}: forward {k}'s loss freed at event {freed}: after the next loss ({}) and before its backward ({})",
                losses[k + 1].0,
                backward[k + 1].0
            );
        }
        // The last are still held at the end, as the loop's names hold them.
        let last = forwards - 1;
        assert!(free_of(logits[last].1).is_none() && free_of(losses[last].1).is_none());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
