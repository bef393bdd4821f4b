//! `vramlab train`: trains a zoo model on the GPU and prints, per step, the
//! loss and memory_allocated / memory_reserved / max_memory_allocated in MiB
//! (what the documents print), then the memory summary. With `--load`,
//! `--data` and `--dump` it reproduces a PyTorch step exactly: weights and
//! batch come from safetensors files written by PyTorch, and the last step's
//! logits, loss, gradients and updated parameters go out as safetensors.

use super::args::{AllocArgs, DeviceArgs, ModelArgs};
use crate::io::SafeTensors;
use crate::memory::memory_summary;
use crate::memory::mib;
use crate::memory::AllocatorConfig;
use crate::nn::init::Rng;
use crate::nn::{Model, ModelSpec, ParamStore};
use crate::profile::OpTimes;
use crate::tensor::{DType, Engine};
use crate::train::step::StepOutputs;
use crate::train::text::CharText;
use crate::train::{Batch, OptimizerConfig, OptimizerKind, StepRecord, Trainer};
use anyhow::Context;
use clap::Args;
use std::path::{Path, PathBuf};
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
    /// Micro-batches are generated (not --data), each drawn on its own.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub accumulate: usize,
    /// gpt: train on this text file, character level (printable ASCII and
    /// newline; other bytes read as spaces), fresh random windows each step.
    /// Without it gpt trains on the Apache License text in data/.
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Write the last step's `logits`, `loss`, `grad.<name>` and
    /// `param.<name>` (after the update) here, all as f32 whatever --dtype
    /// (16-bit values widen exactly).
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

/// Runs `vramlab train`: flags checked, setup, the steps, the files
/// written, then the report (text or JSON).
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let checked = check_flags(args)?;
    // The output files' directories before any training: a path that
    // cannot be written is found now, not after the run.
    for (flag, path) in [
        ("--dump", &args.dump),
        ("--record-trace", &args.record_trace),
    ] {
        if let Some(path) = path {
            super::args::out_file_dir(flag, path)?;
        }
    }
    super::args::outputs_apart(
        &[
            ("--dump", args.dump.as_deref()),
            ("--record-trace", args.record_trace.as_deref()),
        ],
        &[
            ("--data", args.data.as_deref()),
            ("--text", args.text.as_deref()),
        ],
    )?;
    // --dump may replace its --load (read whole before the first step): a
    // run that goes on from a checkpoint and writes it back.
    super::args::outputs_apart(
        &[("--record-trace", args.record_trace.as_deref())],
        &[("--load", args.load.as_deref())],
    )?;
    let setup = setup(args, checked)?;
    print_header(args, &setup);
    let f32_peaks = f32_peaks(args, &setup)?;
    let mut training = Training::start(args, setup);
    let records = match train_loop(args, &mut training, f32_peaks.as_deref()) {
        Ok(r) => r,
        // A run that ran out of memory is the trace most worth replaying
        // (`replay --allocators`): written up to the refusal.
        Err(e) => match &args.record_trace {
            Some(path) if super::is_oom(&e) => {
                let said = match write_trace(args, &training.trainer.engine, path, true) {
                    Ok(()) => format!(
                        "its allocations up to the refusal, the refused one last, are in --record-trace {}",
                        path.display()
                    ),
                    Err(w) => format!("and its trace could not be written: {w:#}"),
                };
                return Err(e.context(format!("the run ran out of memory; {said}")));
            }
            _ => return Err(e),
        },
    };
    if let (Some(path), Some(out)) = (&args.dump, training.trainer.outputs()) {
        dump(args, &training, path, out)?;
    }
    if let Some(path) = &args.record_trace {
        write_trace(args, &training.trainer.engine, path, false)?;
    }
    print_report(args, &training, records, start)
}

/// What [`check_flags`] hands on: the model's sizes (from the flags and
/// any files), the files read, and the optimizer.
struct Checked {
    spec: ModelSpec,
    weights: Option<SafeTensors>,
    data: Option<SafeTensors>,
    opt: OptimizerConfig,
}

/// Refuses the bad flags that need no device (steps, batch, sizes against
/// the files, optimizer numbers) and reads `--load` and `--data`.
fn check_flags(args: &TrainArgs) -> anyhow::Result<Checked> {
    if args.steps == 0 {
        anyhow::bail!("--steps must be at least 1");
    }
    let (spec, weights, data) = model_and_files(args)?;
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
    Ok(Checked {
        spec,
        weights,
        data,
        opt,
    })
}

/// The model's sizes from the flags, then from `--load`'s weights and
/// `--data`'s batch (both read here), refused where a file contradicts a flag.
fn model_and_files(
    args: &TrainArgs,
) -> anyhow::Result<(ModelSpec, Option<SafeTensors>, Option<SafeTensors>)> {
    if args.text.is_some() && args.data.is_some() {
        anyhow::bail!(
            "--text and --data both give the batch (windows of the text, or the file's x and y); give one of them"
        );
    }
    let flags = args.model.size_flags_given();
    let weights = match &args.load {
        Some(p) => Some(weights_of(SafeTensors::read(p)?)),
        None => None,
    };
    let data = match &args.data {
        Some(p) => Some(SafeTensors::read(p)?),
        None => None,
    };
    let mut spec = match &weights {
        None => args.model.spec()?,
        Some(w) => sizes_from_weights(args, w, &flags)?,
    };
    if let Some(d) = &data {
        // The shape only: a language model's x holds integer token ids,
        // which the batch reads (f32 here refused int64, the dtype its own
        // error advised).
        let xs = d.get("x")?.shape.clone();
        spec.adapt_to_input(&xs)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("reading the input size from {}", d.origin))?;
        agree(args, &spec, &flags, &d.origin, "--data")?;
        // What no size adapts to (simple-cnn takes 3×32×32 only; an mlp's
        // input is flat): refused here, naming the file, not mid-step.
        let sample = spec.input_shape();
        if spec.vocab().is_some() && xs.len() != 2 {
            anyhow::bail!(
                "--data {}: x is {xs:?}, and {} takes token ids of [N, positions] (int64); reshape x",
                d.origin,
                spec.describe()
            );
        }
        if spec.vocab().is_none() && xs.get(1..) != Some(&sample[..]) {
            let want: Vec<String> = sample.iter().map(usize::to_string).collect();
            anyhow::bail!(
                "--data {}: x is {xs:?}, and {} takes samples of [{}] (x of [N, {}]); reshape x, or pick the --model (and sizes) it was made for",
                d.origin,
                spec.describe(),
                want.join(", "),
                want.join(", ")
            );
        }
    }
    Ok((spec, weights, data))
}

/// `--load`'s weights: a state_dict as it is, or a `--dump` file's
/// `param.<name>` and `buffer.<name>` tensors under their names (its
/// gradients, logits and loss left out), so a run continues from where a
/// dumped one stopped.
fn weights_of(st: SafeTensors) -> SafeTensors {
    // `hidden` stands for the logits under --loss chunked, which makes none.
    let dumped = |k: &str| {
        ["param.", "grad.", "buffer."]
            .iter()
            .any(|p| k.starts_with(p))
            || ["logits", "hidden", "loss"].contains(&k)
    };
    if !st.tensors.keys().any(|k| k.starts_with("param.")) || !st.tensors.keys().all(|k| dumped(k))
    {
        return st;
    }
    let tensors = st
        .tensors
        .into_iter()
        .filter_map(|(k, t)| {
            let name = k.strip_prefix("param.").or(k.strip_prefix("buffer."))?;
            Some((name.to_string(), t))
        })
        .collect();
    SafeTensors { tensors, ..st }
}

/// The model `--load`'s state_dict `w` describes, with the size flags on
/// top: the file's shapes decide every size they hold, so a flag may add
/// only what no shape holds (gpt's --heads, a resnet's --resolution) or
/// repeat what the file says; one that contradicts it is refused. (Flags
/// were checked first, against the defaults, so `--heads 3` for a file of
/// dim 12 failed on the default dim 64.)
fn sizes_from_weights(
    args: &TrainArgs,
    w: &SafeTensors,
    flags: &[&str],
) -> anyhow::Result<ModelSpec> {
    let adapt = |spec: &mut ModelSpec| {
        let name = spec.name();
        spec.adapt_to_weights(w)
            .map_err(anyhow::Error::msg)
            .with_context(|| {
                format!(
                    "reading the model's sizes from {} (is it a {name} state_dict? pick the --model it was saved from)",
                    w.origin
                )
            })
    };
    let mut spec = ModelSpec::default_for(&args.model.model).map_err(anyhow::Error::msg)?;
    // A vramlab dump names its model: another --model is refused naming
    // it, before a missing tensor or head count would say less.
    if let Some(m) = w.metadata.get("model") {
        let dumped = m.split_whitespace().next().unwrap_or_default();
        if ModelSpec::default_for(dumped).is_ok() && dumped != spec.name() {
            anyhow::bail!(
                "{} was dumped from {dumped} ({m}), not {}: pass --model {dumped}",
                w.origin,
                spec.name()
            );
        }
    }
    // gpt's head count is in no shape: from the file's metadata (vramlab's
    // --dump and the PyTorch-side scripts write it), else --heads. A guess
    // trains with the loss right and the attention's gradients wrong (and
    // the default 4 may not divide the file's dim). A file with no gpt
    // table is refused below for that, more to the point.
    if spec.vocab().is_some()
        && w.tensors.contains_key("wte.weight")
        && !flags.contains(&"heads")
        && !w.metadata.contains_key("heads")
    {
        anyhow::bail!(
            "{} says nothing of the head count (no shape holds it, and it has no `heads` metadata): give --heads as the model was built (nanoGPT's n_head), or save it with safetensors' metadata={{\"heads\": \"N\"}}",
            w.origin
        );
    }
    adapt(&mut spec)?;
    let from_file = spec.clone();
    spec.apply(&args.model.sizes_given()).map_err(|e| {
        anyhow::anyhow!(
            "{e} (with the sizes --load {} holds: {})",
            w.origin,
            from_file.describe()
        )
    })?;
    // The flags agree with the file where reading the file again changes
    // nothing they set.
    let mut again = spec.clone();
    adapt(&mut again)?;
    if again != spec {
        anyhow::bail!(
            "--load {} holds {}, but the flags (--{}) give {}; leave those flags out (the file decides) or use a file of those sizes",
            w.origin,
            again.describe(),
            flags.join(", --"),
            spec.describe()
        );
    }
    Ok(spec)
}

/// Refuses a file (`flag` names it) whose sizes differ from those the size
/// flags gave, when any were given.
/// Sizes from flags and sizes from files must agree: a file that changes a
/// size the user gave is an error, not a silent override. Only the sizes
/// the flags set are compared (applied again on top of what the file
/// decided, they change nothing); a size no flag gave is the file's to set,
/// as `--data`'s sequence length is (it was refused once any flag, say
/// `--heads`, was given).
fn agree(
    args: &TrainArgs,
    spec: &ModelSpec,
    flags: &[&str],
    file: &str,
    flag: &str,
) -> anyhow::Result<()> {
    if flags.is_empty() {
        return Ok(());
    }
    let mut from_flags = spec.clone();
    let applied = from_flags.apply(&args.model.sizes_given());
    if applied.is_err() || from_flags != *spec {
        anyhow::bail!(
            "{flag} {file} holds {}, but the flags (--{}) give {}; leave those flags out (the file decides) or use a file of those sizes",
            spec.describe(),
            flags.join(", --"),
            from_flags.describe()
        );
    }
    Ok(())
}

/// Refuses the precision and loss flags the model cannot take (checked
/// after the model is built, as before).
fn check_precision(args: &TrainArgs, spec: &ModelSpec) -> anyhow::Result<()> {
    if args.amp.is_some() && args.dtype != DType::F32 {
        anyhow::bail!(
            "--amp autocasts an f32 model; --dtype {} makes the model 16-bit already (leave one out)",
            args.dtype
        );
    }
    spec.check_dtype(args.dtype).map_err(anyhow::Error::msg)?;
    args.loss.check_model(spec).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Refuses `--accumulate` where it cannot split the batch or meets a flag
/// it does not train with.
fn check_accumulate(args: &TrainArgs, has_data: bool) -> anyhow::Result<()> {
    let k = args.accumulate;
    if k > 1 && has_data {
        anyhow::bail!(
            "--accumulate {k} cuts generated batches into micro-batches; --data's one batch is not cut: leave one of them out"
        );
    }
    if k == 0 || (k > 1 && !args.batch.is_multiple_of(k)) {
        anyhow::bail!(
            "--accumulate {k}: needs K ≥ 1 dividing --batch {} into micro-batches of one size",
            args.batch
        );
    }
    if k > 1 && (args.retain_graph || args.amp == Some(DType::F16)) {
        anyhow::bail!("--accumulate trains without --retain-graph and without f16 loss scaling (use --amp bf16)");
    }
    Ok(())
}

/// The engine, the model and its parameters, the text and the first
/// step's batches, before the trainer takes them.
struct Setup {
    spec: ModelSpec,
    opt: OptimizerConfig,
    alloc_config: AllocatorConfig,
    engine: Engine,
    model: Box<dyn Model>,
    store: ParamStore,
    rng: Rng,
    text: Option<CharText>,
    /// Samples per micro-batch (the whole batch without --accumulate).
    per: usize,
    batch: Batch,
    /// The other K − 1 micro-batches.
    more: Vec<Batch>,
}

/// Makes the engine, the model (weights loaded, dtype converted), the text
/// and the batches, refusing the flags checked against the built model.
fn setup(args: &TrainArgs, checked: Checked) -> anyhow::Result<Setup> {
    let Checked {
        spec,
        weights,
        data,
        opt,
    } = checked;
    let alloc_config = args.alloc.config(None)?;
    let engine = args.device.engine(alloc_config.clone())?;
    if args.record_trace.is_some() {
        engine.allocator().start_recording();
    }
    let mut rng = Rng::new(args.seed);
    let mut store = ParamStore::new();
    let model = spec.build(&engine, &mut store, &mut rng)?;
    if let Some(w) = &weights {
        store
            .load_with_buffers(w, &model.buffers())
            .map_err(|e| match (&args.data, &e) {
                // --data sized the model's input: a weight that disagrees
                // in shape may be the batch's fault, not the file's.
                (Some(d), crate::tensor::TensorError::Load { problems, .. })
                    if problems
                        .iter()
                        .any(|p| matches!(p, crate::tensor::LoadProblem::Shape { .. })) =>
                {
                    anyhow::anyhow!(
                        "{e}\n(the model's input and sequence sizes come from --data {}, its x of shape {:?}: if the weights are the model's, that batch is not)",
                        d.display(),
                        data.as_ref()
                            .and_then(|b| b.tensors.get("x"))
                            .map(|x| x.shape.clone())
                            .unwrap_or_default()
                    )
                }
                _ => anyhow::Error::msg(e),
            })?;
    }
    check_precision(args, &spec)?;
    store.to_dtype(args.dtype)?;
    let text = load_text(args, &spec, data.is_some())?;
    check_accumulate(args, data.is_some())?;
    // Samples per micro-batch (the whole batch without --accumulate).
    let per = args.batch / args.accumulate;
    let (batch, more) = first_batches(
        args,
        &engine,
        &mut rng,
        &spec,
        data.as_ref(),
        text.as_ref(),
        per,
    )?;
    Ok(Setup {
        spec,
        opt,
        alloc_config,
        engine,
        model,
        store,
        rng,
        text,
        per,
        batch,
        more,
    })
}

/// The character text gpt trains on: `--text`'s file, or the built-in text
/// when gpt has no `--data`; refuses `--text` for other models and a vocab
/// too small for it.
fn load_text(
    args: &TrainArgs,
    spec: &ModelSpec,
    has_data: bool,
) -> anyhow::Result<Option<CharText>> {
    let is_gpt = spec.vocab().is_some();
    if args.text.is_some() && !is_gpt {
        anyhow::bail!("--text trains a language model; use it with --model gpt");
    }

    let text = match (&args.text, is_gpt && !has_data) {
        (Some(p), _) => {
            let bytes = crate::io::bounded::read_whole(p, crate::io::bounded::STREAM_LIMIT)
                .with_context(|| format!("reading --text {}", p.display()))?;
            Some(CharText::new(&bytes))
        }
        (None, true) => Some(CharText::new(crate::train::text::DEFAULT_TEXT.as_bytes())),
        (None, false) => None,
    };
    if let (Some(_), Some(vocab)) = (&text, spec.vocab()) {
        if vocab < crate::train::text::VOCAB {
            anyhow::bail!(
                "character-level text needs --vocab of at least {} (printable ASCII and newline); got {vocab}",
                crate::train::text::VOCAB,
            );
        }
    }
    Ok(text)
}

/// Fresh random windows of the text as a batch of `per` samples, or `None`
/// when the model trains on no text.
fn text_batch(
    text: Option<&CharText>,
    spec: &ModelSpec,
    per: usize,
    rng: &mut Rng,
    engine: &Engine,
) -> anyhow::Result<Option<Batch>> {
    match (text, spec.vocab()) {
        (Some(t), Some(_)) => Ok(Some(t.batch(engine, rng, per, spec.input_shape()[0])?)),
        _ => Ok(None),
    }
}

/// The first step's batch (from `--data`, the text, or random) and the
/// other K − 1 micro-batches, all in `--dtype`.
fn first_batches(
    args: &TrainArgs,
    engine: &Engine,
    rng: &mut Rng,
    spec: &ModelSpec,
    data: Option<&SafeTensors>,
    text: Option<&CharText>,
    per: usize,
) -> anyhow::Result<(Batch, Vec<Batch>)> {
    let mut batch = match data {
        Some(d) => Batch::from_safetensors(engine, d, spec.classes(), spec.vocab())
            .map_err(anyhow::Error::msg)?,
        None if text.is_some() => {
            text_batch(text, spec, per, rng, engine)?.context("text batch")?
        }
        None => Batch::random_for(engine, rng, spec, per, DType::F32)?,
    };
    batch.to_dtype(args.dtype)?;
    let mut more: Vec<Batch> = Vec::new();
    for _ in 1..args.accumulate {
        let mut b = match text_batch(text, spec, per, rng, engine)? {
            Some(b) => b,
            None => Batch::random_for(engine, rng, spec, per, DType::F32)?,
        };
        b.to_dtype(args.dtype)?;
        more.push(b);
    }
    Ok((batch, more))
}

/// Prints (as text, not with `--json`) the f16 note, the run's
/// description, the text's source and the parameter count.
fn print_header(args: &TrainArgs, s: &Setup) {
    // On stderr, so under --json too.
    if let (Some(t), Some(p)) = (&s.text, &args.text) {
        if 2 * t.replaced > t.tokens.len() {
            eprintln!(
                "warning: most of {} ({} of {} bytes) is outside printable ASCII and reads as spaces: the model learns little but spaces from it (vramlab's gpt reads text character by character, in ASCII)",
                p.display(),
                t.replaced,
                t.tokens.len()
            );
        }
    }
    if args.json {
        return;
    }
    let uses_f16 = args.amp == Some(DType::F16) || args.dtype == DType::F16;
    if uses_f16 && !s.engine.has_shader_f16() {
        println!("note: this device has no native f16 (SHADER_F16): f16 tensors are stored as f16, two per 32-bit word, and computed in f32; memory is the same, speed differs");
    }
    println!("vramlab train: {}", s.spec.describe());
    // The batch as given; with --accumulate, the micro-batches it is cut
    // into (what each forward holds).
    let micro = if args.accumulate > 1 {
        format!(" ({} micro-batches of {})", args.accumulate, s.batch.size())
    } else {
        String::new()
    };
    println!(
        "batch {}{micro}, {} lr {}{}, {}, on {} ({})",
        s.batch.size() * args.accumulate,
        s.opt.kind,
        s.opt.lr,
        [
            ("momentum", s.opt.momentum),
            ("weight decay", s.opt.weight_decay)
        ]
        .iter()
        .filter(|(_, v)| *v != 0.0)
        .map(|(name, v)| format!(" {name} {v}"))
        .collect::<String>(),
        super::steps(args.steps),
        s.engine.device_name(),
        s.engine.backend_name(),
    );
    if let Some(t) = &s.text {
        let source = match &args.text {
            Some(p) => p.display().to_string(),
            None => "data/apache-2.0.txt (built in)".into(),
        };
        // Bytes, each a token: a UTF-8 letter is two to four of them.
        println!(
            "text: {source}, {} bytes{}; random windows of each step's batch",
            t.tokens.len(),
            if t.replaced > 0 {
                format!(" ({} outside printable ASCII read as spaces)", t.replaced)
            } else {
                String::new()
            }
        );
    }
    println!(
        "parameters: {} elements = {:.2} MiB in {}{}",
        s.store.numel(),
        mib((s.store.numel() * args.dtype.size_in_bytes()) as u64),
        args.dtype,
        if args.retain_graph {
            "; retain_graph: the graph of every step is kept"
        } else {
            ""
        }
    );
    println!();
}

/// With `--amp`, each step's peak for the same steps in f32 on a simulated
/// device (memory depends on shapes only, so they are the f32 run's to the byte).
fn f32_peaks(args: &TrainArgs, s: &Setup) -> anyhow::Result<Option<Vec<u64>>> {
    if args.amp.is_none() {
        return Ok(None);
    }
    let plan = crate::estimate::Plan {
        model: s.spec.clone(),
        batch: s.batch.size(),
        optimizer: s.opt,
        mode: crate::train::Mode::Train,
        amp: None,
        dtype: DType::F32,
        loss: args.loss,
        config: s.alloc_config.clone(),
    };
    Ok(Some(plan.step_peaks(args.steps)?))
}

/// The trainer and what its steps need: the batches, the text and the rng
/// for fresh windows, and the names the report prints.
struct Training {
    trainer: Trainer,
    spec: ModelSpec,
    opt: OptimizerConfig,
    rng: Rng,
    text: Option<CharText>,
    per: usize,
    batch: Batch,
    more: Vec<Batch>,
    gpu_name: String,
    backend: &'static str,
    /// Whether device time is taken per step.
    timed: bool,
}

impl Training {
    /// Starts device timing (where the adapter or `--op-times` asks for
    /// it) and hands the engine, model and parameters to a trainer.
    fn start(args: &TrainArgs, s: Setup) -> Training {
        let gpu_name = s.engine.device_name();
        let backend = s.engine.backend_name();
        let timing = if args.op_times || s.engine.has_timestamp_queries() {
            s.engine.start_timing()
        } else {
            None
        };
        let mut trainer =
            Trainer::new(s.engine, s.model, s.store, s.opt.build(), args.retain_graph)
                .with_amp(args.amp);
        trainer.loss = args.loss;
        Training {
            trainer,
            spec: s.spec,
            opt: s.opt,
            rng: s.rng,
            text: s.text,
            per: s.per,
            batch: s.batch,
            more: s.more,
            gpu_name,
            backend,
            timed: timing.is_some(),
        }
    }

    /// Replaces the batches with fresh text windows (gpt on text; else
    /// the batches stay).
    fn next_windows(&mut self) -> anyhow::Result<()> {
        let (text, spec, per) = (self.text.as_ref(), &self.spec, self.per);
        if let Some(b) = text_batch(text, spec, per, &mut self.rng, &self.trainer.engine)? {
            self.batch = b;
            for m in self.more.iter_mut() {
                if let Some(b) = text_batch(text, spec, per, &mut self.rng, &self.trainer.engine)? {
                    *m = b;
                }
            }
        }
        Ok(())
    }

    /// One optimizer step: on the batch, or on its K micro-batches.
    fn step(&mut self) -> anyhow::Result<StepRecord> {
        Ok(if self.more.is_empty() {
            self.trainer.step(&self.batch)?
        } else {
            let micro: Vec<Batch> = std::iter::once(&self.batch)
                .chain(&self.more)
                .cloned()
                .collect();
            self.trainer.step_accumulated(&micro)?
        })
    }
}

/// Runs `--steps` steps, printing each (as text); returns their records
/// (the trainer holds the last step's outputs, as the loop's names).
fn train_loop(
    args: &TrainArgs,
    t: &mut Training,
    f32_peaks: Option<&[u64]>,
) -> anyhow::Result<Vec<StepJson>> {
    let mut records = Vec::new();
    for i in 0..args.steps {
        if i > 0 {
            t.next_windows()?;
        }
        let r = t.step()?;
        check_loss(args, &t.opt, &r)?;
        let device_time = match t.trainer.engine.take_dispatch_times()? {
            Some((source, times)) if t.timed => Some(OpTimes::of(source, &times)),
            _ => None,
        };
        let f32_peak = f32_peaks.map(|p| p[r.step - 1]);
        if !args.json {
            print_step(args, &r, f32_peak, device_time.as_ref());
        }
        records.push(StepJson {
            record: r,
            f32_peak_allocated_bytes: f32_peak,
            device_time,
        });
    }
    Ok(records)
}

/// Stops the run at a NaN or infinite loss, saying why pure 16-bit Adam
/// may have made it.
fn check_loss(args: &TrainArgs, opt: &OptimizerConfig, r: &StepRecord) -> anyhow::Result<()> {
    if r.loss.is_finite() {
        return Ok(());
    }
    let files: Vec<&str> = [("--load", &args.load), ("--data", &args.data)]
        .into_iter()
        .filter(|(_, p)| p.is_some())
        .map(|(flag, _)| flag)
        .collect();
    let set: Vec<&str> = [
        ("--momentum", args.momentum),
        ("--weight-decay", args.weight_decay),
    ]
    .into_iter()
    .filter(|(_, v)| v.is_some_and(|v| v != 0.0))
    .map(|(flag, _)| flag)
    .collect();
    let mut e = super::args::non_finite_loss(r.step, r.loss, &files, &set);
    // PyTorch's foreach and for-loop Adam store sqrt(v) + eps in
    // the parameters' dtype: in f16, eps 1e-8 rounds to 0 and a
    // zero second moment divides by zero, as it does in PyTorch.
    if args.dtype != DType::F32
        && opt.kind != OptimizerKind::Sgd
        && opt.implementation != crate::optim::OptimizerImpl::Fused
    {
        e.0.push_str(&format!(
            ". With {} parameters, {} Adam keeps sqrt(v) + eps in {} too (as PyTorch's does), where eps = 1e-8 rounds to 0; pure 16-bit Adam is fragile in PyTorch as well: --amp {} keeps f32 parameters and state (--optimizer-impl fused computes in f32 but stores {})",
            args.dtype, opt.implementation, args.dtype, args.dtype, args.dtype
        ));
    }
    Err(e.into())
}

/// Prints a step's line: loss and memory, the amp peak beside f32's, and
/// device time per phase (per op with `--op-times`).
fn print_step(
    args: &TrainArgs,
    r: &StepRecord,
    f32_peak: Option<u64>,
    device_time: Option<&OpTimes>,
) {
    println!(
        "step {:>3}  loss {:<10.6} memory_allocated {:>9.2} MiB  memory_reserved {:>9.2} MiB  max_memory_allocated {:>9.2} MiB",
        r.step,
        // A one-class cross-entropy is exactly -0.0 (-(x - x)); + 0.0 prints
        // it as the 0 it is. `--json` keeps the value as computed.
        r.loss + 0.0,
        mib(r.allocated_bytes),
        mib(r.reserved_bytes),
        mib(r.peak_allocated_bytes)
    );
    if let (Some(d), Some(f32_peak)) = (args.amp, f32_peak) {
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
    if let Some(d) = device_time {
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

/// Writes `--dump`: the last step's output, loss, gradients and updated
/// parameters as safetensors.
fn dump(args: &TrainArgs, t: &Training, path: &Path, out: &StepOutputs) -> anyhow::Result<()> {
    let mut st = SafeTensors::new();
    // The chunked loss never makes logits: its output is the head's input.
    let output = if args.loss.fuses_head() {
        "hidden"
    } else {
        "logits"
    };
    st.insert_f32(output, out.logits.shape(), &out.logits.to_vec()?)?;
    st.insert_f32("loss", &[], &out.loss.to_vec()?)?;
    t.trainer.store.dump(&mut st)?;
    // The running statistics training updated, as `buffer.<name>`: a run
    // that goes on from the dump starts from them.
    let buffers = t.trainer.model.buffers();
    for (name, b) in &buffers {
        st.insert_f32(&format!("buffer.{name}"), b.shape(), &b.to_vec()?)?;
    }
    st.metadata.insert("model".into(), t.spec.describe());
    // The GradScaler's scale after the step (`scaler.get_scale()`), to line
    // a skipped step up with PyTorch's.
    if let Some(scaler) = &t.trainer.scaler {
        st.metadata
            .insert("grad_scale".into(), scaler.scale.to_string());
    }
    // What no shape holds, so that --load reads the dump back as it ran.
    if let Some(g) = t.spec.get::<crate::nn::GptSpec>() {
        st.metadata
            .insert("heads".into(), g.config.heads.to_string());
    }
    st.metadata.insert(
        "optimizer".into(),
        format!("{} lr {}", t.opt.kind, t.opt.lr),
    );
    // The chain keeps the operating system's reason ("No space left").
    st.write(path)
        .with_context(|| format!("--dump {}", path.display()))?;
    if !args.json {
        println!(
            "\nwrote {} ({} tensors: {output}, loss, grad.*, param.*{})",
            path.display(),
            st.tensors.len(),
            if buffers.is_empty() { "" } else { ", buffer.*" }
        );
    }
    Ok(())
}

/// Writes `--record-trace`: every allocation and free of the run, as
/// JSON Lines.
/// With `refused`, the run ran out of memory: the trace stops at the
/// refusal (not the frees of the step's unwinding) and ends with the
/// refused request, so a replay under the run's settings refuses it too.
fn write_trace(
    args: &TrainArgs,
    engine: &Engine,
    path: &Path,
    refused: bool,
) -> anyhow::Result<()> {
    let mut events = engine.allocator().take_events();
    let oom = refused
        .then(|| {
            events
                .iter()
                .position(|e| e.kind == crate::memory::EventKind::Oom)
        })
        .flatten();
    let mut trace = crate::lab::workload::to_trace(&events[..oom.unwrap_or(events.len())]);
    if let Some(i) = oom {
        let e = events.swap_remove(i);
        let id = trace
            .iter()
            .filter(|t| matches!(t, crate::lab::TraceEvent::Alloc { .. }))
            .count() as u64
            + 1;
        trace.push(crate::lab::TraceEvent::Alloc {
            id,
            size: e.requested,
            label: (!e.label.is_empty()).then(|| e.label.to_string()),
            category: (e.category != crate::memory::Category::Untagged).then_some(e.category),
        });
    }
    let lines: Vec<String> = trace.iter().map(|e| e.to_line()).collect();
    crate::io::write_atomic(path, (lines.join("\n") + "\n").as_bytes())
        .with_context(|| format!("cannot write --record-trace {}", path.display()))?;
    if !args.json {
        // A trace holds sizes, not settings: the replay needs them again.
        let config = engine.allocator().config().clone();
        let mut again: Vec<String> = Vec::new();
        let options = crate::memory::AllocatorConfig {
            memory_limit: None,
            ..config.clone()
        };
        if options != crate::memory::AllocatorConfig::default() {
            again.push(format!("--alloc-conf {}", config.options_text()));
        }
        if let Some(l) = config.memory_limit {
            again.push(format!("--memory-limit {l}"));
        }
        let how = if again.is_empty() {
            String::new()
        } else {
            format!(
                "; replay it with {} (a trace holds no settings)",
                again.join(" ")
            )
        };
        println!("\nwrote {} ({} events{how})", path.display(), lines.len());
    }
    Ok(())
}

/// Prints the run's end: the JSON report, or the three memory levels, the
/// memory summary and the time taken.
fn print_report(
    args: &TrainArgs,
    t: &Training,
    records: Vec<StepJson>,
    start: Instant,
) -> anyhow::Result<()> {
    let levels = t.trainer.engine.three_levels();
    let alloc = t.trainer.engine.allocator();
    if args.json {
        let report = serde_json::json!({
            "model": t.spec,
            "batch": t.batch.size() * args.accumulate,
            // Micro-batches a step's batch is cut into (1: not cut), and
            // each one's samples.
            "accumulate": args.accumulate,
            "micro_batch": t.batch.size(),
            "optimizer": t.opt,
            "adapter": t.gpu_name,
            "backend": t.backend,
            "parameters": t.trainer.store.numel(),
            "optimizer_state_bytes": t.trainer.optimizer.state_bytes(),
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
    print!("{}", memory_summary(alloc.stats(), &t.gpu_name, true));
    println!("finished in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
