//! `vramlab doctor`: a PyTorch memory snapshot read and replayed under its
//! own settings and under the settings a user could have chosen instead,
//! side by side, with what is live at the peak and at each out-of-memory,
//! and sentences that say what would have helped.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::args::parse_capacity;
use super::replay::print_live;
use crate::lab::peak::{LiveAt, OomAt};
use crate::lab::segment_map::{self, SegmentMap};
use crate::lab::torch_snapshot::{self, TorchSnapshot};
use crate::lab::LabError;
use crate::memory::{AllocatorConfig, Category, Mib};

/// Past this many allocations the planner's packing is computed only when
/// asked for (`--planner`): 200,000 took it 40 s on the CI machine.
const PLANNER_AUTO_MAX: usize = 50_000;

#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// A PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot()`'s
    /// pickle), or one the recorder wrote (`python -m vramlab_torch record`).
    pub snapshot: PathBuf,
    /// The card's memory (e.g. 24GiB, 80GB): each setting is replayed on a
    /// device of this size, so the table says which would have run out.
    /// Without it the replays have no limit and only peaks are compared.
    #[arg(long, value_name = "SIZE", value_parser = super::args::capacity_text)]
    pub capacity: Option<String>,
    /// Only this device (default: every device with a history).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Leave out the offline planner's arena (the trace packed with every
    /// lifetime known in advance: about the least an allocator could
    /// reserve; the planner is a heuristic, so an online allocator can
    /// occasionally do better).
    #[arg(long, conflicts_with = "planner")]
    pub no_planner: bool,
    /// Compute the planner's arena however long the trace: by default it is
    /// left out past 50,000 allocations (200,000 took it 40 s).
    #[arg(long)]
    pub planner: bool,
    /// Also write DIR/timeline-deviceN.html for each device: the replay
    /// under the recorded settings as memory_viz draws it (memory over time
    /// stacked by category, zoom and pan, hover for the allocating code, the
    /// segments at any chosen event), one self-contained page.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// A trace longer than this many operations gets a page that draws
    /// buckets of operations (each its highest moment, the largest
    /// allocation in it, segments at 48 moments plus the peak and the first
    /// refusal) instead of every event: a few MB for millions of entries.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    pub page_points: usize,
    /// Also show what is live, and the replay's segments, after this trace
    /// operation (0-based, as the page and `at_peak.after_op` count them):
    /// any moment, not only the peak.
    #[arg(long, value_name = "OP")]
    pub at: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One setting replayed.
#[derive(Debug, Clone, Serialize)]
struct WhatIf {
    setting: String,
    peak_reserved_bytes: u64,
    peak_allocated_bytes: u64,
    /// Allocations the replay could not place on `--capacity`.
    ooms: u64,
    /// The recorded settings only: whether the replay ends with exactly the
    /// recorded segments, reserved and allocated bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    equals_recording: Option<bool>,
    /// Why this setting could not be replayed on `--capacity`.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct DeviceReport {
    device: usize,
    /// The device size the what-ifs ran on (`--capacity`, unless the
    /// recording's own starting state did not fit it).
    capacity_bytes: Option<u64>,
    /// The memory limit a vramlab run recorded (`--memory-limit`), under
    /// which every what-if replays.
    memory_limit_bytes: Option<u64>,
    allocations: usize,
    /// What the trace holds, counted as memory_viz's `trace` lists it.
    trace_counts: TraceCounts,
    recorded_settings: String,
    what_ifs: Vec<WhatIf>,
    /// The offline planner's arena for this trace (every lifetime known in
    /// advance) plus what predates the recording, and no less than the
    /// replay's peak allocated: the planner packs requested bytes, while
    /// PyTorch's blocks also hold their rounding and unsplit tails, which
    /// no setting removes. About the least an allocator could reserve; the
    /// planner is a heuristic, so an online one can occasionally reserve less.
    planner_floor_bytes: Option<u64>,
    at_peak: LiveAt,
    recorded_ooms: Vec<RecordedOom>,
    at_first_oom: Option<LiveAt>,
    /// What is live after `--at`'s operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    at_chosen: Option<LiveAt>,
    /// The replay's segments after `--at`'s operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    segments_at_chosen: Option<SegmentMap>,
    /// The replay's segments at the peak of allocated bytes.
    segments_at_peak: Option<SegmentMap>,
    /// The replay's segments when the first allocation was refused.
    segments_at_first_oom: Option<SegmentMap>,
    /// The snapshot's own segments, when it was taken.
    segments_at_snapshot: Option<SegmentMap>,
    advice: Vec<String>,
}

#[derive(Debug, Serialize)]
struct TraceCounts {
    entries: usize,
    allocations: usize,
    frees: usize,
    /// `segment_alloc` (or `segment_map`) entries.
    segment_allocs: usize,
    segment_frees: usize,
    /// Entries of actions PyTorch's TraceEntry does not name, skipped by
    /// the replay: (action, count).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unknown_actions: Vec<(String, usize)>,
}

#[derive(Debug, Serialize)]
struct RecordedOom {
    requested_bytes: u64,
    device_free_bytes: u64,
}

/// For a file that is not a snapshot pickle: what it looks like instead,
/// where that is one of the traces `replay` reads.
fn trace_hint(path: &std::path::Path) -> &'static str {
    use crate::lab::file_kind::{sniff, FileKind};
    // The first line only (the file may be huge): a trace's opens with an
    // object that has an "op".
    let opens_as_trace = || {
        use std::io::{BufRead, Read};
        let mut line = String::new();
        let f = std::fs::File::open(path).ok()?;
        std::io::BufReader::new(f.take(4096))
            .read_line(&mut line)
            .ok()?;
        let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
        Some(v.get("op").is_some())
    };
    match sniff(path) {
        Ok(FileKind::Intervals) => {
            "; it is an interval file (id,lower,upper,size), which `vramlab replay` reads"
        }
        Ok(FileKind::JsonLines) if opens_as_trace() == Some(true) => {
            "; it looks like a JSON Lines trace, which `vramlab replay` reads (doctor reads PyTorch memory snapshots)"
        }
        _ => "",
    }
}

pub fn run(args: &DoctorArgs) -> anyhow::Result<()> {
    let name = args.snapshot.display().to_string();
    // One streaming parse for both the trace and the segments.
    let mut parsed = torch_snapshot::parse_file(&args.snapshot)
        .map_err(|e| anyhow::anyhow!("{e}{}", trace_hint(&args.snapshot)))?;
    // The segments read once, for the map and the replay's rewind.
    let segments = crate::lab::snapshot_segments::read(&parsed.root)
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let maps = segment_map::maps_from(&segments);
    let capacity = parse_capacity(&args.capacity)?;
    let file = match torch_snapshot::read_parsed_with(
        &parsed.root,
        &mut parsed.entries,
        &segments,
        &name,
    ) {
        Ok(f) => f,
        // No trace (recorded with enabled="state", or without history):
        // the segments still say what was held when it was taken.
        Err(LabError::NoDeviceTraces { .. } | LabError::NoHistory { .. }) => {
            if let Some(at) = args.at {
                anyhow::bail!(
                    "{name}: --at {at} names an operation of the allocation history, and this snapshot has none (its segments are shown without --at)"
                );
            }
            return state_only(&name, args, &maps, None);
        }
        // A trace this reader cannot replay: its segments still report
        // (but not at an operation of that trace).
        Err(e) if !maps.is_empty() => {
            if let Some(at) = args.at {
                anyhow::bail!(
                    "{name}: --at {at} needs the allocation history, which cannot be replayed: {e}"
                );
            }
            return state_only(&name, args, &maps, Some(e.to_string()));
        }
        Err(e) => return Err(anyhow::Error::msg(e.in_file(&name))),
    };
    let distributed = distributed_advice(&parsed.root);
    drop(parsed);
    let devices: Vec<&TorchSnapshot> = file
        .devices
        .iter()
        .filter(|s| args.device.is_none_or(|d| s.device == d))
        .collect();
    if devices.is_empty() {
        let have: Vec<String> = file.devices.iter().map(|s| s.device.to_string()).collect();
        anyhow::bail!(
            "{name}: device {} has no allocation history; devices with one: {}",
            args.device.unwrap_or(0),
            have.join(", ")
        );
    }
    let mut reports = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    // --at past every chosen device's trace is an error; past a shorter
    // device's only, that device shows its last operation.
    let longest = devices
        .iter()
        .map(|s| s.workload.ops.len())
        .max()
        .unwrap_or(0);
    if let Some(at) = args.at.filter(|&at| at >= longest) {
        anyhow::bail!(
            "{name}: --at {at} is past the trace's last operation, {} (operations count from 0)",
            longest.saturating_sub(1)
        );
    }
    for snap in devices {
        let mut recorded = file.settings.clone().unwrap_or_default();
        if snap.expandable || file.expandable_setting {
            recorded.expandable_segments = true;
        }
        let planner =
            !args.no_planner && (args.planner || snap.workload.allocations() <= PLANNER_AUTO_MAX);
        let page_points = args.out.as_ref().map(|_| args.page_points);
        let (mut r, page) = match diagnose(
            snap,
            recorded,
            capacity,
            planner,
            &name,
            page_points,
            args.at,
        ) {
            Ok(r) => r,
            Err(e) => {
                failures.push(e.to_string());
                continue;
            }
        };
        if let Some(dir) = &args.out {
            if let Some(page) = &page {
                write_page(page, snap.device, args.json, dir, &name)?;
            }
        }
        if let Some(note) = &distributed {
            r.advice.push(note.clone());
        }
        if snap.streams > 1 {
            let same = r.what_ifs[0].equals_recording == Some(true);
            r.advice.push(format!(
                "The trace allocates on {} CUDA streams. PyTorch keeps each stream's free blocks apart; this replay keeps one pool for all of them, so its segments {} the recording's.",
                snap.streams,
                if same { "still equal" } else { "can differ from" }
            ));
        }
        if !planner && !args.no_planner {
            r.advice.push(format!(
                "The offline planner's packing was left out: {} allocations are too many for it by default (200,000 took 40 s); --planner computes it.",
                snap.workload.allocations()
            ));
        }
        let last = snap.workload.ops.len().saturating_sub(1);
        if let Some(at) = args.at.filter(|&at| at > last) {
            r.advice.push(format!(
                "--at {at} is past this device's trace: what is live is shown after its last operation, {last}."
            ));
        }
        r.segments_at_snapshot = maps.iter().find(|m| m.device == snap.device).cloned();
        reports.push(r);
    }
    if reports.is_empty() && !maps.is_empty() {
        return state_only(&name, args, &maps, Some(failures.join("; ")));
    }
    if args.json {
        let out = serde_json::json!({
            "snapshot": name,
            "capacity_bytes": capacity,
            "devices": reports,
            "devices_not_replayed": failures,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_text(&name, &reports);
    for f in &failures {
        println!("\nnot replayed: {f}");
    }
    Ok(())
}

/// The settings to try beside the recorded ones: each changes one thing.
/// What the page draws: every event when the trace is short, buckets of
/// operations past `--page-points`.
enum Page {
    Events(Vec<crate::memory::MemEvent>),
    Buckets(crate::lab::timeline::Timeline),
}

enum Job {
    Segments(Option<usize>),
    Page(usize),
}

enum Done {
    Segments(Option<SegmentMap>),
    Page(Result<Page, LabError>),
}

fn page(
    snap: &TorchSnapshot,
    recorded: AllocatorConfig,
    capacity: Option<u64>,
    points: usize,
    peak: usize,
    first_oom: Option<usize>,
) -> Result<Page, LabError> {
    if snap.workload.ops.len() > points {
        let mut at = vec![peak];
        at.extend(first_oom);
        crate::lab::timeline::timeline(snap, recorded, capacity, points, &at, 48).map(Page::Buckets)
    } else {
        crate::lab::replay_events::replay_events(snap, recorded, capacity).map(Page::Events)
    }
}

/// Writes DIR/timeline-deviceN.html.
fn write_page(
    page: &Page,
    device: usize,
    json: bool,
    dir: &std::path::Path,
    name: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(format!("timeline-device{device}.html"));
    let title = format!("{name}, device {device}: replayed under its recorded settings");
    let html = match page {
        Page::Buckets(t) => super::doctor_page::render(t, &title),
        Page::Events(events) => crate::profile::html::render(events, &title),
    };
    crate::io::write_atomic(&path, html.as_bytes())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    if !json {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `f` over `items` on every core, results in the items' order. A job that
/// panics panics the caller, as it would have run there.
fn parallel_map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let n = items.len();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let jobs = std::sync::Mutex::new(items.into_iter().enumerate());
    // The list stays whole if a job panics (taking the next item cannot).
    let next = || {
        jobs.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .next()
    };
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cores.min(n))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    while let Some((i, item)) = next() {
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

fn alternatives(
    recorded: &AllocatorConfig,
    capacity: Option<u64>,
) -> Vec<(String, AllocatorConfig)> {
    let mut out = Vec::new();
    let with = |conf: &str| {
        let mut c = recorded.clone();
        c.apply(conf).ok().map(|_| (conf.to_string(), c))
    };
    if !recorded.expandable_segments {
        out.extend(with("expandable_segments:True"));
    }
    for mb in [128u64, 256, 512] {
        if recorded.max_split_size != mb << 20 {
            out.extend(with(&format!("max_split_size_mb:{mb}")));
        }
    }
    // The threshold acts against a memory limit: the card's size here.
    if let Some(cap) = capacity {
        if recorded.garbage_collection_threshold == 0.0 {
            if let Some((s, mut c)) = with("garbage_collection_threshold:0.8") {
                c.memory_limit = Some(c.memory_limit.map_or(cap, |l| l.min(cap)));
                out.push((s, c));
            }
        }
    }
    out
}

fn diagnose(
    snap: &TorchSnapshot,
    recorded: AllocatorConfig,
    capacity: Option<u64>,
    planner: bool,
    name: &str,
    page_points: Option<usize>,
    at: Option<usize>,
) -> anyhow::Result<(DeviceReport, Option<Page>)> {
    // The recorded settings and every alternative replay at once, one per
    // core. The recording's own state may not fit `--capacity` (the card
    // was larger, or shared): then every setting replays without a limit.
    let run_all = |capacity: Option<u64>| {
        let mut jobs = vec![(String::new(), recorded.clone())];
        jobs.extend(alternatives(&recorded, capacity));
        parallel_map(jobs, |(setting, cfg)| {
            // Only the recorded settings' replay looks at `--at`.
            let at = if setting.is_empty() { at } else { None };
            (
                setting,
                torch_snapshot::replay_from_state_at(snap, cfg, capacity, at),
            )
        })
    };
    let mut runs = run_all(capacity);
    let mut capacity = capacity;
    let mut capacity_note = None;
    if runs[0].1.is_err() && capacity.is_some() {
        capacity_note = Some(format!(
            "--capacity {} is less than the recording held before its first entry, so every setting was replayed without a limit: give the card's full memory.",
            Mib(capacity.unwrap_or(0))
        ));
        capacity = None;
        runs = run_all(None);
    }
    let mut runs = runs.into_iter();
    let base = match runs.next().map(|(_, r)| r) {
        Some(Ok(r)) => r,
        Some(Err(e)) => anyhow::bail!("{name}: device {}: {e}", snap.device),
        None => anyhow::bail!("{name}: device {}: nothing replayed", snap.device),
    };
    let mut what_ifs = vec![WhatIf {
        setting: format!("recorded: {}", recorded.options_text()),
        peak_reserved_bytes: base.peak_reserved_bytes,
        peak_allocated_bytes: base.peak_allocated_bytes,
        ooms: base.ooms,
        equals_recording: Some(base.segments_match),
        error: None,
    }];
    for (setting, run) in runs {
        what_ifs.push(match run {
            Ok(r) => WhatIf {
                setting,
                peak_reserved_bytes: r.peak_reserved_bytes,
                peak_allocated_bytes: r.peak_allocated_bytes,
                ooms: r.ooms,
                equals_recording: None,
                error: None,
            },
            Err(e) => WhatIf {
                setting,
                peak_reserved_bytes: 0,
                peak_allocated_bytes: 0,
                ooms: 0,
                equals_recording: None,
                error: Some(e.to_string()),
            },
        });
    }
    // The planner sees the trace's own allocations; blocks that predate the
    // recording are live beside them.
    let planner_floor_bytes = if planner {
        // The arena the trace needs, whatever limit it ran under: a limit
        // it passes is what the advice compares it with.
        let unlimited = AllocatorConfig {
            memory_limit: None,
            ..recorded.clone()
        };
        // Under a size the rows ask for each refused request (freed at once
        // if granted), so the planner packs it too; without one they skip
        // it, and so does the planner.
        let limited = capacity.or(recorded.memory_limit).is_some();
        let all = if limited {
            snap.workload.with_refusals_granted()
        } else {
            snap.workload.clone()
        };
        crate::lab::workload::compare_with(&all, &["planner"], None, &unlimited)
            .ok()
            .and_then(|r| r.first().map(|p| p.peak_reserved_bytes))
            .map(|arena| {
                (arena + base.at_peak.before_recording_bytes).max(base.peak_allocated_bytes)
            })
    } else {
        None
    };
    let recorded_ooms: Vec<RecordedOom> = snap
        .ooms
        .iter()
        .map(|&(requested_bytes, device_free_bytes)| RecordedOom {
            requested_bytes,
            device_free_bytes,
        })
        .collect();
    // The segments at the peak, at the first refusal and at `--at`, and the
    // page's replay: side by side.
    let first_oom = base.oom_at.first().map(|o| o.op);
    let chosen = base.at_chosen.as_ref().map(|l| l.after_op);
    let mut jobs = vec![
        Job::Segments(Some(base.at_peak.after_op)),
        Job::Segments(first_oom),
        Job::Segments(chosen),
    ];
    jobs.extend(page_points.map(Job::Page));
    let mut done = parallel_map(jobs, |job| match job {
        Job::Segments(at) => Done::Segments(
            at.and_then(|at| segment_map::segments_at(snap, recorded.clone(), capacity, at).ok()),
        ),
        Job::Page(points) => Done::Page(page(
            snap,
            recorded.clone(),
            capacity,
            points,
            base.at_peak.after_op,
            first_oom,
        )),
    })
    .into_iter();
    let mut segments = || match done.next() {
        Some(Done::Segments(m)) => m,
        _ => None,
    };
    let segments_at_peak = segments();
    let segments_at_first_oom = segments();
    let segments_at_chosen = segments();
    let page = match done.next() {
        Some(Done::Page(p)) => {
            Some(p.map_err(|e| anyhow::anyhow!("{name}: device {}: {e}", snap.device))?)
        }
        _ => None,
    };
    let mut advice = advise(
        base.oom_at.first(),
        &what_ifs,
        planner_floor_bytes,
        &base.at_peak,
        capacity,
        recorded.memory_limit,
        &recorded_ooms,
    );
    advice.extend(capacity_note);
    if let (Some(o), Some(m)) = (base.oom_at.first(), &segments_at_first_oom) {
        let free = m.free_external_bytes;
        if m.largest_free_block < o.requested_bytes && free >= o.requested_bytes {
            advice.push(format!(
                "When it was refused, {} lay free in the segments but the largest free block was {}: fragmentation, not a lack of memory. expandable_segments:True maps memory where it is needed instead.",
                Mib(free),
                Mib(m.largest_free_block)
            ));
        } else if let Some(cap) = capacity {
            advice.push(format!(
                "When it was refused, {} of the {} device was reserved and {} of it free ({} in the largest block): the request did not fit at all.",
                Mib(m.reserved_bytes),
                Mib(cap),
                Mib(free),
                Mib(m.largest_free_block)
            ));
        }
    }
    Ok((
        DeviceReport {
            device: snap.device,
            capacity_bytes: capacity,
            memory_limit_bytes: recorded.memory_limit,
            allocations: snap.workload.allocations(),
            trace_counts: TraceCounts {
                unknown_actions: snap.unknown_actions.clone(),
                entries: snap.entries,
                allocations: snap.workload.allocations(),
                frees: snap
                    .workload
                    .ops
                    .iter()
                    .filter(|o| matches!(o, crate::lab::workload::Op::Free { .. }))
                    .count(),
                segment_allocs: snap.segment_allocs.len(),
                segment_frees: snap.segment_frees.len(),
            },
            recorded_settings: match recorded.memory_limit {
                Some(l) => format!("{}, memory limit {}", recorded.describe(), Mib(l)),
                None => recorded.describe(),
            },
            what_ifs,
            planner_floor_bytes,
            at_peak: base.at_peak,
            at_chosen: base.at_chosen,
            segments_at_chosen,
            recorded_ooms,
            at_first_oom: base.at_first_oom,
            segments_at_peak,
            segments_at_first_oom,
            segments_at_snapshot: None,
            advice,
        },
        page,
    ))
}

/// For a distributed recording (`vramlab_torch record --dist`, its
/// `vramlab_torch.dist`): which rank this is, and what the layout itself
/// can still change, beyond the batch and checkpointing.
fn distributed_advice(root: &crate::lab::pickle::PyValue) -> Option<String> {
    use crate::lab::pickle::PyValue;
    let d = root.get("vramlab_torch")?.get("dist")?;
    let ranks = d.get("world_size").and_then(PyValue::as_i64)?;
    Some(match d.get("kind").and_then(PyValue::as_str)? {
        "ddp" => {
            let view = d
                .get("gradient_as_bucket_view")
                .and_then(PyValue::as_bool)
                .unwrap_or(false);
            format!(
                "This is rank 0 of DDP over {ranks} ranks: every rank holds the whole model, its gradients and optimizer state. Sharding them (ZeRO, FSDP) divides those by the rank count{}; `vramlab estimate --model gpt --dp N --zero K` compares the layouts for a transformer.",
                if view {
                    ""
                } else {
                    ", and gradient_as_bucket_view=True drops DDP's second copy of the gradients (its buckets)"
                }
            )
        }
        "fsdp2" => format!(
            "This is rank 0 of FSDP2 over {ranks} ranks: parameters, gradients and optimizer state are already sharded by the rank count, so more ranks shrink them further; activations are each rank's own, which only the batch, checkpointing or sequence and tensor parallelism reduce."
        ),
        _ => return None,
    })
}

/// Plain sentences from the figures: what the peak is made of, how much is
/// held but unused, and which setting would have saved what.
fn advise(
    first_oom: Option<&OomAt>,
    what_ifs: &[WhatIf],
    floor: Option<u64>,
    at_peak: &LiveAt,
    capacity: Option<u64>,
    limit: Option<u64>,
    recorded_ooms: &[RecordedOom],
) -> Vec<String> {
    let mut out = Vec::new();
    let base = &what_ifs[0];
    let idle = base
        .peak_reserved_bytes
        .saturating_sub(base.peak_allocated_bytes);
    if base.peak_reserved_bytes > 0 {
        out.push(format!(
            "Peak reserved {} for a peak of {} allocated: {} ({:.0}%) of what the allocator held at its peak was never handed to tensors at once (cached blocks and split segments).",
            Mib(base.peak_reserved_bytes),
            Mib(base.peak_allocated_bytes),
            Mib(idle),
            100.0 * idle as f64 / base.peak_reserved_bytes as f64
        ));
    }
    if at_peak.before_recording_bytes > 0 {
        out.push(format!(
            "{} of the peak's {} was allocated before the recording began, so no frame or category is known for it: start _record_memory_history() before the model is built to see it.",
            Mib(at_peak.before_recording_bytes),
            Mib(at_peak.allocated_bytes)
        ));
    }
    if let Some((cat, bytes)) = at_peak.by_category.first() {
        // The frame is over every category: said apart, as it need not
        // hold the largest one (cuBLAS workspaces have no user frame).
        let frame = at_peak
            .by_frame
            .first()
            .map(|(f, b)| {
                format!(
                    " Of all the live memory, the code holding most is {f} ({}).",
                    Mib(*b)
                )
            })
            .unwrap_or_default();
        // What shrinks activations, the share a user can change most.
        let act = if cat == Category::Activation.name() {
            " Activations saved for the backward shrink with activation checkpointing (recomputed in the backward), 16-bit autocast (half the bytes) or a smaller batch."
        } else {
            ""
        };
        out.push(format!(
            "At the peak of allocated memory the largest share is {cat}: {} of {}.{act}{frame}",
            Mib(*bytes),
            Mib(at_peak.allocated_bytes)
        ));
    }
    let best = what_ifs[1..]
        .iter()
        .filter(|w| w.error.is_none())
        .min_by_key(|w| (w.ooms, w.peak_reserved_bytes));
    if let Some(best) = best {
        out.push(setting_advice(base, best));
    }
    // The device's size, or the limit the recording ran under.
    match (floor, capacity.or(limit)) {
        (Some(floor), Some(cap)) if floor > cap => out.push(format!(
            "No allocator setting is likely to fit this step in {}: even an offline planner that knew every lifetime in advance needs {}. Lower the batch, checkpoint activations, or shard.",
            Mib(cap),
            Mib(floor)
        )),
        (Some(floor), _) if base.ooms == 0 && floor < base.peak_reserved_bytes => out.push(format!(
            "An offline planner that knew every lifetime in advance needs about {} for this step (its packing, and no less than the blocks PyTorch's allocator holds at the peak): {} under the recorded peak reserved, about the most any allocator setting could save (the planner is a heuristic, not a proven bound).",
            Mib(floor),
            Mib(base.peak_reserved_bytes - floor)
        )),
        (Some(floor), _) if base.ooms == 0 => out.push(format!(
            "An offline planner that knew every lifetime in advance needs about {} for this step, no less than the recorded settings reserved ({}): little is left to gain from allocator settings.",
            Mib(floor),
            Mib(base.peak_reserved_bytes)
        )),
        (Some(floor), Some(cap)) => out.push(format!(
            "An offline planner that knew every lifetime in advance packs every request of this step, each refused one as if freed at once, into about {} of the {}: no allocator is ruled out, and at the refusal what ran out was the packing (rounding, split segments, cached blocks), not the tensors (how long a refused block would have lived, the trace cannot say).",
            Mib(floor),
            Mib(cap)
        )),
        _ => {}
    }
    if base.ooms > 0 {
        if let Some(cap) = capacity {
            out.push(format!(
                "On {} the recorded settings run out of memory {} in the replay; the table says which settings would not.",
                Mib(cap),
                super::count(base.ooms, "time")
            ));
        }
    }
    if let Some(o) = first_oom {
        let from = o
            .origin
            .describe()
            .map_or(String::new(), |d| format!(", {d}"));
        out.push(format!(
            "The first refused allocation asked for {} ({}){from}, with {} allocated and {} reserved.",
            crate::memory::format_size(o.requested_bytes),
            o.category,
            Mib(o.allocated_bytes),
            Mib(o.reserved_bytes)
        ));
    }
    for o in recorded_ooms.iter().take(3) {
        // Under a recorded memory limit the device's free memory is not
        // what refused it, and every row already replays under that limit.
        let why = match (limit, capacity) {
            (Some(l), _) => format!(
                " under its memory limit of {} (vramlab's --memory-limit, recorded in the file), as every row above is replayed",
                Mib(l)
            ),
            (None, None) => format!(
                " with {} free on the device; give --capacity (the card's memory) to replay each setting on a device that size",
                Mib(o.device_free_bytes)
            ),
            (None, Some(_)) => format!(" with {} free on the device", Mib(o.device_free_bytes)),
        };
        out.push(format!(
            "The recording ran out of memory asking for {}{why}.",
            Mib(o.requested_bytes)
        ));
    }
    out
}

fn print_text(name: &str, reports: &[DeviceReport]) {
    println!("{name}: PyTorch memory snapshot");
    for r in reports {
        println!();
        println!(
            "device {}: {}; recorded settings: {}",
            r.device,
            super::count(r.allocations as u64, "allocation"),
            r.recorded_settings
        );
        let on = match (r.capacity_bytes, r.memory_limit_bytes) {
            (Some(c), _) => format!("on a device of {}", Mib(c)),
            (None, Some(l)) => format!("under the recorded limit of {}", Mib(l)),
            (None, None) => "no device size: peaks only".into(),
        };
        println!("  what-ifs, each replayed from the recording's first entry ({on}):");
        println!(
            "    {:<58} {:>14} {:>14} {:>6}",
            "setting", "peak reserved", "vs recorded", "OOMs"
        );
        let base = r.what_ifs[0].peak_reserved_bytes as i128;
        let base_ooms = r.what_ifs[0].ooms;
        for w in &r.what_ifs {
            if let Some(e) = &w.error {
                println!("    {:<58} cannot replay: {e}", w.setting);
                continue;
            }
            let delta = w.peak_reserved_bytes as i128 - base;
            let delta = match delta {
                // Refusing more allocations lowers a peak without saving
                // anything: no comparison.
                _ if w.ooms > base_ooms => "(more OOMs)".to_string(),
                0 => "—".to_string(),
                d if d < 0 => format!("-{}", Mib((-d) as u64)),
                d => format!("+{}", Mib(d as u64)),
            };
            println!(
                "    {:<58} {:>14} {:>14} {:>6}",
                w.setting,
                Mib(w.peak_reserved_bytes).to_string(),
                delta,
                w.ooms
            );
        }
        if let Some(f) = r.planner_floor_bytes {
            println!(
                "    {:<58} {:>14}",
                "offline planner (foresight)",
                Mib(f).to_string()
            );
        }
        if !r.trace_counts.unknown_actions.is_empty() {
            println!(
                "  skipped: trace entries of actions PyTorch's TraceEntry does not name: {}",
                torch_snapshot::list_actions(&r.trace_counts.unknown_actions)
            );
        }
        if let Some(eq) = r.what_ifs[0].equals_recording {
            println!(
                "  the recorded settings replay to {}",
                if eq {
                    "exactly the recorded segments, reserved and allocated bytes"
                } else {
                    "a different end state than recorded (see `vramlab replay` for how)"
                }
            );
        }
        print_live("live at the peak", &r.at_peak);
        if let Some(live) = &r.at_first_oom {
            print_live("live at the replay's first out-of-memory", live);
        }
        if let Some(m) = &r.segments_at_peak {
            print_map("the replay's segments at the peak", m);
        }
        if let Some(m) = &r.segments_at_first_oom {
            print_map("the replay's segments at the first refusal", m);
        }
        if let Some(live) = &r.at_chosen {
            print_live("live at the moment --at names", live);
        }
        if let Some(m) = &r.segments_at_chosen {
            print_map("the replay's segments then", m);
        }
        if let Some(m) = &r.segments_at_snapshot {
            print_map("the segments when the snapshot was taken", m);
        }
        println!("  what to do:");
        for a in &r.advice {
            println!("    - {a}");
        }
    }
}

/// The report of a snapshot with no trace: its segments, and what they say.
fn state_only(
    name: &str,
    args: &DoctorArgs,
    maps: &[SegmentMap],
    reason: Option<String>,
) -> anyhow::Result<()> {
    let maps: Vec<&SegmentMap> = maps
        .iter()
        .filter(|m| args.device.is_none_or(|d| m.device == d))
        .collect();
    if maps.is_empty() {
        anyhow::bail!(
            "{name}: no allocation history and no segments{}: nothing was allocated when it was taken, or it is not a memory snapshot",
            args.device.map_or(String::new(), |d| format!(" on device {d}"))
        );
    }
    let advice: Vec<Vec<String>> = maps.iter().map(|m| state_advice(m)).collect();
    if args.json {
        let devices: Vec<_> = maps
            .iter()
            .zip(&advice)
            .map(|(m, a)| serde_json::json!({"device": m.device, "segments_at_snapshot": m, "advice": a}))
            .collect();
        let out = serde_json::json!({"snapshot": name, "trace": false, "trace_not_replayed": reason, "devices": devices});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    match &reason {
        None => println!("{name}: PyTorch memory snapshot with no trace (recorded without _record_memory_history, or with enabled=\"state\"): its segments only"),
        Some(r) => println!("{name}: PyTorch memory snapshot whose trace cannot be replayed ({r}): its segments only"),
    }
    for (m, a) in maps.iter().zip(&advice) {
        println!();
        println!("device {}:", m.device);
        print_map("the segments when the snapshot was taken", m);
        println!("  what to do:");
        for line in a {
            println!("    - {line}");
        }
        println!("    - Record a trace to see what happened before: torch.cuda.memory._record_memory_history(max_entries=100000) before the step, then _dump_snapshot().");
    }
    Ok(())
}

/// Sentences from a segment map alone.
fn state_advice(m: &SegmentMap) -> Vec<String> {
    let mut out = Vec::new();
    let unused = m.reserved_bytes.saturating_sub(m.requested_bytes);
    out.push(format!(
        "{} reserved in {}, {} requested by live tensors: {} held but unused.",
        Mib(m.reserved_bytes),
        super::count(m.segments as u64, "segment"),
        Mib(m.requested_bytes),
        Mib(unused)
    ));
    if m.free_segment_bytes > 0 {
        out.push(format!(
            "{} sit in segments with no live block: torch.cuda.empty_cache() would return them to the device.",
            Mib(m.free_segment_bytes)
        ));
    }
    if m.inactive_split_bytes > 0 {
        let fix = if m.expandable_segments > 0 {
            "expandable_segments is already on, so these are gaps between live blocks; fewer long-lived tensors made between short-lived ones would close them"
        } else {
            "expandable_segments:True grows segments in place instead of splitting them, which avoids most of this"
        };
        out.push(format!(
            "{} are free blocks inside segments that still hold live blocks (fragmentation: empty_cache cannot return them; the largest free block is {}): {fix}.",
            Mib(m.inactive_split_bytes),
            Mib(m.largest_free_block)
        ));
    }
    out
}

fn print_map(what: &str, m: &SegmentMap) {
    println!(
        "  {what}: {} ({} expandable), {} reserved",
        super::count(m.segments as u64, "segment"),
        m.expandable_segments,
        Mib(m.reserved_bytes)
    );
    println!(
        "    allocated {} (requested {}, rounding {}), free {}: {} in segments with live blocks (inactive_split), {} in wholly free segments; largest free block {}",
        Mib(m.allocated_bytes),
        Mib(m.requested_bytes),
        Mib(m.free_internal_bytes),
        Mib(m.free_external_bytes),
        Mib(m.inactive_split_bytes),
        Mib(m.free_segment_bytes),
        Mib(m.largest_free_block)
    );
    if m.most_free.iter().any(|r| r.free_bytes > 0) {
        println!("    segments with the most free bytes:");
        for r in m.most_free.iter().filter(|r| r.free_bytes > 0) {
            println!(
                "      0x{:x} {} {}{}: {} free of {} ({}, largest free {})",
                r.address,
                r.pool,
                Mib(r.total_bytes),
                if r.expandable { " expandable" } else { "" },
                Mib(r.free_bytes),
                Mib(r.total_bytes),
                super::count(r.blocks as u64, "block"),
                Mib(r.largest_free_block)
            );
        }
    }
    if !m.by_frame.is_empty() {
        println!("    allocated by frame:");
        for (f, b) in &m.by_frame {
            println!("      {:>12}  {f}", Mib(*b).to_string());
        }
    }
}

/// The advice on allocator settings from the best single change tried
/// (fewest refusals, then the lowest peak reserved) against the recorded
/// settings. A run stops at its first refusal, so only a change with none
/// is recommended: a lower peak bought by refusals is no saving.
fn setting_advice(base: &WhatIf, best: &WhatIf) -> String {
    let saved = base.peak_reserved_bytes as i128 - best.peak_reserved_bytes as i128;
    if best.ooms == 0 && (base.ooms > 0 || saved > 0) {
        let reserved = Mib(best.peak_reserved_bytes);
        let what = match (saved > 0, base.ooms > 0) {
            (true, true) => format!(
                "would have peaked {} lower and would not have run out of memory ({reserved} reserved)",
                Mib(saved as u64)
            ),
            (true, false) => format!(
                "would have peaked {} lower ({reserved} reserved)",
                Mib(saved as u64)
            ),
            (false, _) => {
                format!("would not have run out of memory ({reserved} reserved at its peak)")
            }
        };
        format!(
            "{} {what}: set PYTORCH_CUDA_ALLOC_CONF={}.",
            best.setting, best.setting
        )
    } else if best.ooms > 0 && best.ooms < base.ooms {
        format!(
            "{} runs out of memory less often ({} against {}) but still does, and a run stops at its first refusal: no single change tried avoids it.",
            best.setting,
            super::count(best.ooms, "time"),
            base.ooms
        )
    } else if saved > 0 && best.ooms == base.ooms && base.ooms > 0 {
        // Lower, but refused as often: no row to recommend.
        format!(
            "{} would have peaked {} lower ({} reserved) but still runs out of memory {}, as the recorded settings do: no single change tried avoids it.",
            best.setting,
            Mib(saved as u64),
            Mib(best.peak_reserved_bytes),
            super::count(best.ooms, "time")
        )
    } else {
        format!(
            "None of the single changes tried lowers the peak reserved{}: the recorded settings are already the best of them for this trace.",
            if base.ooms > 0 { " or avoids running out of memory" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what_if(setting: &str, peak: u64, ooms: u64) -> WhatIf {
        WhatIf {
            setting: setting.to_string(),
            peak_reserved_bytes: peak,
            peak_allocated_bytes: peak / 2,
            ooms,
            equals_recording: None,
            error: None,
        }
    }

    /// Every combination of refusals (none, fewer, as many, more) and peaks
    /// (lower, equal, higher): a setting is recommended exactly when it
    /// runs with no refusal and saves memory or refusals; "less often" only
    /// when it refuses fewer times but some; a saving is named only where
    /// there is one; and no advice says a refused run would not run out.
    #[test]
    fn a_setting_is_recommended_only_when_it_never_runs_out() {
        let mib = 1 << 20;
        for base_ooms in 0..4u64 {
            for best_ooms in 0..4u64 {
                for base_peak in [64 * mib, 100 * mib] {
                    for best_peak in [32 * mib, 64 * mib, 100 * mib, 128 * mib] {
                        let base = what_if("recorded", base_peak, base_ooms);
                        let best = what_if("expandable_segments:True", best_peak, best_ooms);
                        let text = setting_advice(&base, &best);
                        let case = format!("base {base_ooms} at {base_peak}, best {best_ooms} at {best_peak}: {text}");
                        let recommends = text.contains("set PYTORCH_CUDA_ALLOC_CONF=");
                        let wanted = best_ooms == 0 && (base_ooms > 0 || best_peak < base_peak);
                        assert_eq!(recommends, wanted, "{case}");
                        assert_eq!(
                            text.contains("less often"),
                            best_ooms > 0 && best_ooms < base_ooms,
                            "{case}"
                        );
                        if text.contains("lower") && !text.contains("lowers") {
                            assert!(best_peak < base_peak, "{case}");
                        }
                        if best_ooms > 0 {
                            assert!(!text.contains("would not have run out"), "{case}");
                        }
                        assert!(!text.is_empty(), "{case}");
                    }
                }
            }
        }
    }
}
