//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()`) as
//! workloads: the `device_traces` history — `alloc` (address, requested
//! size), `free_requested` / `free_completed`, `segment_alloc` /
//! `segment_free` — becomes an allocation trace, and the segment events the
//! snapshot recorded are kept to compare with what the replay does.
//!
//! Most real recordings begin mid-run: segments and blocks exist before the
//! first trace entry, and the trace frees addresses it never allocated. The
//! state at the start is rebuilt by rewinding the snapshot's end state
//! (`segments`) through the trace, as PyTorch's MemoryViz.js does: segments
//! alive at the end that no `segment_alloc` made, blocks alive at the end
//! that no `alloc` made, and blocks the trace frees without having
//! allocated them were all there from the start. The replay starts the
//! allocator from that state and compares its end with the recorded one.
//!
//! Each allocation's Python frames (recorded with
//! `_record_memory_history(stacks="python")` or `"all"`) say what some blocks
//! hold: a block made in a `torch.optim` optimizer's `_init_group` is
//! optimizer state, one made while a module is built or moved
//! (`torch/nn/modules` `__init__`, `reset_parameters`, `_apply`) is a
//! parameter. Those categories are the lifetime hints the `vramlab` strategy
//! places by; every other block stays untagged.

use super::error::LabError;
pub use super::frames::{
    category_from_frames, metadata_of, metadata_of_text, user_frame, Metadata,
};
pub use super::peak::Origin;
use super::peak::{live_at, LiveAt, OomAt};
use super::pickle::{unpickle_from, PyValue};
use super::recorded_source::RecordedSource;
use super::snapshot_fields::size_field;
use super::snapshot_segments;
use super::trace_entries::Entries;
use super::workload::{Op, Workload};
use crate::memory::caching::{pool_for, round_size, BlockHandle, CachingAllocator, PoolKind};
use crate::memory::config::AllocatorConfig;
use crate::memory::source::SimulatedSource;
use crate::memory::tag::Category;
use crate::strategies::IdMap;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One device of a snapshot, as a workload and a recorded state.
pub struct TorchSnapshot {
    pub device: usize,
    pub workload: Workload,
    /// Sizes of the segments PyTorch obtained (`segment_alloc`), in order.
    pub segment_allocs: Vec<u64>,
    /// (size, address) of each `segment_alloc`, in order: where CUDA put
    /// the segments, for a replay to put them there too.
    pub segment_addresses: Vec<(u64, u64)>,
    pub segment_frees: Vec<u64>,
    /// Peak of allocated bytes implied by the history (requests rounded as
    /// PyTorch rounds them), counting only the trace's own allocations.
    pub peak_allocated: u64,
    /// Allocations whose frames gave a category, per category.
    pub categories_from_frames: BTreeMap<Category, usize>,
    /// What existed before the first trace entry.
    pub initial: Vec<InitialSegment>,
    /// The snapshot's own end state (its `segments` for this device).
    pub recorded_end: EndState,
    /// Recorded out-of-memory entries: (requested size, device free bytes).
    pub ooms: Vec<(u64, u64)>,
    /// Segments recorded as expandable (`is_expandable`).
    pub expandable: bool,
    /// Frees of blocks from before the recording that no recorded segment
    /// holds (a trace that lost entries); replayed as no-ops.
    pub unplaced_frees: usize,
    /// Expandable segments as they were before the first trace entry, one
    /// per pool (`expandable_segments:True`).
    pub initial_expandable: Vec<InitialExpandable>,
    /// Where each trace allocation came from (by workload id), when its
    /// frames or `user_metadata` say.
    pub origins: HashMap<u64, Origin>,
    /// Allocations whose `user_metadata` named their category (a recording
    /// by `vramlab_torch`, which also names the module).
    pub categories_from_metadata: usize,
    /// Trace entries of this device (every action).
    pub entries: usize,
    /// Entries whose action PyTorch's TraceEntry does not name, skipped:
    /// (action, count), by action.
    pub unknown_actions: Vec<(String, usize)>,
    /// CUDA streams the trace's allocations were made on. PyTorch keeps
    /// each stream's free blocks apart; the replay keeps one pool, so with
    /// more than one its segments can differ from the recording.
    pub streams: usize,
}

/// An expandable segment before the recording began: its mapped ranges and
/// live blocks as offsets from `base` (the lowest address the recording
/// shows for the pool), blocks as in [`InitialSegment`].
#[derive(Debug, Clone)]
pub struct InitialExpandable {
    pub pool: PoolKind,
    pub base: u64,
    pub mapped: Vec<(u64, u64)>,
    pub blocks: Vec<(u64, u64, u64, Option<u64>)>,
}

/// A segment that existed before the recording began, with its live blocks
/// (offset, block size, requested bytes, and the workload id of those the
/// trace frees).
#[derive(Debug, Clone)]
pub struct InitialSegment {
    pub address: u64,
    pub size: u64,
    pub pool: PoolKind,
    pub blocks: Vec<(u64, u64, u64, Option<u64>)>,
}

/// A device's memory at one moment: what `segments` describes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EndState {
    pub segments: usize,
    /// Segment sizes, sorted (a multiset).
    #[serde(skip)]
    pub segment_sizes: Vec<u64>,
    pub reserved_bytes: u64,
    /// Block sizes of allocated blocks (what PyTorch's `allocated_bytes`
    /// counts: requests rounded, unsplit remainders included).
    pub allocated_bytes: u64,
}

/// A whole snapshot file: every device with a history, and the allocator
/// settings it was recorded under.
pub struct SnapshotFile {
    pub devices: Vec<TorchSnapshot>,
    /// From `allocator_settings` (newer PyTorch); `None` when absent.
    pub settings: Option<AllocatorConfig>,
    /// `expandable_segments` was on.
    pub expandable_setting: bool,
}

/// Ids given to blocks that existed before the recording (never clash with
/// the trace's own, which count from 1).
const PRE_EXISTING_IDS: u64 = 1 << 48;

/// `allocator_settings`' key for the memory limit a run had (`--memory-limit`,
/// PyTorch's `set_per_process_memory_fraction`), which PyTorch's snapshots
/// do not carry.
pub const MEMORY_LIMIT_KEY: &str = "vramlab_memory_limit";

/// `allocator_settings` as a configuration (PyTorch's names and units);
/// a value PyTorch's own parser refuses is an error, not a setting.
fn settings_of(root: &PyValue) -> Result<(Option<AllocatorConfig>, bool), LabError> {
    let Some(s) = root.get("allocator_settings") else {
        return Ok((None, false));
    };
    let mut c = AllocatorConfig::default();
    // Unset is SIZE_MAX, which reads as -1 (or not at all); a set value is
    // at least 20 MiB (older PyTorch wanted above 20, newer at least 20).
    if let Some(m) = s.get("max_split_size").and_then(PyValue::as_i64) {
        let least = (crate::memory::constants::K_MIN_MAX_SPLIT_SIZE_MB << 20) as i64;
        if m > 0 && m < least {
            return Err(LabError::BadSetting {
                key: "max_split_size",
                value: m.to_string(),
                expected: "at least 20 MiB (in bytes)",
            });
        }
        if m > 0 {
            c.max_split_size = m as u64;
        }
    }
    if let Some(t) = s
        .get("garbage_collection_threshold")
        .and_then(PyValue::as_f64)
    {
        // 0 is off; a set threshold lies strictly between 0 and 1.
        if !(t == 0.0 || (t > 0.0 && t < 1.0)) {
            return Err(LabError::BadSetting {
                key: "garbage_collection_threshold",
                value: t.to_string(),
                expected: "0 (off) or strictly between 0 and 1",
            });
        }
        c.garbage_collection_threshold = t;
    }
    c.expandable_segments = s
        .get("expandable_segments")
        .and_then(PyValue::as_bool)
        .unwrap_or(false);
    if let Some(d) = s.get("roundup_power2_divisions").and_then(PyValue::as_dict) {
        // Keys are interval starts in MiB ("1", "2", … "32768").
        for (k, v) in d.iter() {
            let mib: u64 = k.as_str().and_then(|k| k.parse().ok()).unwrap_or(0);
            if mib == 0 || !mib.is_power_of_two() {
                continue;
            }
            // 0 (off) or a power of 2, as PyTorch's parser takes them; a
            // bound keeps 512 × divisions far from overflowing.
            let divisions = v
                .as_i64()
                .filter(|&d| d == 0 || (d > 0 && (d as u64).is_power_of_two() && d <= 1 << 20))
                .ok_or_else(|| LabError::BadSetting {
                    key: "roundup_power2_divisions",
                    value: format!("{v:?}"),
                    expected: "0 or a power of 2 (at most 2^20) for each interval",
                })?;
            let i = mib.trailing_zeros() as usize;
            if i < c.roundup_power2_divisions.len() {
                c.roundup_power2_divisions[i] = divisions as u64;
            }
        }
    }
    // vramlab's own options ride in the conf string (PyTorch's are read
    // from their fields above), and its memory limit under its own key.
    if let Some(conf) = s.get("PYTORCH_CUDA_ALLOC_CONF").and_then(PyValue::as_str) {
        let ours: Vec<&str> = crate::memory::config::split_options(conf)
            .into_iter()
            .filter(|o| {
                o.split_once(':')
                    .is_some_and(|(k, _)| crate::strategies::vramlab::KEYS.contains(&k.trim()))
            })
            .collect();
        if !ours.is_empty() {
            let options = crate::strategies::vramlab::parse_alloc_conf(&ours.join(","))?;
            c.placement = options.placement;
        }
    }
    if let Some(limit) = s
        .get(MEMORY_LIMIT_KEY)
        .and_then(PyValue::as_i64)
        .filter(|&l| l > 0)
    {
        c.memory_limit = Some(limit as u64);
    }
    let expandable = s
        .get("expandable_segments")
        .and_then(PyValue::as_bool)
        .unwrap_or(false);
    Ok((Some(c), expandable))
}

/// The recorded segments of `device`: (address, size, pool, blocks as
/// (address, size, requested, allocated), expandable).
type Recorded = (u64, u64, PoolKind, Vec<(u64, u64, u64, bool)>, bool);

fn recorded_segments(
    segments: &[snapshot_segments::Segment],
    device: usize,
) -> (Vec<Recorded>, bool) {
    let mut out = Vec::new();
    let mut expandable = false;
    for seg in segments.iter().filter(|s| s.device == device) {
        expandable |= seg.expandable;
        let address = seg.address.unwrap_or(0);
        let size = seg.total_size;
        let pool = match seg.segment_type.as_str() {
            "small" => PoolKind::Small,
            "large" => PoolKind::Large,
            _ => pool_for(size.min(2 << 20)),
        };
        let mut blocks = Vec::with_capacity(seg.blocks.len());
        let mut at = address;
        for b in &seg.blocks {
            // Older versions give no block address: blocks tile the segment.
            let addr = b.address.unwrap_or(at);
            blocks.push((addr, b.size, b.requested, b.allocated()));
            at = addr.saturating_add(b.size);
        }
        out.push((address, size, pool, blocks, seg.expandable));
    }
    out.sort_by_key(|s| s.0);
    (out, expandable)
}

fn end_state(
    recorded: &[Recorded],
    segments: &[snapshot_segments::Segment],
    device: usize,
) -> EndState {
    let mut sizes: Vec<u64> = recorded.iter().map(|s| s.1).collect();
    sizes.sort_unstable();
    let allocated = segments
        .iter()
        .filter(|s| s.device == device)
        .map(|s| s.allocated_size)
        .fold(0u64, u64::saturating_add);
    EndState {
        segments: sizes.len(),
        reserved_bytes: sizes.iter().fold(0u64, |a, &b| a.saturating_add(b)),
        segment_sizes: sizes,
        allocated_bytes: allocated,
    }
}

/// A snapshot as parsed: the tree, in which each trace entry is the index
/// of its compact record in `entries`.
pub struct Parsed {
    pub root: PyValue,
    pub entries: Entries,
}

/// Parses a snapshot of `len` bytes as it streams from `reader`.
pub fn parse<R: std::io::BufRead>(reader: R, len: usize, name: &str) -> Result<Parsed, LabError> {
    let mut entries = Entries::default();
    let root = unpickle_from(reader, len, &mut entries).map_err(|e| LabError::NotAPickle {
        name: name.to_string(),
        why: Box::new(e),
    })?;
    Ok(Parsed { root, entries })
}

/// Parses the snapshot at `path`, streaming (never the whole file in
/// memory).
pub fn parse_file(path: &std::path::Path) -> Result<Parsed, LabError> {
    let open = |source| LabError::OpenTrace {
        path: path.to_path_buf(),
        source,
    };
    // What the bytes are first: an empty file, a directory or a text file
    // would otherwise fail deep inside the unpickler ("memo entry 101").
    if crate::file_kind::sniff(path)? != crate::file_kind::FileKind::Snapshot {
        return Err(LabError::NotSnapshotBytes {
            name: path.display().to_string(),
        });
    }
    let file = std::fs::File::open(path).map_err(open)?;
    let len = file.metadata().map_err(open)?.len() as usize;
    let reader = std::io::BufReader::with_capacity(1 << 20, file);
    parse(reader, len, &path.display().to_string())
}

/// Every device of a snapshot with an allocation history.
pub fn read_all(bytes: &[u8], name: &str) -> Result<SnapshotFile, LabError> {
    let mut parsed = parse(bytes, bytes.len(), name)?;
    read_parsed(&mut parsed, name)
}

/// [`read_all`] of a snapshot already parsed (so one parse serves the
/// trace and [`crate::segment_map::maps_of`] alike).
pub fn read_parsed(parsed: &mut Parsed, name: &str) -> Result<SnapshotFile, LabError> {
    let segments = snapshot_segments::read(&parsed.root)?;
    read_parsed_with(&parsed.root, &mut parsed.entries, &segments, name)
}

/// [`read_parsed`] of a parsed snapshot's tree and entries, with its
/// `segments` already read ([`snapshot_segments::read`]): doctor reads them
/// once for its map and the replay.
pub fn read_parsed_with(
    root: &PyValue,
    entries: &mut Entries,
    segments: &[snapshot_segments::Segment],
    name: &str,
) -> Result<SnapshotFile, LabError> {
    let traces = match root.get("device_traces") {
        // Segments without a trace: a snapshot taken with no history on.
        None if root.get("segments").is_some() => {
            return Err(LabError::NoHistory {
                name: name.to_string(),
            })
        }
        None => {
            return Err(LabError::NoDeviceTraces {
                name: name.to_string(),
            })
        }
        Some(t) => t.as_list().ok_or_else(|| LabError::CorruptSegments {
            at: "device_traces".into(),
            what: "not a list (PyTorch writes one list of trace entries a device)".into(),
        })?,
    };
    let (settings, expandable_setting) = settings_of(root)?;
    let config = settings.clone().unwrap_or_default();
    let mut devices = Vec::new();
    for (device, trace) in traces.iter().enumerate() {
        let Some(trace) = trace.as_list().filter(|t| !t.is_empty()) else {
            continue;
        };
        devices.push(read_device(
            segments, device, trace, entries, &config, name,
        )?);
    }
    if devices.is_empty() {
        return Err(LabError::NoHistory {
            name: name.to_string(),
        });
    }
    Ok(SnapshotFile {
        devices,
        settings,
        expandable_setting,
    })
}

/// The device with the longest history.
pub fn read(bytes: &[u8], name: &str) -> Result<TorchSnapshot, LabError> {
    let file = read_all(bytes, name)?;
    file.devices
        .into_iter()
        .max_by_key(|d| d.workload.ops.len())
        .ok_or_else(|| LabError::NoHistory {
            name: name.to_string(),
        })
}

fn read_device(
    segments: &[snapshot_segments::Segment],
    device: usize,
    trace: &[PyValue],
    table: &mut Entries,
    config: &AllocatorConfig,
    name: &str,
) -> Result<TorchSnapshot, LabError> {
    // Newer PyTorch records free_requested then free_completed (the block is
    // reusable at the second); older versions one of them, or "free".
    const FREES: [&str; 3] = ["free_completed", "free_requested", "free"];
    const SEGMENT_ACTIONS: [&str; 4] = [
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
    ];
    let mut seen = [false; FREES.len()];
    for item in trace {
        let e = table.resolve(item);
        if let Some(k) = FREES.iter().position(|a| *a == table.action_name(&e)) {
            seen[k] = true;
        }
    }
    let free_action = FREES
        .into_iter()
        .zip(seen)
        .find_map(|(a, seen)| seen.then_some(a))
        .unwrap_or("free_completed");
    // Blocks the trace allocated and has not freed: address → id.
    let mut live: IdMap<u64, u64> = IdMap::default();
    let mut pre_freed: Vec<(u64, u64, u64, u64)> = Vec::new();
    let mut created: IdMap<u64, u64> = IdMap::default();
    let mut pre_segments_freed: Vec<(u64, u64)> = Vec::new();
    let mut mapping: Vec<(bool, u64, u64)> = Vec::new();
    let mut seg_addresses: Vec<(u64, u64)> = Vec::new();
    let (mut ops, mut seg_a, mut seg_f, mut ooms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut live_bytes, mut peak, mut next) = (0u64, 0u64, 0u64);
    let mut sizes: IdMap<u64, u64> = IdMap::default();
    // The trace entry of each live id's alloc, for an error that names it.
    let mut alloc_entry: IdMap<u64, usize> = IdMap::default();
    // The entry that last freed each address not allocated since: a second
    // free there frees nothing (a double free, not a block from before).
    let mut freed_at: IdMap<u64, usize> = IdMap::default();
    let mut categories = BTreeMap::new();
    let mut origins: HashMap<u64, Origin> = HashMap::new();
    let mut from_metadata = 0;
    let mut streams = std::collections::BTreeSet::new();
    let releases_mean_empty_cache = releases_mean_empty_cache(config);
    let mut releasing = false;
    let mut unknown: BTreeMap<String, usize> = BTreeMap::new();
    for (i, item) in trace.iter().enumerate() {
        let e = &table.resolve(item);
        let act = table.action_name(e);
        let at = || format!("device_traces[{device}][{i}] ({act:?})");
        let size = size_field(e.size(), "size", at)?;
        // Every action that changes memory names its block or segment by
        // address; the rest (oom, snapshot, user_defined, unknown) need none.
        let addr = match e.addr(table) {
            Some(a) => a,
            None if act == "alloc" || FREES.contains(&act) || SEGMENT_ACTIONS.contains(&act) => {
                return Err(LabError::AddrMissing { at: at() })
            }
            None => 0,
        };
        let release = act == "segment_free" || act == "segment_unmap";
        if release && !releasing && releases_mean_empty_cache {
            ops.push(Op::EmptyCache);
        }
        releasing = release;
        match act {
            "alloc" => {
                streams.insert(e.stream);
                next += 1;
                if let Some(&earlier) = live.get(&addr) {
                    return Err(LabError::AddrStillLive {
                        at: at(),
                        addr,
                        earlier: alloc_entry[&earlier],
                    });
                }
                live.insert(addr, next);
                alloc_entry.insert(next, i);
                freed_at.remove(&addr);
                from_metadata += usize::from(e.named.is_some());
                let category = e.named.unwrap_or(e.from_frames);
                if category != Category::Untagged {
                    *categories.entry(category).or_insert(0) += 1;
                }
                let origin = table.origin(e);
                if *origin != Origin::default() {
                    origins.insert(next, origin.clone());
                }
                ops.push(Op::Alloc {
                    id: next,
                    size,
                    category,
                });
                let r = round_size(size.max(1), config);
                sizes.insert(next, r);
                live_bytes = live_bytes.saturating_add(r);
                peak = peak.max(live_bytes);
            }
            a if a == free_action => {
                if let Some(&earlier) = freed_at.get(&addr) {
                    return Err(LabError::AddrFreedTwice {
                        at: at(),
                        addr,
                        earlier,
                    });
                }
                freed_at.insert(addr, i);
                match live.remove(&addr) {
                    Some(id) => {
                        alloc_entry.remove(&id);
                        live_bytes = live_bytes.saturating_sub(sizes.remove(&id).unwrap_or(0));
                        ops.push(Op::Free { id });
                    }
                    None => {
                        // Allocated before the recording began.
                        let id = PRE_EXISTING_IDS + pre_freed.len() as u64;
                        pre_freed.push((addr, round_size(size.max(1), config), size, id));
                        ops.push(Op::Free { id });
                    }
                }
            }
            "segment_alloc" => {
                created.insert(addr, size);
                seg_a.push(size);
                seg_addresses.push((size, addr));
            }
            "segment_free" => {
                if created.remove(&addr).is_none() {
                    pre_segments_freed.push((addr, size));
                }
                seg_f.push(size);
            }
            "segment_map" | "segment_unmap" => {
                let map = act == "segment_map";
                mapping.push((map, addr, size));
                if map {
                    seg_a.push(size);
                } else {
                    seg_f.push(size);
                }
            }
            "oom" => {
                ooms.push((size, e.device_free(table)));
                ops.push(Op::Probe { size });
            }
            // The frees not chosen as the one that frees, and what changes
            // no memory.
            a if FREES.contains(&a) || a == "snapshot" || a == "user_defined" => {}
            other => *unknown.entry(other.to_string()).or_insert(0) += 1,
        }
    }
    let (recorded, expandable) = recorded_segments(segments, device);
    let recorded_end = end_state(&recorded, segments, device);
    // Rewind: what was there at the start.
    let trace_live: std::collections::HashSet<u64> = live.keys().copied().collect();
    let mut initial_expandable = rewind_expandable(&recorded, &mapping, &trace_live);
    let mut initial: Vec<InitialSegment> = recorded
        .iter()
        .filter(|(address, .., expandable)| !expandable && !created.contains_key(address))
        .map(|(address, size, pool, blocks, _)| InitialSegment {
            address: *address,
            size: *size,
            pool: *pool,
            blocks: blocks
                .iter()
                .filter(|(a, _, _, allocated)| *allocated && !trace_live.contains(a))
                .map(|(a, s, r, _)| (a.saturating_sub(*address), *s, *r, None))
                .collect(),
        })
        .collect();
    for (address, size) in pre_segments_freed {
        initial.push(InitialSegment {
            address,
            size,
            pool: if size == 2 << 20 {
                PoolKind::Small
            } else {
                PoolKind::Large
            },
            blocks: Vec::new(),
        });
    }
    initial.sort_by_key(|s| s.address);
    let mut unplaced = 0;
    for (addr, block, requested, id) in pre_freed {
        if let Some(s) = initial
            .iter_mut()
            .find(|s| s.address <= addr && addr < s.address.saturating_add(s.size))
        {
            s.blocks
                .push((addr - s.address, block, requested, Some(id)));
        } else if let Some(e) = initial_expandable.iter_mut().find(|e| {
            e.mapped.iter().any(|&(o, l)| {
                let start = e.base.saturating_add(o);
                start <= addr && addr < start.saturating_add(l)
            })
        }) {
            e.blocks.push((addr - e.base, block, requested, Some(id)));
        } else {
            // A free of a block no recorded segment holds (a trace that
            // lost entries): its free is replayed as a no-op, and said.
            unplaced += 1;
        }
    }
    Ok(TorchSnapshot {
        device,
        workload: Workload {
            name: format!("{name} (device {device})"),
            ops,
            measure_from: 0,
        },
        segment_allocs: seg_a,
        segment_addresses: seg_addresses,
        segment_frees: seg_f,
        peak_allocated: peak,
        categories_from_frames: categories,
        initial,
        recorded_end,
        ooms,
        expandable: expandable || !mapping.is_empty(),
        unplaced_frees: unplaced,
        initial_expandable,
        origins,
        categories_from_metadata: from_metadata,
        streams: streams.len(),
        entries: trace.len(),
        unknown_actions: unknown.into_iter().collect(),
    })
}

/// Skipped actions as said to a person: `"bogus" ×2, "other" ×1`.
pub fn list_actions(actions: &[(String, usize)]) -> String {
    actions
        .iter()
        .map(|(a, n)| format!("{a:?} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Adds [at, at + len) to a set of disjoint ranges (start → length),
/// joining neighbours.
fn add_range(set: &mut BTreeMap<u64, u64>, mut at: u64, mut len: u64) {
    if let Some((&p, &plen)) = set.range(..=at).next_back() {
        if p.saturating_add(plen) >= at {
            set.remove(&p);
            len = at.saturating_add(len).max(p.saturating_add(plen)) - p;
            at = p;
        }
    }
    let end = at.saturating_add(len);
    let inside: Vec<(u64, u64)> = set.range(at..=end).map(|(&a, &l)| (a, l)).collect();
    let mut end = end;
    for (a, l) in inside {
        set.remove(&a);
        end = end.max(a.saturating_add(l));
    }
    set.insert(at, end - at);
}

/// Removes [at, at + len) from a set of disjoint ranges.
fn remove_range(set: &mut BTreeMap<u64, u64>, at: u64, len: u64) {
    let end = at.saturating_add(len);
    let hit: Vec<(u64, u64)> = set
        .range(..end)
        .filter(|(&a, &l)| a.saturating_add(l) > at)
        .map(|(&a, &l)| (a, l))
        .collect();
    for (a, l) in hit {
        set.remove(&a);
        if a < at {
            set.insert(a, at - a);
        }
        let aend = a.saturating_add(l);
        if aend > end {
            set.insert(end, aend - end);
        }
    }
}

/// Rewinds the expandable segments' mapped ranges through the trace's
/// `segment_map` / `segment_unmap` entries (undoing each, last first) to
/// what was mapped before the first entry, one segment per pool. A map of
/// exactly 2 MiB is the small pool (a small request never maps more than
/// one page), any other the large; an unmap belongs to the pool that mapped
/// it in the trace, or else to the pool whose addresses it lies among. A
/// pool's segment may be released whole and a new one reserved elsewhere
/// (after `empty_cache`), so the one before the first entry is placed by
/// its own ranges.
fn rewind_expandable(
    recorded: &[Recorded],
    mapping: &[(bool, u64, u64)],
    trace_live: &std::collections::HashSet<u64>,
) -> Vec<InitialExpandable> {
    let mut out = Vec::new();
    if mapping.is_empty() && !recorded.iter().any(|r| r.4) {
        return out;
    }
    let by_size = |len: u64| {
        if len == 2 << 20 {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    };
    // Each pool's address span, from the end state and the maps.
    let mut span: HashMap<PoolKind, (u64, u64)> = HashMap::new();
    let mut widen = |pool: PoolKind, at: u64, len: u64| {
        let e = span.entry(pool).or_insert((at, at));
        e.0 = e.0.min(at);
        e.1 = e.1.max(at.saturating_add(len));
    };
    for r in recorded.iter().filter(|r| r.4) {
        widen(r.2, r.0, r.1);
    }
    for &(map, at, len) in mapping {
        if map {
            widen(by_size(len), at, len);
        }
    }
    let by_span = |at: u64, len: u64| {
        for pool in [PoolKind::Small, PoolKind::Large] {
            if let Some(&(lo, hi)) = span.get(&pool) {
                if lo <= at && at < hi {
                    return pool;
                }
            }
        }
        if len.is_multiple_of(20 << 20) {
            PoolKind::Large
        } else {
            PoolKind::Small
        }
    };
    // Each entry's pool, forward: what the trace itself mapped first.
    let mut mapped_in_trace: HashMap<PoolKind, BTreeMap<u64, u64>> = HashMap::new();
    let pools: Vec<PoolKind> = mapping
        .iter()
        .map(|&(map, at, len)| {
            let pool = if map {
                by_size(len)
            } else {
                [PoolKind::Small, PoolKind::Large]
                    .into_iter()
                    .find(|p| {
                        mapped_in_trace.get(p).is_some_and(|set| {
                            set.range(..=at).next_back().is_some_and(|(&a, &l)| {
                                at.saturating_add(len) <= a.saturating_add(l)
                            })
                        })
                    })
                    .unwrap_or_else(|| by_span(at, len))
            };
            let set = mapped_in_trace.entry(pool).or_default();
            if map {
                add_range(set, at, len);
            } else {
                remove_range(set, at, len);
            }
            pool
        })
        .collect();
    for pool in [PoolKind::Small, PoolKind::Large] {
        let mut set = BTreeMap::new();
        let mut blocks = Vec::new();
        for r in recorded.iter().filter(|r| r.4 && r.2 == pool) {
            add_range(&mut set, r.0, r.1);
            for &(a, size, requested, allocated) in &r.3 {
                if allocated && !trace_live.contains(&a) {
                    blocks.push((a, size, requested, None));
                }
            }
        }
        let mut touched = !set.is_empty();
        for (&(map, at, len), &p) in mapping.iter().zip(&pools).rev() {
            if p != pool {
                continue;
            }
            touched = true;
            if map {
                remove_range(&mut set, at, len);
            } else {
                add_range(&mut set, at, len);
            }
        }
        if !touched {
            continue;
        }
        // The segment before the first entry starts at its lowest mapped
        // range (where nothing was mapped, it holds nothing either).
        let base = set.keys().next().copied().unwrap_or(0);
        out.push(InitialExpandable {
            pool,
            base,
            mapped: set
                .iter()
                .map(|(&a, &l)| (a.saturating_sub(base), l))
                .collect(),
            blocks: blocks
                .into_iter()
                .map(|(a, s, r, id)| (a.saturating_sub(base), s, r, id))
                .collect(),
        });
    }
    out
}

/// Whether a run of segment releases in a trace is read as `empty_cache`.
/// A trace has no entry for `empty_cache`: it shows as a run of
/// segment_free / segment_unmap entries, and the first of each run becomes
/// an EmptyCache op, so the replay releases what PyTorch released. But the
/// allocator also releases on its own rules, which the replay follows
/// itself: against a memory limit (garbage collection, and the retries of a
/// request that does not fit: oversize blocks first, then everything), and
/// under vramlab's `release_before_grow`. Where a limit was recorded (vramlab
/// writes its own; PyTorch's snapshots carry none) or that option was on,
/// releases are left to those rules, and a program's own `empty_cache` is
/// not told apart.
pub fn releases_mean_empty_cache(config: &AllocatorConfig) -> bool {
    config.memory_limit.is_none()
        && !crate::strategies::vramlab::VramlabOptions::of(config).release_before_grow
}

/// A replay from the recorded start state.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplayFromState {
    pub pre_existing_segments: usize,
    pub replayed: EndState,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub ooms: u64,
    /// Segment count, sizes (as a multiset), reserved and allocated bytes all
    /// equal to the recorded end state.
    pub segments_match: bool,
    /// Where they differ, in words.
    pub differences: Vec<String>,
    /// What is live at the peak of allocated bytes.
    pub at_peak: LiveAt,
    /// The allocations that ran out of memory (the first [`MAX_OOMS`]).
    pub oom_at: Vec<OomAt>,
    /// What was live at the first of them.
    pub at_first_oom: Option<LiveAt>,
    /// What was live after the operation asked for, if one was.
    pub at_chosen: Option<LiveAt>,
}

/// How many out-of-memory allocations a replay describes.
pub const MAX_OOMS: usize = 16;

/// An allocator holding what `snap` held before its first trace entry:
/// its segments rebuilt with their blocks, the live ones' handles by trace
/// id and their sizes, and what could not be rebuilt, in words.
pub struct Started {
    pub allocator: CachingAllocator<RecordedSource>,
    pub handles: HashMap<u64, BlockHandle>,
    pub pre_sizes: HashMap<u64, u64>,
    pub differences: Vec<String>,
}

/// What one trace entry did to a replay's allocator.
pub enum Applied {
    /// An allocation got a block of this size.
    Allocated(u64),
    /// The device refused an allocation; its later free is a no-op.
    Refused,
    /// A free failed. Handles come from this allocator, so that is a bug,
    /// but a report beats a crash on someone's file.
    FreeFailed(String),
    /// A free or `empty_cache` done, or a probe that asked nothing.
    Done,
    /// A probe under a limit that got its block (and gave it back).
    Granted,
}

/// Whether the replay under `a` has a limit a request can run into: the
/// device's capacity or the allocator's memory limit.
fn limited<S: crate::memory::SegmentSource>(a: &CachingAllocator<S>) -> bool {
    a.source().total_capacity().is_some() || a.config().memory_limit.is_some()
}

/// [`Op::Probe`] on `a`: under a limit, asks for `size` and frees it at
/// once. `Some(granted)` where it asked, `None` where there is no limit.
pub fn probe<S: crate::memory::SegmentSource>(
    a: &mut CachingAllocator<S>,
    size: u64,
) -> Option<bool> {
    if !limited(a) {
        return None;
    }
    Some(match a.malloc(size.max(1), "oom probe") {
        Ok(x) => a.free(x.handle).is_ok(),
        Err(_) => false,
    })
}

/// Runs trace entry `op` on `a` (allocations labelled `label`), keeping the
/// live blocks' handles by trace id in `handles`.
pub fn apply_op(
    a: &mut CachingAllocator<RecordedSource>,
    handles: &mut HashMap<u64, BlockHandle>,
    op: &Op,
    label: &str,
) -> Applied {
    match *op {
        Op::Alloc { id, size, category } => {
            match a.malloc_tagged(size.max(1), label, category, None) {
                Ok(x) => {
                    handles.insert(id, x.handle);
                    Applied::Allocated(x.size)
                }
                Err(_) => Applied::Refused,
            }
        }
        Op::Free { id } => match handles.remove(&id).map(|h| a.free(h)) {
            Some(Err(e)) => Applied::FreeFailed(e.to_string()),
            _ => Applied::Done,
        },
        Op::EmptyCache => {
            a.empty_cache();
            Applied::Done
        }
        Op::Probe { size } => match probe(a, size) {
            Some(true) => Applied::Granted,
            Some(false) => Applied::Refused,
            None => Applied::Done,
        },
    }
}

/// Rebuilds the state `snap` starts from on a simulated device; with
/// `record`, the allocator's event log runs from its first segment.
pub fn start_replay(
    snap: &TorchSnapshot,
    config: AllocatorConfig,
    capacity: Option<u64>,
    record: bool,
) -> Result<Started, LabError> {
    let source = match capacity {
        Some(c) => SimulatedSource::new(c),
        None => SimulatedSource::unlimited(),
    };
    // Segments where the recording had them: first those that existed
    // before it, in the order they are rebuilt, then its segment_allocs.
    let recorded: Vec<(u64, u64)> = snap
        .initial
        .iter()
        .map(|s| (s.size, s.address))
        .chain(snap.segment_addresses.iter().copied())
        .collect();
    let mut a = CachingAllocator::new(RecordedSource::new(source, recorded), config);
    if record {
        a.start_recording();
    }
    let mut handles: HashMap<u64, BlockHandle> = HashMap::new();
    let mut differences = Vec::new();
    let mut pre_sizes: HashMap<u64, u64> = HashMap::new();
    if snap.unplaced_frees > 0 {
        differences.push(format!(
            "{} frees of blocks from before the recording lie in no recorded segment (replayed as no-ops)",
            snap.unplaced_frees
        ));
    }
    if !snap.unknown_actions.is_empty() {
        differences.push(format!(
            "trace entries of actions PyTorch's TraceEntry does not name were skipped: {}",
            list_actions(&snap.unknown_actions)
        ));
    }
    let mut dropped = 0;
    for seg in &snap.initial {
        // Blocks in address order; one that overlaps its predecessor (an
        // address reused before the recording) is left out, and said.
        let mut blocks = seg.blocks.clone();
        blocks.sort_by_key(|b| b.0);
        let mut kept: Vec<(u64, u64, u64, Option<u64>)> = Vec::new();
        for b in blocks {
            let fits = b.0.checked_add(b.1).is_some_and(|e| e <= seg.size);
            if fits && kept.last().is_none_or(|k| k.0.saturating_add(k.1) <= b.0) {
                kept.push(b);
            } else {
                dropped += 1;
            }
        }
        let layout: Vec<(u64, u64, u64)> = kept.iter().map(|b| (b.0, b.1, b.2)).collect();
        let hs = a
            .adopt_segment(seg.pool, seg.size, &layout)
            .map_err(|source| LabError::RebuildSegment {
                address: seg.address,
                size: seg.size,
                source,
            })?;
        for (b, h) in kept.iter().zip(hs) {
            if let Some(id) = b.3 {
                handles.insert(id, h);
                pre_sizes.insert(id, b.1);
            }
        }
    }
    for e in &snap.initial_expandable {
        let layout: Vec<(u64, u64, u64)> = e.blocks.iter().map(|b| (b.0, b.1, b.2)).collect();
        let hs = a
            .adopt_expandable(e.pool, &e.mapped, &layout)
            .map_err(|source| LabError::RebuildExpandable {
                pool: e.pool,
                base: e.base,
                source,
            })?;
        for (b, h) in e.blocks.iter().zip(hs) {
            if let Some(id) = b.3 {
                handles.insert(id, h);
                pre_sizes.insert(id, b.1);
            }
        }
    }
    if dropped > 0 {
        differences.push(format!(
            "{dropped} blocks from before the recording overlap others and were left out"
        ));
    }
    Ok(Started {
        allocator: a,
        handles,
        pre_sizes,
        differences,
    })
}

/// Replays `snap` on a simulated device under `config`, starting from the
/// state that existed before its first trace entry.
pub fn replay_from_state(
    snap: &TorchSnapshot,
    config: AllocatorConfig,
    capacity: Option<u64>,
) -> Result<ReplayFromState, LabError> {
    replay_from_state_at(snap, config, capacity, None)
}

/// [`replay_from_state`], also saying what is live after operation `at`
/// ([`ReplayFromState::at_chosen`]).
pub fn replay_from_state_at(
    snap: &TorchSnapshot,
    config: AllocatorConfig,
    capacity: Option<u64>,
    at: Option<usize>,
) -> Result<ReplayFromState, LabError> {
    let Started {
        allocator: mut a,
        mut handles,
        pre_sizes,
        mut differences,
    } = start_replay(snap, config, capacity, false)?;
    a.reset_peak_memory_stats();
    let before = a.memory_allocated();
    let (mut peak_alloc, mut peak_res, mut ooms) = (a.memory_allocated(), a.memory_reserved(), 0);
    let (mut peak_op, mut sizes, mut failed) = (0, HashMap::new(), HashSet::new());
    let mut oom_at = Vec::new();
    // Requests the recording ran out of memory on that this replay served.
    let mut granted: Vec<(usize, u64)> = Vec::new();
    for (i, op) in snap.workload.ops.iter().enumerate() {
        match (apply_op(&mut a, &mut handles, op, ""), *op) {
            (Applied::Allocated(block), Op::Alloc { id, .. }) => {
                sizes.insert(id, block);
            }
            (Applied::Refused, op) => {
                // An allocation (its later free a no-op), or a recorded
                // out-of-memory request refused again.
                let (size, category, origin) = match op {
                    Op::Alloc { id, size, category } => {
                        failed.insert(id);
                        (size, category, snap.origins.get(&id).cloned())
                    }
                    Op::Probe { size } => (size, Category::Untagged, None),
                    Op::Free { .. } | Op::EmptyCache => continue,
                };
                ooms += 1;
                if oom_at.len() < MAX_OOMS {
                    oom_at.push(OomAt {
                        op: i,
                        requested_bytes: size,
                        category,
                        origin: origin.unwrap_or_default(),
                        allocated_bytes: a.memory_allocated(),
                        reserved_bytes: a.memory_reserved(),
                    });
                }
            }
            (Applied::Granted, Op::Probe { size }) => granted.push((i, size)),
            (Applied::FreeFailed(e), _) => differences.push(format!("a free failed: {e}")),
            _ => {}
        }
        if a.memory_allocated() > peak_alloc {
            peak_alloc = a.memory_allocated();
            peak_op = i;
        }
        peak_res = peak_res.max(a.memory_reserved());
    }
    let ops = &snap.workload.ops;
    let live = |upto: usize| {
        live_at(
            ops,
            upto,
            &failed,
            &sizes,
            &pre_sizes,
            before,
            &snap.origins,
        )
    };
    let at_peak = live(peak_op);
    let at_first_oom = oom_at.first().map(|o| live(o.op));
    let at_chosen = at.map(|at| live(at.min(ops.len().saturating_sub(1))));
    let snapshot = a.snapshot();
    let mut sizes: Vec<u64> = snapshot.segments.iter().map(|s| s.total_size).collect();
    sizes.sort_unstable();
    let replayed = EndState {
        segments: sizes.len(),
        reserved_bytes: a.memory_reserved(),
        segment_sizes: sizes,
        allocated_bytes: a.memory_allocated(),
    };
    let rec = &snap.recorded_end;
    // Notes so far are about the input; what follows compares the replay.
    let notes = differences.len();
    if let Some(&(op, size)) = granted.first() {
        let more = match granted.len() {
            1 => String::new(),
            n => format!(" (and {} more such requests)", n - 1),
        };
        differences.push(format!(
            "the recording ran out of memory asking for {size} bytes at operation {op}; this replay got them{more}"
        ));
    }
    if replayed.segments != rec.segments {
        differences.push(format!(
            "{} segments replayed, {} recorded",
            replayed.segments, rec.segments
        ));
    }
    if replayed.segment_sizes != rec.segment_sizes && replayed.segments == rec.segments {
        differences.push("the same number of segments, of other sizes".into());
    }
    if replayed.reserved_bytes != rec.reserved_bytes {
        differences.push(format!(
            "reserved {} bytes replayed, {} recorded",
            replayed.reserved_bytes, rec.reserved_bytes
        ));
    }
    if replayed.allocated_bytes != rec.allocated_bytes {
        differences.push(format!(
            "allocated {} bytes replayed, {} recorded",
            replayed.allocated_bytes, rec.allocated_bytes
        ));
    }
    Ok(ReplayFromState {
        pre_existing_segments: snap.initial.len() + snap.initial_expandable.len(),
        segments_match: differences.len() == notes,
        replayed,
        peak_reserved_bytes: peak_res,
        peak_allocated_bytes: peak_alloc,
        ooms,
        differences,
        at_peak,
        oom_at,
        at_first_oom,
        at_chosen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(filename: &str, name: &str) -> PyValue {
        let s = PyValue::str;
        PyValue::dict(vec![
            (s("filename"), s(filename)),
            (s("line"), PyValue::Int(1)),
            (s("name"), s(name)),
        ])
    }

    fn category(frames: &[(&str, &str)]) -> Category {
        let list = PyValue::list(frames.iter().map(|(f, n)| frame(f, n)).collect());
        category_from_frames(Some(&list))
    }

    #[test]
    fn frames_tell_parameters_and_optimizer_state_apart_from_the_rest() {
        let torch = "/opt/conda/lib/python3.11/site-packages/torch";
        let adam = format!("{torch}/optim/adam.py");
        let module = format!("{torch}/nn/modules/module.py");
        let linear = format!("{torch}/nn/modules/linear.py");
        assert_eq!(
            category(&[
                ("??", "c10::cuda::CUDACachingAllocator::malloc"),
                (&adam, "_init_group"),
                (&adam, "step"),
                ("train.py", "<module>"),
            ]),
            Category::OptimizerState
        );
        // Adam's step itself makes temporaries (foreach): not state.
        assert_eq!(
            category(&[(&adam, "_multi_tensor_adam"), (&adam, "step")]),
            Category::Untagged
        );
        assert_eq!(
            category(&[(&module, "convert"), (&module, "_apply")]),
            Category::Parameter
        );
        assert_eq!(
            category(&[(&linear, "__init__"), ("model.py", "__init__")]),
            Category::Parameter
        );
        assert_eq!(
            category(&[(
                r"C:\py\Lib\site-packages\torch\optim\adamw.py",
                "_init_group"
            )]),
            Category::OptimizerState
        );
        // A forward's output: module code, but not building the module.
        assert_eq!(
            category(&[(&linear, "forward"), (&module, "_call_impl")]),
            Category::Untagged
        );
        assert_eq!(category(&[]), Category::Untagged);
        assert_eq!(category_from_frames(None), Category::Untagged);
    }
}
