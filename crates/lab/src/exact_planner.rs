//! An exact offline planner in the style of MiniMalloc (Moffitt, "MiniMalloc:
//! A Lightweight Memory Allocator for Hardware-Accelerated Machine Learning",
//! ASPLOS 2023): given buffers with sizes and half-open lifetimes, find
//! offsets so that no two buffers live at the same time share a byte, with
//! the smallest arena (max offset + size).
//!
//! The search solves the decision problem "does everything fit in capacity
//! C?" by depth-first branch and bound over *canonical* placements — each
//! buffer at the lowest offset its already-placed temporal neighbours allow,
//! buffers taken in non-decreasing (offset, static order) — with
//! MiniMalloc's pruning: per-section inference (the floor of each time
//! section plus the unplaced bytes live there must fit under C), dominance
//! (never leave a gap an unplaced buffer could fill), the unallocated floor,
//! the monotonic floor, hatless pruning and dynamic temporal decomposition
//! (once no unplaced buffer crosses a section boundary, the two sides are
//! solved independently). Sections are MiniMalloc's (one per distinct end
//! time) and every update is incremental with undo logs; on MiniMalloc's
//! challenging instances the search visits MiniMalloc's own node counts.
//! The driver starts from a greedy incumbent and the peak-live lower bound,
//! both on multiples of the sizes' gcd, probes the lower bound first, then
//! binary-searches the capacity with growing node limits and three static
//! orders (MiniMalloc's round robin) until the bounds meet or the time
//! budget runs out. An exhausted search at capacity C proves the next
//! multiple of the gcd a lower bound.

use crate::error::LabError;
use crate::intervals::{peak_live, validate, Interval};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::{Duration, Instant};

/// What [`plan`] found: a valid plan and how good it is known to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExactPlan {
    /// Offset of each interval, in input order.
    pub offsets: Vec<u64>,
    /// The arena the plan needs: max over buffers of offset + size.
    pub arena: u64,
    /// A proven lower bound on every plan's arena.
    pub lower_bound: u64,
    /// True only when `arena == lower_bound` (proven optimal).
    pub optimal: bool,
    /// Search nodes visited, over all probes.
    pub nodes: u64,
    /// Wall time spent.
    pub elapsed: Duration,
}

/// Proves a plan valid: returns its arena, or which two buffers collide.
pub fn verify(intervals: &[Interval], offsets: &[u64]) -> Result<u64, LabError> {
    validate(intervals)?;
    if offsets.len() != intervals.len() {
        return Err(LabError::OffsetCount {
            offsets: offsets.len(),
            intervals: intervals.len(),
        });
    }
    let mut arena = 0u64;
    let mut events: Vec<(i64, bool, usize)> = Vec::with_capacity(2 * intervals.len());
    for (k, i) in intervals.iter().enumerate() {
        let end = offsets[k]
            .checked_add(i.size)
            .ok_or(LabError::OffsetOverflow {
                index: k,
                id: i.id,
                offset: offsets[k],
                size: i.size,
            })?;
        arena = arena.max(end);
        events.push((i.lower, true, k));
        events.push((i.upper, false, k));
    }
    // At equal times frees (false) come first: lifetimes are half open.
    events.sort_unstable();
    // Live buffers by offset: offset -> (end, index). They never overlap in
    // memory, so checking a newcomer against its neighbours suffices.
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    let clash = |a: usize, b: usize| LabError::Overlap {
        a: intervals[a],
        a_offset: offsets[a],
        b: intervals[b],
        b_offset: offsets[b],
    };
    for (_, alloc, k) in events {
        let start = offsets[k];
        if !alloc {
            live.remove(&start);
            continue;
        }
        let end = start + intervals[k].size;
        if let Some((_, &(pend, p))) = live.range(..=start).next_back() {
            if pend > start {
                return Err(clash(p, k));
            }
        }
        if let Some((&nstart, &(_, q))) = live
            .range((Bound::Excluded(start), Bound::Unbounded))
            .next()
        {
            if nstart < end {
                return Err(clash(k, q));
            }
        }
        live.insert(start, (end, k));
    }
    Ok(arena)
}

/// The arena of a plan (max offset + size), without checking it.
pub fn arena_of(intervals: &[Interval], offsets: &[u64]) -> u64 {
    intervals
        .iter()
        .zip(offsets)
        .map(|(i, &o)| o + i.size)
        .max()
        .unwrap_or(0)
}

/// The static lower bound: the peak over time of the sum of live sizes.
pub fn lower_bound(intervals: &[Interval]) -> u64 {
    peak_live(intervals)
}

/// For each interval, the indices of those whose lifetimes overlap it.
fn overlap_lists(intervals: &[Interval]) -> Vec<Vec<u32>> {
    let n = intervals.len();
    let mut by_lower: Vec<usize> = (0..n).collect();
    by_lower.sort_unstable_by_key(|&k| intervals[k].lower);
    let mut out = vec![Vec::new(); n];
    for (a, &i) in by_lower.iter().enumerate() {
        for &j in &by_lower[a + 1..] {
            if intervals[j].lower >= intervals[i].upper {
                break;
            }
            out[i].push(j as u32);
            out[j].push(i as u32);
        }
    }
    out
}

/// Places buffers in `order`, each in the best-fitting (smallest) gap among
/// the placed buffers whose lifetimes overlap its own, else on top.
fn greedy_in_order(intervals: &[Interval], overlaps: &[Vec<u32>], order: &[usize]) -> Vec<u64> {
    const NONE: u64 = u64::MAX;
    let mut offsets = vec![NONE; intervals.len()];
    let mut near: Vec<(u64, u64)> = Vec::new();
    for &b in order {
        let size = intervals[b].size;
        near.clear();
        near.extend(
            overlaps[b]
                .iter()
                .filter(|&&j| offsets[j as usize] != NONE)
                .map(|&j| (offsets[j as usize], intervals[j as usize].size)),
        );
        near.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        let mut prev_end = 0;
        for &(off, len) in &near {
            if off >= prev_end + size {
                let gap = off - prev_end;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, prev_end));
                }
            }
            prev_end = prev_end.max(off + len);
        }
        offsets[b] = best.map_or(prev_end, |(_, o)| o);
    }
    offsets
}

/// The greedy incumbent: best-fit placement in several orders (size, area,
/// lifetime length, start time), the smallest arena kept.
pub fn greedy(intervals: &[Interval]) -> Vec<u64> {
    let overlaps = overlap_lists(intervals);
    let n = intervals.len();
    let width = |k: usize| (intervals[k].upper - intervals[k].lower) as u128;
    let keys: [&dyn Fn(usize, usize) -> Ordering; 4] = [
        &|a, b| intervals[b].size.cmp(&intervals[a].size),
        &|a, b| (intervals[b].size as u128 * width(b)).cmp(&(intervals[a].size as u128 * width(a))),
        &|a, b| width(b).cmp(&width(a)),
        &|a, b| intervals[a].lower.cmp(&intervals[b].lower),
    ];
    let mut best: Option<(u64, Vec<u64>)> = None;
    for key in keys {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| key(a, b).then(intervals[b].size.cmp(&intervals[a].size)));
        let offsets = greedy_in_order(intervals, &overlaps, &order);
        let arena = arena_of(intervals, &offsets);
        if best.as_ref().is_none_or(|(a, _)| arena < *a) {
            best = Some((arena, offsets));
        }
    }
    best.map(|(_, o)| o).unwrap_or_default()
}

/// The problem as the search sees it: time cut into sections, one per
/// distinct end time (MiniMalloc's sweep): section `k` is the cross section
/// of buffers live just before the `k`-th end time. These are the maximal
/// cross sections (every other instant's live set is contained in one), so
/// they carry every constraint the finer cut between all endpoints would,
/// with fewer sections to update. Each buffer spans a contiguous range.
struct Prep {
    size: Vec<u64>,
    /// Section span `[lo, hi)` of each buffer.
    lo: Vec<usize>,
    hi: Vec<usize>,
    width: Vec<u64>,
    overlaps: Vec<Vec<u32>>,
    /// Buffers live in each section.
    live: Vec<Vec<u32>>,
    /// Per section boundary s (between s and s + 1): buffers spanning it.
    cuts: Vec<u32>,
}

impl Prep {
    fn new(intervals: &[Interval]) -> Prep {
        let mut ends: Vec<i64> = intervals.iter().map(|i| i.upper).collect();
        ends.sort_unstable();
        ends.dedup();
        let nsec = ends.len();
        // Live just before end time e: lower < e <= upper.
        let lo: Vec<usize> = intervals
            .iter()
            .map(|i| ends.partition_point(|&e| e <= i.lower))
            .collect();
        let hi: Vec<usize> = intervals
            .iter()
            .map(|i| ends.partition_point(|&e| e <= i.upper))
            .collect();
        let mut live = vec![Vec::new(); nsec];
        let mut cuts = vec![0u32; nsec.saturating_sub(1)];
        for b in 0..intervals.len() {
            for (s, l) in live.iter_mut().enumerate().take(hi[b]).skip(lo[b]) {
                l.push(b as u32);
                if s + 1 < hi[b] {
                    cuts[s] += 1;
                }
            }
        }
        Prep {
            size: intervals.iter().map(|i| i.size).collect(),
            width: intervals
                .iter()
                .map(|i| i.upper.abs_diff(i.lower))
                .collect(),
            lo,
            hi,
            overlaps: overlap_lists(intervals),
            live,
            cuts,
        }
    }
}

/// How one decision search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Found,
    /// Search space exhausted: nothing fits in the capacity.
    NotFound,
    /// Node limit reached.
    Aborted,
    /// Time budget spent.
    Timeout,
}

const NONE: u64 = u64::MAX;

/// The dynamic-order entries the search path may hold at once: 16 Mi of
/// 16 bytes, 256 MiB.
const PATH_ENTRIES: usize = 16 << 20;

/// MiniMalloc's static orders: W width, A area, T max section total, Z size.
const HEURISTICS: [&[u8]; 3] = [b"WAT", b"TAW", b"TWA"];

/// One decision search: does everything fit under `cap`?
struct Search<'a> {
    p: &'a Prep,
    cap: u64,
    heuristic: &'a [u8],
    off: Vec<u64>,
    sol: Vec<u64>,
    min_off: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    /// Per section, its unplaced buffers (in any order; swap-removed when
    /// placed, restored on undo).
    unplaced: Vec<Vec<u32>>,
    /// Where buffer b sits in `unplaced[s]`: `slot[base[b] + s - lo[b]]`.
    slot: Vec<u32>,
    base: Vec<usize>,
    off_changes: Vec<(u32, u64)>,
    sec_changes: Vec<(usize, u64)>,
    nodes: u64,
    limit: u64,
    deadline: Instant,
    /// Dynamic-order entries held by the nodes on the current path, and
    /// how many they may hold ([`PATH_ENTRIES`]; tests lower it).
    path: usize,
    path_limit: usize,
}

impl<'a> Search<'a> {
    fn new(p: &'a Prep, cap: u64, heuristic: &'a [u8], limit: u64, deadline: Instant) -> Self {
        let n = p.size.len();
        let nsec = p.live.len();
        let mut total = vec![0u64; nsec];
        for (s, l) in p.live.iter().enumerate() {
            total[s] = l.iter().map(|&b| p.size[b as usize]).sum();
        }
        let mut base = Vec::with_capacity(n);
        let mut spans = 0;
        for b in 0..n {
            base.push(spans);
            spans += p.hi[b] - p.lo[b];
        }
        let unplaced = p.live.clone();
        let mut slot = vec![0u32; spans];
        for (s, l) in unplaced.iter().enumerate() {
            for (i, &b) in l.iter().enumerate() {
                let b = b as usize;
                slot[base[b] + s - p.lo[b]] = i as u32;
            }
        }
        Search {
            p,
            cap,
            heuristic,
            off: vec![NONE; n],
            sol: vec![NONE; n],
            min_off: vec![0; n],
            floor: vec![0; nsec],
            total,
            cuts: p.cuts.clone(),
            unplaced,
            slot,
            base,
            off_changes: Vec::new(),
            sec_changes: Vec::new(),
            nodes: 0,
            limit,
            deadline,
            path: 0,
            path_limit: PATH_ENTRIES,
        }
    }

    /// Solves every initial partition (split where no buffer crosses).
    fn run(&mut self) -> Status {
        let nsec = self.p.live.len();
        let mut start = 0;
        for s in 0..nsec {
            if s + 1 == nsec || self.cuts[s] == 0 {
                // Each buffer once: in the section where it starts.
                let p = self.p;
                let bufs: Vec<u32> = (start..=s)
                    .flat_map(|x| {
                        p.live[x]
                            .iter()
                            .copied()
                            .filter(move |&b| p.lo[b as usize] == x)
                    })
                    .collect();
                if !bufs.is_empty() {
                    let st = self.sub_solve(&bufs, (start, s + 1));
                    if st != Status::Found {
                        return st;
                    }
                }
                start = s + 1;
            }
        }
        Status::Found
    }

    /// The static order: `a` and `b` with their max section totals.
    fn compare(&self, (a, ta): (u32, u64), (b, tb): (u32, u64)) -> Ordering {
        let (x, y) = (a as usize, b as usize);
        let p = self.p;
        for &c in self.heuristic {
            let o = match c {
                b'W' => p.width[y].cmp(&p.width[x]),
                b'A' => (p.size[y] as u128 * p.width[y] as u128)
                    .cmp(&(p.size[x] as u128 * p.width[x] as u128)),
                b'T' => tb.cmp(&ta),
                b'Z' => p.size[y].cmp(&p.size[x]),
                _ => Ordering::Equal,
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        x.cmp(&y)
    }

    /// Orders a partition's buffers statically, then searches it.
    fn sub_solve(&mut self, bufs: &[u32], range: (usize, usize)) -> Status {
        let p = self.p;
        // T: the largest unplaced total among the sections a buffer spans.
        let mut keyed: Vec<(u32, u64)> = bufs
            .iter()
            .map(|&b| {
                let (lo, hi) = (p.lo[b as usize], p.hi[b as usize]);
                (b, self.total[lo..hi].iter().copied().max().unwrap_or(0))
            })
            .collect();
        keyed.sort_by(|&a, &b| self.compare(a, b));
        let pre: Vec<u32> = keyed.iter().map(|&(b, _)| b).collect();
        self.search(&pre, None, range, 0, 0)
    }

    /// Whether every section of the partition still fits under the capacity.
    fn check(&self, range: (usize, usize), offset: u64) -> bool {
        (range.0..range.1).all(|s| self.floor[s].max(offset) + self.total[s] <= self.cap)
    }

    /// The unplaced buffers of the partition by (minimum offset, preorder
    /// index), from scratch.
    fn fresh_order(&self, pre: &[u32]) -> Vec<(u64, u32)> {
        let mut ordering: Vec<(u64, u32)> = (0..pre.len() as u32)
            .filter(|&k| self.off[pre[k as usize] as usize] == NONE)
            .map(|k| (self.min_off[pre[k as usize] as usize], k))
            .collect();
        ordering.sort_unstable();
        ordering
    }

    /// The same from the parent's order `orig`, sorted by the keys of one
    /// placement ago: only the buffers that placement raised have new keys,
    /// so the kept ones stay sorted and the raised ones (few, sorted apart)
    /// are merged back in: O(m).
    fn merged_order(&self, pre: &[u32], orig: &[(u64, u32)]) -> Vec<(u64, u32)> {
        let mut ordering: Vec<(u64, u32)> = Vec::with_capacity(orig.len());
        let mut raised: Vec<(u64, u32)> = Vec::new();
        for &(o, k) in orig {
            let b = pre[k as usize] as usize;
            if self.off[b] != NONE {
                continue;
            }
            let m = self.min_off[b];
            if m == o {
                ordering.push((o, k));
            } else {
                raised.push((m, k));
            }
        }
        if raised.is_empty() {
            return ordering;
        }
        raised.sort_unstable();
        let kept = std::mem::replace(&mut ordering, Vec::with_capacity(orig.len()));
        let (mut i, mut j) = (0, 0);
        while i < kept.len() && j < raised.len() {
            if kept[i] < raised[j] {
                ordering.push(kept[i]);
                i += 1;
            } else {
                ordering.push(raised[j]);
                j += 1;
            }
        }
        ordering.extend_from_slice(&kept[i..]);
        ordering.extend_from_slice(&raised[j..]);
        ordering
    }

    /// One node: `orig` is the parent's order (None: build it afresh).
    fn search(
        &mut self,
        pre: &[u32],
        orig: Option<&[(u64, u32)]>,
        range: (usize, usize),
        min_offset: u64,
        min_pre: u32,
    ) -> Status {
        if self.nodes >= self.limit {
            return Status::Aborted;
        }
        self.nodes += 1;
        if self.nodes & 15 == 0 && Instant::now() >= self.deadline {
            return Status::Timeout;
        }
        let mut ordering = match orig {
            Some(orig) => self.merged_order(pre, orig),
            None => self.fresh_order(pre),
        };
        if ordering.is_empty() {
            return Status::Found;
        }
        // Every node on the path keeps its order while its children search
        // (O(m) each: O(n^2) along a deep path of a large instance). Past
        // PATH_ENTRIES a node lets go of its order while a child searches
        // and rebuilds it afterwards (O(m log m) per child instead).
        let held = if self.path + ordering.len() <= self.path_limit {
            ordering.len()
        } else {
            0
        };
        self.path += held;
        let status = self.expand(pre, &mut ordering, held > 0, range, min_offset, min_pre);
        self.path -= held;
        status
    }

    /// Tries each candidate of a node in turn.
    fn expand(
        &mut self,
        pre: &[u32],
        ordering: &mut Vec<(u64, u32)>,
        keep: bool,
        range: (usize, usize),
        min_offset: u64,
        min_pre: u32,
    ) -> Status {
        debug_assert!(ordering.windows(2).all(|w| w[0] < w[1]));
        let p = self.p;
        let min_height = ordering
            .iter()
            .map(|&(o, k)| o + p.size[pre[k as usize] as usize])
            .min()
            .unwrap_or(NONE);
        let mut i = 0;
        while i < ordering.len() {
            let (o, k) = ordering[i];
            i += 1;
            // Dominance: an unplaced buffer would fit entirely below.
            if o >= min_height {
                break;
            }
            // Canonical order: non-decreasing (offset, preorder index).
            if o < min_offset || (o == min_offset && k < min_pre) {
                continue;
            }
            // Floors only rise, so a section that cannot take its unplaced
            // bytes above `o` now never will, for this or any later (higher)
            // candidate.
            if !self.check(range, o) {
                break;
            }
            let b = pre[k as usize] as usize;
            let top = o + p.size[b];
            self.off[b] = o;
            self.sol[b] = o;
            // Raise the minimum offsets of unplaced temporal neighbours.
            let oc = self.off_changes.len();
            let mut hatless = true;
            // The sections whose lowest unplaced minimum offset may have
            // risen: those of the raised neighbours. Each neighbour's span
            // meets b's, so outside b's span their union is contiguous; the
            // hull with b's span is rescanned (a superset: a floor recomputed
            // where nothing changed is still a floor).
            let (mut a_lo, mut a_hi) = (usize::MAX, 0);
            for &j in &p.overlaps[b] {
                let j = j as usize;
                if self.off[j] != NONE {
                    continue;
                }
                hatless = false;
                if self.min_off[j] >= top {
                    continue;
                }
                self.off_changes.push((j as u32, self.min_off[j]));
                self.min_off[j] = top;
                a_lo = a_lo.min(p.lo[j]);
                a_hi = a_hi.max(p.hi[j]);
            }
            if a_lo < a_hi {
                a_lo = a_lo.min(p.lo[b]);
                a_hi = a_hi.max(p.hi[b]);
            }
            // Section floors and unplaced totals.
            let sc = self.sec_changes.len();
            for s in p.lo[b]..p.hi[b] {
                self.sec_changes.push((s, self.floor[s]));
                self.floor[s] = self.floor[s].max(top);
                self.total[s] -= p.size[b];
                // Swap-remove b from the section's unplaced list.
                let i = self.slot[self.base[b] + s - p.lo[b]] as usize;
                let list = &mut self.unplaced[s];
                let last = list.pop().unwrap_or(b as u32);
                if last as usize != b {
                    list[i] = last;
                    let l = last as usize;
                    self.slot[self.base[l] + s - p.lo[l]] = i as u32;
                }
            }
            // Unallocated floor: no section's floor is below its lowest
            // unplaced buffer's minimum offset m. The floor only serves the
            // check max(floor, o) + total <= cap, so the scan stops at the
            // first buffer at or below max(floor, cap - total): then m fits
            // and the check's outcome is the same with the old floor, and
            // stays so until the section's total or minimum offsets change,
            // which brings it back into this range.
            for s in a_lo..a_hi {
                let f = self.floor[s];
                let enough = f.max(self.cap.saturating_sub(self.total[s]));
                let mut m = NONE;
                for &x in &self.unplaced[s] {
                    m = m.min(self.min_off[x as usize]);
                    if m <= enough {
                        break;
                    }
                }
                if m != NONE && enough < m {
                    self.sec_changes.push((s, f));
                    self.floor[s] = m;
                }
            }
            let status = if self.check(range, o) {
                if keep {
                    self.decompose(pre, Some(ordering), range, o, k, b)
                } else {
                    *ordering = Vec::new();
                    self.decompose(pre, None, range, o, k, b)
                }
            } else {
                Status::NotFound
            };
            // Undo.
            while self.sec_changes.len() > sc {
                let (s, f) = self.sec_changes.pop().unwrap_or((0, 0));
                self.floor[s] = f;
            }
            for s in (p.lo[b]..p.hi[b]).rev() {
                self.total[s] += p.size[b];
                // Undo the swap-remove: b back at its slot, the buffer that
                // took it back at the end.
                let i = self.slot[self.base[b] + s - p.lo[b]] as usize;
                let list = &mut self.unplaced[s];
                if i == list.len() {
                    list.push(b as u32);
                } else {
                    let moved = list[i];
                    list.push(moved);
                    list[i] = b as u32;
                    let m = moved as usize;
                    self.slot[self.base[m] + s - p.lo[m]] = (list.len() - 1) as u32;
                }
            }
            while self.off_changes.len() > oc {
                let (j, m) = self.off_changes.pop().unwrap_or((0, 0));
                self.min_off[j as usize] = m;
            }
            self.off[b] = NONE;
            if status != Status::NotFound {
                return status;
            }
            if ordering.is_empty() {
                // Let go of during the child's search: the state is back as
                // it was, so is the order; go on after (o, k).
                *ordering = self.fresh_order(pre);
                i = ordering
                    .binary_search(&(o, k))
                    .map_or(ordering.len(), |x| x + 1);
            }
            // Hatless: nothing unplaced lives beside b, so no other choice
            // here can do better than the one that just failed.
            if hatless {
                break;
            }
        }
        Status::NotFound
    }

    /// After placing `b`: if boundaries lost their last crossing buffer,
    /// solves the pieces independently; else continues the search.
    fn decompose(
        &mut self,
        pre: &[u32],
        ordering: Option<&[(u64, u32)]>,
        range: (usize, usize),
        o: u64,
        k: u32,
        b: usize,
    ) -> Status {
        let p = self.p;
        let mut cutpoints = Vec::new();
        for s in p.lo[b]..p.hi[b].saturating_sub(1) {
            self.cuts[s] -= 1;
            if self.cuts[s] == 0 {
                cutpoints.push(s + 1);
            }
        }
        let status = if cutpoints.is_empty() {
            self.search(pre, ordering, range, o, k)
        } else {
            let mut bounds = vec![range.0];
            bounds.extend(cutpoints);
            bounds.push(range.1);
            let mut status = Status::Found;
            for w in bounds.windows(2) {
                let (c0, c1) = (w[0], w[1]);
                let bufs: Vec<u32> = pre
                    .iter()
                    .copied()
                    .filter(|&x| {
                        let x = x as usize;
                        self.off[x] == NONE && p.lo[x] < c1 && c0 < p.hi[x]
                    })
                    .collect();
                if bufs.is_empty() {
                    continue;
                }
                let st = self.sub_solve(&bufs, (c0, c1));
                if st != Status::Found {
                    status = st;
                    break;
                }
            }
            status
        };
        for s in p.lo[b]..p.hi[b].saturating_sub(1) {
            self.cuts[s] += 1;
        }
        status
    }
}

/// The outcome of probing one capacity.
enum Probe {
    Found(Vec<u64>),
    NotFound,
    Aborted,
    Timeout,
}

/// Runs the decision search at `cap` with each static order in turn.
fn probe(p: &Prep, cap: u64, limit: u64, deadline: Instant, nodes: &mut u64) -> Probe {
    for h in HEURISTICS {
        let mut s = Search::new(p, cap, h, limit, deadline);
        let st = s.run();
        *nodes += s.nodes;
        match st {
            Status::Found => return Probe::Found(s.sol),
            Status::NotFound => return Probe::NotFound,
            Status::Timeout => return Probe::Timeout,
            Status::Aborted => {}
        }
    }
    Probe::Aborted
}

/// Runs `f` on a thread with a 512 MiB stack (the search recurses once per
/// buffer placed), or here if no such thread can be made; a panic in `f`
/// carries on here.
fn on_big_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let task = std::sync::Mutex::new(Some(f));
    let take = || task.lock().ok().and_then(|mut t| t.take());
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .stack_size(512 << 20)
            .spawn_scoped(scope, || take().map(|f| f()));
        let done = match spawned {
            Ok(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
            Err(_) => None,
        };
        match done {
            Some(v) => v,
            None => take().map(|f| f()).expect("the search ran nowhere"),
        }
    })
}

/// What [`fit`] found at one capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fit {
    /// A plan within the capacity, if one was found.
    pub offsets: Option<Vec<u64>>,
    /// True when the search was exhausted: no plan fits the capacity.
    pub exhausted: bool,
    /// Search nodes visited.
    pub nodes: u64,
}

/// MiniMalloc's own question: does everything fit in `capacity`? Searches
/// until a plan is found, the search is exhausted, or `budget` runs out.
pub fn fit(intervals: &[Interval], capacity: u64, budget: Duration) -> Fit {
    if let Err(e) = validate(intervals) {
        panic!("exact_planner::fit: {e}");
    }
    let p = Prep::new(intervals);
    let mut nodes = 0;
    let deadline = Instant::now() + budget;
    let mut limit = intervals.len() as u64;
    // MiniMalloc's round robin: each static order in turn, the node limit
    // doubled each round.
    let (offsets, exhausted) = on_big_stack(|| loop {
        limit = limit.saturating_mul(2);
        match probe(&p, capacity, limit, deadline, &mut nodes) {
            Probe::Found(o) => break (Some(o), false),
            Probe::NotFound => break (None, true),
            Probe::Timeout => break (None, false),
            Probe::Aborted => {}
        }
    });
    Fit {
        offsets,
        exhausted,
        nodes,
    }
}

/// Plans the intervals within `budget`: the best plan found, a proven lower
/// bound, and whether the two meet. Panics on invalid intervals (see
/// [`crate::intervals::validate`]).
pub fn plan(intervals: &[Interval], budget: Duration) -> ExactPlan {
    let start = Instant::now();
    if let Err(e) = validate(intervals) {
        panic!("exact_planner::plan: {e}");
    }
    let mut best = greedy(intervals);
    let mut ub = arena_of(intervals, &best);
    let mut lb = lower_bound(intervals);
    let mut nodes = 0u64;
    if lb < ub {
        let p = Prep::new(intervals);
        let deadline = start + budget;
        let mut st = Bounds {
            best,
            ub,
            lb,
            nodes,
        };
        on_big_stack(|| drive(intervals, &p, deadline, &mut st));
        (best, ub, lb, nodes) = (st.best, st.ub, st.lb, st.nodes);
    }
    ExactPlan {
        offsets: best,
        arena: ub,
        lower_bound: lb.min(ub),
        optimal: lb >= ub,
        nodes,
        elapsed: start.elapsed(),
    }
}

/// The incumbent, the bounds and the nodes spent so far.
#[derive(Clone)]
struct Bounds {
    best: Vec<u64>,
    ub: u64,
    lb: u64,
    nodes: u64,
}

/// The greatest common divisor of the sizes: every canonical plan (each
/// buffer on the top of another or at 0) puts every offset, hence the arena,
/// on a multiple of it, and every plan can be made canonical without
/// growing, so the optimum is a multiple too.
fn size_gcd(intervals: &[Interval]) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    intervals.iter().fold(0, |g, i| gcd(g, i.size)).max(1)
}

/// The anytime loop. Each round (node limit doubled) first asks whether the
/// lower bound itself fits (a yes is optimal), then binary-searches the
/// capacities between the bounds, on multiples of the sizes' gcd, at a
/// quarter of the round's limit: plans at slack capacities come cheap, and
/// the lower-bound probe, which settles most instances, keeps most of the
/// nodes.
fn drive(intervals: &[Interval], p: &Prep, deadline: Instant, st: &mut Bounds) {
    let Bounds {
        best,
        ub,
        lb,
        nodes,
    } = st;
    let g = size_gcd(intervals);
    *lb = lb.div_ceil(g) * g;
    let floor_limit = (intervals.len() as u64).max(64) * 2;
    let mut limit = floor_limit;
    // A plan within `cap` (its arena may be lower); an exhausted search
    // proves the next multiple of `g` a lower bound.
    let take = |offsets: Vec<u64>, ub: &mut u64, best: &mut Vec<u64>| {
        let arena = arena_of(intervals, &offsets);
        debug_assert_eq!(verify(intervals, &offsets).ok(), Some(arena));
        if arena < *ub {
            *ub = arena;
            *best = offsets;
        }
    };
    while *lb < *ub && Instant::now() < deadline {
        match probe(p, *lb, limit, deadline, nodes) {
            Probe::Found(offsets) => {
                take(offsets, ub, best);
                continue;
            }
            Probe::NotFound => {
                *lb += g;
                continue;
            }
            Probe::Timeout => return,
            Probe::Aborted => {}
        }
        let bs_limit = (limit / 4).max(floor_limit);
        let mut lo = *lb + g;
        while lo < *ub {
            let hi = *ub - g;
            let cap = lo + (hi - lo) / g / 2 * g;
            match probe(p, cap, bs_limit, deadline, nodes) {
                Probe::Found(offsets) => take(offsets, ub, best),
                Probe::NotFound => {
                    *lb = cap + g;
                    lo = cap + g;
                }
                Probe::Aborted => lo = cap + g,
                Probe::Timeout => return,
            }
        }
        limit = limit.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the round robin at `cap` with the path's order memory limited
    /// to `path_limit` entries: the outcome and the nodes visited.
    fn decide(v: &[Interval], cap: u64, path_limit: usize) -> (Status, u64, Vec<u64>) {
        let p = Prep::new(v);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut limit = v.len() as u64;
        let mut nodes = 0;
        loop {
            limit *= 2;
            for h in HEURISTICS {
                let mut s = Search::new(&p, cap, h, limit, deadline);
                s.path_limit = path_limit;
                let st = s.run();
                nodes += s.nodes;
                if st != Status::Aborted {
                    return (st, nodes, s.sol);
                }
            }
        }
    }

    #[test]
    fn letting_go_of_orders_visits_the_same_tree() {
        // Past the memory limit a node rebuilds its order after each
        // child instead of keeping it: the same nodes, the same plan.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut r = |n: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        };
        for case in 0..300 {
            let n = 5 + r(20);
            let v: Vec<Interval> = (0..n)
                .map(|k| {
                    let lower = r(30) as i64;
                    Interval {
                        id: k as i64,
                        lower,
                        upper: lower + 1 + r(10) as i64,
                        size: 1 + r(16),
                    }
                })
                .collect();
            let lb = lower_bound(&v);
            for cap in [lb, lb + 3, lb + 8] {
                assert_eq!(
                    decide(&v, cap, PATH_ENTRIES),
                    decide(&v, cap, 0),
                    "case {case} cap {cap}"
                );
            }
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/minimalloc");
        for name in ["A", "G", "J"] {
            let text = std::fs::read_to_string(format!("{dir}/{name}.1048576.csv"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let v = crate::intervals::parse_csv(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            let (st, nodes, sol) = decide(&v, 1 << 20, 0);
            assert_eq!(st, Status::Found, "{name}");
            assert_eq!(
                (st, nodes, sol),
                decide(&v, 1 << 20, PATH_ENTRIES),
                "{name}"
            );
        }
    }
}
