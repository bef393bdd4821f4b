//! `vramlab max-batch`: the largest batch that trains within a memory limit
//! — the documents' find_max_batch done properly. The estimator (a step on a
//! simulated device under the same limit) finds the answer without
//! touching the GPU; real steps on the GPU then confirm it (the next batch
//! out of memory, the batch itself trains), or bisect around it where they
//! disagree, each out-of-memory recovered from (the step's tensors drop,
//! the allocator frees its cache, the search goes on). A safety margin keeps the answer
//! below the limit; every strategy's own answer is reported from its
//! simulated replay of the step's trace.

use super::args::{AllocArgs, DeviceArgs, ModelArgs, StepArgs};
use crate::estimate::run::run_steps;
use crate::estimate::{analyze, Plan};
use crate::lab::strategies::NAMES;
use crate::lab::workload::{compare, Workload};
use crate::memory::mib;
use crate::memory::AllocatorConfig;
use crate::tensor::Engine;
use clap::Args;
use serde::Serialize;

#[derive(Debug, Args)]
pub struct MaxBatchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Old spelling of --memory-limit (kept so scripts keep working).
    #[arg(long = "limit", value_name = "SIZE", hide = true, conflicts_with_all = ["memory_limit", "memory_fraction"], value_parser = super::args::memory_limit_text)]
    pub limit: Option<String>,
    /// Allocator used on the GPU: pytorch or vramlab (the others are
    /// reported from simulation).
    #[arg(long, default_value = "pytorch")]
    pub allocator: String,
    #[command(flatten)]
    pub step: StepArgs,
    /// Safety margin: the search runs under (1 − margin) × limit, leaving
    /// room for what a real run adds (other processes, fragmentation drift).
    #[arg(long, default_value_t = 0.05)]
    pub margin: f64,
    /// Training steps per trial. The default, 2, reaches the steady state:
    /// from step 2 a stateful optimizer's state (Adam's moments, momentum)
    /// is live through forward and backward, and the last step's logits
    /// through the model's forward (until `logits =` rebinds them), so a
    /// batch that trains step 1 can run out in step 2. With 1, only the
    /// first step is checked. With --record, the recorder command's own
    /// steps apply.
    #[arg(long, value_name = "N")]
    pub steps: Option<usize>,
    /// Largest batch considered.
    #[arg(long, default_value_t = 1 << 16)]
    pub max: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Search your own PyTorch model instead of a zoo model: COMMAND
    /// records its step at a batch size on fake tensors (`{batch}` in it is
    /// replaced; the snapshot goes to `{out}`, or `--out PATH` is appended),
    /// e.g. 'python -m vramlab_torch record model.py:build --input
    /// {batch},3,224,224 --optimizer sgd'; each recording is replayed
    /// through the caching allocator under the limit. No GPU is used.
    #[arg(long, value_name = "COMMAND")]
    pub record: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Trial {
    batch: usize,
    /// "estimate" (simulated) or "device".
    on: &'static str,
    fits: bool,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    /// Why it did not fit, when not for memory: a tensor past what the
    /// adapter binds or buffers.
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<String>,
}

fn config_for(
    allocator: &str,
    base: &AllocatorConfig,
    limit: u64,
) -> anyhow::Result<AllocatorConfig> {
    let mut c = match allocator {
        "pytorch" => base.clone(),
        "vramlab" => crate::lab::strategies::vramlab::with_extensions(base.clone()),
        other => anyhow::bail!(
            "--allocator {other}: the GPU runs pytorch or vramlab; `replay --allocators` compares the rest"
        ),
    };
    c.memory_limit = Some(limit);
    Ok(c)
}

/// One trial: does `batch` train within the engine's limit?
fn trial(engine: &Engine, plan: &Plan, steps: usize, on: &'static str) -> anyhow::Result<Trial> {
    engine.allocator().empty_cache();
    engine.allocator().reset_peak_memory_stats();
    match run_steps(engine.clone(), plan, 0, steps) {
        Ok(p) => {
            let a = analyze(&p.events, &p.layer_outputs);
            Ok(Trial {
                batch: plan.batch,
                on,
                fits: true,
                peak_allocated_bytes: a.peak_allocated_bytes,
                peak_reserved_bytes: a.peak_reserved_bytes,
                limit: None,
            })
        }
        Err(e) if e.is_oom() || past_adapter_limit(&e) => {
            // Everything the step held has dropped; give the cache back too.
            let _ = engine.allocator().take_events();
            engine.allocator().empty_cache();
            let a = engine.allocator();
            Ok(Trial {
                batch: plan.batch,
                on,
                fits: false,
                peak_allocated_bytes: a.max_memory_allocated(),
                peak_reserved_bytes: a.max_memory_reserved(),
                limit: past_adapter_limit(&e).then(|| e.to_string()),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// A batch whose tensor the adapter cannot bind or buffer does not fit,
/// as one that runs out of memory does not: the search goes below it.
fn past_adapter_limit(e: &crate::tensor::TensorError) -> bool {
    use crate::device::DeviceError;
    use crate::memory::AllocError;
    use crate::tensor::TensorError;
    matches!(
        e,
        TensorError::Device(DeviceError::TooManyWindows { .. })
            | TensorError::Alloc(AllocError::TooLarge { .. })
            // A tensor past 2^62 bytes: a batch no device holds.
            | TensorError::TooLarge { .. }
    )
}

/// The largest `--max`: 2^40 samples, far past any device, and small
/// enough that the search's doubling and bracket never overflow.
const MAX_MAX: usize = 1 << 40;

fn check_max(max: usize) -> anyhow::Result<()> {
    if max > MAX_MAX {
        anyhow::bail!(
            "--max {max} is more than {} (2^40) samples, past any device's memory; give a smaller cap",
            super::grouped(MAX_MAX as u64)
        );
    }
    Ok(())
}

/// Batches past the search's answer the estimator tries as well.
const SCAN_ABOVE: usize = 32;

/// Largest batch in [1, max] for which `fits` holds, by doubling then
/// bisection, then the next [`SCAN_ABOVE`] batches past that answer: fitting
/// is not monotone in the batch (at a small limit one more sample can need
/// a new 20 MiB segment that a larger batch avoids: under 38 MiB
/// simple-cnn fits at 1, 2 and 7, and bisection stopped at 2).
fn search(
    max: usize,
    mut fits: impl FnMut(usize) -> anyhow::Result<bool>,
) -> anyhow::Result<usize> {
    let mut found = bisect(max, &mut fits)?;
    for b in (found + 1..=max).take(SCAN_ABOVE * usize::from(found > 0)) {
        if fits(b)? {
            found = b;
        }
    }
    Ok(found)
}

/// Largest batch in [1, max] for which `fits` holds were it monotone.
fn bisect(
    max: usize,
    mut fits: impl FnMut(usize) -> anyhow::Result<bool>,
) -> anyhow::Result<usize> {
    if !fits(1)? {
        return Ok(0);
    }
    let (mut lo, mut hi) = (1usize, 2usize);
    while hi <= max && fits(hi)? {
        lo = hi;
        hi *= 2;
    }
    let mut hi = hi.min(max + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// The limit the search fits under: --memory-limit (or --memory-fraction
/// of --capacity), and the bytes under it once the margin is taken.
fn limits(args: &MaxBatchArgs, base_config: &AllocatorConfig) -> anyhow::Result<(u64, u64)> {
    // A recorded step runs on a simulated device only: its size is a limit.
    let capacity = match args.record {
        Some(_) => args.alloc.capacity()?,
        None => None,
    };
    let limit = match &args.limit {
        Some(s) => super::args::parse_memory("--memory-limit", s)?,
        None => base_config.memory_limit.or(capacity).ok_or_else(|| {
            anyhow::anyhow!(
                "max-batch needs the memory to fit in: add --memory-limit SIZE (e.g. --memory-limit 16GiB), or --memory-fraction F with --capacity SIZE"
            )
        })?,
    };
    if !(0.0..0.9).contains(&args.margin) {
        anyhow::bail!("--margin must be in [0, 0.9), got {}", args.margin);
    }
    Ok((limit, (limit as f64 * (1.0 - args.margin)) as u64))
}

/// Steps a trial runs without `--steps`: the steady state.
const DEFAULT_STEPS: usize = 2;

pub fn run(args: &MaxBatchArgs) -> anyhow::Result<()> {
    let base_config = args.alloc.config(None)?;
    let (limit, effective) = limits(args, &base_config)?;
    if let Some(command) = &args.record {
        if args.steps.is_some() {
            anyhow::bail!(super::args::STEPS_WITH_RECORD);
        }
        return run_recorded(args, command, &base_config, limit, effective);
    }
    let steps = args.steps.unwrap_or(DEFAULT_STEPS);
    super::args::check_recorded_steps(steps)?;
    super::args::at_least_one(&[("--steps", steps as u64), ("--max", args.max as u64)])?;
    check_max(args.max)?;
    let spec = args.model.spec()?;
    let config = config_for(&args.allocator, &base_config, effective)?;
    let base = args.step.plan(spec.clone(), 1, config.clone())?;
    let plan = |batch| Plan {
        batch,
        ..base.clone()
    };
    let mut trials: Vec<Trial> = Vec::new();
    // 1. The estimator's answer, on a simulated device under the same limit.
    let sim = Engine::simulated(config.clone(), None);
    let progress = super::progress::spinner("max-batch", args.json);
    let estimated = search(args.max, |b| {
        if let Some(t) = trials.iter().find(|t| t.batch == b) {
            return Ok(t.fits);
        }
        progress.set_message(format!("estimate: batch {b}"));
        progress.inc(1);
        let t = trial(&sim, &plan(b), steps, "estimate")?;
        trials.push(t.clone());
        Ok(t.fits)
    })?;
    // 2. The GPU confirms it, or else bisects inside a bracket around it,
    // widened until its lower end trains and its upper end does not.
    let engine = args.device.engine(config.clone())?;
    let device = |b: usize, trials: &mut Vec<Trial>| -> anyhow::Result<bool> {
        if let Some(t) = trials.iter().find(|t| t.batch == b && t.on == "device") {
            return Ok(t.fits);
        }
        progress.set_message(format!("device: batch {b}"));
        progress.inc(1);
        let t = trial(&engine, &plan(b), steps, "device")?;
        trials.push(t.clone());
        Ok(t.fits)
    };
    // The estimate is exact for vramlab's step, so two trials usually
    // settle it: the next batch runs out of memory, then the estimated one
    // trains (the process recovering from that OOM). At --max, one trial.
    let confirmed = estimated >= 1
        && (estimated >= args.max || !device(estimated + 1, &mut trials)?)
        && device(estimated, &mut trials)?;
    // Where the device trained past the estimate, the bracket starts there.
    let above = trials
        .iter()
        .filter(|t| t.on == "device" && t.fits)
        .map(|t| t.batch)
        .max();
    let mut lo = above.unwrap_or((estimated / 2).max(1));
    while !confirmed && lo > 1 && !device(lo, &mut trials)? {
        lo /= 2;
    }
    let max_batch = if confirmed {
        estimated
    } else if !device(lo, &mut trials)? {
        0
    } else {
        let mut hi = (estimated + 1).max(lo + 1).min(args.max + 1);
        while hi <= args.max && device(hi, &mut trials)? {
            lo = hi;
            hi = (hi * 2).min(args.max + 1);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if device(mid, &mut trials)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // Fitting is not monotone in the batch (segment rounding: one more
        // sample can need a new 20 MiB segment that a larger batch avoids),
        // so a larger estimated answer is checked too.
        if estimated > lo
            && estimated < args.max
            && device(estimated, &mut trials)?
            && !device(estimated + 1, &mut trials)?
        {
            lo = estimated;
        }
        lo
    };
    // 3. What each strategy allows: its replay of the step's trace, simulated.
    progress.set_message("each strategy's replay");
    let mut by_allocator = Vec::new();
    let unlimited = AllocatorConfig {
        memory_limit: None,
        ..config.clone()
    };
    let mut traces: std::collections::HashMap<usize, Workload> = Default::default();
    for name in NAMES {
        // `None`: a step no device could run (a tensor or the whole past
        // 2^62 bytes), which fits no strategy.
        let mut trace_of = |b: usize| -> anyhow::Result<Option<Workload>> {
            if let Some(w) = traces.get(&b) {
                return Ok(Some(w.clone()));
            }
            let mut p = plan(b);
            p.config = unlimited.clone();
            let prof = match run_steps(Engine::simulated(unlimited.clone(), None), &p, 0, steps) {
                Ok(prof) => prof,
                Err(e) if e.is_oom() || past_adapter_limit(&e) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let w = Workload::from_events("step", &prof.events);
            traces.insert(b, w.clone());
            Ok(Some(w))
        };
        let n = search(args.max, |b| {
            let Some(w) = trace_of(b)? else {
                return Ok(false);
            };
            let r = compare(&w, &[name], Some(effective)).map_err(anyhow::Error::msg)?;
            Ok(!r[0].oom)
        })?;
        by_allocator.push(serde_json::json!({"allocator": name, "max_batch": n}));
    }
    progress.finish_and_clear();
    let none_fits = nothing_fits(
        max_batch,
        effective,
        trials.iter().map(|t| (t.batch, t.peak_reserved_bytes)),
    );
    if args.json {
        let mut out = serde_json::json!({
            "model": spec,
            "limit_bytes": limit,
            "margin": args.margin,
            "effective_limit_bytes": effective,
            "allocator": args.allocator,
            "adapter": engine.device_name(),
            "estimated_max_batch": estimated,
            "max_batch": max_batch,
            // The search's cap (--max): a max_batch equal to it may not be
            // the device's limit.
            "max": args.max,
            "trials": trials,
            "by_allocator": by_allocator,
        });
        let failed = none_fits.map(|e| super::fail_in_json(&mut out, e));
        println!("{}", serde_json::to_string_pretty(&out)?);
        return failed.map_or(Ok(()), Err);
    }
    println!(
        "vramlab max-batch: {}, {}, mode {}, limit {} − {:.0}% margin = {}, allocator {} on {}",
        spec.describe(),
        base.optimizer.kind,
        args.step.mode,
        crate::memory::Mib(limit),
        args.margin * 100.0,
        crate::memory::Mib(effective),
        args.allocator,
        engine.device_name()
    );
    println!(
        "  {:>8} {:>9} {:>6} {:>16} {:>16}",
        "batch", "on", "fits", "peak alloc MiB", "peak resv MiB"
    );
    for t in &trials {
        println!(
            "  {:>8} {:>9} {:>6} {:>16.2} {:>16.2}",
            t.batch,
            t.on,
            match (t.fits, &t.limit) {
                (true, _) => "yes",
                (false, None) => "OOM",
                (false, Some(_)) => "limit",
            },
            mib(t.peak_allocated_bytes),
            mib(t.peak_reserved_bytes)
        );
    }
    if trials.iter().any(|t| !t.fits && t.limit.is_none()) {
        println!("  (an OOM row's peaks are where its step was refused: what it reached, not what it needed)");
    }
    // What bounds the answer: the smallest larger batch that failed on the
    // device, or --max (larger batches are not tried).
    let bound = match trials
        .iter()
        .filter(|t| t.on == "device" && !t.fits && t.batch > max_batch)
        .map(|t| t.batch)
        .min()
    {
        Some(b) => format!("batch {b} did not fit"),
        None => format!(
            "capped by --max {}: larger batches were not tried",
            args.max
        ),
    };
    println!("estimated: {estimated}; on the device: max batch {max_batch} ({bound})");
    if by_allocator.iter().any(|r| r["max_batch"] == args.max) {
        println!(
            "(an allocator at {} may allow more: --max caps every search)",
            args.max
        );
    }
    if let Some(why) = trials.iter().find_map(|t| t.limit.as_ref()) {
        println!("limit: a batch failed past what the adapter binds or any device holds, not for memory: {why}");
    }
    if let Some(e) = none_fits {
        return Err(e);
    }
    let gaps: Vec<usize> = trials
        .iter()
        .filter(|t| t.on == "device" && !t.fits && t.batch < max_batch)
        .map(|t| t.batch)
        .collect();
    if !gaps.is_empty() {
        println!(
            "note: smaller batches {gaps:?} ran out of memory although {max_batch} fits — the caching allocator's segment sizes make fitting non-monotone in the batch"
        );
    }
    println!("what each allocator allows at this limit (simulated replay of the step):");
    if args.allocator == "vramlab" {
        // Two things share the name: say which the search above ran.
        println!(
            "  (the search above ran --allocator vramlab: PyTorch's allocator with vramlab's options lookahead and small_from_large; the row `vramlab` below is the lab's strategy of that name, segments over 2 MiB granules remapped as blocks come and go, which needs page mapping that wgpu lacks)"
        );
    }
    let width = NAMES.iter().map(|n| n.len()).max().unwrap_or(0);
    for r in &by_allocator {
        println!(
            "  {:<width$} {}",
            r["allocator"].as_str().unwrap_or(""),
            r["max_batch"]
        );
    }
    Ok(())
}

/// `--record`: the batch search on the user's own recorded step.
fn run_recorded(
    args: &MaxBatchArgs,
    command: &str,
    base_config: &AllocatorConfig,
    limit: u64,
    effective: u64,
) -> anyhow::Result<()> {
    use super::recorded::{Probe, Recorder, UNSEEN};
    if args.max == 0 {
        anyhow::bail!("--max must be at least 1");
    }
    check_max(args.max)?;
    let recorder = Recorder::new(command, &args.model)?;
    // The recording's own allocator settings, unless --alloc-conf (or
    // VRAMLAB_ALLOC_CONF) says otherwise; the limit is the device's size.
    let config = args.alloc.conf_given().then(|| AllocatorConfig {
        memory_limit: None,
        ..base_config.clone()
    });
    let progress = super::progress::spinner("max-batch", args.json);
    let mut probes: Vec<Probe> = Vec::new();
    // Bisection only: each probe runs the user's script, so the batches
    // past its answer are not tried here (docs/recorder.md says so).
    let max_batch = bisect(args.max, |b| {
        progress.set_message(format!("recording batch {b}"));
        progress.inc(1);
        let p = recorder.probe(b, config.as_ref(), Some(effective))?;
        probes.push(p.clone());
        Ok(p.fits)
    })?;
    progress.finish_and_clear();
    let none_fits = nothing_fits(
        max_batch,
        effective,
        probes.iter().map(|p| (p.batch, p.peak_reserved_bytes)),
    );
    if args.json {
        let mut out = serde_json::json!({
            "record": command,
            "limit_bytes": limit,
            "margin": args.margin,
            "effective_limit_bytes": effective,
            "max_batch": max_batch,
            "probes": probes,
            "not_seen": UNSEEN,
        });
        let failed = none_fits.map(|e| super::fail_in_json(&mut out, e));
        println!("{}", serde_json::to_string_pretty(&out)?);
        return failed.map_or(Ok(()), Err);
    }
    println!(
        "vramlab max-batch: your step, recorded by `{command}`; limit {:.2} MiB − {:.0}% margin = {:.2} MiB",
        mib(limit),
        args.margin * 100.0,
        mib(effective)
    );
    println!(
        "  {:>8} {:>10} {:>6} {:>16} {:>16}",
        "batch", "record s", "fits", "peak alloc MiB", "peak resv MiB"
    );
    for p in &probes {
        println!(
            "  {:>8} {:>10.1} {:>6} {:>16.2} {:>16.2}",
            p.batch,
            p.record_seconds,
            if p.fits { "yes" } else { "OOM" },
            mib(p.peak_allocated_bytes),
            mib(p.peak_reserved_bytes)
        );
    }
    println!("max batch: {max_batch} (recorded {UNSEEN})");
    none_fits.map_or(Ok(()), Err)
}

/// Not even batch 1 fits (`max_batch` 0): an out-of-memory answer is an
/// error that says what would make room, not a batch of 0. `tried` gives
/// each trial's batch and reserved bytes.
fn nothing_fits(
    max_batch: usize,
    effective: u64,
    tried: impl Iterator<Item = (usize, u64)>,
) -> Option<anyhow::Error> {
    if max_batch > 0 {
        return None;
    }
    let need = tried
        .filter(|&(batch, _)| batch == 1)
        .map(|(_, reserved)| reserved)
        .max()
        .map(|b| {
            format!(
                " (batch 1 was refused with {} reserved)",
                crate::memory::Mib(b)
            )
        })
        .unwrap_or_default();
    Some(anyhow::anyhow!(
        "not even batch 1 trains within {}{need}: raise --memory-limit (or lower --margin), or use a smaller model",
        crate::memory::Mib(effective)
    ))
}
