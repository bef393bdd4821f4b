//! `vramlab estimate`: a step's memory predicted without a GPU — per layer,
//! per category, per phase, the peak allocated and the reserved memory the
//! caching allocator will hold — with `--measure` the same step on the
//! device beside it, and the documents' hand method beside both.

use super::args::{AllocArgs, DeviceArgs, ModelArgs, StepArgs};
use crate::estimate::hand::{hand_method, HandMethod};
use crate::estimate::run::run_steps;
use crate::estimate::{analyze, Analysis, Plan};
use crate::memory::{Category, CATEGORIES};
use crate::tensor::{DType, Engine};
use crate::train::Mode;
use clap::Args;
use serde::Serialize;

#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    #[command(flatten)]
    pub step: StepArgs,
    /// The model's dtype: f16 or bf16 is `model.half()` / `.to(bf16)` —
    /// parameters, gradients, optimizer state and activations all 16-bit
    /// (the loss in f32). A real run, measurable with --measure. For mixed
    /// precision (f32 weights, 16-bit compute) use --amp instead.
    #[arg(long, value_name = "f32|f16|bf16", value_parser = super::args::parse_dtype, default_value = "f32")]
    pub dtype: DType,
    /// Steps to run on the same batch (the peak is the highest of them):
    /// 1 shows the first step, 2 the steady state, where the optimizer's
    /// state (allocated at the end of step 1) is alive all along.
    #[arg(long, default_value_t = 1)]
    pub steps: usize,
    /// Also run the step on the GPU and compare.
    #[arg(long)]
    pub measure: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    // Last: its help heading holds for the arguments declared after it.
    #[command(flatten)]
    pub layout: super::layout_args::LayoutArgs,
}

/// The per-rank estimate of a parallel layout (`--dp`, `--zero`, `--tp`,
/// `--pp`, ...): `--batch` is the micro-batch of one data-parallel rank.
fn run_layout(args: &EstimateArgs) -> anyhow::Result<()> {
    use crate::parallel::Precision;
    let spec = args.model.spec()?;
    let (model, seq) = super::layout_args::transformer(&spec)?;
    if !matches!(
        args.step.optimizer,
        crate::train::OptimizerKind::Adam | crate::train::OptimizerKind::Adamw
    ) {
        anyhow::bail!("parallel layouts model Adam's two moments: use --optimizer adam or adamw");
    }
    if args.measure {
        anyhow::bail!("--measure runs one GPU; a parallel layout's ranks are estimated only (leave out --measure)");
    }
    if args.step.mode == Mode::Inference {
        anyhow::bail!(
            "a parallel layout's estimate is a training step; --mode inference is for one GPU"
        );
    }
    if args.steps != 1 && args.steps != 2 {
        anyhow::bail!("a parallel layout's estimate always runs two steps (the first allocates Adam's state, the second is the steady state); leave out --steps (or say 2)");
    }
    // The rank's program models PyTorch's default loss; other choices
    // would be ignored, so they are refused.
    if args.step.loss != crate::train::LossMode::CrossEntropy {
        anyhow::bail!(
            "a parallel layout's ranks run F.cross_entropy; --loss is for one GPU (leave it out)"
        );
    }
    let precision = if args.step.amp.is_some() || args.dtype != DType::F32 {
        Precision::Mixed
    } else {
        Precision::Fp32
    };
    // The rank's optimizer step follows the precision (rank.rs): fp32 runs
    // PyTorch's foreach Adam, mixed precision a fused Adam (DeepSpeed's,
    // Megatron's). Any other --optimizer-impl would be ignored: refused.
    let modelled = match precision {
        Precision::Fp32 => crate::optim::OptimizerImpl::Foreach,
        Precision::Mixed => crate::optim::OptimizerImpl::Fused,
    };
    if let Some(given) = args.step.optimizer_impl.filter(|i| *i != modelled) {
        let runs = match precision {
            Precision::Fp32 => "in fp32 a parallel layout's ranks run PyTorch's foreach Adam (with mixed precision, --amp bf16, a fused one)",
            Precision::Mixed => "with mixed precision a parallel layout's ranks run a fused Adam, DeepSpeed's and Megatron's (in fp32, without --amp or a 16-bit --dtype, PyTorch's foreach one)",
        };
        anyhow::bail!(
            "--optimizer-impl {given}: {runs}; leave --optimizer-impl out, or give {modelled}"
        );
    }
    args.step.optimizer()?;
    for (flag, given) in [
        ("--weight-decay", args.step.weight_decay.is_some()),
        ("--momentum", args.step.momentum.is_some()),
    ] {
        if given {
            anyhow::bail!("a parallel layout's ranks model Adam's two moments without {flag}; it is for one GPU (leave it out)");
        }
    }
    let mut layout = args.layout.layout(
        args.batch as u64,
        seq,
        precision,
        args.step.mode == Mode::Checkpoint,
    )?;
    layout.dropout = super::layout_args::dropout(&spec);
    layout.check(&model)?;
    let capacity = args.alloc.capacity()?;
    let config = args.alloc.config(None)?;
    let headroom = args.layout.headroom.unwrap_or(0.0);
    if !(0.0..1.0).contains(&headroom) {
        anyhow::bail!("--headroom is a fraction of --capacity, from 0 up to (not including) 1");
    }
    if args.layout.headroom.is_some() && capacity.is_none() {
        anyhow::bail!(
            "--headroom is a fraction of the GPU's size: add --capacity SIZE (e.g. --capacity 80GiB)"
        );
    }
    let rows = super::estimate_layout::stages(&model, &layout, capacity, &config);
    let fit = super::estimate_layout::fit(&rows, capacity, headroom, config.memory_limit);
    // A stage that ran out of memory fails the command, as one GPU's
    // estimate does: the figures are printed, then the error.
    let oom = rows.iter().find_map(|r| {
        r.report.oom.as_ref().map(|o| {
            anyhow::anyhow!(
                "stage {} of the layout runs out of memory: {o} A layout can also hold less a rank: --zero or --fsdp over more --dp, --tp, --pp or --recompute.",
                r.report.stage
            )
        })
    });
    if args.json {
        let mut out = serde_json::json!({
            "model": model,
            "parameters": model.params(),
            "layout": layout,
            "gpus": layout.gpus(),
            "capacity": capacity,
            "headroom": headroom,
            "memory_limit": config.memory_limit,
            "fit_limit": fit.as_ref().map(|f| f.limit),
            "fits": fit.as_ref().map(|f| f.fits),
            "memory_left": fit.as_ref().and_then(|f| f.memory_left),
            "stages": rows,
        });
        if let Some(e) = oom {
            let e = super::fail_in_json(&mut out, e);
            println!("{}", serde_json::to_string_pretty(&out)?);
            return Err(e);
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        super::estimate_layout::print(&model, &layout, &rows);
        if let Some(f) = &fit {
            println!(
                "{}",
                super::estimate_layout::verdict(f, capacity, headroom, config.memory_limit)
            );
        }
        if let Some(e) = oom {
            return Err(e);
        }
    }
    Ok(())
}

/// The precision modes the table compares: (name, autocast, model dtype,
/// mode override). A model whose kernels are f32 only (gpt) has no
/// 16-bit-model rows.
fn precision_modes(
    mode: Mode,
    model_16bit: bool,
) -> Vec<(&'static str, Option<DType>, DType, Mode)> {
    let mut v = vec![
        ("f32", None, DType::F32, mode),
        ("amp f16", Some(DType::F16), DType::F32, mode),
        ("amp bf16", Some(DType::Bf16), DType::F32, mode),
    ];
    if !model_16bit {
        return v;
    }
    v.push(("half() (f16)", None, DType::F16, mode));
    v.push(("bf16", None, DType::Bf16, mode));
    if mode != Mode::Inference {
        v.push(("half() inference", None, DType::F16, Mode::Inference));
    }
    v
}

/// One row of the precision table.
#[derive(Serialize)]
struct ModeRow {
    mode: &'static str,
    amp: Option<DType>,
    dtype: DType,
    step: Mode,
    /// `None` where this mode's step runs out of memory under the limit
    /// (`--memory-limit`): the row then says so instead of failing the
    /// estimate of the step that was asked for.
    peak_allocated_bytes: Option<u64>,
    out_of_memory: bool,
    by_category: std::collections::BTreeMap<&'static str, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    measured_peak_allocated_bytes: Option<u64>,
    /// Steps the device's f16 GradScaler skipped (with --measure).
    #[serde(skip_serializing_if = "Option::is_none")]
    measured_skipped_steps: Option<usize>,
}

/// `steps` steps of `p` on `engine`.
fn steps_on(
    engine: Engine,
    p: &Plan,
    steps: usize,
) -> anyhow::Result<crate::estimate::run::StepProfile> {
    Ok(run_steps(engine, p, 0, steps)?)
}

fn mode_rows(
    plan: &Plan,
    steps: usize,
    capacity: Option<u64>,
    measure: Option<&DeviceArgs>,
) -> anyhow::Result<Vec<ModeRow>> {
    let mut rows = Vec::new();
    for (name, amp, dtype, mode) in precision_modes(plan.mode, plan.model.supports_16bit_model()) {
        let p = Plan {
            amp,
            dtype,
            mode,
            ..plan.clone()
        };
        // A mode that runs out of memory under the limit (or on a device of
        // --capacity) is a row saying so.
        let a = match run_steps(Engine::simulated(p.config.clone(), capacity), &p, 0, steps) {
            Ok(e) => Some(analyze(&e.events, &e.layer_outputs)),
            Err(err) if err.is_oom() => None,
            Err(err) => return Err(err.into()),
        };
        let measured = match (measure, &a) {
            (Some(d), Some(_)) => {
                let engine = Engine::new(&d.options(), p.config.clone())?;
                let m = steps_on(engine, &p, steps)?;
                let peak = analyze(&m.events, &m.layer_outputs).peak_allocated_bytes;
                Some((peak, m.skipped_steps))
            }
            _ => None,
        };
        rows.push(ModeRow {
            mode: name,
            amp,
            dtype,
            step: mode,
            peak_allocated_bytes: a.as_ref().map(|a| a.peak_allocated_bytes),
            out_of_memory: a.is_none(),
            by_category: a.map(|a| a.by_category).unwrap_or_default(),
            measured_peak_allocated_bytes: measured.map(|m| m.0),
            measured_skipped_steps: measured.map(|m| m.1),
        });
    }
    Ok(rows)
}

/// Why a measured f16 step can differ from its estimate; with a fused
/// optimizer (which skips on the device, its state made as an update makes
/// it, as PyTorch's fused optimizers do) why it does not.
fn skipped_note(skipped: usize, steps: usize, fused: bool) -> String {
    let head = format!(
        "  note: the device's GradScaler skipped {skipped} of {steps} steps: a gradient overflowed f16 at the\n  current scale (65536 at first, as in PyTorch, whose first steps often skip too)"
    );
    if fused {
        return format!(
            "{head}. The fused\n  optimizer skipped on the device and made its state all the same, as PyTorch's fused\n  optimizers do, so the estimate (which has no values to overflow) holds."
        );
    }
    format!(
        "{head}, and a skipped\n  step allocates no optimizer state, so the device peaked lower. The estimate has no values to\n  overflow and assumes every step updates: the memory a run needs once the scale has settled.\n  With --optimizer-impl fused a skipped step makes the state too, and the estimate holds."
    )
}

fn mib(b: f64) -> f64 {
    b / 1048576.0
}

#[derive(Serialize)]
struct Side<'a> {
    /// Steps the f16 GradScaler skipped (measured side only).
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped_steps: Option<usize>,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    by_category: &'a std::collections::BTreeMap<&'static str, u64>,
    allocated_after_bytes: u64,
    device_allocs: u64,
    phases: &'a [crate::estimate::PhaseRow],
    seconds: f64,
}

fn side(a: &Analysis, seconds: f64, skipped_steps: Option<usize>) -> Side<'_> {
    Side {
        skipped_steps,
        peak_allocated_bytes: a.peak_allocated_bytes,
        peak_reserved_bytes: a.peak_reserved_bytes,
        by_category: &a.by_category,
        allocated_after_bytes: a.allocated_after_bytes,
        device_allocs: a.device_allocs,
        phases: &a.phases,
        seconds,
    }
}

pub fn run(args: &EstimateArgs) -> anyhow::Result<()> {
    args.device.only_with_measure(args.measure)?;
    if args.batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    if args.layout.given() {
        return run_layout(args);
    }
    if args.layout.headroom.is_some() {
        anyhow::bail!(
            "--headroom is the part of --capacity a parallel layout's fit verdict leaves free (with --dp, --tp or --pp); one GPU's estimate runs out of memory at --capacity or --memory-limit: give the size to fit in as one of them"
        );
    }
    // --capacity is the simulated device's size, as everywhere: a step that
    // needs more runs out of memory on it (the figures are the same).
    let capacity = args.alloc.capacity()?;
    let spec = args.model.spec()?;
    let mut plan = args
        .step
        .plan(spec.clone(), args.batch, args.alloc.config(None)?)?;
    plan.dtype = args.dtype;
    if plan.amp.is_some() && plan.dtype != DType::F32 {
        anyhow::bail!(
            "--amp autocasts an f32 model; with --dtype {} the model is already 16-bit (leave one of them out)",
            plan.dtype
        );
    }
    super::args::check_recorded_steps(args.steps)?;
    let est = match run_steps(
        Engine::simulated(plan.config.clone(), capacity),
        &plan,
        0,
        args.steps,
    ) {
        Ok(e) => e,
        // Out of memory under a limit or a --capacity: say what the step
        // would need without them, the figure an estimate is asked for.
        Err(err) if err.is_oom() => {
            let mut free = plan.clone();
            free.config.memory_limit = None;
            let need = run_steps(
                Engine::simulated(free.config.clone(), None),
                &free,
                0,
                args.steps,
            )
            .map(|p| analyze(&p.events, &p.layer_outputs));
            let without = match (plan.config.memory_limit, capacity) {
                (Some(_), Some(_)) => {
                    "Without --memory-limit and on a device larger than --capacity"
                }
                (Some(_), None) => "Without the limit",
                _ => "On a device larger than --capacity",
            };
            return Err(match need {
                Ok(n) => anyhow::anyhow!(
                    "{err}\n{without} the step needs {} allocated at its peak and {} reserved.",
                    crate::memory::Mib(n.peak_allocated_bytes),
                    crate::memory::Mib(n.peak_reserved_bytes)
                ),
                Err(_) => err.into(),
            });
        }
        Err(err) => return Err(err.into()),
    };
    let a = analyze(&est.events, &est.layer_outputs);
    let input_elements = args.batch * spec.input_shape().iter().product::<usize>();
    let layers: Vec<String> = spec
        .parameter_shapes()
        .iter()
        .filter_map(|(n, _)| n.rsplit_once('.').map(|x| x.0.to_string()))
        .collect();
    let hand = hand_method(
        &layers,
        est.parameters,
        input_elements,
        &a,
        &plan.optimizer,
        args.step.mode,
        args.dtype.size_in_bytes() as u64,
    );
    let measured = if args.measure {
        let engine = args.device.engine(plan.config.clone())?;
        let m = steps_on(engine, &plan, args.steps)?;
        Some((analyze(&m.events, &m.layer_outputs), m))
    } else {
        None
    };
    let modes = mode_rows(
        &plan,
        args.steps,
        capacity,
        args.measure.then_some(&args.device),
    )?;
    if args.json {
        let mut est_side = serde_json::to_value(side(&a, est.seconds, None))?;
        est_side["layers"] = serde_json::to_value(&a.layers)?;
        let mut out = serde_json::json!({
            "plan": plan,
            "dtype": args.dtype,
            "parameters": est.parameters,
            "estimate": est_side,
            "hand_method": hand,
            "precision_modes": modes,
        });
        if let Some((m, p)) = &measured {
            out["measured"] = serde_json::to_value(side(m, p.seconds, Some(p.skipped_steps)))?;
            out["device"] = p.device.clone().into();
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_text(
        args,
        &plan,
        &a,
        est.parameters,
        &hand,
        measured
            .as_ref()
            .map(|(m, p)| (m, p.device.as_str(), p.skipped_steps)),
        &modes,
    );
    Ok(())
}

fn print_text(
    args: &EstimateArgs,
    plan: &Plan,
    a: &Analysis,
    parameters: usize,
    hand: &HandMethod,
    measured: Option<(&Analysis, &str, usize)>,
    modes: &[ModeRow],
) {
    let s = |b: u64| mib(b as f64);
    // Inference runs no optimizer; autocast names its dtype beside the
    // f32 weights.
    let optimizer = match plan.mode {
        Mode::Inference => String::new(),
        _ => format!("{}, ", plan.optimizer.kind),
    };
    let precision = match plan.amp {
        Some(d) => format!("{} with autocast to {d}", plan.dtype),
        None => plan.dtype.to_string(),
    };
    println!(
        "vramlab estimate: {}, batch {}, {optimizer}mode {}, {precision} — predicted on a simulated device{}",
        plan.model.describe(),
        plan.batch,
        plan.mode,
        match measured {
            Some((_, device, _)) => format!(", then measured on {device}"),
            None => " (no GPU touched)".to_string(),
        }
    );
    println!();
    let shapes = plan.model.parameter_shapes();
    println!(
        "{:<22} {:<22} {:>10} {:>14} {:>14} {:>14}",
        "Layer", "Output shape", "Params", "Saved (MiB)", "Fwd + (MiB)", "Bwd − (MiB)"
    );
    let tied = plan.model.tied_parameters();
    for l in &a.layers {
        let params: usize = shapes
            .iter()
            .filter(|(n, _)| n.rsplit_once('.').map(|x| x.0) == Some(l.layer.as_str()))
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        // A tied layer reads another's parameter: name it, counted once in
        // the total under its owner.
        let params = match tied.iter().find(|(layer, _)| *layer == l.layer.as_str()) {
            Some((_, p)) if params == 0 => {
                format!("tied {}", p.rsplit_once('.').map_or(*p, |x| x.0))
            }
            _ => params.to_string(),
        };
        println!(
            "{:<22} {:<22} {:>10} {:>14.2} {:>14.2} {:>14.2}",
            l.layer,
            format!("{:?}", l.output_shape),
            params,
            s(l.activation_bytes),
            mib(l.forward_added as f64),
            s(l.backward_released)
        );
    }
    println!("{:<22} {:<22} {:>10}", "total", "", parameters);
    println!();
    println!("Phases (allocated MiB):");
    for p in &a.phases {
        let cats: Vec<String> = p
            .by_category_at_start
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", s(*v)))
            .collect();
        println!(
            "  {:<10} at start {:>9.2}  peak inside {:>9.2}   live: {}",
            p.phase,
            s(p.allocated_at_start),
            s(p.peak_allocated),
            if cats.is_empty() {
                "nothing".into()
            } else {
                cats.join(", ")
            }
        );
    }
    println!();
    match measured {
        None => {
            println!("At the peak (MiB):");
            for c in CATEGORIES {
                if let Some(v) = a.by_category.get(c.name()) {
                    println!("  {:<16} {:>10.2}", c.name(), s(*v));
                }
            }
            println!(
                "  {:<16} {:>10.2}",
                "peak allocated",
                s(a.peak_allocated_bytes)
            );
            println!(
                "  {:<16} {:>10.2}",
                "peak reserved",
                s(a.peak_reserved_bytes)
            );
        }
        Some((m, device, skipped)) => {
            println!("Estimate vs measured on {device} (bytes at the peak):");
            println!(
                "  {:<16} {:>14} {:>14} {:>12} {:>8}",
                "", "estimate", "measured", "diff", "diff %"
            );
            let row = |name: &str, e: u64, m: u64| {
                let d = m as i64 - e as i64;
                let pct = match (m, d) {
                    (_, 0) => format!("{:>7.2}%", 0.0),
                    (0, _) => format!("{:>8}", "n/a"),
                    _ => format!("{:>7.2}%", 100.0 * d as f64 / m as f64),
                };
                println!("  {name:<16} {e:>14} {m:>14} {d:>12} {pct}");
            };
            for c in CATEGORIES {
                let (e, mv) = (
                    a.by_category.get(c.name()).copied().unwrap_or(0),
                    m.by_category.get(c.name()).copied().unwrap_or(0),
                );
                if e > 0 || mv > 0 {
                    row(c.name(), e, mv);
                }
            }
            row(
                "peak allocated",
                a.peak_allocated_bytes,
                m.peak_allocated_bytes,
            );
            row(
                "peak reserved",
                a.peak_reserved_bytes,
                m.peak_reserved_bytes,
            );
            if skipped > 0 {
                let fused = plan.optimizer.takes_found_inf();
                println!("{}", skipped_note(skipped, args.steps, fused));
            }
        }
    }
    println!();
    println!("Precision modes (each a real step, predicted exactly; MiB at the peak):");
    let cat =
        |r: &ModeRow, c: Category| mib(r.by_category.get(c.name()).copied().unwrap_or(0) as f64);
    println!(
        "  {:<17} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "mode", "params", "grads", "optim", "activ.", "temp", "cast $", "other", "peak", "vs f32"
    );
    // The columns add up to the peak: `other` is the rest (input, output,
    // op workspace).
    let shown = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::CastCache,
    ];
    let f32_peak = modes[0].peak_allocated_bytes;
    for r in modes {
        let Some(peak) = r.peak_allocated_bytes else {
            println!("  {:<17} out of memory under the memory limit", r.mode);
            continue;
        };
        let measured = match (r.measured_peak_allocated_bytes, r.measured_skipped_steps) {
            (Some(m), _) if m == peak => "  measured: exact".to_string(),
            (Some(m), Some(k)) if k > 0 => format!(
                "  measured: {:.2} MiB (the GradScaler skipped {k} of {} steps)",
                mib(m as f64),
                args.steps
            ),
            (Some(m), _) => format!("  measured: {:.2} MiB (differs!)", mib(m as f64)),
            (None, _) => String::new(),
        };
        let listed: u64 = shown
            .iter()
            .map(|c| r.by_category.get(c.name()).copied().unwrap_or(0))
            .sum();
        let vs_f32 = match f32_peak {
            Some(f) => format!("{:>8.1}%", 100.0 * (peak as f64 / f as f64 - 1.0)),
            None => format!("{:>9}", "-"),
        };
        println!(
            "  {:<17} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {}{}",
            r.mode,
            cat(r, Category::Parameter),
            cat(r, Category::Gradient),
            cat(r, Category::OptimizerState),
            cat(r, Category::Activation),
            cat(r, Category::Temporary),
            cat(r, Category::CastCache),
            mib(peak.saturating_sub(listed) as f64),
            mib(peak as f64),
            vs_f32,
            measured
        );
    }
    println!(
        "  amp keeps f32 weights, gradients and optimizer state (and adds 16-bit weight casts),"
    );
    println!("  so it saves activations only; half() halves everything but the f32 loss. bf16 is 2 bytes.");
    // Said where the figures show it: autocast's activations above f32's.
    let activations = |r: &ModeRow| {
        r.by_category
            .get(Category::Activation.name())
            .copied()
            .unwrap_or(0)
    };
    if modes
        .iter()
        .any(|r| r.amp.is_some() && activations(r) > activations(&modes[0]))
    {
        const SOFTMAX: &str = "ops on CUDA's autocast fp32 list (softmax, the loss) save their f32 output and the 16-bit product after them a 16-bit copy: vramlab's attention is the explicit one (nanoGPT's without flash); PyTorch's fused SDPA keeps one 16-bit copy (`vramlab_torch record --sdpa math` shows it)";
        const INPUT: &str = "the first layer saves autocast's 16-bit copy of the f32 input batch, an activation, where f32 saves the input itself (counted as input)";
        let why = match args.model.model.as_str() {
            "resnet50" | "resnet-mini" => "vramlab's BatchNorm is f32: it widens each 16-bit convolution output and saves the f32 copy (PyTorch's cuDNN BatchNorm takes the 16-bit one)".to_string(),
            "gpt" => SOFTMAX.to_string(),
            "attention" => format!("{INPUT}; and {SOFTMAX}"),
            _ => INPUT.to_string(),
        };
        println!("  Here autocast saves more activations than f32: {why}.");
    }
    println!();
    let truth = a.peak_allocated_bytes as f64;
    println!(
        "The documents' hand method (parameters + gradients + optimizer + layer outputs + input):"
    );
    println!(
        "  {:.2} + {:.2} + {:.2} + {:.2} + {:.2} = {:.2} MiB, vs the true peak of {}, {:.2} MiB ({:+.1}%{})",
        mib(hand.parameters as f64),
        mib(hand.gradients as f64),
        mib(hand.optimizer_state as f64),
        mib(hand.layer_outputs as f64),
        mib(hand.input as f64),
        mib(hand.total as f64),
        if args.steps == 1 {
            "step 1".to_string()
        } else {
            format!("steps 1–{}", args.steps)
        },
        mib(truth),
        100.0 * (hand.total as f64 - truth) / truth,
        match (args.steps, plan.mode) {
            (1, Mode::Train | Mode::Checkpoint) if plan.optimizer.has_state() => format!(
                "; --steps 2 adds step 2's, with {}'s state live, as `demo` runs",
                plan.optimizer.kind
            ),
            _ => String::new(),
        }
    );
    let cat = |c: Category| s(a.by_category.get(c.name()).copied().unwrap_or(0));
    if args.step.mode == Mode::Inference {
        // No backward, no gradients, no optimizer: what a forward holds.
        println!(
            "  It leaves out, at the peak: the forward's temporaries ({:.2} MiB), op workspace ({:.2} MiB),",
            cat(Category::Temporary),
            cat(Category::Workspace)
        );
        println!(
            "  block rounding, and that a no_grad forward frees each layer's input once it is used;\n  reserved ({:.2} MiB) is what the GPU holds.",
            s(a.peak_reserved_bytes)
        );
        return;
    }
    println!(
        "  It leaves out, at the peak: outputs of ops between layers saved for backward (ReLU),"
    );
    println!(
        "  backward's temporaries ({:.2} MiB), op workspace ({:.2} MiB), block rounding, and that",
        cat(Category::Temporary),
        cat(Category::Workspace)
    );
    println!(
        "  gradients and optimizer state are not all alive at once; reserved ({:.2} MiB) is what the GPU holds.",
        s(a.peak_reserved_bytes)
    );
}
