//! `vramlab sweep`: how a step's peak memory grows with batch size,
//! resolution or sequence length — estimated at every point (no GPU),
//! measured too with `--measure` (an out-of-memory point is recorded as such
//! and the sweep goes on), fitted with a line and a power law, plotted.

use super::args::{AllocArgs, DeviceArgs, ModelArgs, StepArgs};
use crate::estimate::analyze;
use crate::estimate::fit::{fit, Fit};
use crate::estimate::run::run_steps;
use crate::memory::mib;
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Batch sizes (a list sweeps them; one value fixes the batch).
    #[arg(long, value_delimiter = ',', default_value = "8")]
    pub batch: Vec<usize>,
    #[command(flatten)]
    pub step: StepArgs,
    /// Training steps at each point; its figures are the peak over all of
    /// them. 1 (the default, as `estimate`'s) is the first step; 2 reaches
    /// the steady state, where a stateful optimizer's state (Adam's
    /// moments, momentum) is live through forward and backward, as
    /// `max-batch` counts by default.
    #[arg(long, default_value_t = 1)]
    pub steps: usize,
    /// Also run each point on the GPU.
    #[arg(long)]
    pub measure: bool,
    /// Write sweep.svg (and sweep.json) here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Sweep your own PyTorch model's batch instead of a zoo model: COMMAND
    /// records its step on fake tensors at each batch (`{batch}` in it is
    /// replaced; the snapshot goes to `{out}`, or `--out PATH` is appended),
    /// and each recording is replayed through the caching allocator (on a
    /// device of --capacity, if given). No GPU is used.
    #[arg(long, value_name = "COMMAND")]
    pub record: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Point {
    value: usize,
    /// Peak allocated of the step (its demand).
    estimated_peak_bytes: u64,
    /// Peak reserved: what the caching allocator holds, and what a memory
    /// limit or --capacity decides `oom` against.
    estimated_reserved_bytes: u64,
    /// The part of the peak that scales with the swept value: input,
    /// activations, outputs and temporaries live at the peak.
    estimated_growing_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    measured_peak_bytes: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    oom: bool,
}

#[derive(Debug, Serialize)]
struct SweepFit {
    /// Line through (value, peak bytes).
    slope: f64,
    intercept: f64,
    r2: f64,
    /// Power-law exponent of the part that grows (input, activations,
    /// outputs and temporaries at the peak).
    exponent: f64,
    /// Power-law exponent of the whole peak.
    exponent_total: f64,
}

/// The most bytes of what scales with the swept value (the batch and what
/// is computed from it: input, activations, outputs, temporaries) live at
/// once in the forward and backward passes. Parameters, gradients and
/// optimizer state do not scale, and the conv workspace is capped (8 MiB
/// per op) by design. The step's own peak can fall in the optimizer step
/// at small values, where Adam's parameter-sized temporaries are live and
/// nothing scales: counted there, attention's sweep over batches 1–16 fit
/// an exponent of 1.31 to memory that is linear in the batch (1.00 from
/// batch 2).
fn growing_bytes(events: &[crate::memory::MemEvent]) -> u64 {
    use crate::memory::tag::Category;
    use crate::memory::EventKind;
    // Each block counted as what it ends up as: a weight's gradient is
    // made as a temporary and retagged `gradient` at once, and counted as
    // made it would grow with nothing.
    let mut last: Vec<Category> = events.iter().map(|e| e.category).collect();
    let mut open: std::collections::HashMap<u64, usize> = Default::default();
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                open.insert(e.address, i);
            }
            EventKind::Retag => {
                if let Some(&j) = open.get(&e.address) {
                    last[j] = e.category;
                }
            }
            EventKind::Free => {
                open.remove(&e.address);
            }
            _ => {}
        }
    }
    let grows = |c: Category| {
        matches!(
            c,
            Category::Input | Category::Activation | Category::Output | Category::Temporary
        )
    };
    // A weight's gradient has the weight's size whatever the batch, also
    // where it stays a temporary (a tied weight's second gradient, summed
    // into the first: gpt's 50,257 × 768 head made the growing part 147 MiB
    // at batch 1 and the exponent 0.45).
    let weight_gradient =
        |label: &str| label.ends_with(".grad_weight") || label.ends_with(".grad_bias");
    let mut live: std::collections::HashMap<u64, u64> = Default::default();
    let (mut in_pass, mut now, mut most) = (false, 0u64, 0u64);
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::Phase => in_pass = matches!(&*e.op, "forward" | "backward"),
            EventKind::Alloc if grows(last[i]) && !weight_gradient(&e.label) => {
                live.insert(e.address, e.size);
                now += e.size;
            }
            EventKind::Free => now -= live.remove(&e.address).unwrap_or(0),
            _ => {}
        }
        if in_pass {
            most = most.max(now);
        }
    }
    most
}

pub fn run(args: &SweepArgs) -> anyhow::Result<()> {
    args.device.only_with_measure(args.measure)?;
    if let Some(dir) = &args.out {
        super::args::out_dir("--out", dir)?;
    }
    let lists = [
        ("batch", Some(args.batch.clone())),
        ("resolution", args.model.resolution.clone()),
        ("seq-len", args.model.seq_len.clone()),
    ];
    let swept: Vec<&(&str, Option<Vec<usize>>)> = lists
        .iter()
        .filter(|(_, v)| v.as_ref().is_some_and(|v| v.len() > 1))
        .collect();
    let (dim, values) = match swept.as_slice() {
        [(d, Some(v))] => (*d, v.clone()),
        [] => anyhow::bail!(
            "give a list to sweep: --batch 1,2,4,8, --resolution 16,32,64 (resnet-mini, resnet50) or --seq-len 64,128,256 (attention, gpt)"
        ),
        _ => anyhow::bail!("sweep one of --batch, --resolution, --seq-len at a time"),
    };
    if values.contains(&0) {
        anyhow::bail!("--{dim} values must be at least 1");
    }
    super::args::check_recorded_steps(args.steps)?;
    // A fit needs distinct points: a repeated value adds nothing to it.
    super::args::listed_once(&format!("--{dim}"), &values)?;
    if let Some(command) = &args.record {
        return run_recorded(args, command, dim, &values);
    }
    // A bad optimizer setting is an error before any GPU work.
    args.step.optimizer()?;
    let config = args.alloc.config(None)?;
    // --capacity is the simulated device's size, as in `estimate` and
    // `replay`; a measured point runs on the GPU, whose size is its own.
    let capacity = args.alloc.capacity()?;
    if args.measure && capacity.is_some() && args.alloc.memory_fraction.is_none() {
        anyhow::bail!(
            "--capacity is the size of the simulated device a point runs on; with --measure each point runs on the GPU, whose size is its own: leave --capacity out, or cap the GPU with --memory-limit SIZE"
        );
    }
    let engine = if args.measure {
        Some(args.device.engine(config.clone())?)
    } else {
        None
    };
    let first = |v: &Option<Vec<usize>>| v.as_ref().map(|v| v[0]);
    let mut points = Vec::new();
    let mut name = String::new();
    // The first point's step: what the sweep holds fixed, for the JSON.
    let mut first_step: Option<crate::estimate::Plan> = None;
    let bar = super::progress::bar(values.len() as u64, "sweep", args.json);
    for &value in values.iter() {
        let (batch, res, seq) = match dim {
            "batch" => (
                value,
                first(&args.model.resolution),
                first(&args.model.seq_len),
            ),
            "resolution" => (args.batch[0], Some(value), first(&args.model.seq_len)),
            _ => (args.batch[0], first(&args.model.resolution), Some(value)),
        };
        let spec = args.model.spec_with(res, seq)?;
        name = spec.name().to_string();
        bar.set_message(format!("{dim} {value}"));
        let plan = args.step.plan(spec, batch, config.clone())?;
        first_step.get_or_insert_with(|| plan.clone());
        // The estimate is the demand, so the memory limit (which decides
        // whether the measured run fits) does not apply to it.
        let mut unlimited = plan.clone();
        unlimited.config.memory_limit = None;
        let est = run_steps(
            crate::tensor::Engine::simulated(unlimited.config.clone(), None),
            &unlimited,
            0,
            args.steps,
        )?;
        let a = analyze(&est.events, &est.layer_outputs);
        let growing = growing_bytes(&est.events);
        let (measured, oom) = match &engine {
            // Under a memory limit or on a device of --capacity, whether
            // the step fits: run on a simulated device with both.
            None if plan.config.memory_limit.is_some() || capacity.is_some() => match run_steps(
                crate::tensor::Engine::simulated(plan.config.clone(), capacity),
                &plan,
                0,
                args.steps,
            ) {
                Ok(_) => (None, false),
                Err(err) if err.is_oom() => (None, true),
                Err(err) => return Err(err).context(format!("{dim} {value}")),
            },
            None => (None, false),
            Some(e) => {
                e.allocator().empty_cache();
                e.allocator().reset_peak_memory_stats();
                match run_steps(e.clone(), &plan, 0, args.steps) {
                    Ok(p) => (
                        Some(analyze(&p.events, &p.layer_outputs).peak_allocated_bytes),
                        false,
                    ),
                    Err(err) if err.is_oom() => (None, true),
                    Err(err) => return Err(err).context(format!("{dim} {value}")),
                }
            }
        };
        points.push(Point {
            value,
            estimated_peak_bytes: a.peak_allocated_bytes,
            estimated_reserved_bytes: a.peak_reserved_bytes,
            estimated_growing_bytes: growing,
            measured_peak_bytes: measured,
            oom,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let xs: Vec<f64> = points.iter().map(|p| p.value as f64).collect();
    let ys: Vec<f64> = points
        .iter()
        .map(|p| p.estimated_peak_bytes as f64)
        .collect();
    let grow: Vec<f64> = points
        .iter()
        .map(|p| p.estimated_growing_bytes as f64)
        .collect();
    let line: Option<Fit> = fit(&xs, &ys);
    let fit_out = line.map(|l| SweepFit {
        slope: l.slope,
        intercept: l.intercept,
        r2: l.r2,
        exponent: fit(&xs, &grow).map(|g| g.exponent).unwrap_or(f64::NAN),
        exponent_total: l.exponent,
    });
    let report = serde_json::json!({
        "model": name,
        "swept": dim,
        "steps": args.steps,
        // The step at the first point (model sizes, batch, optimizer, mode,
        // precision, loss): all but the swept value hold for every point.
        "step": first_step,
        "memory_limit": config.memory_limit,
        "points": points,
        "fit": fit_out,
    });
    if let Some(dir) = &args.out {
        let svg = plot(&points, dim, &name);
        crate::io::write_atomic(&dir.join("sweep.svg"), svg.as_bytes())?;
        crate::io::write_atomic(
            &dir.join("sweep.json"),
            serde_json::to_string_pretty(&report)?.as_bytes(),
        )?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "vramlab sweep: {name}, {dim} over {values:?}, mode {}, {}",
        args.step.mode,
        if args.steps == 1 {
            "step 1 (--steps 2 for the steady state)".to_string()
        } else {
            format!("the peak over {} steps", args.steps)
        }
    );
    // Without --measure, a memory limit is checked on a simulated device:
    // the last column says whether each point fits it.
    let limit = match (config.memory_limit, capacity) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
    .filter(|_| engine.is_none());
    if let Some(l) = limit {
        println!(
            "  estimated: the step's demand, peak allocated and peak reserved (the cache the allocator holds\n  with no limit; under one it frees cached blocks before it runs out); under the limit: whether it\n  runs within {} (simulated)",
            crate::memory::format_size(l)
        );
    }
    println!(
        "  {:>10} {:>18} {:>15} {:>18} {:>18}",
        dim,
        "estimated (MiB)",
        "reserved (MiB)",
        "growing part",
        if limit.is_some() {
            "under the limit"
        } else {
            "measured (MiB)"
        }
    );
    for p in &points {
        let m = match (p.measured_peak_bytes, p.oom) {
            (_, true) => "out of memory".to_string(),
            (_, false) if limit.is_some() => "fits".to_string(),
            (Some(b), _) => format!("{:.2}", mib(b)),
            (None, _) => "-".to_string(),
        };
        println!(
            "  {:>10} {:>18.2} {:>15.2} {:>18.2} {:>18}",
            p.value,
            mib(p.estimated_peak_bytes),
            mib(p.estimated_reserved_bytes),
            mib(p.estimated_growing_bytes),
            m
        );
    }
    if let Some(f) = &fit_out {
        println!(
            "  line: {:.0} bytes per unit of {dim} ({:+.2} MiB), R² = {:.6}",
            f.slope,
            f.intercept / 1048576.0,
            f.r2
        );
        println!(
            "  power fit of the growing part: exponent {:.3} (whole peak: {:.3})",
            f.exponent, f.exponent_total
        );
    }
    if let Some(dir) = &args.out {
        println!(
            "wrote {} and {}",
            dir.join("sweep.svg").display(),
            dir.join("sweep.json").display()
        );
    }
    Ok(())
}

fn plot(points: &[Point], dim: &str, model: &str) -> String {
    let (w, h, l, t) = (700.0, 380.0, 80.0, 40.0);
    let xmax = points.iter().map(|p| p.value).max().unwrap_or(1) as f64;
    let ymax = points
        .iter()
        .map(|p| {
            p.estimated_peak_bytes
                .max(p.measured_peak_bytes.unwrap_or(0))
        })
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |v: f64| l + w * v / xmax;
    let y = |b: f64| t + h - h * b / ymax;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{l}" y="22" font-size="15">{model}: peak allocated vs {dim}</text>"#,
        w + l + 40.0,
        h + t + 50.0
    );
    for k in 0..=4 {
        let b = ymax * k as f64 / 4.0;
        s += &format!(
            r##"<line x1="{l}" x2="{0}" y1="{1:.1}" y2="{1:.1}" stroke="#eee"/><text x="{2}" y="{3:.1}" text-anchor="end">{4:.1} MiB</text>"##,
            l + w,
            y(b),
            l - 5.0,
            y(b) + 4.0,
            b / 1048576.0
        );
    }
    let pts: String = points
        .iter()
        .map(|p| {
            format!(
                "{:.1},{:.1} ",
                x(p.value as f64),
                y(p.estimated_peak_bytes as f64)
            )
        })
        .collect();
    s += &format!(r##"<polyline points="{pts}" fill="none" stroke="#4e79a7" stroke-width="2"/>"##);
    for p in points {
        let px = x(p.value as f64);
        s += &format!(
            r##"<text x="{px:.1}" y="{}" text-anchor="middle">{}</text><circle cx="{px:.1}" cy="{:.1}" r="3" fill="#4e79a7"/>"##,
            t + h + 18.0,
            p.value,
            y(p.estimated_peak_bytes as f64)
        );
        if let Some(m) = p.measured_peak_bytes {
            s += &format!(
                r##"<rect x="{:.1}" y="{:.1}" width="8" height="8" fill="none" stroke="#e15759" stroke-width="2"/>"##,
                px - 4.0,
                y(m as f64) - 4.0
            );
        }
        if p.oom {
            s += &format!(
                r##"<text x="{px:.1}" y="{}" fill="#e15759" text-anchor="middle">OOM</text>"##,
                t + 14.0
            );
        }
    }
    // The axis label; the legend sits in the title row, right of the title,
    // off the data (flat curves run along the top), and names "measured"
    // only when a point was measured.
    s += &format!(
        r##"<text x="{}" y="{}" text-anchor="middle">{dim}</text>"##,
        l + w / 2.0,
        t + h + 40.0
    );
    let lx = l + w - 180.0;
    s += &format!(
        r##"<circle cx="{lx}" cy="18" r="3" fill="#4e79a7"/><text x="{}" y="22">estimated</text>"##,
        lx + 10.0
    );
    if points.iter().any(|p| p.measured_peak_bytes.is_some()) {
        s += &format!(
            r##"<rect x="{}" y="14" width="8" height="8" fill="none" stroke="#e15759" stroke-width="2"/><text x="{}" y="22">measured</text>"##,
            lx + 86.0,
            lx + 100.0
        );
    }
    s += "</svg>";
    s
}

/// `--record`: each batch of the user's own step recorded and replayed; the
/// peaks and the line through them.
fn run_recorded(
    args: &SweepArgs,
    command: &str,
    dim: &str,
    values: &[usize],
) -> anyhow::Result<()> {
    use super::recorded::{Recorder, UNSEEN};
    if dim != "batch" {
        anyhow::bail!("--record sweeps the batch (--batch 1,2,4,8); the resolution and sequence length are the recorder command's");
    }
    if args.steps != 1 {
        anyhow::bail!(super::args::STEPS_WITH_RECORD);
    }
    if args.measure || args.out.is_some() {
        anyhow::bail!(
            "--record replays on a simulated device: --measure and --out apply to zoo models"
        );
    }
    let recorder = Recorder::new(command, &args.model)?;
    let capacity = args.alloc.capacity()?;
    let config = if args.alloc.conf_given() {
        Some(args.alloc.config(None)?)
    } else {
        None
    };
    let bar = super::progress::bar(values.len() as u64, "sweep", args.json);
    let mut probes = Vec::new();
    for &b in values {
        bar.set_message(format!("recording batch {b}"));
        probes.push(recorder.probe(b, config.as_ref(), capacity)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let xs: Vec<f64> = probes.iter().map(|p| p.batch as f64).collect();
    let ys: Vec<f64> = probes
        .iter()
        .map(|p| p.peak_allocated_bytes as f64)
        .collect();
    let line = fit(&xs, &ys);
    if args.json {
        let out = serde_json::json!({
            "record": command,
            "swept": "batch",
            "probes": probes,
            "fit": line.map(|l| serde_json::json!({"slope": l.slope, "intercept": l.intercept, "r2": l.r2, "exponent": l.exponent})),
            "not_seen": UNSEEN,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("vramlab sweep: your step, recorded by `{command}`, batch over {values:?}");
    println!(
        "  {:>10} {:>10} {:>18} {:>18} {:>6}",
        "batch", "record s", "peak alloc (MiB)", "peak resv (MiB)", "fits"
    );
    for p in &probes {
        println!(
            "  {:>10} {:>10.1} {:>18.2} {:>18.2} {:>6}",
            p.batch,
            p.record_seconds,
            mib(p.peak_allocated_bytes),
            mib(p.peak_reserved_bytes),
            match (
                p.fits,
                capacity.is_some() || config.as_ref().is_some_and(|c| c.memory_limit.is_some())
            ) {
                (false, _) => "OOM",
                (true, true) => "yes",
                // Without a device size or a limit nothing can be refused.
                (true, false) => "-",
            }
        );
    }
    if let Some(l) = line {
        println!(
            "  line: {:.0} bytes per sample ({:+.2} MiB), R² = {:.6}",
            l.slope,
            l.intercept / 1048576.0,
            l.r2
        );
    }
    println!("  (recorded {UNSEEN})");
    Ok(())
}
