//! Skipping what a replay repeats. 1F1B's steady state runs one forward and
//! one backward a micro-batch, the same ops each time with new ids. Once
//! the allocator is back in the state it was in q pairs earlier (its blocks,
//! and the live tensors at the same ages in the same blocks; with several
//! micro-batches in flight the blocks can alternate, q = 2 or more), every
//! following run of q pairs whose ops are the last run's shifted by its ids
//! does what that one did. The replay runs the first of them and skips to
//! the end of the repeats, moving the live tensors' ids along: peaks, what
//! is live at them and every later op come out as an every-op replay's,
//! which `tests/parallel.rs` holds on generated layouts.

use crate::rank::{Kind, Op};
use std::collections::{BTreeSet, VecDeque};
use vramlab_alloc::{BlockHandle, CachingAllocator, SimulatedSource};

/// Not in a pair (before the first).
const NONE: u32 = u32::MAX;

/// Pairs whose state repeats none before after which a replay stops
/// looking (a key costs the live tensors and blocks).
const MOST_MISSES: u32 = 512;

/// A live allocation as the replay holds it: block, bytes, kind, address.
pub(crate) type Live = Option<(BlockHandle, u64, Kind, u64)>;

struct Mark {
    /// Index of the pair's `Op::Pair`.
    at: usize,
    next: u32,
    key: Vec<u64>,
}

pub(crate) struct Periods {
    /// Runs of up to this many pairs are looked for.
    span: usize,
    /// Tensors at most this many pairs old move with their pair when pairs
    /// are skipped; older ones (the model states, gradients made in the
    /// first pair) stay.
    window: u32,
    /// The current pair (NONE before the first).
    period: u32,
    /// Per id, the pair it was allocated in.
    born: Vec<u32>,
    /// Per pair, the id its first allocation takes.
    first_id: Vec<u32>,
    /// Live ids that do not move (made before the first pair, or older
    /// than `window`); the moving ones are the live ids from
    /// `first_id[period − window]` on.
    old_live: BTreeSet<u32>,
    /// The last `span` pairs' starts, the latest last.
    marks: VecDeque<Mark>,
    misses: u32,
    skipped: u64,
}

impl Periods {
    /// `in_flight`: micro-batches whose tensors a stage holds at once.
    pub(crate) fn new(in_flight: u64) -> Periods {
        let span = in_flight.clamp(1, 64) as usize + 1;
        Periods {
            span,
            window: 2 * span as u32 + 2,
            period: NONE,
            born: vec![],
            first_id: vec![],
            old_live: BTreeSet::new(),
            marks: VecDeque::new(),
            misses: 0,
            skipped: 0,
        }
    }

    /// Pairs skipped so far.
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped
    }

    pub(crate) fn born(&mut self, id: u32) {
        let i = id as usize;
        if self.born.len() <= i {
            self.born.resize(i + 1, NONE);
        }
        self.born[i] = self.period;
        if self.period == NONE {
            self.old_live.insert(id);
        }
    }

    pub(crate) fn died(&mut self, id: u32) {
        if !self.young(id, self.period) {
            self.old_live.remove(&id);
        }
    }

    /// Whether `id` moves with its pair, seen from pair `at`.
    fn young(&self, id: u32, at: u32) -> bool {
        let b = self.born.get(id as usize).copied().unwrap_or(NONE);
        b != NONE && at != NONE && at >= b && at - b <= self.window
    }

    /// The first id that can be young at the current pair.
    fn young_from(&self) -> u32 {
        let p = self.period.saturating_sub(self.window) as usize;
        self.first_id
            .get(p)
            .copied()
            .filter(|&f| f != NONE)
            .unwrap_or(0)
    }

    /// At the `Op::Pair` at `ops[at]`: where the replay goes on (past the
    /// runs of pairs that repeat the last one, their live ids moved in
    /// `live`), or `None` to replay this pair.
    pub(crate) fn at_pair(
        &mut self,
        ops: &[Op],
        at: usize,
        next: u32,
        alloc: &CachingAllocator<SimulatedSource>,
        live: &mut Vec<Live>,
    ) -> Option<usize> {
        self.period = if self.period == NONE {
            0
        } else {
            self.period + 1
        };
        let k = self.period as usize;
        if self.first_id.len() <= k + 1 {
            self.first_id.resize(k + 2, NONE);
        }
        self.first_id[k] = next;
        self.age_out(live);
        // No run can be skipped before the window holds regular pairs
        // (`regular`): keys start `span` pairs before that.
        if self.misses >= MOST_MISSES || k + self.span < self.window as usize + 1 {
            return None;
        }
        let key = self.key(alloc.layout_key()?, live);
        // The shortest run of q pairs that this state closes.
        let found = self.marks.iter().rev().enumerate().find_map(|(back, m)| {
            let q = back + 1;
            if m.key != key || next < m.next || !self.regular(q, next - m.next) {
                return None;
            }
            let n = self.repeats(ops, m.at, at, (next - m.next) as u64);
            (n > 0).then_some((q, n, at - m.at, next - m.next))
        });
        let Some((q, n, len, d)) = found else {
            self.misses += 1;
            if self.marks.len() == self.span {
                self.marks.pop_front();
            }
            self.marks.push_back(Mark { at, next, key });
            return None;
        };
        // The n runs of q pairs from here repeat the last run: their ids
        // move by n·d, their pairs by n·q.
        let (shift, pairs) = (n as u32 * d, (n * q) as u32);
        let from = self.young_from() as usize;
        for id in (from..live.len()).rev() {
            let id = id as u32;
            if live[id as usize].is_none() || !self.young(id, self.period) {
                continue;
            }
            let to = (id + shift) as usize;
            if live.len() <= to {
                live.resize(to + 1, None);
            }
            live[to] = live[id as usize].take();
            let b = self.born[id as usize];
            self.born(to as u32);
            self.born[to] = b + pairs;
        }
        let top = (self.period + pairs) as usize + 2;
        if self.first_id.len() < top {
            self.first_id.resize(top, NONE);
        }
        for p in self.period.saturating_sub(self.window)..=self.period {
            let f = self.first_id[p as usize];
            if f != NONE {
                self.first_id[(p + pairs) as usize] = f + shift;
            }
        }
        self.skipped += pairs as u64;
        // Misses count towards giving up only until a run repeats.
        self.misses = 0;
        // The landing `Op::Pair` (if one) starts pair k + n·q.
        self.period += pairs - 1;
        self.marks.clear();
        Some(at + n * len)
    }

    /// Whether each pair of the window starts `d` ids after the pair `q`
    /// before it: then a young tensor's age and place in its pair name the
    /// same tensor `d` ids on, as the key compares them.
    fn regular(&self, q: usize, d: u32) -> bool {
        let (k, w) = (self.period as usize, self.window as usize);
        k >= w + q
            && (k - w..=k).all(|p| {
                let (a, b) = (self.first_id[p], self.first_id[p - q]);
                a != NONE && b != NONE && a.wrapping_sub(b) == d
            })
    }

    /// Live ids of the pair that just stopped being young join the old.
    fn age_out(&mut self, live: &[Live]) {
        let Some(p) = self.period.checked_sub(self.window + 1) else {
            return;
        };
        let (a, b) = (self.first_id[p as usize], self.first_id[p as usize + 1]);
        if a == NONE || b == NONE {
            return;
        }
        for id in a..b.min(live.len() as u32) {
            if live[id as usize].is_some() && self.born[id as usize] == p {
                self.old_live.insert(id);
            }
        }
    }

    /// What decides the rest of the replay: the allocator's layout key and
    /// each live tensor's block, bytes and kind, by its age and place in
    /// its pair where it moves with pairs, else by its id.
    fn key(&self, mut key: Vec<u64>, live: &[Live]) -> Vec<u64> {
        let entry = |key: &mut Vec<u64>, id: u32, head: [u64; 3]| {
            if let Some((_, bytes, kind, address)) = live.get(id as usize).copied().flatten() {
                key.extend(head);
                key.extend([address, bytes, kind.index() as u64]);
            }
        };
        for &id in &self.old_live {
            entry(&mut key, id, [0, id as u64, 0]);
        }
        for id in self.young_from()..live.len() as u32 {
            if !self.young(id, self.period) {
                continue;
            }
            let b = self.born[id as usize];
            let first = self.first_id[b as usize];
            let age = (self.period - b) as u64;
            entry(&mut key, id, [1, age, id.wrapping_sub(first) as u64]);
        }
        key
    }

    /// How many runs of `at − last` ops from `ops[at]` on repeat the run
    /// `ops[last..at]`, each one's ids `d` further.
    fn repeats(&self, ops: &[Op], last: usize, at: usize, d: u64) -> usize {
        let len = at - last;
        let before = self.period - 1;
        let mut n = 0;
        while at + (n + 1) * len <= ops.len() {
            let shift = (n as u64 + 1) * d;
            let moved = |a: u32, b: u32| b as u64 == a as u64 + shift;
            let same = (0..len).all(|t| match (&ops[last + t], &ops[at + n * len + t]) {
                (Op::Pair { next: a }, Op::Pair { next: b }) => moved(*a, *b),
                (
                    Op::Alloc {
                        id: a,
                        bytes: x,
                        kind: p,
                        label: u,
                    },
                    Op::Alloc {
                        id: b,
                        bytes: y,
                        kind: q,
                        label: v,
                    },
                ) => moved(*a, *b) && x == y && p == q && u == v,
                // A free of a tensor that does not move with the pairs
                // would free the same id twice: never a repeat.
                (Op::Free { id: a }, Op::Free { id: b }) => self.young(*a, before) && moved(*a, *b),
                (Op::StatesLive, Op::StatesLive) => true,
                _ => false,
            });
            if !same {
                break;
            }
            n += 1;
        }
        n
    }
}
