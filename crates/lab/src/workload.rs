//! Allocation workloads and the harness that runs them through every
//! strategy: peak allocated and reserved, fragmentation (peak reserved /
//! peak live requested, the lower bound for any allocator), device calls,
//! out-of-memory at a capacity, and nanoseconds per operation.

use super::error::LabError;
use super::strategies::planner::{plan, Lifetime};
use super::strategies::{IdMap, Mappings, Strategy};
use super::trace::TraceEvent;
use crate::memory::constants::MAX_BYTES;
use crate::memory::events::{EventKind, MemEvent};
use crate::memory::tag::Category;
use crate::memory::AllocatorConfig;
use serde::Serialize;
use std::collections::HashMap;
use std::io::BufRead;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `category` is what the block holds, where the trace says
    /// (`Untagged` otherwise); only lifetime-aware strategies look at it.
    Alloc {
        id: u64,
        size: u64,
        category: Category,
    },
    Free {
        id: u64,
    },
    EmptyCache,
    /// A request the recording ran out of memory on (a snapshot's `oom`
    /// entry). A replay under a limit asks for it too and gives it back at
    /// once if granted, so whether another setting would have fitted it
    /// shows; without a limit it does nothing.
    Probe {
        size: u64,
    },
}

impl Op {
    /// The id an alloc or free names.
    pub fn id(&self) -> Option<u64> {
        match *self {
            Op::Alloc { id, .. } | Op::Free { id } => Some(id),
            Op::EmptyCache | Op::Probe { .. } => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub ops: Vec<Op>,
    /// The index of the first op after the trace's last `reset_peak` (0
    /// without one): peaks and the lower bound are measured from there, as
    /// PyTorch's `max_memory_allocated()` after `reset_peak_memory_stats()`.
    pub measure_from: usize,
}

impl Workload {
    /// Reads a JSON Lines trace (`replay`'s format); the last `reset_peak`
    /// sets [`Workload::measure_from`]. The error says which line
    /// ([`LabError::AtLine`]).
    pub fn from_trace<R: BufRead>(name: &str, reader: R) -> Result<Workload, LabError> {
        Workload::from_trace_noting(name, reader).map(|(w, _)| w)
    }

    /// [`Workload::from_trace`], with the fields its events carry that the
    /// format does not read.
    pub fn from_trace_noting<R: BufRead>(
        name: &str,
        reader: R,
    ) -> Result<(Workload, super::trace::IgnoredFields), LabError> {
        let mut ignored = super::trace::IgnoredFields::default();
        // The same checks as `replay` (lab/replay.rs): bounded lines, sizes
        // in range, ids allocated and freed in order.
        let mut ops = Vec::new();
        let mut measure_from = 0;
        let mut ids = super::trace::LiveIds::default();
        for item in super::trace::lines(reader) {
            let at = |line: usize, e: LabError| LabError::AtLine {
                line,
                source: Box::new(e),
            };
            let (line, text) = item.map_err(|(line, e)| at(line, e))?;
            let event = TraceEvent::parse_line(&text).map_err(|e| at(line, e))?;
            ids.check(&event).map_err(|e| at(line, e))?;
            ignored.see(line, &text, event.op_name());
            match event {
                TraceEvent::Alloc {
                    id, size, category, ..
                } => ops.push(Op::Alloc {
                    id,
                    size,
                    category: category.unwrap_or_default(),
                }),
                TraceEvent::Free { id } => ops.push(Op::Free { id }),
                TraceEvent::EmptyCache => ops.push(Op::EmptyCache),
                TraceEvent::ResetPeak => measure_from = ops.len(),
            }
        }
        let w = Workload {
            name: name.to_string(),
            ops,
            measure_from,
        };
        Ok((w, ignored))
    }

    /// A recorded event log as a workload (tensors by their requested size).
    pub fn from_events(name: &str, events: &[MemEvent]) -> Workload {
        Workload {
            name: name.to_string(),
            ops: to_trace(events)
                .into_iter()
                .filter_map(|e| match e {
                    TraceEvent::Alloc {
                        id, size, category, ..
                    } => Some(Op::Alloc {
                        id,
                        size,
                        category: category.unwrap_or_default(),
                    }),
                    TraceEvent::Free { id } => Some(Op::Free { id }),
                    _ => None,
                })
                .collect(),
            measure_from: 0,
        }
    }

    /// The peak of live requested bytes from [`Workload::measure_from`]
    /// (what was live then counts): no allocator can do better.
    pub fn lower_bound(&self) -> u64 {
        let mut live: IdMap<u64, u64> = IdMap::default();
        // In u128: live sizes of up to 2^62 each can sum past u64.
        let (mut now, mut peak) = (0u128, 0u128);
        for (i, op) in self.ops.iter().enumerate() {
            if i == self.measure_from {
                peak = now;
            }
            match *op {
                Op::Alloc { id, size, .. } => {
                    if let Some(old) = live.insert(id, size) {
                        now -= old as u128;
                    }
                    now += size as u128;
                    peak = peak.max(now);
                }
                Op::Free { id } => now -= live.remove(&id).unwrap_or(0) as u128,
                Op::EmptyCache | Op::Probe { .. } => {}
            }
        }
        if self.measure_from >= self.ops.len() {
            // A reset after the last op: only what is live at the end.
            peak = now;
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }

    /// Each allocation's lifetime in operation indices (to the end if never
    /// freed), of the allocations live from [`Workload::measure_from`] on:
    /// one live at the reset starts just before it, so an offline plan
    /// covers the same span as the other strategies' peaks.
    pub fn lifetimes(&self) -> Vec<Lifetime> {
        let all = self.all_lifetimes();
        if self.measure_from == 0 {
            return all;
        }
        let start = self.measure_from - 1;
        all.into_iter()
            .filter(|l| l.last > start)
            .map(|l| Lifetime {
                first: l.first.max(start),
                ..l
            })
            .collect()
    }

    fn all_lifetimes(&self) -> Vec<Lifetime> {
        let mut open: IdMap<u64, usize> = IdMap::default();
        let mut out: Vec<Lifetime> = Vec::new();
        for (i, op) in self.ops.iter().enumerate() {
            match *op {
                Op::Alloc { id, size, .. } => {
                    open.insert(id, out.len());
                    out.push(Lifetime {
                        size,
                        first: i,
                        last: self.ops.len(),
                    });
                }
                Op::Free { id } => {
                    if let Some(k) = open.remove(&id) {
                        out[k].last = i;
                    }
                }
                Op::EmptyCache | Op::Probe { .. } => {}
            }
        }
        out
    }

    /// The workload with each refused request ([`Op::Probe`]) granted and
    /// freed at once, under an id no op uses: what serving every request
    /// takes, so a plan of it says whether any packing would have fitted.
    pub fn with_refusals_granted(&self) -> Workload {
        if !self.ops.iter().any(|op| matches!(op, Op::Probe { .. })) {
            return self.clone();
        }
        let mut next = self
            .ops
            .iter()
            .filter_map(Op::id)
            .max()
            .map_or(0, |m| m.saturating_add(1));
        let mut ops = Vec::with_capacity(self.ops.len());
        // A reset after the last op stays after the last op.
        let mut measure_from = usize::MAX;
        for (i, op) in self.ops.iter().enumerate() {
            if i == self.measure_from {
                measure_from = ops.len();
            }
            match *op {
                Op::Probe { size } => {
                    let category = Category::Untagged;
                    ops.push(Op::Alloc {
                        id: next,
                        size,
                        category,
                    });
                    ops.push(Op::Free { id: next });
                    next += 1;
                }
                other => ops.push(other),
            }
        }
        Workload {
            name: self.name.clone(),
            measure_from: measure_from.min(ops.len()),
            ops,
        }
    }

    pub fn allocations(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::Alloc { .. }))
            .count()
    }
}

/// The JSON Lines trace of an event log: ids by address, sizes as requested.
pub fn to_trace(events: &[MemEvent]) -> Vec<TraceEvent> {
    let mut ids: HashMap<u64, u64> = HashMap::new();
    let mut next = 0;
    let mut out = Vec::new();
    for e in events {
        match e.kind {
            EventKind::Alloc => {
                next += 1;
                ids.insert(e.address, next);
                out.push(TraceEvent::Alloc {
                    id: next,
                    size: e.requested,
                    label: (!e.label.is_empty()).then(|| e.label.to_string()),
                    category: (e.category != Category::Untagged).then_some(e.category),
                });
            }
            EventKind::Free => {
                if let Some(id) = ids.remove(&e.address) {
                    out.push(TraceEvent::Free { id });
                }
            }
            _ => {}
        }
    }
    out
}

/// One strategy's result on one workload.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub allocator: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Peak reserved / lower bound; `None` where the strategy ran out of
    /// memory (its peaks then cover a workload with allocations missing).
    pub fragmentation: Option<f64>,
    /// Peak reserved / planner's arena − 1 (filled in by `compare`; `None`
    /// where either ran out of memory).
    pub gap_to_planner: Option<f64>,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub oom: bool,
    pub ooms: u64,
    /// Nanoseconds per operation of the replay loop. `compare_with` reports
    /// the fastest of up to [`TIMING_RUNS`] replays from a fresh strategy
    /// (repeated while under [`TIMING_BUDGET_NS`] in all), so that a trace
    /// of a few thousand operations is not timed by one cold run.
    pub ns_per_op: f64,
    /// Granules mapped and unmapped one at a time (`vramlab` only): each a
    /// cuMemMap / cuMemUnmap on a real device, which `ns_per_op` leaves out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mappings: Option<Mappings>,
    /// (operation index, reserved bytes), sampled for plots.
    #[serde(skip)]
    pub reserved_timeline: Vec<(usize, u64)>,
}

/// Live handles by workload id, indexed rather than hashed where the ids
/// allow: a snapshot numbers its allocations from 1, and its frees of
/// blocks from before the recording from 2^62 up, so two vectors (one from
/// 0, one from the smallest high id) hold both; ids spread wider go to a
/// map. Either acts as a `HashMap`.
struct Live {
    low: Vec<Option<u64>>,
    high_base: u64,
    high: Vec<Option<u64>>,
    sparse: IdMap<u64, u64>,
}

impl Live {
    fn for_ops(ops: &[Op]) -> Live {
        // Each vector stays within a small multiple of the workload.
        let span = 2 * ops.len() as u64 + 1024;
        let ids = || ops.iter().filter_map(Op::id);
        let low = ids().filter(|&id| id < span).max().map_or(0, |m| m + 1);
        let high_base = ids().filter(|&id| id >= span).min().unwrap_or(u64::MAX);
        let high = ids()
            .filter(|&id| id >= high_base && id - high_base < span)
            .map(|id| id - high_base + 1)
            .max()
            .unwrap_or(0);
        Live {
            low: vec![None; low as usize],
            high_base,
            high: vec![None; high as usize],
            sparse: IdMap::default(),
        }
    }

    #[inline]
    fn slot(&mut self, id: u64) -> Option<&mut Option<u64>> {
        if id < self.high_base {
            self.low.get_mut(id as usize)
        } else {
            self.high.get_mut((id - self.high_base) as usize)
        }
    }

    #[inline]
    fn insert(&mut self, id: u64, h: u64) {
        match self.slot(id) {
            Some(slot) => *slot = Some(h),
            None => {
                self.sparse.insert(id, h);
            }
        }
    }

    #[inline]
    fn remove(&mut self, id: u64) -> Option<u64> {
        match self.slot(id) {
            Some(slot) => slot.take(),
            None => self.sparse.remove(&id),
        }
    }
}

/// Runs `w` through `s`. An allocation that fails is counted and skipped
/// (its later free is a no-op), as `replay` does. No device limit applies,
/// so a probe (a request the recording ran out of memory on) asks nothing.
pub fn run(s: &mut dyn Strategy, w: &Workload) -> RunResult {
    run_with(s, w, false)
}

/// [`run`]; with `limited` (the strategy's device has a size or a memory
/// limit) each probe asks for its request and frees it at once if granted,
/// a refusal counted as an out-of-memory, as a snapshot's replay does.
pub fn run_with(s: &mut dyn Strategy, w: &Workload, limited: bool) -> RunResult {
    let (mut peak_alloc, mut peak_res, mut ooms) = (0, 0, 0);
    let every = (w.ops.len() / 2000).max(1);
    let mut timeline = Vec::new();
    let mut next_sample = 0usize;
    let t0 = Instant::now();
    let mut handles = Live::for_ops(&w.ops);
    for (i, op) in w.ops.iter().enumerate() {
        // `reset_peak` before op i: the peaks restart from what is held now.
        if i == w.measure_from {
            (peak_alloc, peak_res) = (s.allocated(), s.reserved());
        }
        match *op {
            Op::Alloc { id, size, category } => match s.malloc(size.max(1), category) {
                Ok(h) => {
                    handles.insert(id, h);
                }
                Err(_) => ooms += 1,
            },
            Op::Free { id } => {
                if let Some(h) = handles.remove(id) {
                    s.free(h);
                }
            }
            Op::EmptyCache => s.empty_cache(),
            Op::Probe { size } if limited => match s.malloc(size.max(1), Category::Untagged) {
                Ok(h) => s.free(h),
                Err(_) => ooms += 1,
            },
            Op::Probe { .. } => {}
        }
        peak_alloc = peak_alloc.max(s.allocated());
        peak_res = peak_res.max(s.reserved());
        // `i % every == 0`, without a division per operation.
        if next_sample == 0 {
            timeline.push((i, s.reserved()));
            next_sample = every;
        }
        next_sample -= 1;
    }
    if w.measure_from >= w.ops.len() {
        (peak_alloc, peak_res) = (s.allocated(), s.reserved());
    }
    let ns = t0.elapsed().as_nanos() as f64 / w.ops.len().max(1) as f64;
    let lb = w.lower_bound();
    RunResult {
        allocator: s.name().to_string(),
        peak_allocated_bytes: peak_alloc,
        peak_reserved_bytes: peak_res,
        fragmentation: (ooms == 0 && lb > 0).then(|| peak_res as f64 / lb as f64),
        gap_to_planner: None,
        device_allocs: s.device_allocs(),
        device_frees: s.device_frees(),
        oom: ooms > 0,
        ooms,
        ns_per_op: ns,
        mappings: s.mappings(),
        reserved_timeline: timeline,
    }
}

/// What a replay may reserve: the device's size or the memory limit,
/// whichever is smaller, where either is set.
pub fn bound(capacity: Option<u64>, memory_limit: Option<u64>) -> Option<u64> {
    match (capacity, memory_limit) {
        (Some(c), Some(l)) => Some(c.min(l)),
        (c, l) => c.or(l),
    }
}

/// The offline planner on `w`: one arena; out of memory if it exceeds `capacity`.
pub fn run_planner(w: &Workload, capacity: Option<u64>) -> RunResult {
    let t0 = Instant::now();
    let p = plan(&w.lifetimes());
    let ns = t0.elapsed().as_nanos() as f64 / w.ops.len().max(1) as f64;
    let lb = w.lower_bound();
    // No device holds more than 2^62 bytes, a simulated one without a
    // size included.
    let oom = p.arena > capacity.unwrap_or(MAX_BYTES).min(MAX_BYTES);
    // An arena past the device is refused whole: nothing is reserved, as
    // a device reports it (the arena it needed is the lower bound's row).
    let held = if oom { 0 } else { p.arena };
    RunResult {
        allocator: "planner".into(),
        peak_allocated_bytes: held,
        peak_reserved_bytes: held,
        // Ratios of nothing (a trace with no allocation) are no figures.
        fragmentation: (!oom && lb > 0).then(|| p.arena as f64 / lb as f64),
        gap_to_planner: (!oom && p.arena > 0).then_some(0.0),
        device_allocs: u64::from(held > 0),
        device_frees: 0,
        oom,
        ooms: oom as u64,
        ns_per_op: ns,
        mappings: None,
        reserved_timeline: vec![(0, held), (w.ops.len(), held)],
    }
}

fn unknown(name: &str) -> LabError {
    LabError::UnknownAllocator {
        name: name.to_string(),
        known: &super::strategies::NAMES,
    }
}

/// Most replays `compare_with` times each online strategy with.
pub const TIMING_RUNS: usize = 20;
/// Replays are repeated only while one strategy's have taken less than
/// this in all (20 ms): a short trace is timed more than once, a long one
/// once.
pub const TIMING_BUDGET_NS: f64 = 20e6;

/// Every named strategy on `w` under PyTorch's default settings.
pub fn compare(
    w: &Workload,
    names: &[&str],
    capacity: Option<u64>,
) -> Result<Vec<RunResult>, LabError> {
    compare_with(w, names, capacity, &AllocatorConfig::default())
}

/// Every named strategy on `w`. `config` is what `--alloc-conf` and
/// `--memory-limit` say: `pytorch` runs under it, `vramlab` and
/// `expandable` under it plus their own options, and the memory limit caps
/// every strategy's device. The offline planner (quadratic in the worst
/// case) runs only when named, and only then is each gap to it reported.
pub fn compare_with(
    w: &Workload,
    names: &[&str],
    capacity: Option<u64>,
    config: &AllocatorConfig,
) -> Result<Vec<RunResult>, LabError> {
    let capacity = bound(capacity, config.memory_limit);
    for &name in names {
        if name != "planner" && !super::strategies::NAMES.contains(&name) {
            return Err(unknown(name));
        }
    }
    let planner = names.contains(&"planner").then(|| run_planner(w, capacity));
    let mut out = Vec::new();
    for &name in names {
        let mut r = match (name, &planner) {
            ("planner", Some(p)) => p.clone(),
            _ => {
                let fresh = || {
                    super::strategies::online_configured(name, capacity, config)
                        .ok_or_else(|| unknown(name))
                };
                let limited = capacity.is_some();
                let mut r = run_with(fresh()?.as_mut(), w, limited);
                // A replay is deterministic: the repeats only time it again.
                let ops = w.ops.len().max(1) as f64;
                let mut spent = r.ns_per_op * ops;
                for _ in 1..TIMING_RUNS {
                    if spent >= TIMING_BUDGET_NS {
                        break;
                    }
                    let again = run_with(fresh()?.as_mut(), w, limited);
                    debug_assert_eq!(again.peak_reserved_bytes, r.peak_reserved_bytes);
                    r.ns_per_op = r.ns_per_op.min(again.ns_per_op);
                    spent += again.ns_per_op * ops;
                }
                r
            }
        };
        r.gap_to_planner = planner
            .as_ref()
            .filter(|p| !p.oom && !r.oom && p.peak_reserved_bytes > 0)
            .map(|p| r.peak_reserved_bytes as f64 / p.peak_reserved_bytes as f64 - 1.0);
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot's refused request, granted and freed at once, counts
    /// toward the lower bound and the planner's arena; the reset stays on
    /// the op it was before.
    #[test]
    fn refused_requests_granted_count_toward_the_plan() {
        // 1 MiB and 18 MiB live when 10.5 MiB was refused (a snapshot's oom).
        let alloc = |id, size| Op::Alloc {
            id,
            size,
            category: Category::Untagged,
        };
        let w = Workload {
            name: "oom".into(),
            ops: vec![
                alloc(1, 15 << 20),
                alloc(2, 1 << 20),
                Op::Free { id: 1 },
                Op::EmptyCache,
                alloc(3, 18 << 20),
                Op::Probe { size: 21 << 19 },
                Op::Free { id: 3 },
                Op::Free { id: 2 },
            ],
            measure_from: 4,
        };
        let granted = w.with_refusals_granted();
        assert_eq!(w.lower_bound(), 19 << 20);
        assert_eq!(granted.lower_bound(), (19 << 20) + (21 << 19));
        assert_eq!(granted.measure_from, 4);
        assert_eq!(granted.ops.len(), w.ops.len() + 1);
        // The grant's id is new, and it is freed before anything else is.
        assert!(matches!(granted.ops[5], Op::Alloc { id: 4, .. }));
        assert!(matches!(granted.ops[6], Op::Free { id: 4 }));
        let arena = run_planner(&granted, None).peak_reserved_bytes;
        assert!(arena >= (19 << 20) + (21 << 19), "{arena}");
        // A refusal before the reset moves the reset one op on.
        let early = Workload {
            ops: [vec![Op::Probe { size: 1 << 20 }], w.ops.clone()].concat(),
            measure_from: 5,
            ..w.clone()
        };
        let g = early.with_refusals_granted();
        assert_eq!(g.measure_from, 6);
        assert!(matches!(g.ops[6], Op::Alloc { id: 3, .. }), "{:?}", g.ops);
        // A reset after the last op stays after the last op.
        let end = Workload {
            measure_from: w.ops.len(),
            ..w
        };
        let g = end.with_refusals_granted();
        assert_eq!(g.measure_from, g.ops.len());
    }

    /// `--allocators` ignored `reset_peak`: its rows kept the 30 MiB before
    /// the reset while a plain replay reported the peaks after it.
    #[test]
    fn peaks_are_measured_from_the_last_reset_peak() {
        let trace = [
            r#"{"op":"alloc","id":1,"size":31457280}"#,
            r#"{"op":"alloc","id":3,"size":4096}"#,
            r#"{"op":"free","id":1}"#,
            r#"{"op":"empty_cache"}"#,
            r#"{"op":"reset_peak"}"#,
            r#"{"op":"alloc","id":2,"size":1000}"#,
        ]
        .join("\n");
        let w = Workload::from_trace("rp", trace.as_bytes()).unwrap();
        assert_eq!(w.measure_from, 4);
        assert_eq!(w.lower_bound(), 4096 + 1000);
        let names = ["pytorch", "expandable", "nocache", "planner", "vramlab"];
        for r in compare(&w, &names, None).unwrap() {
            let name = &r.allocator;
            assert!(r.peak_allocated_bytes < 1 << 20, "{name}: {r:?}");
            assert!(r.peak_reserved_bytes < 30 << 20, "{name}: {r:?}");
            let f = r.fragmentation.unwrap();
            assert!(f >= 1.0, "{name}: fragmentation {f} below the lower bound");
        }
        let pytorch = &compare(&w, &["pytorch"], None).unwrap()[0];
        // Two 512-byte blocks in one 2 MiB segment, as a plain replay says.
        assert_eq!(pytorch.peak_allocated_bytes, 4096 + 1024);
        assert_eq!(pytorch.peak_reserved_bytes, 2 << 20);
        // Without the reset, the 30 MiB counts.
        let whole = Workload {
            measure_from: 0,
            ..w.clone()
        };
        assert_eq!(whole.lower_bound(), 31457280 + 4096);
        // A reset after the last op: what is held at the end.
        let end = Workload {
            measure_from: w.ops.len(),
            ..w
        };
        assert_eq!(end.lower_bound(), 4096 + 1000);
        let r = &compare(&end, &["pytorch", "planner"], None).unwrap();
        assert_eq!(r[0].peak_allocated_bytes, 4096 + 1024);
        // The planner's arena: the two blocks live at the end (512-byte aligned).
        assert_eq!(r[1].peak_reserved_bytes, 4096 + 1024);
    }
}
