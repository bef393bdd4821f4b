//! Differential test: `estimate` (the step on a simulated device) against
//! the same step measured on the GPU adapter, over configurations drawn at
//! random — every zoo model at small random sizes, batch, optimizer, mode,
//! autocast, model dtype, gradient accumulation, steps and allocator
//! settings. Peak allocated and peak reserved must be equal to the byte,
//! and so must everything else the analysis reads off the event log; each
//! step must also keep its own invariants (nothing but parameters, their
//! gradients, optimizer state and the batch alive after it; reserved ≥
//! allocated; whole 2 MiB pages). `expandable_segments` has no wgpu
//! counterpart (no page mapping), so its estimate is checked against the
//! measured run's trace replayed under that setting instead.
//!
//! Each case's model, mode (train, checkpoint, inference) and precision
//! (f32, autocast f16, autocast bf16, 16-bit model) come from a cycle, so the
//! default 72 cases run every combination once; all else is drawn. Seeded:
//! `VRAMLAB_DIFF_SEED` and `VRAMLAB_DIFF_CASES` change the draw (defaults:
//! seed 25, 72 cases, about a minute on lavapipe with Mesa's shader cache
//! filled). A failure prints the configuration whole, as JSON.

use crate::common;
use common::Rng;
use std::sync::Arc;
use vramlab::estimate::{analyze, Analysis, Plan};
use vramlab::lab::workload::{compare_with, Workload};
use vramlab::memory::{AllocatorConfig, Category, MemEvent};
use vramlab::nn::gpt::GptConfig;
use vramlab::nn::ModelSpec;
use vramlab::optim::OptimizerImpl;
use vramlab::tensor::{DType, Engine, TensorError};
use vramlab::train::{Batch, LossMode, Mode, OptimizerConfig, OptimizerKind};

/// One drawn configuration.
#[derive(Clone)]
struct Case {
    plan: Plan,
    /// Micro-batches per optimizer step (1: a plain step).
    accumulate: usize,
    steps: usize,
    /// The allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax.
    alloc_conf: &'static str,
}

impl Case {
    fn describe(&self) -> String {
        serde_json::json!({
            "plan": self.plan,
            "accumulate": self.accumulate,
            "steps": self.steps,
            "alloc_conf": self.alloc_conf,
        })
        .to_string()
    }

    fn expandable(&self) -> bool {
        self.plan.config.expandable_segments
    }
}

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.below(items.len() as u64) as usize]
}

fn between(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + rng.below((hi - lo + 1) as u64) as usize
}

/// Zoo model `which` (0–5) at a small random size (valid by
/// `ModelSpec::validate`).
fn draw_model(rng: &mut Rng, which: usize) -> ModelSpec {
    loop {
        let spec = match which {
            0 => {
                let hidden = between(rng, 1, 4);
                let mut widths = vec![between(rng, 3, 40)];
                widths.extend((0..hidden).map(|_| between(rng, 1, 48)));
                widths.push(between(rng, 2, 12));
                ModelSpec::from(vramlab::nn::MlpSpec {
                    widths,
                    checkpoint_every: pick(rng, &[0, 0, 1, 2, 3]),
                })
            }
            // Up to 16 channels (64 in the third block: K = 576, long
            // enough for split-K products with odd output widths).
            1 => ModelSpec::from(vramlab::nn::ResnetMiniSpec {
                width: between(rng, 2, 16),
                depth: between(rng, 1, 3),
                resolution: between(rng, 8, 20),
                classes: between(rng, 2, 10),
            }),
            2 => ModelSpec::from(vramlab::nn::AttentionSpec {
                seq_len: between(rng, 3, 20),
                dim: between(rng, 4, 20),
                hidden: between(rng, 4, 40),
                classes: between(rng, 2, 8),
            }),
            3 => {
                let heads = between(rng, 1, 3);
                let seq = between(rng, 3, 14);
                ModelSpec::from(vramlab::nn::GptSpec {
                    config: GptConfig {
                        layers: between(rng, 1, 2),
                        heads,
                        dim: heads * between(rng, 2, 6),
                        seq_len: seq + pick(rng, &[0, 0, 3]),
                        vocab: between(rng, 5, 40),
                    },
                    seq,
                    dropout: pick(rng, &[0.0, 0.0, 0.1]),
                })
            }
            4 => ModelSpec::from(vramlab::nn::SimpleCnnSpec),
            _ => ModelSpec::from(vramlab::nn::Resnet50Spec {
                depth: 50,
                width: between(rng, 2, 3),
                resolution: pick(rng, &[16, 24, 32]),
                classes: between(rng, 2, 6),
            }),
        };
        if spec.validate().is_ok() {
            return spec;
        }
    }
}

/// The allocator settings a case runs under.
const ALLOC_CONFS: [&str; 6] = [
    "",
    "",
    "expandable_segments:True",
    "max_split_size_mb:21",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,max_split_size_mb:40",
];

/// Models × modes × precisions: case `i` takes combination `i` modulo
/// this, so every combination runs once in that many cases.
const STRATA: usize = 6 * 3 * 4;

/// Case `i`: its model, mode and precision from the strata, the rest drawn.
fn draw_case(rng: &mut Rng, i: usize) -> Case {
    let model = draw_model(rng, i % 6);
    // resnet50's last BatchNorm sees one value per channel at batch 1 (a
    // 1×1 map), which PyTorch refuses in training, as vramlab does.
    let batch = match model.name() {
        "simple-cnn" => between(rng, 1, 2),
        "resnet50" => 2,
        _ => between(rng, 1, 6),
    };
    let optimizer = match rng.below(4) {
        0 => OptimizerConfig::new(OptimizerKind::Sgd, None, Some(0.0), None),
        1 => OptimizerConfig::new(OptimizerKind::Sgd, None, Some(0.9), None),
        2 => OptimizerConfig::new(OptimizerKind::Adam, None, None, None),
        _ => OptimizerConfig::new(OptimizerKind::Adamw, None, None, None),
    }
    .with_impl(pick(
        rng,
        &[
            OptimizerImpl::Foreach,
            OptimizerImpl::ForLoop,
            OptimizerImpl::Fused,
        ],
    ));
    let mut loss = pick(rng, &[LossMode::CrossEntropy, LossMode::Fused]);
    // The chunked loss runs a bias-free linear head: gpt's only. Drawn from
    // a generator of its own, so the main stream (and every other case)
    // stays what it was.
    if model.name() == "gpt" {
        let mut side = Rng::new(0x5eed ^ i as u64);
        if side.below(2) == 0 {
            let rows = between(&mut side, 1, 5);
            loss = pick(
                &mut side,
                &[LossMode::Chunked(None), LossMode::Chunked(Some(rows))],
            );
        }
    }
    let mode = [Mode::Train, Mode::Checkpoint, Mode::Inference][i / 6 % 3];
    // Plain f32, autocast, or a 16-bit model where its kernels allow one
    // (else autocast again).
    let (amp, dtype) = match i / 18 % 4 {
        0 => (None, DType::F32),
        1 => (Some(DType::F16), DType::F32),
        2 => (Some(DType::Bf16), DType::F32),
        _ if model.supports_16bit_model() => (None, pick(rng, &[DType::F16, DType::Bf16])),
        _ => (Some(pick(rng, &[DType::F16, DType::Bf16])), DType::F32),
    };
    // Accumulation trains without f16 loss scaling (PyTorch's GradScaler
    // would be stepped once per micro-batch) and has no inference form.
    let accumulate = if mode != Mode::Inference && amp != Some(DType::F16) && rng.below(3) == 0 {
        between(rng, 2, 3)
    } else {
        1
    };
    let alloc_conf = pick(rng, &ALLOC_CONFS);
    let config = AllocatorConfig::parse(alloc_conf).expect("a valid setting");
    Case {
        plan: Plan {
            model,
            batch,
            optimizer,
            mode,
            amp,
            dtype,
            loss,
            config,
        },
        accumulate,
        steps: between(rng, 1, 2),
        alloc_conf,
    }
}

/// What one run recorded.
struct Run {
    events: Vec<MemEvent>,
    layer_outputs: Vec<(Arc<str>, Vec<usize>)>,
    loss: f32,
    /// Steps the f16 GradScaler skipped (a gradient was not finite).
    skipped: Vec<bool>,
    /// Bytes of the last step's logits and loss, which the trainer holds
    /// as a Python loop's names hold them.
    held: u64,
}

/// The case's steps on `engine`, recorded from the first allocation.
fn run(engine: Engine, case: &Case) -> Result<Run, TensorError> {
    let plan = &case.plan;
    engine.allocator().start_recording();
    let (mut trainer, first) = plan.trainer(&engine, 0)?;
    // Whether the f16 GradScaler skips a step depends on the gradients'
    // values, which a simulated device does not have (the estimate assumes
    // every step updates; `estimate --measure` says when the device
    // skipped). Starting at scale 1 instead of 65536, the device's steps
    // update too, so the two runs can be held equal to the byte.
    if let Some(s) = trainer.scaler.as_mut() {
        s.scale = 1.0;
    }
    let mut micro = vec![first];
    for i in 1..case.accumulate {
        let mut rng = Rng::new(100 + i as u64);
        micro.push(Batch::random_for(
            &engine,
            &mut rng,
            &plan.model,
            plan.batch,
            plan.dtype,
        )?);
    }
    let mut loss = 0.0;
    let mut skipped = Vec::new();
    for _ in 0..case.steps {
        let record = if case.accumulate == 1 {
            trainer.step(&micro[0])?
        } else {
            trainer.step_accumulated(&micro)?
        };
        loss = record.loss;
        skipped.push(record.skipped);
    }
    engine.synchronize()?;
    let bytes = |t: &vramlab::tensor::Tensor| {
        (t.shape().iter().product::<usize>() * t.dtype().size_in_bytes()) as u64
    };
    let held = trainer
        .outputs()
        .map_or(0, |o| bytes(&o.logits) + bytes(&o.loss));
    Ok(Run {
        events: engine.allocator().take_events(),
        layer_outputs: engine.take_layer_outputs(),
        loss,
        skipped,
        held,
    })
}

/// Bytes requested by the blocks live per category after the last event
/// (a block may be larger than its request: PyTorch leaves a large block
/// unsplit when less than 1 MiB would remain).
fn live_at_end(events: &[MemEvent]) -> std::collections::BTreeMap<Category, u64> {
    let mut live = vramlab::memory::LiveBlocks::default();
    for e in events {
        live.apply(e);
    }
    let mut by = std::collections::BTreeMap::new();
    for b in live.iter() {
        *by.entry(b.category).or_insert(0) += b.requested;
    }
    by
}

/// What the step itself must keep, whatever the allocator: after it only
/// parameters, their gradients, optimizer state and the batch are alive,
/// besides the last step's logits and loss (`held` bytes, the loop's names),
/// the parameters' bytes are their shapes',
/// and reserved memory holds what is allocated in whole 2 MiB pages.
fn check_step_invariants(case: &Case, a: &Analysis, run: &Run, what: &str) {
    let events = &run.events;
    assert!(a.peak_allocated_bytes > 0, "{what}");
    assert!(a.peak_reserved_bytes >= a.peak_allocated_bytes, "{what}");
    assert!(a.allocated_after_bytes <= a.peak_allocated_bytes, "{what}");
    assert!(a.reserved_after_bytes <= a.peak_reserved_bytes, "{what}");
    assert_eq!(a.reserved_after_bytes % (2 << 20), 0, "{what}");
    assert_eq!(a.peak_reserved_bytes % (2 << 20), 0, "{what}");
    let live = live_at_end(events);
    let states = |c: &Category| {
        matches!(
            c,
            Category::Parameter | Category::Gradient | Category::OptimizerState | Category::Input
        )
    };
    let others: u64 = live
        .iter()
        .filter(|(c, _)| !states(c))
        .map(|(_, b)| b)
        .sum();
    assert!(
        run.held > 0,
        "{what}: the trainer holds the last step's outputs"
    );
    assert_eq!(
        others, run.held,
        "{what}: only the last logits and loss outlive the step besides the model's states: {live:?}"
    );
    let elem = case.plan.dtype.size_in_bytes() as u64;
    let params: u64 = case
        .plan
        .model
        .parameter_shapes()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64 * elem)
        .sum();
    let get = |c| live.get(&c).copied().unwrap_or(0);
    // resnet50's BatchNorm running statistics are buffers beside the
    // parameters; every other model's parameters are exactly its shapes.
    if case.plan.model.name() != "resnet50" {
        assert_eq!(get(Category::Parameter), params, "{what}: parameter bytes");
    }
    if case.plan.mode == Mode::Inference {
        assert_eq!(
            get(Category::Gradient),
            0,
            "{what}: inference keeps no .grad"
        );
        assert_eq!(get(Category::OptimizerState), 0, "{what}");
    } else if case.plan.model.name() != "resnet50" {
        assert_eq!(
            get(Category::Gradient),
            params,
            "{what}: one .grad per parameter"
        );
    }
}

#[test]
fn estimate_equals_measurement_over_random_configurations() {
    let seed = std::env::var("VRAMLAB_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25u64);
    let cases = std::env::var("VRAMLAB_DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(STRATA);
    let mut rng = Rng::new(seed);
    let t0 = std::time::Instant::now();
    let mut ran = 0;
    for i in 0..cases {
        let case = draw_case(&mut rng, i);
        let what = format!("case {i} of seed {seed}: {}", case.describe());
        let est = run(Engine::simulated(case.plan.config.clone(), None), &case)
            .unwrap_or_else(|e| panic!("{what}: the estimate failed: {e}"));
        let e_case = analyze(&est.events, &est.layer_outputs);
        check_step_invariants(&case, &e_case, &est, &what);
        // The device runs the step under the same settings; expandable
        // segments, which wgpu cannot map, run as PyTorch's default. Their
        // blocks are not padded as a default segment's are, so allocated
        // bytes differ too: the device is compared with the estimate under
        // the default, the expandable estimate with the device's trace
        // replayed under expandable segments.
        let device_config = if case.expandable() {
            AllocatorConfig::default()
        } else {
            case.plan.config.clone()
        };
        let e = if case.expandable() {
            let est = run(Engine::simulated(device_config.clone(), None), &case)
                .unwrap_or_else(|e| panic!("{what}: the default estimate failed: {e}"));
            analyze(&est.events, &est.layer_outputs)
        } else {
            e_case.clone()
        };
        let measured = run(common::engine_with(device_config), &case)
            .unwrap_or_else(|e| panic!("{what}: the measured run failed: {e}"));
        assert!(measured.loss.is_finite(), "{what}: loss {}", measured.loss);
        let m = analyze(&measured.events, &measured.layer_outputs);
        check_step_invariants(&case, &m, &measured, &what);
        assert!(
            !measured.skipped.contains(&true),
            "{what}: the device skipped a step at scale 1: {:?}",
            measured.skipped
        );
        assert_eq!(e.peak_allocated_bytes, m.peak_allocated_bytes, "{what}");
        assert_eq!(e.by_category, m.by_category, "{what}");
        assert_eq!(e.phases.len(), m.phases.len(), "{what}");
        assert_eq!(e.allocated_after_bytes, m.allocated_after_bytes, "{what}");
        assert_eq!(e.layers, m.layers, "{what}");
        if case.expandable() {
            // Replay = recording: the measured trace, replayed under the
            // case's setting, reserves what the estimate said.
            let w = Workload::from_events("measured", &measured.events);
            let r = compare_with(&w, &["pytorch"], None, &case.plan.config).unwrap();
            assert_eq!(
                r[0].peak_reserved_bytes, e_case.peak_reserved_bytes,
                "{what}"
            );
            assert_eq!(
                r[0].peak_allocated_bytes, e_case.peak_allocated_bytes,
                "{what}"
            );
        } else {
            assert_eq!(e.peak_reserved_bytes, m.peak_reserved_bytes, "{what}");
            assert_eq!(e.phases, m.phases, "{what}");
            assert_eq!(e.reserved_after_bytes, m.reserved_after_bytes, "{what}");
            assert_eq!(e.device_allocs, m.device_allocs, "{what}");
        }
        ran += 1;
        eprintln!(
            "case {i}: {:.1} s {}",
            t0.elapsed().as_secs_f64(),
            case.describe()
        );
    }
    eprintln!(
        "{ran} random configurations (seed {seed}): estimate = measurement, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(ran, cases);
}
