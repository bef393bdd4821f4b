//! vramlab's own runs as PyTorch memory snapshots: the dict
//! `torch.cuda.memory._snapshot()` returns, built from an event log, so
//! PyTorch users can open a vramlab run in the viewer they know
//! (pytorch.org/memory_viz, `torch.cuda._memory_viz`). `device_traces`
//! holds every alloc (`free_requested` + `free_completed` for each free),
//! segment_alloc / segment_free and oom with its time; `segments` is the
//! end state, each segment tiled in address order by its blocks (free gaps
//! as one `inactive` block each, as the allocator merges them). Frames
//! carry vramlab's op (`conv2.forward`) and tensor label, one shared frame
//! object per distinct name, as PyTorch shares its frames. Each alloc's
//! `user_metadata` says its category, module and phase as `vramlab_torch`
//! writes them, so `replay` and `doctor` read vramlab's categories back
//! ([`categories_of`] says which one a retagged block keeps).

use super::pickle::PyValue;
use crate::memory::caching::PoolKind;
use crate::memory::events::{EventKind, LiveSegments, MemEvent};
use crate::memory::tag::Category;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// Interned strings and frame lists, so the pickle shares them.
#[derive(Default)]
struct Frames {
    strings: HashMap<String, PyValue>,
    lists: HashMap<(String, String), PyValue>,
}

impl Frames {
    fn s(&mut self, x: &str) -> PyValue {
        self.strings
            .entry(x.to_string())
            .or_insert_with(|| PyValue::Str(Rc::from(x)))
            .clone()
    }

    fn frame(&mut self, filename: &str, name: &str) -> PyValue {
        PyValue::dict(vec![
            (self.s("filename"), self.s(filename)),
            (self.s("line"), PyValue::Int(0)),
            (self.s("name"), self.s(name)),
        ])
    }

    /// Innermost first: the tensor, then the op that made it.
    fn of(&mut self, op: &str, label: &str) -> PyValue {
        let key = (op.to_string(), label.to_string());
        if let Some(v) = self.lists.get(&key) {
            return v.clone();
        }
        let mut frames = Vec::new();
        if !label.is_empty() {
            frames.push(self.frame("vramlab tensor", label));
        }
        if !op.is_empty() {
            frames.push(self.frame("vramlab op", op));
        }
        let v = PyValue::list(frames);
        self.lists.insert(key, v.clone());
        v
    }
}

/// The category each alloc event (by index) is written with. A block's
/// category changes while it lives (an output saved for backward becomes an
/// activation; a gradient that reaches `.grad` a gradient), and a snapshot
/// entry has one: blocks live at the run's peak (the first event with the
/// most allocated) keep the category they held there, so what a replay
/// finds live at its peak is vramlab's own breakdown; the others keep the
/// last one they held.
pub fn categories_of(events: &[MemEvent]) -> HashMap<usize, Category> {
    let peak = events
        .iter()
        .enumerate()
        .fold((0, 0u64), |(at, most), (i, e)| {
            if e.allocated > most {
                (i, e.allocated)
            } else {
                (at, most)
            }
        })
        .0;
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut kept: HashMap<usize, Category> = HashMap::new();
    let mut frozen: std::collections::HashSet<usize> = Default::default();
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                open.insert(e.address, i);
                kept.insert(i, e.category);
            }
            EventKind::Retag => {
                if let Some(&at) = open.get(&e.address) {
                    if !frozen.contains(&at) {
                        kept.insert(at, e.category);
                    }
                }
            }
            EventKind::Free => {
                open.remove(&e.address);
            }
            _ => {}
        }
        if i == peak {
            frozen.extend(open.values().copied());
        }
    }
    kept
}

/// The operation (0-based, as `doctor --at` and a replay's `after_op` count
/// them) that the event at `index` ends in when [`torch_snapshot`]'s trace
/// is read back: each alloc, free and oom is one, and each run of segment
/// releases one more (the `empty_cache` it is read back as, where garbage
/// collection does not act: [`crate::torch_snapshot::releases_mean_empty_cache`]);
/// `None` before the first.
pub fn operation_of(
    events: &[MemEvent],
    index: usize,
    settings: &crate::memory::AllocatorConfig,
) -> Option<usize> {
    let mut ops = 0usize;
    let mut releasing = false;
    for e in events.iter().take(index.saturating_add(1)) {
        match e.kind {
            // An oom entry is read back as a probe of the request.
            EventKind::Alloc | EventKind::Free | EventKind::Oom => {
                ops += 1;
                releasing = false;
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                if !releasing && crate::torch_snapshot::releases_mean_empty_cache(settings) {
                    ops += 1;
                }
                releasing = true;
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => releasing = false,
            // No trace entry.
            EventKind::Retag | EventKind::Phase => {}
        }
    }
    ops.checked_sub(1)
}

/// An alloc's `user_metadata` as `vramlab_torch` writes it: the category,
/// the module (the op without its `.forward` / `.backward`), the phase
/// and the tensor's label as `op`.
fn metadata(category: Category, op: &str, phase: &str, label: &str) -> String {
    let (module, _) = op
        .rsplit_once('.')
        .filter(|(_, p)| matches!(*p, "forward" | "backward"))
        .unwrap_or((op, ""));
    let mut m = serde_json::Map::new();
    // As serde names it, which is what `frames::metadata_of_text` reads.
    m.insert(
        "category".into(),
        serde_json::to_value(category).unwrap_or(serde_json::Value::Null),
    );
    for (k, v) in [("module", module), ("phase", phase), ("op", label)] {
        if !v.is_empty() {
            m.insert(k.into(), v.into());
        }
    }
    serde_json::Value::Object(m).to_string()
}

struct LiveBlock {
    size: u64,
    requested: u64,
    op: String,
    label: String,
}

/// The snapshot dict for the run recorded in `events` (device 0, one
/// stream), under PyTorch's default allocator settings unless `settings`
/// says otherwise.
pub fn torch_snapshot(events: &[MemEvent], settings: &crate::memory::AllocatorConfig) -> PyValue {
    let mut f = Frames::default();
    let mut trace = Vec::new();
    // Segments (mapped ranges of expandable ones) by address; each
    // segment id's pool and whether it is expandable; blocks by address.
    let mut segments = LiveSegments::default();
    let mut pools: HashMap<u64, (PoolKind, bool)> = HashMap::new();
    let mut blocks: BTreeMap<u64, LiveBlock> = BTreeMap::new();
    let categories = categories_of(events);
    // Allocations before the first phase (parameters, the batch): setup,
    // as the recorder names them.
    let mut phase = String::from("setup");
    // A trace entry, with `extra` fields after the ones every entry has.
    let entry = |f: &mut Frames, action: &str, e: &MemEvent, size: u64, extra: Vec<_>| {
        let mut d = vec![
            (f.s("action"), f.s(action)),
            (f.s("addr"), PyValue::Int(e.address as i64)),
            (f.s("size"), PyValue::Int(size as i64)),
            (f.s("stream"), PyValue::Int(0)),
            (f.s("time_us"), PyValue::Int(e.t_us as i64)),
            (f.s("frames"), f.of(&e.op, &e.label)),
        ];
        d.extend(extra);
        PyValue::dict(d)
    };
    for (i, e) in events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                let category = categories.get(&i).copied().unwrap_or(e.category);
                let text = metadata(category, &e.op, &phase, &e.label);
                let meta = vec![(f.s("user_metadata"), PyValue::Str(Rc::from(text.as_str())))];
                trace.push(entry(&mut f, "alloc", e, e.requested.max(1), meta));
                blocks.insert(
                    e.address,
                    LiveBlock {
                        size: e.size,
                        requested: e.requested,
                        op: e.op.to_string(),
                        label: e.label.to_string(),
                    },
                );
            }
            EventKind::Free => {
                trace.push(entry(
                    &mut f,
                    "free_requested",
                    e,
                    e.requested.max(1),
                    Vec::new(),
                ));
                trace.push(entry(
                    &mut f,
                    "free_completed",
                    e,
                    e.requested.max(1),
                    Vec::new(),
                ));
                blocks.remove(&e.address);
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => {
                let mapped = e.kind == EventKind::SegmentMap;
                let action = if mapped {
                    "segment_map"
                } else {
                    "segment_alloc"
                };
                trace.push(entry(&mut f, action, e, e.size, Vec::new()));
                // A small segment (or an expandable one's first page) is
                // 2 MiB; anything else is the large pool.
                let small = e.size == 2 << 20;
                pools.entry(e.segment).or_insert((
                    if small {
                        PoolKind::Small
                    } else {
                        PoolKind::Large
                    },
                    mapped,
                ));
                segments.apply(e);
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                let action = if e.kind == EventKind::SegmentUnmap {
                    "segment_unmap"
                } else {
                    "segment_free"
                };
                trace.push(entry(&mut f, action, e, e.size, Vec::new()));
                segments.apply(e);
            }
            EventKind::Oom => {
                let free = e.device_free.unwrap_or(0).min(i64::MAX as u64) as i64;
                let free = vec![(f.s("device_free"), PyValue::Int(free))];
                trace.push(entry(&mut f, "oom", e, e.size, free));
            }
            EventKind::Phase => phase = e.op.to_string(),
            EventKind::Retag => {}
        }
    }
    let mut segs = Vec::new();
    for (&address, &(size, id)) in &segments.by_address {
        let (pool, expandable) = pools.get(&id).copied().unwrap_or((PoolKind::Large, false));
        let mut out = Vec::new();
        let (mut allocated, mut requested) = (0u64, 0u64);
        let mut at = address;
        let inactive = |f: &mut Frames, addr: u64, size: u64| {
            PyValue::dict(vec![
                (f.s("address"), PyValue::Int(addr as i64)),
                (f.s("size"), PyValue::Int(size as i64)),
                (f.s("requested_size"), PyValue::Int(0)),
                (f.s("state"), f.s("inactive")),
                (f.s("frames"), PyValue::list(Vec::new())),
            ])
        };
        for (&addr, b) in blocks.range(address..address + size) {
            if addr > at {
                out.push(inactive(&mut f, at, addr - at));
            }
            allocated += b.size;
            requested += b.requested;
            out.push(PyValue::dict(vec![
                (f.s("address"), PyValue::Int(addr as i64)),
                (f.s("size"), PyValue::Int(b.size as i64)),
                (f.s("requested_size"), PyValue::Int(b.requested as i64)),
                (f.s("state"), f.s("active_allocated")),
                (f.s("frames"), f.of(&b.op, &b.label)),
            ]));
            at = addr + b.size;
        }
        if at < address + size {
            out.push(inactive(&mut f, at, address + size - at));
        }
        segs.push(PyValue::dict(vec![
            (f.s("device"), PyValue::Int(0)),
            (f.s("address"), PyValue::Int(address as i64)),
            (f.s("total_size"), PyValue::Int(size as i64)),
            (f.s("allocated_size"), PyValue::Int(allocated as i64)),
            (f.s("active_size"), PyValue::Int(allocated as i64)),
            (f.s("requested_size"), PyValue::Int(requested as i64)),
            (f.s("stream"), PyValue::Int(0)),
            (
                f.s("segment_type"),
                f.s(if pool == PoolKind::Small {
                    "small"
                } else {
                    "large"
                }),
            ),
            (
                f.s("segment_pool_id"),
                PyValue::Tuple(vec![PyValue::Int(0), PyValue::Int(0)].into()),
            ),
            (f.s("is_expandable"), PyValue::Bool(expandable)),
            (f.s("frames"), PyValue::list(Vec::new())),
            (f.s("blocks"), PyValue::list(out)),
        ]));
    }
    let max_split = if settings.max_split_size == u64::MAX {
        -1
    } else {
        settings.max_split_size as i64
    };
    // As PyTorch writes them, so a replay of the file runs under the same
    // rules: every interval's divisions keyed by its start in MiB, the
    // options as a string (vramlab's own among them, which the reader takes
    // from there), and a memory limit under a key of vramlab's own, since
    // garbage collection acts only against one.
    let conf = settings.describe();
    let divisions = settings
        .roundup_power2_divisions
        .iter()
        .enumerate()
        .map(|(i, &d)| (f.s(&(1u64 << i).to_string()), PyValue::Int(d as i64)))
        .collect();
    let mut entries = vec![
        (
            f.s("PYTORCH_CUDA_ALLOC_CONF"),
            f.s(if conf == "(defaults)" { "" } else { &conf }),
        ),
        (f.s("max_split_size"), PyValue::Int(max_split)),
        (
            f.s("garbage_collection_threshold"),
            PyValue::Float(settings.garbage_collection_threshold),
        ),
        (
            f.s("expandable_segments"),
            PyValue::Bool(settings.expandable_segments),
        ),
        (f.s("roundup_power2_divisions"), PyValue::dict(divisions)),
    ];
    if let Some(limit) = settings.memory_limit {
        entries.push((
            f.s(crate::torch_snapshot::MEMORY_LIMIT_KEY),
            PyValue::Int(limit.min(i64::MAX as u64) as i64),
        ));
    }
    let settings = PyValue::dict(entries);
    PyValue::dict(vec![
        (f.s("segments"), PyValue::list(segs)),
        (
            f.s("device_traces"),
            PyValue::list(vec![PyValue::list(trace)]),
        ),
        (f.s("allocator_settings"), settings),
    ])
}
