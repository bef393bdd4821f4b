//! `lookahead` (a vramlab extension): where to put a block that lives for
//! the whole run — a parameter or optimizer state, known from its category.
//!
//! PyTorch's best fit drops Adam's first-step state into whatever hole fits
//! best, often one an activation left; the next step's activation then no
//! longer fits where it did and a new segment follows. Training repeats its
//! step, so the allocations already seen predict the next ones: before such
//! a block takes a free block, the allocator tries each candidate place (the
//! few smallest free blocks that fit, then a new segment) on a copy of its
//! bookkeeping over a simulated device, frees there the short-lived blocks
//! alive now, replays every short-lived allocation and free of the history
//! (a model of the next step), and keeps the place whose replay reserves
//! least — best fit when it is as good as any.
//!
//! With `small_from_large` the same replay decides whether a small request
//! may be carved from a free large block or should open a 2 MiB small
//! segment: carving can leave too little of the large block for a later
//! gradient (simple-cnn batch 2: 26 → 42 MiB without it). It only replays
//! when what would be left is smaller than the largest request seen.
//!
//! Replays are budgeted (`Purpose::budget`), so lookahead costs a bounded
//! number of replayed operations per operation however long the run.

use super::caching::{BlockHandle, CachingAllocator, PoolKind};
use super::constants::K_SMALL_BUFFER;
use super::source::{SegmentSource, SimulatedSource};
use super::tag::Category;
use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};

/// Operations remembered; older ones are forgotten (a step of a large model
/// fits; the cost of a decision is bounded).
const HISTORY: usize = 16_384;
/// Free blocks tried besides a new segment.
const CANDIDATES: usize = 8;
/// What a replay decides; each has its own budget of replayed operations:
/// `start`, plus one for every `ops_per_replayed` operations seen. Past it
/// the allocator decides as without lookahead, so the cost per operation
/// stays bounded however long the run.
#[derive(Debug, Clone, Copy)]
enum Purpose {
    /// Where a parameter or optimizer state goes. Such blocks are few (a
    /// bounded number per run): a generous budget.
    LongLived,
    /// Whether a small block may be carved from a large one: decided often,
    /// a small budget.
    SmallCarve,
}

impl Purpose {
    /// (start, ops_per_replayed).
    fn budget(self) -> (u64, u64) {
        match self {
            Purpose::LongLived => (1_000_000, 1),
            Purpose::SmallCarve => (2_000, 4),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Alloc {
        handle: BlockHandle,
        size: u64,
        category: Category,
    },
    Free {
        handle: BlockHandle,
    },
}

/// The allocations and frees seen so far.
#[derive(Debug, Default)]
pub(crate) struct History {
    ops: VecDeque<Op>,
    frees: usize,
    /// The largest request seen.
    largest: u64,
    /// Operations seen, and operations replayed so far for long-lived blocks
    /// and for small carves (the budgets).
    seen: u64,
    replayed: [Cell<u64>; 2],
}

impl History {
    pub(crate) fn alloc(&mut self, handle: BlockHandle, size: u64, category: Category) {
        self.largest = self.largest.max(size);
        self.push(Op::Alloc {
            handle,
            size,
            category,
        });
    }

    pub(crate) fn free(&mut self, handle: BlockHandle) {
        self.push(Op::Free { handle });
    }

    /// Whether one more replay of the history stays within the budget for
    /// `purpose`; if so, it is spent.
    fn afford(&self, purpose: Purpose) -> bool {
        let cost = self.ops.len() as u64;
        let (start, ops_per_replayed) = purpose.budget();
        let allowed = start + self.seen / ops_per_replayed;
        let spent = &self.replayed[purpose as usize];
        if spent.get() + cost > allowed {
            return false;
        }
        spent.set(spent.get() + cost);
        true
    }

    fn push(&mut self, op: Op) {
        self.seen += 1;
        if self.ops.len() == HISTORY {
            if let Some(Op::Free { .. }) = self.ops.pop_front() {
                self.frees -= 1;
            }
        }
        self.frees += matches!(op, Op::Free { .. }) as usize;
        self.ops.push_back(op);
    }

    /// The blocks whose allocation is still remembered.
    fn remembered(&self) -> HashSet<BlockHandle> {
        self.ops
            .iter()
            .filter_map(|op| match *op {
                Op::Alloc { handle, .. } => Some(handle),
                Op::Free { .. } => None,
            })
            .collect()
    }

    /// Replays every short-lived allocation and free of the history on
    /// `ghost` (long-lived blocks stay where they are). `None` if the ghost
    /// runs out of memory.
    fn replay_on(&self, ghost: &mut CachingAllocator<SimulatedSource>) -> Option<()> {
        let mut map: HashMap<BlockHandle, BlockHandle> = HashMap::new();
        for op in &self.ops {
            match *op {
                Op::Alloc {
                    handle,
                    size,
                    category,
                } => {
                    if category.lives_for_the_run() {
                        continue;
                    }
                    let a = ghost.malloc_tagged(size, "", category, None).ok()?;
                    map.insert(handle, a.handle);
                }
                Op::Free { handle } => {
                    if let Some(h) = map.remove(&handle) {
                        ghost.free(h).ok()?;
                    }
                }
            }
        }
        Some(())
    }
}

/// Where a long-lived block goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// This free block of the large pool.
    Block(usize),
    /// A new segment of this pool and size.
    Fresh(PoolKind, u64),
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// The place for a long-lived large block of `size` (rounded) bytes, or
    /// `None` when there is nothing to decide (no free block fits, or no
    /// short-lived allocation has been seen yet).
    pub(crate) fn look_ahead(&self, size: u64, orig_size: u64, segment: u64) -> Option<Place> {
        let candidates: Vec<usize> = self
            .fitting_free_blocks(PoolKind::Large, size)
            .take(CANDIDATES)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let places: Vec<Place> = candidates
            .into_iter()
            .map(Place::Block)
            .chain([Place::Fresh(PoolKind::Large, segment)])
            .collect();
        self.best_place(&places, size, orig_size, Purpose::LongLived)
    }

    /// `small_from_large` with `lookahead`: whether carving a small block of
    /// `size` bytes from the free large block `index` reserves no more,
    /// replayed, than a new small segment.
    pub(crate) fn carving_is_free(&self, index: usize, size: u64, orig_size: u64) -> bool {
        // What is left still takes any request seen so far: nothing to replay.
        let left = self.blocks[index].size - size;
        if self.history.as_ref().is_none_or(|h| left >= h.largest) {
            return true;
        }
        let places = [
            Place::Block(index),
            Place::Fresh(PoolKind::Small, K_SMALL_BUFFER),
        ];
        self.best_place(&places, size, orig_size, Purpose::SmallCarve) != Some(places[1])
    }

    /// Of `places` (in order of preference), the one whose replay of the
    /// history reserves least; `None` when there is no history to replay.
    fn best_place(
        &self,
        places: &[Place],
        size: u64,
        orig_size: u64,
        purpose: Purpose,
    ) -> Option<Place> {
        let history = self.history.as_ref()?;
        if history.frees == 0 {
            return None;
        }
        let mut short_lived: Option<Vec<BlockHandle>> = None;
        let mut best: Option<(u64, Place)> = None;
        for &place in places {
            if !history.afford(purpose) {
                break;
            }
            // Only blocks the replay makes again: their allocation is
            // remembered.
            let short_lived = short_lived.get_or_insert_with(|| {
                let remembered = history.remembered();
                self.live_short_lived()
                    .into_iter()
                    .filter(|h| remembered.contains(h))
                    .collect()
            });
            let mut ghost = self.ghost();
            if ghost.place(place, size, orig_size).is_none() {
                continue;
            }
            // The next step starts without this step's short-lived blocks
            // (gradients, outputs) and makes them again where the history
            // made them.
            for &h in short_lived.iter() {
                ghost.free(h).ok()?;
            }
            if history.replay_on(&mut ghost).is_none() {
                continue;
            }
            let peak = ghost.max_memory_reserved();
            if best.is_none_or(|(p, _)| peak < p) {
                best = Some((peak, place));
            }
            // Nothing beats a place where the next step needs no new memory.
            if peak <= self.memory_reserved() {
                break;
            }
        }
        best.map(|(_, place)| place)
    }
}
