//! `vramlab replay TRACE.jsonl`: run an allocation trace through the caching
//! allocator on a simulated device and print the statistics it reaches.

use super::args::{parse_capacity, AllocArgs};
use crate::memory::{
    memory_summary, replay, CachingAllocator, Mib, SegmentSource, SimulatedSource,
};
use clap::Args;
use std::io::BufReader;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// JSON Lines trace: {"op":"alloc","id":7,"size":1200}, {"op":"free","id":7},
    /// {"op":"empty_cache"}, {"op":"reset_peak"}; "label" is optional.
    pub trace: PathBuf,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Size of the simulated device, e.g. 16GiB (default: no limit but
    /// --memory-limit).
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<String>,
    /// Also print allocated/reserved bytes after every event.
    #[arg(long)]
    pub timeline: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let capacity = parse_capacity(&args.capacity)?;
    let config = args.alloc.config(capacity)?;
    let file = std::fs::File::open(&args.trace)
        .map_err(|e| anyhow::anyhow!("cannot open trace {}: {e}", args.trace.display()))?;
    let source = match capacity {
        Some(c) => SimulatedSource::new(c),
        None => SimulatedSource::unlimited(),
    };
    let describe = source.describe();
    let mut alloc = CachingAllocator::new(source, config);
    let outcome = replay(&mut alloc, BufReader::new(file), args.timeline);
    let stats = alloc.stats().flat();

    if args.json {
        let mut obj = serde_json::json!({
            "trace": args.trace.display().to_string(),
            "device": describe,
            "alloc_conf": alloc.config().describe(),
            "memory_limit": alloc.config().memory_limit,
            "events": outcome.events,
            "peak_live_requested_bytes": outcome.peak_live_requested_bytes,
            "stats": stats,
            "ooms": outcome.ooms,
            "error": outcome.error,
        });
        if args.timeline {
            obj["timeline"] = serde_json::to_value(&outcome.timeline)?;
        }
        println!("{}", serde_json::to_string_pretty(&obj)?);
    } else {
        println!(
            "Replayed {} events of {} on a {describe}",
            outcome.events,
            args.trace.display()
        );
        println!("  allocator: {}", alloc.config().describe());
        if let Some(limit) = alloc.config().memory_limit {
            println!("  memory limit: {}", Mib(limit));
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
        println!(
            "  peak live requested   {:>14}   (the least any allocator could need)",
            Mib(outcome.peak_live_requested_bytes).to_string()
        );
        if outcome.peak_live_requested_bytes > 0 {
            println!(
                "  fragmentation         {:>14.3}   (peak reserved / peak live requested)",
                alloc.max_memory_reserved() as f64 / outcome.peak_live_requested_bytes as f64
            );
        }
        println!(
            "  device allocs/frees   {:>7} / {:<7}",
            stats["num_device_alloc"], stats["num_device_free"]
        );
        println!("  out-of-memory events  {:>7}", outcome.ooms.len());
        for o in outcome.ooms.iter().take(10) {
            println!("    line {}: id {} asked for {}", o.line, o.id, Mib(o.size));
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
    if let Some(e) = outcome.error {
        anyhow::bail!(
            "{}: {e} (the statistics above cover the {} events before it)",
            args.trace.display(),
            outcome.events
        );
    }
    Ok(())
}
