//! `vramlab demo`: trains the articles' SimpleConvNet (batch 64, Adam, 2
//! steps) on the GPU and shows its memory the way the article printed it, next
//! to the article's own numbers (claims C26 and C27 in docs/claims.md).

use super::args::{AllocArgs, DeviceArgs};
use crate::autograd::{functions as f, Tape, Value};
use crate::memory::mib;
use crate::memory::{memory_summary, AllocatorConfig, Category, Mib};
use crate::nn::init::Rng;
use crate::nn::simple_cnn::{CLASSES, INPUT};
use crate::nn::Model;
use crate::nn::{ParamStore, SimpleConvNet};
use crate::optim::Adam;
use crate::tensor::{DType, Engine, Tensor};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Samples per batch (the article uses 64).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Training steps (the article runs 2).
    #[arg(long, default_value_t = 2)]
    pub steps: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// Seed for weights and the random batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Mixed precision, as the articles advise: the forward under autocast
    /// (f16 with a GradScaler, or bf16). Prints each step's peak beside the
    /// f32 run's.
    #[arg(long, value_name = "f16|bf16", value_parser = super::args::parse_amp)]
    pub amp: Option<crate::tensor::DType>,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct StepReport {
    step: usize,
    loss: f32,
    allocated_bytes: u64,
    reserved_bytes: u64,
    peak_allocated_bytes: u64,
    seconds: f64,
    /// With --amp: the same step's peak in f32 (simulated, exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    f32_peak_allocated_bytes: Option<u64>,
}

/// What the article (seed 002) says, in MiB.
const ARTICLE_ESTIMATE: [(&str, f64); 5] = [
    ("parameter", 4.12),
    ("gradient", 4.12),
    ("optimizer_state", 8.24),
    ("input", 0.75),
    ("activation (conv outputs)", 38.5),
];
const ARTICLE_TOTAL_MIB: f64 = 55.73;
/// The batch the article's figures are for.
const ARTICLE_BATCH: usize = 64;
const ARTICLE_MEASURED_MB: f64 = 54.12;

/// Runs `vramlab demo`: the simulated figures, the real steps, then the
/// comparison with the article (or one JSON object).
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    check_flags(args)?;
    let start = Instant::now();
    let config = args.alloc.config(None)?;
    let f32_peaks = f32_peaks(args, &config)?;
    let mut demo = setup(args, config)?;
    print_header(args, &demo);
    let mut steps = Vec::new();
    for step in 1..=args.steps {
        let (r, skipped) = train_step(args, &mut demo, step, f32_peaks.as_deref())?;
        if !args.json {
            print_step(args, &r, skipped);
        }
        steps.push(r);
    }
    // What was live at the run's peak, by category, from the run's own
    // allocator events: the same step as the figures above, to the byte.
    let events = demo.engine.allocator().take_events();
    let at_peak = crate::estimate::analyze(&events, &[]).by_category;
    report(args, &demo, steps, &at_peak, start)
}

/// Refuses a bad learning rate, batch or step count.
fn check_flags(args: &DemoArgs) -> anyhow::Result<()> {
    super::args::check_number("--lr", args.lr, true)?;
    super::args::at_least_one(&[
        ("--batch", args.batch as u64),
        ("--steps", args.steps as u64),
    ])?;
    Ok(())
}

/// The demo's steps as an estimate plan (simple-cnn, the batch, Adam at
/// `--lr`), autocast to `amp`.
fn plan(
    args: &DemoArgs,
    config: &AllocatorConfig,
    amp: Option<DType>,
) -> anyhow::Result<crate::estimate::Plan> {
    Ok(crate::estimate::Plan {
        model: crate::nn::ModelSpec::default_for("simple-cnn").map_err(anyhow::Error::msg)?,
        batch: args.batch,
        optimizer: crate::train::OptimizerConfig::new(
            crate::train::OptimizerKind::Adam,
            Some(args.lr),
            None,
            None,
        ),
        mode: crate::train::Mode::Train,
        amp,
        dtype: DType::F32,
        loss: Default::default(),
        config: config.clone(),
    })
}

/// With `--amp`, the f32 peaks of the same steps (a simulated run: memory
/// depends on shapes only).
fn f32_peaks(args: &DemoArgs, config: &AllocatorConfig) -> anyhow::Result<Option<Vec<u64>>> {
    match args.amp {
        Some(_) => Ok(Some(plan(args, config, None)?.step_peaks(args.steps)?)),
        None => Ok(None),
    }
}

/// The model on the device, its parameters, Adam, the loss scaler (f16)
/// and the one random batch every step trains on.
struct Demo {
    scaler: Option<crate::optim::GradScaler>,
    engine: Engine,
    store: ParamStore,
    model: SimpleConvNet,
    adam: Adam,
    x: Tensor,
    y: Tensor,
    /// The last step's `logits` and `loss`, bound until the next step
    /// rebinds them (as the trainer holds them: `train::step`).
    held: Option<(Tensor, Tensor)>,
}

/// Makes the engine, the model with its parameters, Adam and the batch
/// (tagged as input).
fn setup(args: &DemoArgs, config: AllocatorConfig) -> anyhow::Result<Demo> {
    let scaler = (args.amp == Some(DType::F16)).then(crate::optim::GradScaler::default);
    let engine = args.device.engine(config)?;
    // Every allocation from the first, for what is live at the peak.
    engine.allocator().start_recording();
    let mut rng = Rng::new(args.seed);
    let mut store = ParamStore::new();
    let model = SimpleConvNet::new(&engine, &mut store, &mut rng)?;
    let adam = Adam::new(args.lr);
    let batch_scope = engine.scope(Category::Input, "batch");
    // Device memory first: a batch the device cannot hold is an error
    // before its values are made on the host.
    let x = Tensor::generated(
        &engine,
        &[args.batch, INPUT[0], INPUT[1], INPUT[2]],
        DType::F32,
        "input",
        |n| rng.normal(n),
    )?;
    let labels: Vec<f32> = (0..args.batch)
        .map(|_| rng.below(CLASSES as u64) as f32)
        .collect();
    let y = Tensor::from_slice(&engine, &labels, &[args.batch], "labels")?;
    drop(batch_scope);
    Ok(Demo {
        scaler,
        engine,
        store,
        model,
        adam,
        x,
        y,
        held: None,
    })
}

/// Prints (as text, not with `--json`) the model, the run and the
/// parameter count.
fn print_header(args: &DemoArgs, d: &Demo) {
    if args.json {
        return;
    }
    println!("vramlab demo: the articles' SimpleConvNet (conv 3→64 k3, ReLU, conv 64→128 k3, ReLU, flatten, fc 100,352→10)");
    println!(
        "batch {}, Adam lr {}, {}, on {} ({})",
        args.batch,
        args.lr,
        super::steps(args.steps),
        d.engine.device_name(),
        d.engine.backend_name()
    );
    println!(
        "parameters: {} elements = {}",
        d.store.numel(),
        Mib((d.store.numel() * 4) as u64)
    );
    println!();
}

/// One training step (forward under autocast with `--amp`, backward scaled
/// with f16, Adam) and its memory; also whether the scaler skipped it.
fn train_step(
    args: &DemoArgs,
    d: &mut Demo,
    step: usize,
    f32_peaks: Option<&[u64]>,
) -> anyhow::Result<(StepReport, bool)> {
    let t0 = Instant::now();
    d.engine.allocator().reset_peak_memory_stats();
    d.store.zero_grad();
    let tape = Tape::new();
    // with torch.autocast(...): logits = model(x); loss = F.cross_entropy(logits, y)
    // Python frees the last step's logits when `logits =` rebinds them,
    // after the model's forward, and its loss after the new loss.
    let (old_logits, old_loss) = d.held.take().unzip();
    let forward = || -> anyhow::Result<_> {
        let logits = d
            .model
            .forward(&tape, &d.store, &Value::constant(d.x.clone()))?;
        drop(old_logits);
        let loss = f::cross_entropy(&tape, &logits, &d.y)?;
        drop(old_loss);
        Ok((logits, loss))
    };
    // Tagged as the trainer tags them (`train::step`): what the forward
    // makes is output, what the backward makes is temporary.
    let scope = d.engine.scope(Category::Output, "forward");
    // `logits` and `loss` stay bound after the step, as a training loop's
    // names are, until the next step rebinds them.
    let (logits, loss) = match args.amp {
        Some(dtype) => tape.autocast(dtype, forward)?,
        None => forward()?,
    };
    drop(scope);
    // scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    let mut skipped = false;
    let scope = d.engine.scope(Category::Temporary, "backward");
    match d.scaler.as_mut() {
        Some(s) => {
            tape.backward_scaled(&loss, &mut d.store, s.scale)?;
            drop(scope);
            skipped = s.unscale(&mut d.store)?;
            s.update(skipped);
        }
        None => {
            tape.backward(&loss, &mut d.store)?;
            drop(scope);
        }
    }
    if !skipped {
        let _scope = d.engine.scope(Category::OptimizerState, "adam.step");
        crate::optim::Optimizer::step(&mut d.adam, &mut d.store)?;
    }
    let loss_value = loss.tensor().to_vec()?[0];
    if !loss_value.is_finite() {
        return Err(super::args::non_finite_loss(step, loss_value, &[], &[]).into());
    }
    d.held = Some((logits.tensor().clone(), loss.tensor().clone()));
    drop((logits, loss));
    d.engine.synchronize()?;
    let a = d.engine.allocator();
    let r = StepReport {
        step,
        loss: loss_value,
        allocated_bytes: a.memory_allocated(),
        reserved_bytes: a.memory_reserved(),
        peak_allocated_bytes: a.max_memory_allocated(),
        seconds: t0.elapsed().as_secs_f64(),
        f32_peak_allocated_bytes: f32_peaks.map(|p| p[step - 1]),
    };
    drop(a);
    // The tape goes only now, after the figures, as it did in one loop.
    drop(tape);
    Ok((r, skipped))
}

/// Prints a step's loss and memory, and with `--amp` its peak beside f32's.
fn print_step(args: &DemoArgs, r: &StepReport, skipped: bool) {
    println!(
        "step {}: loss {:.4}  memory_allocated {:.2} MiB  memory_reserved {:.2} MiB  max_memory_allocated {:.2} MiB  ({:.1} s)",
        r.step,
        r.loss,
        mib(r.allocated_bytes),
        mib(r.reserved_bytes),
        mib(r.peak_allocated_bytes),
        r.seconds
    );
    if let (Some(d), Some(f32_peak)) = (args.amp, r.f32_peak_allocated_bytes) {
        println!(
            "        amp {d}: peak {:.2} MiB vs {:.2} MiB in f32 ({:+.1}%){}",
            mib(r.peak_allocated_bytes),
            mib(f32_peak),
            (r.peak_allocated_bytes as f64 / f32_peak as f64 - 1.0) * 100.0,
            if skipped {
                "; inf/NaN gradient: step skipped, scale halved"
            } else {
                ""
            }
        );
    }
}

/// The last step's allocated, reserved and peak bytes (zeros without
/// steps).
type Last = (u64, u64, u64);

/// Prints the run's end: the JSON report, or the article's figures beside
/// the measured ones, what they mean, and the memory summary.
fn report(
    args: &DemoArgs,
    d: &Demo,
    steps: Vec<StepReport>,
    at_peak: &BTreeMap<&'static str, u64>,
    start: Instant,
) -> anyhow::Result<()> {
    let alloc = d.engine.allocator();
    let live = live_by_category(&alloc.snapshot());
    let last: Last = steps
        .last()
        .map(|s| (s.allocated_bytes, s.reserved_bytes, s.peak_allocated_bytes))
        .unwrap_or_default();
    if args.json {
        return print_json(args, d, steps, &live, at_peak, alloc.stats(), start);
    }
    print_comparison(&live, last);
    print_reading(at_peak, last, args.batch);
    print!(
        "{}",
        memory_summary(alloc.stats(), &d.engine.device_name(), true)
    );
    println!("finished in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// What is alive after the last step, by the category the allocator
/// tagged each block with.
fn live_by_category(snapshot: &crate::memory::Snapshot) -> BTreeMap<&'static str, u64> {
    let mut live: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seg in &snapshot.segments {
        for b in &seg.blocks {
            if let Some(c) = b.category {
                *live.entry(c.name()).or_default() += b.size;
            }
        }
    }
    live
}

/// Prints the `--json` report: the steps, what is live after them and at
/// the peak, the article's figures and the allocator's statistics.
fn print_json(
    args: &DemoArgs,
    d: &Demo,
    steps: Vec<StepReport>,
    live: &BTreeMap<&'static str, u64>,
    at_peak: &BTreeMap<&'static str, u64>,
    stats: &crate::memory::DeviceStats,
    start: Instant,
) -> anyhow::Result<()> {
    let report = serde_json::json!({
        "model": "simple-cnn",
        "batch": args.batch,
        "amp": args.amp,
        "adapter": d.engine.device_name(),
        "backend": d.engine.backend_name(),
        "parameters": d.store.numel(),
        "steps": steps,
        "live_after_last_step_bytes": live,
        "at_peak_by_category_bytes": at_peak,
        "article": {
            "estimate_mib": ARTICLE_ESTIMATE.iter().cloned().collect::<BTreeMap<_, _>>(),
            "estimate_total_mib": ARTICLE_TOTAL_MIB,
            "cuda_allocated_after_step_mb": ARTICLE_MEASURED_MB,
            "cuda_reserved_after_step_mb": ARTICLE_MEASURED_MB,
        },
        "memory_stats": stats.flat(),
        "seconds": start.elapsed().as_secs_f64(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Prints the table of the article's figures beside the measured ones.
fn print_comparison(live: &BTreeMap<&'static str, u64>, last: Last) {
    println!();
    println!("The article vs vramlab (MiB):");
    println!("  {:<28} {:>10} {:>12}", "", "article", "measured");
    for (cat, est) in ARTICLE_ESTIMATE {
        let key = if cat.starts_with("activation") {
            "other"
        } else {
            cat
        };
        let measured = if key == "other" {
            "freed".to_string()
        } else {
            format!("{:.2}", mib(*live.get(key).unwrap_or(&0)))
        };
        println!("  {:<28} {:>10.2} {:>12}", cat, est, measured);
    }
    println!(
        "  {:<28} {:>10.2} {:>12.2}",
        "peak allocated in the step",
        ARTICLE_TOTAL_MIB,
        mib(last.2)
    );
    println!(
        "  {:<28} {:>10.2} {:>12.2}",
        "allocated after the step",
        ARTICLE_MEASURED_MB,
        mib(last.0)
    );
    println!(
        "  {:<28} {:>10.2} {:>12.2}",
        "reserved after the step",
        ARTICLE_MEASURED_MB,
        mib(last.1)
    );
}

/// Prints what the figures mean: what is alive after a step, what is live
/// at the peak, why reserved differs, and the loss.
fn print_reading(at_peak: &BTreeMap<&'static str, u64>, last: Last, batch: usize) {
    println!();
    println!("Reading it:");
    println!("  - After a step only parameters, gradients (kept until zero_grad), Adam's two states, the batch");
    println!("    and the loop's logits and loss are alive: {:.2} MiB. The article's 54.12 MB after each step", mib(last.0));
    println!("    would need the activations still alive; they are freed as backward uses them.");
    let mut live: Vec<(&str, u64)> = at_peak
        .iter()
        .filter(|(_, &b)| b > 0)
        .map(|(&k, &b)| (k, b))
        .collect();
    live.sort_by_key(|&(_, b)| std::cmp::Reverse(b));
    let listed: Vec<String> = live
        .iter()
        .map(|(k, b)| match mib(*b) {
            m if m < 0.005 => format!("{k} <0.01"),
            m => format!("{k} {m:.2}"),
        })
        .collect();
    // Said from the figures: the article's estimate is for batch 64.
    let peak = mib(last.2);
    let relation = if peak > ARTICLE_TOTAL_MIB * 1.25 {
        "well above"
    } else if peak > ARTICLE_TOTAL_MIB * 1.05 {
        "above"
    } else if peak < ARTICLE_TOTAL_MIB * 0.95 {
        "below"
    } else {
        "close to"
    };
    let batch_note = if batch == ARTICLE_BATCH {
        String::new()
    } else {
        format!(" (made for batch {ARTICLE_BATCH}; this run's batch is {batch})")
    };
    println!(
        "  - The peak ({peak:.2} MiB) is {relation} the article's {ARTICLE_TOTAL_MIB} MiB estimate{batch_note}. Live at the peak (MiB):"
    );
    println!("    {}.", listed.join(", "));
    let temporary = at_peak.get("temporary").copied().unwrap_or(0);
    let gap = if batch == ARTICLE_BATCH && relation.ends_with("above") {
        ", which makes the gap"
    } else {
        ""
    };
    // Said from what is live at this peak: in backward the activations
    // are there; at a small batch the peak can be the optimizer step's,
    // after backward freed them, when Adam makes its state.
    let activation = mib(at_peak.get("activation").copied().unwrap_or(0));
    let adam = at_peak.get("optimizer_state").copied().unwrap_or(0);
    let adam_line = if adam > 0 {
        format!(
            "Adam's state ({:.2} MiB) is alive at this peak too.",
            mib(adam)
        )
    } else {
        "Adam's state is not alive yet: the first step's update makes it.".to_string()
    };
    // Activations of a few bytes (a tiny batch's) do not make this a
    // backward peak.
    if activation > 0.01 * peak {
        println!(
            "    The article's count has no line for backward's temporaries ({:.2} MiB: the gradients passed",
            mib(temporary)
        );
        let article = ARTICLE_ESTIMATE[4].1;
        // Said from the figures: the article's activations are for batch
        // 64 in f32.
        let verdict = if (activation / article - 1.0).abs() < 0.05 {
            "as the article counts them".to_string()
        } else {
            format!("against the article's {article} MiB")
        };
        println!(
            "    between layers and their workspaces){gap}; the activations saved for backward are"
        );
        println!("    {activation:.2} MiB here, {verdict}. {adam_line}");
    } else {
        let none = if activation > 0.0 {
            "Almost no activations (under 1% of the peak) are"
        } else {
            "No activations are"
        };
        println!("    {none} alive at this peak: it comes in the optimizer step, after backward");
        println!(
            "    freed them, as Adam makes its state; the temporaries ({:.2} MiB) are the step's own.",
            mib(temporary)
        );
    }
    println!(
        "  - Reserved ({:.2} MiB, {:.2}x the peak allocated) is what the cache holds: segments of 2 MiB /",
        mib(last.1),
        last.1 as f64 / last.2.max(1) as f64
    );
    println!("    20 MiB or rounded sizes, kept after use and partly split, so it never equals allocated.");
    println!("  - The loss: one random batch; at lr 1e-3 Adam's first steps can overshoot (fc has 100,352");
    println!("    inputs per class). `--lr 1e-4 --steps 10` shows it falling steadily.");
    println!();
}
