//! `vramlab train`: trains a zoo model on the GPU and prints, per step, the
//! loss and memory_allocated / memory_reserved / max_memory_allocated in MiB
//! (what the documents print), then the memory summary. With `--load`,
//! `--data` and `--dump` it reproduces a PyTorch step exactly: weights and
//! batch come from safetensors files written by PyTorch, and the last step's
//! logits, loss, gradients and updated parameters go out as safetensors.

use super::args::{AllocArgs, DeviceArgs, ModelArgs};
use crate::io::SafeTensors;
use crate::memory::memory_summary;
use crate::nn::init::Rng;
use crate::nn::ParamStore;
use crate::profile::OpTimes;
use crate::tensor::Engine;
use crate::train::{Batch, OptimizerConfig, OptimizerKind, Trainer};
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Samples per batch (ignored with --data, which fixes it).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Training steps, all on the same batch (gpt on text: fresh windows each step).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Optimizer, as in torch.optim.
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: OptimizerKind,
    /// Learning rate (default: torch.optim's, 0.01 for sgd, 1e-3 for adam/adamw).
    #[arg(long)]
    pub lr: Option<f32>,
    /// SGD momentum (default 0).
    #[arg(long)]
    pub momentum: Option<f32>,
    /// Weight decay (default 0; adamw 0.01).
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Which torch.optim implementation the step follows: foreach
    /// (PyTorch's default on CUDA), for-loop (`foreach=False`) or fused
    /// (`fused=True`); the same update, different temporaries.
    #[arg(long, value_enum, default_value = "foreach")]
    pub optimizer_impl: crate::optim::OptimizerImpl,
    /// The loss: cross-entropy (PyTorch's F.cross_entropy: log_softmax,
    /// then nll_loss; with the logits, four vocabulary-sized buffers at its
    /// peak), fused (vramlab's one kernel; two) or chunked[:ROWS] (PyTorch
    /// 2.15's F.linear_cross_entropy with LinearCrossEntropyOptions: the head
    /// and loss ROWS rows at a time, no logits; gpt only; ROWS defaults to
    /// PyTorch's own choice).
    #[arg(long, value_name = "cross-entropy|fused|chunked[:ROWS]", default_value = "cross-entropy", value_parser = crate::train::LossMode::parse)]
    pub loss: crate::train::LossMode,
    /// Seed for the initial weights and the random batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Weights from a PyTorch state_dict saved with safetensors; the model's
    /// sizes are read from their shapes.
    #[arg(long, value_name = "W.safetensors")]
    pub load: Option<PathBuf>,
    /// The batch: `x` (float, [N, ..input]) and `y` (int64 labels, [N]).
    #[arg(long, value_name = "BATCH.safetensors")]
    pub data: Option<PathBuf>,
    /// Gradient accumulation: each step runs K micro-batches of batch/K
    /// (forward and backward each, losses scaled by 1/K, gradients summed
    /// in .grad), then one optimizer step. The peak is a micro-batch's.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub accumulate: usize,
    /// gpt: train on this text file, character level (printable ASCII and
    /// newline; other bytes read as spaces), fresh random windows each step.
    /// Without it gpt trains on the Apache License text in data/.
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Write the last step's `logits`, `loss`, `grad.<name>` and
    /// `param.<name>` (after the update) here.
    #[arg(long, value_name = "OUT.safetensors")]
    pub dump: Option<PathBuf>,
    /// Write every allocation and free of the run as a JSON Lines trace
    /// (`replay`'s format; replay it through other allocators with
    /// `replay FILE --allocators ...`).
    #[arg(long, value_name = "TRACE.jsonl")]
    pub record_trace: Option<PathBuf>,
    /// Keep the graph across steps (backward(retain_graph=True) on one
    /// graph): shows memory growing step after step.
    #[arg(long)]
    pub retain_graph: bool,
    /// Mixed precision (torch.autocast): convolutions and products in f16
    /// or bf16, the loss in f32, f32 master weights, gradients and Adam
    /// state; f16 adds a GradScaler (init scale 65536, growth interval
    /// 2000). Prints the peak beside an f32 run's.
    #[arg(long, value_name = "f16|bf16", value_parser = super::args::parse_amp)]
    pub amp: Option<crate::tensor::DType>,
    /// The model's dtype: f16 or bf16 converts it (`model.half()`,
    /// `.to(torch.bfloat16)`) and the batch: parameters, gradients and
    /// optimizer state all 16-bit, no master weights, no loss scaling —
    /// watch the loss for the accuracy this loses.
    #[arg(long, value_name = "f32|f16|bf16", value_parser = super::args::parse_dtype, default_value = "f32")]
    pub dtype: crate::tensor::DType,
    /// Print each step's device time per op (PyTorch profiler's "self
    /// device time"). Device time per phase is always shown, and per op in
    /// --json, where the adapter has timestamp queries; this flag also turns
    /// on timing where it has none (a sync per kernel, which slows the run).
    #[arg(long)]
    pub op_times: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A step in `--json`: the memory record and, when timed, device time per
/// phase, op and kernel.
#[derive(serde::Serialize)]
struct StepJson {
    #[serde(flatten)]
    record: crate::train::StepRecord,
    /// With --amp: the same step's peak in f32 (simulated, exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    f32_peak_allocated_bytes: Option<u64>,
    device_time: Option<OpTimes>,
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    if args.steps == 0 {
        anyhow::bail!("--steps must be at least 1");
    }
    let mut spec = args.model.spec()?;
    // Sizes from flags and sizes from files must agree: a file that
    // changes a size the user gave is an error, not a silent override.
    let from_flags = spec.clone();
    let flags = args.model.size_flags_given();
    let agree = |spec: &crate::nn::ModelSpec, file: &str, flag: &str| -> anyhow::Result<()> {
        if *spec != from_flags && !flags.is_empty() {
            anyhow::bail!(
                "{flag} {file} holds {}, but the flags (--{}) give {}; leave those flags out (the file decides) or use a file of those sizes",
                spec.describe(),
                flags.join(", --"),
                from_flags.describe()
            );
        }
        Ok(())
    };
    let weights = match &args.load {
        Some(p) => Some(SafeTensors::read(p)?),
        None => None,
    };
    let data = match &args.data {
        Some(p) => Some(SafeTensors::read(p)?),
        None => None,
    };
    if let Some(w) = &weights {
        spec.adapt_to_weights(w)
            .map_err(anyhow::Error::msg)
            .with_context(|| {
                format!(
                    "reading the model's sizes from {} (is it a {} state_dict? pick the --model it was saved from)",
                    w.origin,
                    spec.name()
                )
            })?;
        agree(&spec, &w.origin, "--load")?;
    }
    if let Some(d) = &data {
        let (_, xs) = d.f32("x")?;
        spec.adapt_to_input(&xs)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("reading the input size from {}", d.origin))?;
        agree(&spec, &d.origin, "--data")?;
    }
    if data.is_none() && args.batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    if let Some(lr) = args.lr {
        super::args::check_number("--lr", lr, true)?;
    }
    if let Some(m) = args.momentum {
        super::args::check_number("--momentum", m, false)?;
    }
    if let Some(w) = args.weight_decay {
        super::args::check_number("--weight-decay", w, false)?;
    }
    let opt = OptimizerConfig::new(args.optimizer, args.lr, args.momentum, args.weight_decay)
        .with_impl(args.optimizer_impl);
    opt.validate().map_err(anyhow::Error::msg)?;

    let alloc_config = args.alloc.config(None)?;
    let engine = Engine::new(&args.device.options(), alloc_config.clone())?;
    if args.record_trace.is_some() {
        engine.allocator().start_recording();
    }
    let mut rng = Rng::new(args.seed);
    let mut store = ParamStore::new();
    let model = spec.build(&engine, &mut store, &mut rng)?;
    if let Some(w) = &weights {
        store.load(w).map_err(anyhow::Error::msg)?;
    }
    if args.amp.is_some() && args.dtype != crate::tensor::DType::F32 {
        anyhow::bail!(
            "--amp autocasts an f32 model; --dtype {} makes the model 16-bit already (leave one out)",
            args.dtype
        );
    }
    spec.check_dtype(args.dtype).map_err(anyhow::Error::msg)?;
    args.loss.check_model(&spec).map_err(anyhow::Error::msg)?;
    store.to_dtype(args.dtype)?;
    let is_gpt = matches!(spec, crate::nn::ModelSpec::Gpt { .. });
    if args.text.is_some() && !is_gpt {
        anyhow::bail!("--text trains a language model; use it with --model gpt");
    }
    let text = match (&args.text, is_gpt && data.is_none()) {
        (Some(p), _) => {
            let bytes =
                std::fs::read(p).with_context(|| format!("reading --text {}", p.display()))?;
            Some(crate::train::text::CharText::new(&bytes))
        }
        (None, true) => Some(crate::train::text::CharText::new(
            crate::train::text::DEFAULT_TEXT.as_bytes(),
        )),
        (None, false) => None,
    };
    if let (Some(_), crate::nn::ModelSpec::Gpt { config, .. }) = (&text, &spec) {
        if config.vocab < crate::train::text::VOCAB {
            anyhow::bail!(
                "character-level text needs --vocab of at least {} (printable ASCII and newline); got {}",
                crate::train::text::VOCAB,
                config.vocab
            );
        }
    }
    let k = args.accumulate;
    if k == 0 || (k > 1 && (data.is_some() || !args.batch.is_multiple_of(k))) {
        anyhow::bail!(
            "--accumulate {k}: needs K ≥ 1 dividing --batch {} into micro-batches, and generated batches (not --data)",
            args.batch
        );
    }
    if k > 1 && (args.retain_graph || args.amp == Some(crate::tensor::DType::F16)) {
        anyhow::bail!("--accumulate trains without --retain-graph and without f16 loss scaling (use --amp bf16)");
    }
    // Samples per micro-batch (the whole batch without --accumulate).
    let per = args.batch / k;
    let text_batch = |rng: &mut Rng, engine: &Engine| -> anyhow::Result<Option<Batch>> {
        match (&text, &spec) {
            (Some(t), crate::nn::ModelSpec::Gpt { seq, .. }) => {
                Ok(Some(t.batch(engine, rng, per, *seq)?))
            }
            _ => Ok(None),
        }
    };
    let mut batch = match &data {
        Some(d) => {
            Batch::from_safetensors(&engine, d, spec.classes()).map_err(anyhow::Error::msg)?
        }
        None if text.is_some() => text_batch(&mut rng, &engine)?.context("text batch")?,
        None => Batch::random_for(&engine, &mut rng, &spec, per, crate::tensor::DType::F32)?,
    };
    batch.to_dtype(args.dtype)?;
    // The other K − 1 micro-batches.
    let mut more: Vec<Batch> = Vec::new();
    for _ in 1..k {
        let mut b = match text_batch(&mut rng, &engine)? {
            Some(b) => b,
            None => Batch::random_for(&engine, &mut rng, &spec, per, crate::tensor::DType::F32)?,
        };
        b.to_dtype(args.dtype)?;
        more.push(b);
    }
    let gpu_name = engine.device_name();
    let uses_f16 =
        args.amp == Some(crate::tensor::DType::F16) || args.dtype == crate::tensor::DType::F16;
    if uses_f16 && !engine.has_shader_f16() && !args.json {
        println!("note: this device has no native f16 (SHADER_F16): f16 tensors are stored as f16, two per 32-bit word, and computed in f32; memory is the same, speed differs");
    }
    let backend = engine.backend_name();
    if !args.json {
        println!("vramlab train: {}", spec.describe());
        println!(
            "batch {}, {:?} lr {}{}, {} steps, on {gpu_name} ({backend})",
            batch.size(),
            opt.kind,
            opt.lr,
            if opt.momentum != 0.0 {
                format!(" momentum {}", opt.momentum)
            } else {
                String::new()
            },
            args.steps,
        );
        if let Some(t) = &text {
            let source = match &args.text {
                Some(p) => p.display().to_string(),
                None => "data/apache-2.0.txt (built in)".into(),
            };
            println!(
                "text: {source}, {} characters{}; random windows of each step's batch",
                t.tokens.len(),
                if t.replaced > 0 {
                    format!(" ({} outside printable ASCII read as spaces)", t.replaced)
                } else {
                    String::new()
                }
            );
        }
        println!(
            "parameters: {} elements = {:.2} MiB{}",
            store.numel(),
            mib((store.numel() * 4) as u64),
            if args.retain_graph {
                "; retain_graph: the graph of every step is kept"
            } else {
                ""
            }
        );
        println!();
    }
    // With --amp, the same steps in f32 on a simulated device (memory
    // depends on shapes only, so its peaks are the f32 run's to the byte).
    let f32_peaks: Option<Vec<u64>> = match args.amp {
        Some(_) => {
            let plan = crate::estimate::Plan {
                model: spec.clone(),
                batch: batch.size(),
                optimizer: opt,
                mode: crate::train::Mode::Train,
                amp: None,
                dtype: crate::tensor::DType::F32,
                loss: args.loss,
                config: alloc_config.clone(),
            };
            Some(plan.step_peaks(args.steps)?)
        }
        None => None,
    };
    let timing = if args.op_times || engine.has_timestamp_queries() {
        engine.start_timing()
    } else {
        None
    };
    let mut trainer =
        Trainer::new(engine, model, store, opt.build(), args.retain_graph).with_amp(args.amp);
    trainer.loss = args.loss;
    let mut records = Vec::new();
    let mut last = None;
    for i in 0..args.steps {
        if i > 0 {
            if let Some(b) = text_batch(&mut rng, &trainer.engine)? {
                batch = b;
                for m in more.iter_mut() {
                    if let Some(b) = text_batch(&mut rng, &trainer.engine)? {
                        *m = b;
                    }
                }
            }
        }
        let (r, out) = if more.is_empty() {
            trainer.step(&batch)?
        } else {
            let micro: Vec<Batch> = std::iter::once(&batch).chain(&more).cloned().collect();
            trainer.step_accumulated(&micro)?
        };
        if !r.loss.is_finite() {
            let mut e = super::args::non_finite_loss(r.step, r.loss);
            // PyTorch's foreach and for-loop Adam store sqrt(v) + eps in
            // the parameters' dtype: in f16, eps 1e-8 rounds to 0 and a
            // zero second moment divides by zero, as it does in PyTorch.
            if args.dtype != crate::tensor::DType::F32
                && opt.kind != OptimizerKind::Sgd
                && opt.implementation != crate::optim::OptimizerImpl::Fused
            {
                e.0.push_str(&format!(
                    ". With {} parameters, {} Adam keeps sqrt(v) + eps in {} too (as PyTorch's does), where eps = 1e-8 rounds to 0; pure 16-bit Adam is fragile in PyTorch as well: --amp {} keeps f32 parameters and state (--optimizer-impl fused computes in f32 but stores {})",
                    args.dtype, opt.implementation, args.dtype, args.dtype, args.dtype
                ));
            }
            return Err(e.into());
        }
        let device_time = match trainer.engine.take_dispatch_times()? {
            Some((source, times)) if timing.is_some() => Some(OpTimes::of(source, &times)),
            _ => None,
        };
        if !args.json {
            println!(
                "step {:>3}  loss {:<10.6} memory_allocated {:>9.2} MiB  memory_reserved {:>9.2} MiB  max_memory_allocated {:>9.2} MiB",
                r.step,
                r.loss,
                mib(r.allocated_bytes),
                mib(r.reserved_bytes),
                mib(r.peak_allocated_bytes)
            );
            if let (Some(d), Some(peaks)) = (args.amp, &f32_peaks) {
                let f32_peak = peaks[r.step - 1];
                println!(
                    "          amp {d}: peak {:.2} MiB vs {:.2} MiB in f32 ({:+.1}%){}{}",
                    mib(r.peak_allocated_bytes),
                    mib(f32_peak),
                    (r.peak_allocated_bytes as f64 / f32_peak as f64 - 1.0) * 100.0,
                    r.grad_scale
                        .map(|s| format!(", grad scale {s}"))
                        .unwrap_or_default(),
                    if r.skipped {
                        " (inf/NaN gradient: step skipped, scale halved)"
                    } else {
                        ""
                    }
                );
            }
            if let Some(d) = &device_time {
                if args.op_times {
                    print!("{}", d.table(12));
                } else {
                    let phases: Vec<String> = d
                        .phases
                        .iter()
                        .map(|p| format!("{} {:.1} ms", p.name, p.seconds * 1e3))
                        .collect();
                    println!("          device time: {}", phases.join(", "));
                }
            }
        }
        let f32_peak = f32_peaks.as_ref().map(|p| p[r.step - 1]);
        records.push(StepJson {
            record: r,
            f32_peak_allocated_bytes: f32_peak,
            device_time,
        });
        last = Some(out);
    }
    if let (Some(path), Some(out)) = (&args.dump, &last) {
        let mut st = SafeTensors::new();
        // The chunked loss never makes logits: its output is the head's input.
        let output = if args.loss.fuses_head() {
            "hidden"
        } else {
            "logits"
        };
        st.insert_f32(output, out.logits.shape(), &out.logits.to_vec()?)?;
        st.insert_f32("loss", &[], &out.loss.to_vec()?)?;
        trainer.store.dump(&mut st)?;
        st.metadata.insert("model".into(), spec.describe());
        st.metadata
            .insert("optimizer".into(), format!("{:?} lr {}", opt.kind, opt.lr));
        st.write(path)?;
        if !args.json {
            println!(
                "\nwrote {} ({} tensors: {output}, loss, grad.*, param.*)",
                path.display(),
                st.tensors.len()
            );
        }
    }
    if let Some(path) = &args.record_trace {
        let events = trainer.engine.allocator().take_events();
        let lines: Vec<String> = crate::lab::workload::to_trace(&events)
            .iter()
            .map(|e| e.to_line())
            .collect();
        crate::io::write_atomic(path, (lines.join("\n") + "\n").as_bytes())
            .with_context(|| format!("cannot write --record-trace {}", path.display()))?;
        if !args.json {
            println!("\nwrote {} ({} events)", path.display(), lines.len());
        }
    }
    let levels = trainer.engine.three_levels();
    let alloc = trainer.engine.allocator();
    if args.json {
        let report = serde_json::json!({
            "model": spec,
            "batch": batch.size(),
            "optimizer": opt,
            "adapter": gpu_name,
            "backend": backend,
            "parameters": trainer.store.numel(),
            "optimizer_state_bytes": trainer.optimizer.state_bytes(),
            "retain_graph": args.retain_graph,
            "amp": args.amp,
            "dtype": args.dtype,
            "steps": records,
            "memory_stats": alloc.stats().flat(),
            "three_levels": levels,
            "seconds": start.elapsed().as_secs_f64(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!();
    println!("memory: {levels}");
    print!("{}", memory_summary(alloc.stats(), &gpu_name, true));
    println!("finished in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
