//! `vramlab replay TRACE.jsonl`: run an allocation trace through the caching
//! allocator on a simulated device and print the statistics it reaches.

use super::args::AllocArgs;
use crate::lab::replay;
use crate::memory::mib;
use crate::memory::{memory_summary, CachingAllocator, Mib, SegmentSource, SimulatedSource};
use clap::Args;
use std::io::BufReader;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// JSON Lines trace: {"op":"alloc","id":7,"size":1200}, {"op":"free","id":7},
    /// {"op":"empty_cache"}, {"op":"reset_peak"}; "label" and "category" (parameter, optimizer_state, activation, ...; what `vramlab` places by) are optional.
    /// Or a PyTorch memory snapshot pickle, or an interval file (CSV with the
    /// header id,lower,upper,size, other columns ignored: half-open lifetimes, as MiniMalloc's
    /// benchmarks), replayed as a trace with frees first at each time.
    pub trace: PathBuf,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Also print allocated/reserved bytes after every event (JSON Lines and
    /// interval files; for a snapshot, `vramlab doctor FILE --out DIR`).
    #[arg(long, conflicts_with = "allocators")]
    pub timeline: bool,
    /// Compare allocator strategies on this trace instead (`all`, or names;
    /// --help says what each is).
    #[arg(long, value_delimiter = ',', value_name = "NAMES", long_help = STRATEGIES_HELP)]
    pub allocators: Option<Vec<String>>,
    /// With --allocators: write reserved.svg (reserved memory over the
    /// trace, one line per strategy) here.
    #[arg(long, value_name = "DIR", requires = "allocators")]
    pub out: Option<PathBuf>,
    /// Also write the replay as a PyTorch memory snapshot (the pickle
    /// `torch.cuda.memory._dump_snapshot()` writes), for pytorch.org/memory_viz
    /// or `torch.cuda._memory_viz`. JSON Lines and interval traces (a
    /// snapshot is one already).
    #[arg(long, value_name = "FILE", conflicts_with = "allocators")]
    pub export_snapshot: Option<PathBuf>,
    /// Also write the trace as an interval file (id,lower,upper,size; time
    /// is the event index, lifetimes half open, and a buffer's id its
    /// alloc's event index, as trace ids may be reused) for offline planners
    /// such as MiniMalloc. JSON Lines traces and interval files.
    #[arg(long, value_name = "FILE")]
    pub export_intervals: Option<PathBuf>,
    /// A PyTorch snapshot: replay only this device (default: every device
    /// with a history, each reported on its own).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    use crate::lab::file_kind::{sniff, FileKind};
    if let Some(dir) = &args.out {
        super::args::out_dir("--out", dir)?;
    }
    if let Some(f) = &args.export_snapshot {
        super::args::out_file_dir("--export-snapshot", f)?;
    }
    if let Some(f) = &args.export_intervals {
        super::args::out_file_dir("--export-intervals", f)?;
    }
    super::args::outputs_apart(
        &[
            ("--export-snapshot", args.export_snapshot.as_deref()),
            ("--export-intervals", args.export_intervals.as_deref()),
        ],
        &[("the trace", Some(args.trace.as_path()))],
    )?;
    let kind = sniff(&args.trace).map_err(anyhow::Error::msg)?;
    if kind == FileKind::Snapshot {
        if args.export_snapshot.is_some() || args.export_intervals.is_some() {
            anyhow::bail!("--export-snapshot and --export-intervals write out a JSON Lines trace or an interval file; this file is a PyTorch snapshot (replay it as it is)");
        }
        // A snapshot's replay starts from the rebuilt state before its
        // trace; its per-event curve is doctor's page, not this flag's list.
        if args.timeline {
            anyhow::bail!(
                "--timeline lists allocated and reserved bytes after each event of a JSON Lines trace or an interval file; {} is a PyTorch snapshot: `vramlab doctor {} --out DIR` draws its replay over the trace (DIR/timeline-deviceN.html), and `doctor --at OP` breaks down any moment",
                args.trace.display(),
                args.trace.display()
            );
        }
        return replay_snapshot(args);
    }
    // No events (blank lines only, or an interval header alone) is refused
    // as an empty file is: statistics of nothing would pass for a replay.
    if no_events(&args.trace, kind)? {
        let what = if kind == FileKind::Intervals {
            "the interval file has its header and no buffers; add one line per buffer below the header"
        } else {
            "every line is blank; a trace has at least one event, one JSON object a line, e.g. {\"op\":\"alloc\",\"id\":7,\"size\":1200}"
        };
        return Err(anyhow::Error::msg(crate::lab::LabError::NoEvents {
            path: args.trace.clone(),
            what,
        }));
    }
    if let Some(d) = args.device {
        anyhow::bail!("--device {d} picks a device of a PyTorch snapshot; this file is a trace of one device (leave --device out)");
    }
    if let Some(path) = &args.export_intervals {
        export_intervals(args, kind, path)?;
    }
    if let Some(names) = &args.allocators {
        return compare_strategies(args, names);
    }
    let capacity = args.alloc.capacity()?;
    let config = args.alloc.config(capacity)?;
    let file = trace_reader(&args.trace, kind)?;
    let source = match capacity {
        Some(c) => SimulatedSource::new(c),
        None => SimulatedSource::unlimited(),
    };
    let describe = source.describe();
    let mut notes = config_notes(&config);
    let mut alloc = CachingAllocator::new(source, config);
    if args.export_snapshot.is_some() {
        alloc.start_recording();
    }
    let outcome = replay(&mut alloc, file, args.timeline);
    notes.extend(crate::lab::trace::ignored_note(&outcome.ignored.0));
    let stats = alloc.stats().flat();
    // A trace that stopped with an error exports nothing: the file named
    // keeps what it held (a snapshot of part of a trace would pass for one
    // of all of it).
    if let Some(path) = args
        .export_snapshot
        .as_ref()
        .filter(|_| outcome.error.is_none())
    {
        let events = alloc.take_events();
        let snap = crate::lab::snapshot_export::torch_snapshot(&events, alloc.config());
        crate::io::write_atomic(path, &crate::lab::pickle::pickle(&snap)).map_err(|e| {
            anyhow::anyhow!("cannot write --export-snapshot {}: {e}", path.display())
        })?;
        if !args.json {
            println!(
                "wrote {} (a PyTorch memory snapshot of this replay)",
                path.display()
            );
        }
    }

    if args.json {
        let mut obj = serde_json::json!({
            "trace": args.trace.display().to_string(),
            "device": describe,
            "alloc_conf": alloc.config().describe(),
            "memory_limit": alloc.config().memory_limit,
            "notes": notes,
            "events": outcome.events,
            "peak_live_requested_bytes": outcome.peak_live_requested_bytes,
            "stats": stats,
            "ooms": outcome.ooms,
        });
        if args.timeline {
            obj["timeline"] = serde_json::to_value(&outcome.timeline)?;
        }
        if let Some(e) = &outcome.error {
            obj["error_line"] = e.line.into();
            let e = stopped_error(args, e, outcome.events);
            let e = super::fail_in_json(&mut obj, e);
            println!("{}", serde_json::to_string_pretty(&obj)?);
            return Err(e);
        }
        println!("{}", serde_json::to_string_pretty(&obj)?);
    } else if outcome.events > 0 || outcome.error.is_none() {
        // (A trace refused at its first line has no statistics to show.)
        println!(
            "Replayed {} events of {} on a {describe}",
            outcome.events,
            args.trace.display()
        );
        println!("  allocator: {}", alloc.config().describe());
        if let Some(limit) = alloc.config().memory_limit {
            println!("  memory limit: {}", Mib(limit));
        }
        for n in &notes {
            println!("  note: {n}");
        }
        println!();
        println!(
            "  memory_allocated      {:>14}   peak {:>14}",
            Mib(alloc.memory_allocated()).to_string(),
            Mib(alloc.max_memory_allocated()).to_string()
        );
        println!(
            "  memory_reserved       {:>14}   peak {:>14}",
            Mib(alloc.memory_reserved()).to_string(),
            Mib(alloc.max_memory_reserved()).to_string()
        );
        // With refusals, whether any allocator could have served them all.
        let bound = crate::lab::workload::bound(capacity, alloc.config().memory_limit);
        let verdict = match bound.filter(|_| !outcome.ooms.is_empty()) {
            Some(b) if outcome.peak_live_requested_bytes > b => format!(
                "; more than the {}, so no allocator serves every request",
                Mib(b)
            ),
            Some(b) => format!(
                "; within the {}, so no allocator is ruled out: a tighter packing might serve every request",
                Mib(b)
            ),
            None => String::new(),
        };
        println!(
            "  peak live requested   {:>14}   (the least any allocator could need{verdict})",
            Mib(outcome.peak_live_requested_bytes).to_string()
        );
        if outcome.peak_live_requested_bytes > 0 {
            // With refused allocations the reserved peak is of a different
            // workload than the requested one: no ratio, as --allocators shows.
            let (ratio, what) = if outcome.ooms.is_empty() {
                (
                    format!(
                        "{:.3}",
                        alloc.max_memory_reserved() as f64
                            / outcome.peak_live_requested_bytes as f64
                    ),
                    "peak reserved / peak live requested",
                )
            } else {
                (
                    "-".to_string(),
                    "none: refused allocations are missing from the reserved peak",
                )
            };
            println!("  fragmentation         {ratio:>14}   ({what})");
        }
        println!(
            "  device allocs/frees   {:>7} / {:<7}",
            stats["num_device_alloc"], stats["num_device_free"]
        );
        println!("  out-of-memory events  {:>7}", outcome.ooms.len());
        for o in outcome.ooms.iter().take(10) {
            // In the request's own unit: a 1000-byte request is not 0.00 MiB.
            println!(
                "    line {}: id {} asked for {}",
                o.line,
                o.id,
                crate::memory::format_size(o.size)
            );
        }
        if outcome.ooms.len() > 10 {
            println!("    ... and {} more", outcome.ooms.len() - 10);
        }
        if args.timeline {
            println!();
            println!(
                "{:>8} {:>6}  {:<12} {:>14} {:>14}",
                "event", "line", "op", "allocated", "reserved"
            );
            for p in &outcome.timeline {
                println!(
                    "{:>8} {:>6}  {:<12} {:>14} {:>14}",
                    p.event, p.line, p.op, p.allocated_bytes, p.reserved_bytes
                );
            }
        }
        println!();
        print!("{}", memory_summary(alloc.stats(), &describe, false));
    }
    if let Some(e) = &outcome.error {
        return Err(stopped_error(args, e, outcome.events));
    }
    Ok(())
}

/// A trace that stopped at a bad line: the line's error, and what the
/// statistics printed cover.
fn stopped_error(
    args: &ReplayArgs,
    e: &crate::lab::replay::ReplayError,
    events: usize,
) -> anyhow::Error {
    // Failing on the first line, the file may be of another kind.
    let (kind, covered) = if events == 0 {
        (
            format!("{}; ", crate::lab::file_kind::READ_AS_JSON_LINES),
            "nothing was replayed".to_string(),
        )
    } else {
        (
            String::new(),
            format!(
                "the statistics above cover the {} before it",
                super::count(events as u64, "event")
            ),
        )
    };
    let kept = match &args.export_snapshot {
        Some(p) => format!("; {} was not written", p.display()),
        None => String::new(),
    };
    anyhow::anyhow!("{}: {e} ({kind}{covered}{kept})", args.trace.display(),)
}

/// `--allocators`' long help (replay and bench-alloc): each strategy in a line.
pub const STRATEGIES_HELP: &str = "Allocator strategies to compare, comma-separated, or all:
  pytorch     PyTorch's caching allocator, with the --alloc-conf options
  expandable  pytorch with expandable_segments:True
  nocache     one buffer per tensor, freed at once (PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  buckets     power-of-two size classes, one buffer per block, cached per class
  sliced      64 MiB pages carved into slices, first fit, merged on free
  buddy       a binary buddy allocator in 64 MiB arenas
  planner     offline: sees the whole trace and packs every lifetime into one arena
  vramlab     expandable's decisions, with physical memory in 2 MiB granules
              mapped only under live blocks";

/// The strategies named, `all` standing for every one; a name given twice
/// is refused (it printed its row twice).
pub fn strategy_names(names: &[String]) -> anyhow::Result<Vec<&str>> {
    super::args::listed_once("--allocators", names)?;
    if names.iter().any(|n| n == "all") {
        return Ok(crate::lab::strategies::NAMES.to_vec());
    }
    Ok(names.iter().map(String::as_str).collect())
}

/// What the columns of `print_results` mean, printed once under the tables.
pub const COLUMNS: &str = "frag: peak reserved / lower bound (peak live requested); vs plan: peak reserved over the offline planner's arena; dev+ / dev−: times memory was asked of the driver / given back; ns/op: host time per operation; -: no ratio (the strategy ran out of memory, the trace allocates nothing, or, under vs plan, planner is not among the allocators).";

/// The comparison table `replay --allocators` and `bench-alloc` print.
pub fn print_results(results: &[crate::lab::workload::RunResult]) {
    println!(
        "  {:<10} {:>15} {:>15} {:>8} {:>9} {:>8} {:>8} {:>5} {:>9}",
        "allocator", "peak alloc", "peak resv", "frag", "vs plan", "dev+", "dev−", "OOM", "ns/op"
    );
    for r in results {
        // Wide enough for an 80 GB device's figures in MiB.
        println!(
            "  {:<10} {:>15} {:>15} {:>8} {:>9} {:>8} {:>8} {:>5} {:>9.0}",
            r.allocator,
            Mib(r.peak_allocated_bytes).to_string(),
            Mib(r.peak_reserved_bytes).to_string(),
            // Ratios of a run that ran out of memory compare nothing.
            r.fragmentation
                .map_or("-".to_string(), |f| format!("{f:.3}")),
            r.gap_to_planner
                .map_or("-".to_string(), |g| format!("{:.1}%", 100.0 * g)),
            r.device_allocs,
            r.device_frees,
            if r.oom { "yes" } else { "no" },
            r.ns_per_op
        );
    }
}

/// `replay --allocators`: every named strategy on the trace.
fn compare_strategies(args: &ReplayArgs, names: &[String]) -> anyhow::Result<()> {
    use crate::lab::workload::{compare_with, Workload};
    let capacity = args.alloc.capacity()?;
    // --alloc-conf and --memory-limit apply here as in a plain replay.
    let config = args.alloc.config(capacity)?;
    let kind = crate::lab::file_kind::sniff(&args.trace).map_err(anyhow::Error::msg)?;
    let file = trace_reader(&args.trace, kind)?;
    let name = args.trace.display().to_string();
    let (w, ignored) = Workload::from_trace_noting(&name, file).map_err(|e| {
        let kind = if matches!(e, crate::lab::LabError::AtLine { line: 1, .. }) {
            format!(" ({})", crate::lab::file_kind::READ_AS_JSON_LINES)
        } else {
            String::new()
        };
        anyhow::anyhow!("{name}: {e}{kind}; --allocators compares whole traces, so it shows nothing of one that does not read to its end (a replay without --allocators prints the statistics up to the bad line)")
    })?;
    let names = strategy_names(names)?;
    let results = compare_with(&w, &names, capacity, &config).map_err(anyhow::Error::msg)?;
    let mut notes = config_notes(&config);
    notes.extend(crate::lab::trace::ignored_note(&ignored.0));
    if w.measure_from > 0 {
        notes.push(format!(
            "peaks and the lower bound are measured from the trace's last reset_peak (before operation {} of {}), as a plain replay and PyTorch's max_memory_allocated() after reset_peak_memory_stats() count them; OOMs and device calls cover the whole trace",
            w.measure_from,
            w.ops.len()
        ));
    }
    if let Some(dir) = &args.out {
        let svg = reserved_plot(&results, w.ops.len(), &name);
        crate::io::write_atomic(&dir.join("reserved.svg"), svg.as_bytes())?;
    }
    if args.json {
        let out = serde_json::json!({
            "trace": name,
            "operations": w.ops.len(),
            "measured_from_operation": w.measure_from,
            "notes": notes,
            "lower_bound_bytes": w.lower_bound(),
            "capacity": capacity,
            "results": results,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{name}: {} operations, lower bound (peak live requested) {}{}",
        w.ops.len(),
        Mib(w.lower_bound()),
        capacity
            .map(|c| format!(", capacity {}", Mib(c)))
            .unwrap_or_default()
    );
    print_results(&results);
    println!("{COLUMNS}");
    for n in &notes {
        println!("note: {n}");
    }
    if let Some(dir) = &args.out {
        println!("wrote {}", dir.join("reserved.svg").display());
    }
    Ok(())
}

/// Reserved memory over the trace, one line per strategy.
fn reserved_plot(results: &[crate::lab::workload::RunResult], ops: usize, title: &str) -> String {
    use crate::profile::svg::{escape, COLORS};
    let (w, h, l, t) = (900.0, 360.0, 80.0, 40.0);
    let max = results
        .iter()
        .map(|r| r.peak_reserved_bytes)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |i: usize| l + w * i as f64 / ops.max(1) as f64;
    let y = |b: u64| t + h - h * b as f64 / max;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{l}" y="22" font-size="15">reserved memory: {}</text>"#,
        w + l + 150.0,
        h + t + 40.0,
        escape(title)
    );
    for k in 0..=4 {
        let b = (max * k as f64 / 4.0) as u64;
        s += &format!(
            r##"<line x1="{l}" x2="{0}" y1="{1:.1}" y2="{1:.1}" stroke="#eee"/><text x="{2}" y="{3:.1}" text-anchor="end">{4:.1} MiB</text>"##,
            l + w,
            y(b),
            l - 5.0,
            y(b) + 4.0,
            mib(b)
        );
    }
    for (k, r) in results.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let mut pts = String::new();
        let mut last = 0;
        for &(i, b) in &r.reserved_timeline {
            pts += &format!("{:.1},{:.1} {:.1},{:.1} ", x(i), y(last), x(i), y(b));
            last = b;
        }
        pts += &format!("{:.1},{:.1}", x(ops), y(last));
        s += &format!(
            r#"<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/><rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            l + w + 15.0,
            t + 18.0 * k as f64,
            l + w + 32.0,
            t + 18.0 * k as f64 + 5.0,
            r.allocator
        );
    }
    s += &format!(
        r#"<text x="{}" y="{}" text-anchor="middle">trace operations</text></svg>"#,
        l + w / 2.0,
        t + h + 30.0
    );
    s
}

/// `replay snapshot.pickle`: a PyTorch memory snapshot's history through the
/// `pytorch` strategy, compared with what the snapshot itself recorded.
fn replay_snapshot(args: &ReplayArgs) -> anyhow::Result<()> {
    use crate::lab::torch_snapshot;
    let name = args.trace.display().to_string();
    let mut parsed = torch_snapshot::parse_file(&args.trace).map_err(anyhow::Error::msg)?;
    // Entry errors say where in the file ("device_traces[0][0]"): the
    // file's name goes in front, as the other snapshot errors have it.
    let file = torch_snapshot::read_parsed(&mut parsed, &name)
        .map_err(|e| anyhow::Error::msg(e.in_file(&name)))?;
    drop(parsed);
    let capacity = args.alloc.capacity()?;
    // The snapshot's own allocator settings, unless --alloc-conf (or
    // VRAMLAB_ALLOC_CONF) says otherwise.
    let user_conf = args.alloc.conf_source();
    let mut config = args.alloc.config(capacity)?;
    let mut settings_source = match (&file.settings, user_conf) {
        (Some(s), Some(from)) if config.memory_limit.is_none() && s.memory_limit.is_some() => {
            // The recorded limit is not an allocator option: it stays
            // unless --memory-limit or --memory-fraction replaces it.
            config.memory_limit = s.memory_limit;
            format!(
                "{from} ({}), under the recording's memory limit, in place of the recorded {}",
                config.options_text(),
                s.options_text()
            )
        }
        (Some(s), Some(from)) => format!(
            "{from} ({}), in place of the recorded {}",
            config.options_text(),
            s.options_text()
        ),
        (None, Some(from)) => format!("{from} ({})", config.options_text()),
        (Some(s), None) => {
            // --memory-limit wins over the limit a vramlab run recorded.
            let limit = config.memory_limit.or(s.memory_limit);
            config = s.clone();
            config.memory_limit = limit;
            format!(
                "the snapshot's allocator_settings ({})",
                config.options_text()
            )
        }
        (None, None) => {
            "PyTorch's defaults (the snapshot records no allocator_settings)".to_string()
        }
    };
    let notes = config_notes(&config);
    let devices: Vec<&torch_snapshot::TorchSnapshot> = match args.device {
        Some(d) => {
            let found: Vec<_> = file.devices.iter().filter(|s| s.device == d).collect();
            if found.is_empty() {
                let have: Vec<String> = file.devices.iter().map(|s| s.device.to_string()).collect();
                anyhow::bail!(
                    "{name}: device {d} has no allocation history; devices with one: {}",
                    have.join(", ")
                );
            }
            found
        }
        None => file.devices.iter().collect(),
    };
    // Older PyTorch records expandable segments only on the segments: each
    // such device replays with them (below), which the header says.
    if user_conf.is_none()
        && !config.expandable_segments
        && (file.expandable_setting || devices.iter().any(|d| d.expandable))
    {
        settings_source.push_str(", with expandable_segments:True as its segments are");
    }
    let mut reports = Vec::new();
    let mut all_results = Vec::new();
    let mut replays = Vec::new();
    for snap in &devices {
        // A snapshot recorded with expandable segments replays with them
        // (older PyTorch records no setting, only `is_expandable`).
        let mut cfg = config.clone();
        if user_conf.is_none() && (snap.expandable || file.expandable_setting) {
            cfg.expandable_segments = true;
        }
        let r = torch_snapshot::replay_from_state(snap, cfg.clone(), capacity)
            .map_err(|e| anyhow::anyhow!("{name}: device {}: {e}", snap.device))?;
        let results = match &args.allocators {
            Some(names) => {
                let names = strategy_names(names)?;
                crate::lab::workload::compare_with(&snap.workload, &names, capacity, &cfg)
                    .map_err(anyhow::Error::msg)?
            }
            None => Vec::new(),
        };
        // One plot a device: reserved.svg, or reserved-deviceN.svg where
        // the file holds several.
        let plot = match &args.out {
            Some(dir) if !results.is_empty() => {
                let file = match devices.len() {
                    1 => "reserved.svg".to_string(),
                    _ => format!("reserved-device{}.svg", snap.device),
                };
                let path = dir.join(file);
                let title = format!("{name}, device {}", snap.device);
                let svg = reserved_plot(&results, snap.workload.ops.len(), &title);
                crate::io::write_atomic(&path, svg.as_bytes())?;
                Some(path.display().to_string())
            }
            _ => None,
        };
        reports.push(serde_json::json!({
            "device": snap.device,
            "expandable": cfg.expandable_segments,
            "allocations": snap.workload.allocations(),
            "pre_existing_segments": r.pre_existing_segments,
            "recorded": snap.recorded_end,
            "replayed": {
                "segments": r.replayed.segments,
                "reserved_bytes": r.replayed.reserved_bytes,
                "allocated_bytes": r.replayed.allocated_bytes,
                "peak_reserved_bytes": r.peak_reserved_bytes,
                "peak_allocated_bytes": r.peak_allocated_bytes,
                "ooms": r.ooms,
            },
            "segments_match": r.segments_match,
            "differences": r.differences,
            "ooms_recorded": snap.ooms.iter().map(|(size, free)| serde_json::json!({"size": size, "device_free": free})).collect::<Vec<_>>(),
            "categories_from_frames": snap.categories_from_frames,
            "categories_from_metadata": snap.categories_from_metadata,
            "at_peak": r.at_peak,
            "oom_at": r.oom_at,
            "at_first_oom": r.at_first_oom,
            "results": results,
            "lower_bound_bytes": args.allocators.as_ref().map(|_| snap.workload.lower_bound()),
            "plot": plot,
        }));
        all_results.push(results);
        replays.push(r);
    }
    if args.json {
        let out = serde_json::json!({
            "trace": name,
            "format": "pytorch memory snapshot",
            "settings_from": settings_source,
            "notes": notes,
            "devices": reports,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("{name}: PyTorch memory snapshot; allocator settings: {settings_source}");
    for n in &notes {
        println!("note: {n}");
    }
    for (((snap, rep), results), r) in devices.iter().zip(&reports).zip(&all_results).zip(&replays)
    {
        println!();
        if let Some(e) = rep.get("error").and_then(|e| e.as_str()) {
            println!("device {}: {e}", snap.device);
            continue;
        }
        let n = |k: &str, f: &str| rep[k][f].as_u64().unwrap_or(0);
        println!(
            "device {}: {} in the trace; {} existed before the recording began",
            snap.device,
            super::count(snap.workload.allocations() as u64, "allocation"),
            super::count(
                rep["pre_existing_segments"].as_u64().unwrap_or(0),
                "segment"
            )
        );
        println!(
            "  {:<22} {:>18} {:>18}",
            "at the end", "recorded", "replayed"
        );
        println!(
            "  {:<22} {:>18} {:>18}",
            "segments",
            n("recorded", "segments"),
            n("replayed", "segments")
        );
        for (label, key) in [
            ("reserved", "reserved_bytes"),
            ("allocated", "allocated_bytes"),
        ] {
            println!(
                "  {:<22} {:>18} {:>18}",
                format!("{label} (bytes)"),
                n("recorded", key),
                n("replayed", key)
            );
        }
        println!(
            "  replay peaks: reserved {}, allocated {}",
            Mib(n("replayed", "peak_reserved_bytes")),
            Mib(n("replayed", "peak_allocated_bytes"))
        );
        print_live("live at the peak", &r.at_peak);
        if let (Some(first), Some(live)) = (r.oom_at.first(), &r.at_first_oom) {
            println!(
                "  out of memory in the replay: {} refused; the first asked for {} ({}{}) with {} allocated and {} reserved",
                super::count(r.ooms, "allocation"),
                crate::memory::format_size(first.requested_bytes),
                first.category,
                origin_text(&first.origin),
                Mib(first.allocated_bytes),
                Mib(first.reserved_bytes)
            );
            print_live("live at the first refusal", live);
        }
        let diffs: Vec<&str> = rep["differences"]
            .as_array()
            .map(|d| d.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        if rep["segments_match"].as_bool() == Some(true) {
            println!("  the replay ends with exactly the recorded segments, reserved and allocated bytes");
            if !diffs.is_empty() {
                println!("  note: {}", diffs.join("; "));
            }
        } else {
            println!("  differs from the recording: {}", diffs.join("; "));
        }
        for (size, free) in &snap.ooms {
            println!(
                "  recorded out-of-memory: {} requested with {} free on the device",
                Mib(*size),
                Mib(*free)
            );
        }
        if snap.categories_from_metadata > 0 {
            let named: Vec<String> = snap
                .categories_from_frames
                .iter()
                .map(|(c, n)| format!("{n} {c}"))
                .collect();
            if named.is_empty() {
                println!(
                    "  categories named by the recording (user_metadata): untagged, all {}",
                    super::count(snap.categories_from_metadata as u64, "allocation")
                );
            } else {
                println!(
                    "  categories named by the recording (user_metadata): {}",
                    named.join(", ")
                );
            }
        } else if snap.categories_from_frames.is_empty() {
            println!("  no lifetime hints in the frames (parameters and optimizer state made before the recording have none; record from the start with stacks=\"python\")");
        } else {
            let hints: Vec<String> = snap
                .categories_from_frames
                .iter()
                .map(|(c, n)| format!("{n} {c}"))
                .collect();
            println!(
                "  lifetime hints from Python frames: {} (--alloc-conf lookahead:True places these)",
                hints.join(", ")
            );
        }
        if !results.is_empty() {
            println!();
            println!(
                "  lower bound (peak live requested) {}",
                Mib(snap.workload.lower_bound())
            );
            print_results(results);
            println!("{COLUMNS}");
        }
        if let Some(p) = rep["plot"].as_str() {
            println!("wrote {p}");
        }
    }
    Ok(())
}

/// `, MODULE at FILE:LINE FUNCTION` where the recording says.
fn origin_text(o: &crate::lab::peak::Origin) -> String {
    o.describe().map_or(String::new(), |d| format!(", {d}"))
}

/// A breakdown of live bytes: by category, module and code, and the largest
/// blocks (lines for what the recording does not say are left out). The
/// moment is an operation of the replay (its allocs and frees, 0-based), as
/// JSON's `after_op` and `doctor --at` count them.
pub(super) fn print_live(what: &str, live: &crate::lab::peak::LiveAt) {
    println!(
        "  {what} ({} allocated, after operation {}):",
        Mib(live.allocated_bytes),
        live.after_op
    );
    let list = |v: &[(String, u64)]| {
        v.iter()
            .map(|(k, b)| format!("{k} {}", Mib(*b)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut categories = live.by_category.clone();
    if live.before_recording_bytes > 0 {
        categories.push(("before the recording".into(), live.before_recording_bytes));
    }
    if !categories.is_empty() {
        println!("    by category: {}", list(&categories));
    }
    // The first few modules and frames; the rest as one total (JSON has all).
    let top = |v: &[(String, u64)]| {
        let shown = v.len().min(crate::lab::peak::TOP);
        let rest: u64 = v[shown..].iter().map(|(_, b)| b).sum();
        let more = match v.len() - shown {
            0 => String::new(),
            n => format!(", and {n} more {}", Mib(rest)),
        };
        format!("{}{more}", list(&v[..shown]))
    };
    if !live.by_module.is_empty() {
        println!("    by module:   {}", top(&live.by_module));
    }
    if !live.by_frame.is_empty() {
        println!("    by code:     {}", top(&live.by_frame));
    }
    let largest: Vec<String> = live
        .largest
        .iter()
        .take(3)
        .map(|b| format!("{} {}{}", Mib(b.bytes), b.category, origin_text(&b.origin)))
        .collect();
    if !largest.is_empty() {
        println!("    largest:     {}", largest.join("; "));
    }
}

/// The trace at `path` as JSON Lines: the file itself, or an interval file
/// converted (each buffer allocated at `lower`, freed at `upper`, frees
/// first at one time).
fn trace_reader(
    path: &std::path::Path,
    kind: crate::lab::file_kind::FileKind,
) -> anyhow::Result<Box<dyn std::io::BufRead>> {
    let file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    if kind != crate::lab::file_kind::FileKind::Intervals {
        return Ok(Box::new(BufReader::new(file)));
    }
    let intervals = crate::lab::intervals::read_csv(file).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (read as an interval file, since its first line names id,lower,upper,size)",
            path.display()
        )
    })?;
    let lines = crate::lab::interval_trace::to_json_lines(&intervals);
    Ok(Box::new(std::io::Cursor::new(lines.into_bytes())))
}

/// Writes the trace at `args.trace` as an interval file at `path`.
fn export_intervals(
    args: &ReplayArgs,
    kind: crate::lab::file_kind::FileKind,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let reader = trace_reader(&args.trace, kind)?;
    let mut events = Vec::new();
    for item in crate::lab::trace::lines(reader) {
        let at = |line: usize, e: crate::lab::LabError| {
            anyhow::anyhow!("{} line {line}: {e}", args.trace.display())
        };
        let (line, text) = item.map_err(|(line, e)| at(line, e))?;
        events.push(crate::lab::TraceEvent::parse_line(&text).map_err(|e| at(line, e))?);
    }
    let intervals = crate::lab::intervals::from_trace(&events)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.trace.display()))?;
    crate::io::write_atomic(path, crate::lab::intervals::to_csv(&intervals).as_bytes())
        .map_err(|e| anyhow::anyhow!("cannot write --export-intervals {}: {e}", path.display()))?;
    if !args.json {
        eprintln!(
            "wrote {} ({} buffers as intervals)",
            path.display(),
            intervals.len()
        );
    }
    Ok(())
}

/// What a replay's settings do not do that a user would expect:
/// `garbage_collection_threshold` collects only against a memory limit
/// (PyTorch: only once `set_per_process_memory_fraction` is set), so
/// without `--memory-limit` it is inert, and the replay should say so.
fn config_notes(config: &crate::memory::AllocatorConfig) -> Vec<String> {
    let mut notes = Vec::new();
    if config.garbage_collection_threshold > 0.0 && config.memory_limit.is_none() {
        notes.push(format!(
            "garbage_collection_threshold:{} acts only under a memory limit (PyTorch collects only once torch.cuda.set_per_process_memory_fraction is set), so it changes nothing in this replay; pass --memory-limit SIZE (or --memory-fraction F with --capacity) for it to act",
            config.garbage_collection_threshold
        ));
    }
    notes
}

/// Whether the trace at `path` has no event: no line but blank ones (an
/// interval file: no buffer under its header). Reads up to the first event.
fn no_events(
    path: &std::path::Path,
    kind: crate::lab::file_kind::FileKind,
) -> anyhow::Result<bool> {
    let reader = trace_reader(path, kind)?;
    Ok(crate::lab::trace::lines(reader).next().is_none())
}
