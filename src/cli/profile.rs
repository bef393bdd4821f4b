//! `vramlab profile`: runs training steps on the GPU with every allocator
//! event recorded (alloc, free, segment alloc/free, OOM, category changes,
//! phases) and writes timeline.svg, timeline.html, trace.json (Chrome trace
//! format), snapshot.json (segments and blocks at the peak) and
//! snapshot.pickle (PyTorch's format) — up to the refusal when a step runs
//! out of memory.

use super::args::{AllocArgs, DeviceArgs, ModelArgs, StepArgs};
use crate::estimate::analyze;
use crate::estimate::run::run_steps;
use crate::memory::mib;
use crate::profile::{chrome, html, live_at, svg, OpTimes, Series};
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Samples per batch.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Training steps to record.
    #[arg(long, default_value_t = 2)]
    pub steps: usize,
    #[command(flatten)]
    pub step: StepArgs,
    /// Directory for timeline.svg, timeline.html, trace.json, snapshot.json
    /// and snapshot.pickle (PyTorch's format; created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Print, per layer, the bytes its forward added and backward released.
    #[arg(long)]
    pub per_layer: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The files `--out` receives.
const PROFILE_FILES: [&str; 5] = [
    "timeline.svg",
    "timeline.html",
    "trace.json",
    "snapshot.json",
    "snapshot.pickle",
];

pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    super::args::check_recorded_steps(args.steps)?;
    super::args::at_least_one(&[
        ("--batch", args.batch as u64),
        ("--steps", args.steps as u64),
    ])?;
    let spec = args.model.spec()?;
    let plan = args
        .step
        .plan(spec.clone(), args.batch, args.alloc.config(None)?)?;
    // Every file it writes, checked before the run: a blocked one is found
    // before the work, not after it with a half-written directory.
    super::args::out_dir_for("--out", &args.out, &PROFILE_FILES)?;
    let engine = args.device.engine(plan.config.clone())?;
    engine.start_timing();
    let title = |device: &str| {
        format!(
            "vramlab profile: {}, batch {}, {}, {} on {}",
            spec.describe(),
            args.batch,
            plan.optimizer.kind,
            super::steps(args.steps),
            device
        )
    };
    let profile = match run_steps(engine.clone(), &plan, 0, args.steps) {
        Ok(p) => p,
        // Out of memory is what a timeline is for: the events up to the
        // refusal are written, then the error says where.
        Err(e) if e.is_oom() => {
            // Up to the refusal: the frees of the step's unwinding after it
            // would leave the snapshot's segments empty.
            let mut events = engine.allocator().take_events();
            let refused = events
                .iter()
                .position(|e| e.kind == crate::memory::EventKind::Oom);
            events.truncate(refused.map_or(events.len(), |i| i + 1));
            let device = engine.device_name();
            let title = title(&device);
            // The figures up to the refusal go beside the error, as the
            // files have them.
            let peaks = Peaks::of(&events, &[], &plan.config);
            let files = write_files(args, &events, &peaks.series, &title, &plan.config)?;
            let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
            let err = anyhow::Error::new(e).context(format!(
                "the step ran out of memory; the {} events up to it are in {}",
                events.len(),
                names.join(", ")
            ));
            if args.json {
                let mut doc = peaks.json(args, &plan, &device, &files);
                let err = super::fail_in_json(&mut doc, err);
                println!("{}", serde_json::to_string_pretty(&doc)?);
                return Err(err);
            }
            println!("{title}");
            println!(
                "{}",
                peaks.line(" up to the refusal", &peaks.operation_text())
            );
            return Err(err);
        }
        Err(e) => return Err(e.into()),
    };
    // Device time of every kernel of every recorded step, by op and phase.
    let op_times = engine
        .take_dispatch_times()?
        .map(|(source, times)| OpTimes::of(source, &times));
    let levels = &profile.levels;
    let events = &profile.events;
    let peaks = Peaks::of(events, &profile.layer_outputs, &plan.config);
    let analysis = &peaks.analysis;
    let title = title(&profile.device);
    let files = write_files(args, events, &peaks.series, &title, &plan.config)?;
    if args.json {
        let mut out = peaks.json(args, &plan, &profile.device, &files);
        out["layers"] = serde_json::to_value(&analysis.layers)?;
        out["three_levels"] = serde_json::to_value(levels)?;
        out["device_time"] = serde_json::to_value(&op_times)?;
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("{title}");
    println!("{}", peaks.line("", &peaks.operation_text()));
    println!("memory: {levels}");
    if let Some(t) = &op_times {
        println!();
        print!("{}", t.table(16));
    }
    if args.per_layer {
        println!();
        println!("Per layer, last step (the forward-hook method, from the allocator's log):");
        println!(
            "  {:<20} {:>16} {:>18} {:>20}",
            "layer", "forward + (MiB)", "saved at end (MiB)", "backward − (MiB)"
        );
        for l in &analysis.layers {
            println!(
                "  {:<20} {:>16.2} {:>18.2} {:>20.2}",
                l.layer,
                l.forward_added as f64 / 1048576.0,
                mib(l.activation_bytes),
                mib(l.backward_released)
            );
        }
        println!("  (forward +: bytes the op's allocations still held when forward ended;");
        println!("   backward −: those freed during backward — what a forward hook reading");
        println!("   memory_allocated() around each layer would try to measure.)");
    }
    println!();
    for p in &files {
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// The peaks of the recorded events, for the summary line, `--json` and
/// the files alike, whether the steps finished or ran out of memory.
struct Peaks {
    events: usize,
    /// Allocated and reserved after each event (the timeline's).
    series: Series,
    peak_event: usize,
    /// The peak as `doctor --at` counts snapshot.pickle's operations.
    operation: Option<usize>,
    analysis: crate::estimate::Analysis,
}

impl Peaks {
    fn of(
        events: &[crate::memory::MemEvent],
        layer_outputs: &[(std::sync::Arc<str>, Vec<usize>)],
        config: &crate::memory::AllocatorConfig,
    ) -> Peaks {
        let series = Series::of(events);
        let peak_event = series.peak_index;
        Peaks {
            events: events.len(),
            series,
            peak_event,
            operation: crate::lab::snapshot_export::operation_of(events, peak_event, config),
            analysis: analyze(events, layer_outputs),
        }
    }

    /// `N events{what}; peak allocated … (event E{op}), peak reserved …`.
    /// The peak as `doctor --at` / `replay` count snapshot.pickle's
    /// operations, for [`Peaks::line`].
    fn operation_text(&self) -> String {
        self.operation.map_or(String::new(), |op| {
            format!("; operation {op} of snapshot.pickle, as `doctor --at` counts")
        })
    }

    fn line(&self, what: &str, op: &str) -> String {
        format!(
            "{} events{what}; peak allocated {:.2} MiB (event {}{op}), peak reserved {:.2} MiB",
            self.events,
            mib(self.analysis.peak_allocated_bytes),
            self.peak_event,
            mib(self.analysis.peak_reserved_bytes)
        )
    }

    fn json(
        &self,
        args: &ProfileArgs,
        plan: &crate::estimate::Plan,
        adapter: &str,
        files: &[PathBuf],
    ) -> serde_json::Value {
        serde_json::json!({
            "plan": plan,
            "steps": args.steps,
            "adapter": adapter,
            "events": self.events,
            "peak_allocated_bytes": self.analysis.peak_allocated_bytes,
            "peak_reserved_bytes": self.analysis.peak_reserved_bytes,
            "peak_event": self.peak_event,
            "peak_snapshot_operation": self.operation,
            "by_category": self.analysis.by_category,
            "files": files,
        })
    }
}

/// Writes the timeline (SVG, HTML), the Chrome trace, the snapshot at the
/// peak (JSON) and the PyTorch snapshot pickle of `events` into --out.
fn write_files(
    args: &ProfileArgs,
    events: &[crate::memory::MemEvent],
    series: &Series,
    title: &str,
    config: &crate::memory::AllocatorConfig,
) -> anyhow::Result<[PathBuf; 5]> {
    let write = |name: &str, contents: &[u8]| -> anyhow::Result<PathBuf> {
        let p = args.out.join(name);
        crate::io::write_atomic(&p, contents)
            .with_context(|| format!("cannot write {}", p.display()))?;
        Ok(p)
    };
    let trace = chrome::render(events, series);
    let snapshot = serde_json::json!({
        "event": series.peak_index,
        "allocated_bytes": series.allocated.get(series.peak_index),
        "reserved_bytes": series.reserved.get(series.peak_index),
        "segments": live_at(events, series.peak_index),
    });
    // The same run as a PyTorch memory snapshot, for pytorch.org/memory_viz.
    let torch = crate::lab::snapshot_export::torch_snapshot(events, config);
    Ok([
        write("timeline.svg", svg::render(series, title).as_bytes())?,
        write("timeline.html", html::render(events, title).as_bytes())?,
        write("trace.json", serde_json::to_string(&trace)?.as_bytes())?,
        write(
            "snapshot.json",
            serde_json::to_string_pretty(&snapshot)?.as_bytes(),
        )?,
        write("snapshot.pickle", &crate::lab::pickle::pickle(&torch))?,
    ])
}
