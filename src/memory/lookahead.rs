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

use super::caching::{BlockHandle, CachingAllocator};
use super::source::{SegmentSource, SimulatedSource};
use super::tag::Category;
use std::collections::{HashMap, VecDeque};

/// Operations remembered; older ones are forgotten (a step of a large model
/// fits; the cost of a decision is bounded).
const HISTORY: usize = 16_384;
/// Free blocks tried besides a new segment.
const CANDIDATES: usize = 8;

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
}

impl History {
    pub(crate) fn alloc(&mut self, handle: BlockHandle, size: u64, category: Category) {
        self.push(Op::Alloc {
            handle,
            size,
            category,
        });
    }

    pub(crate) fn free(&mut self, handle: BlockHandle) {
        self.push(Op::Free { handle });
    }

    fn push(&mut self, op: Op) {
        if self.ops.len() == HISTORY {
            if let Some(Op::Free { .. }) = self.ops.pop_front() {
                self.frees -= 1;
            }
        }
        self.frees += matches!(op, Op::Free { .. }) as usize;
        self.ops.push_back(op);
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
    /// A new segment of this size.
    Fresh(u64),
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// The place for a long-lived large block of `size` (rounded) bytes, or
    /// `None` when there is nothing to decide (no free block fits, or no
    /// short-lived allocation has been seen yet).
    pub(crate) fn look_ahead(&self, size: u64, orig_size: u64, segment: u64) -> Option<Place> {
        let history = self.history.as_ref()?;
        if history.frees == 0 {
            return None;
        }
        let candidates = self.large_candidates(size, CANDIDATES);
        if candidates.is_empty() {
            return None;
        }
        let short_lived = self.live_short_lived();
        let mut best: Option<(u64, Place)> = None;
        let places = candidates
            .into_iter()
            .map(Place::Block)
            .chain([Place::Fresh(segment)]);
        for place in places {
            let mut ghost = self.ghost();
            if ghost.place(place, size, orig_size).is_none() {
                continue;
            }
            // The next step starts without this step's short-lived blocks
            // (gradients, outputs) and makes them again where the history
            // made them.
            for &h in &short_lived {
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
