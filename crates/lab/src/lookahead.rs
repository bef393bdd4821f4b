//! `lookahead` (the `vramlab` strategy's placement, through the allocator's
//! placement hook): where to put a block that lives for the whole run — a
//! parameter or optimizer state, known from its category.
//!
//! PyTorch's best fit drops Adam's first-step state into whatever hole fits
//! best, often one an activation left; the next step's activation then no
//! longer fits where it did and a new segment follows. Training repeats its
//! step, so the allocations already seen predict the next ones: before such
//! a block takes a free block, each candidate place (the few smallest free
//! blocks that fit, then a new segment) is tried on a ghost of the allocator
//! over a simulated device: the short-lived blocks alive now are freed
//! there, every short-lived allocation and free of the history is replayed
//! (a model of the next step), and the place whose replay reserves least is
//! kept — best fit when it is as good as any.
//!
//! With `small_from_large` the same replay decides whether a small request
//! may be carved from a free large block or should open a 2 MiB small
//! segment: carving can leave too little of the large block for a later
//! gradient (simple-cnn batch 2: 26 → 42 MiB without it). It only replays
//! when what would be left is smaller than the largest request seen.
//!
//! Replays are budgeted (`Purpose::budget`), so lookahead costs a bounded
//! number of replayed operations per operation however long the run.

use crate::memory::constants::K_SMALL_BUFFER;
use crate::memory::{
    AllocatorView, BlockHandle, Category, FreeBlock, Ghost, Place, PoolKind, Request,
};
use std::collections::{HashMap, HashSet, VecDeque};

/// Operations remembered; older ones are forgotten (a step of a large model
/// fits; the cost of a decision is bounded).
const HISTORY: usize = 16_384;
/// Free blocks tried besides a new segment.
const CANDIDATES: usize = 8;

/// What a replay decides; each has its own budget of replayed operations:
/// `start`, plus one for every `ops_per_replayed` operations seen. Past it
/// the decision is the one without lookahead, so the cost per operation
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
    replayed: [u64; 2],
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
    fn afford(&mut self, purpose: Purpose) -> bool {
        let cost = self.ops.len() as u64;
        let (start, ops_per_replayed) = purpose.budget();
        let allowed = start + self.seen / ops_per_replayed;
        let spent = &mut self.replayed[purpose as usize];
        if *spent + cost > allowed {
            return false;
        }
        *spent += cost;
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
    fn replay_on(&self, ghost: &mut dyn Ghost) -> Option<()> {
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
                    map.insert(handle, ghost.malloc(size, category)?);
                }
                Op::Free { handle } => {
                    if let Some(h) = map.remove(&handle) {
                        ghost.free(h).then_some(())?;
                    }
                }
            }
        }
        Some(())
    }

    /// The place for a long-lived large block, or `None` when there is
    /// nothing to decide (no free block fits, or no short-lived allocation
    /// has been freed yet). `ghost` makes a ghost of `view` with the hook
    /// the replay runs under.
    pub(crate) fn look_ahead(
        &mut self,
        view: &dyn AllocatorView,
        request: &Request,
        ghost: &dyn Fn(&dyn AllocatorView) -> Box<dyn Ghost>,
    ) -> Option<Place> {
        let places: Vec<Place> = view
            .fitting_free_blocks(PoolKind::Large, request.size)
            .take(CANDIDATES)
            .map(Place::Block)
            .collect();
        if places.is_empty() {
            return None;
        }
        let fresh = Place::NewSegment {
            pool: PoolKind::Large,
            size: request.segment_size,
        };
        let places: Vec<Place> = places.into_iter().chain([fresh]).collect();
        self.best_place(view, &places, request, Purpose::LongLived, ghost)
    }

    /// Whether carving the small `request` from the free large `block`
    /// reserves no more, replayed, than a new small segment.
    pub(crate) fn carving_is_free(
        &mut self,
        view: &dyn AllocatorView,
        request: &Request,
        block: FreeBlock,
        ghost: &dyn Fn(&dyn AllocatorView) -> Box<dyn Ghost>,
    ) -> bool {
        // What is left still takes any request seen so far: nothing to replay.
        if block.size() - request.size >= self.largest {
            return true;
        }
        let places = [
            Place::Block(block),
            Place::NewSegment {
                pool: PoolKind::Small,
                size: K_SMALL_BUFFER,
            },
        ];
        self.best_place(view, &places, request, Purpose::SmallCarve, ghost) != Some(places[1])
    }

    /// Of `places` (in order of preference), the one whose replay of the
    /// history reserves least; `None` when there is no history to replay.
    fn best_place(
        &mut self,
        view: &dyn AllocatorView,
        places: &[Place],
        request: &Request,
        purpose: Purpose,
        make_ghost: &dyn Fn(&dyn AllocatorView) -> Box<dyn Ghost>,
    ) -> Option<Place> {
        if self.frees == 0 {
            return None;
        }
        let mut short_lived: Option<Vec<BlockHandle>> = None;
        let mut best: Option<(u64, Place)> = None;
        for &place in places {
            if !self.afford(purpose) {
                break;
            }
            // Only blocks the replay makes again: their allocation is
            // remembered.
            let short_lived = short_lived.get_or_insert_with(|| {
                let remembered = self.remembered();
                view.allocated_blocks()
                    .filter(|&(h, c)| !c.lives_for_the_run() && remembered.contains(&h))
                    .map(|(h, _)| h)
                    .collect()
            });
            let mut ghost = make_ghost(view);
            if ghost
                .malloc_at(place, request.requested, request.category)
                .is_none()
            {
                continue;
            }
            // The next step starts without this step's short-lived blocks
            // (gradients, outputs) and makes them again where the history
            // made them.
            for &h in short_lived.iter() {
                ghost.free(h).then_some(())?;
            }
            if self.replay_on(ghost.as_mut()).is_none() {
                continue;
            }
            let peak = ghost.max_memory_reserved();
            if best.is_none_or(|(p, _)| peak < p) {
                best = Some((peak, place));
            }
            // Nothing beats a place where the next step needs no new memory.
            if peak <= view.memory_reserved() {
                break;
            }
        }
        best.map(|(_, place)| place)
    }
}
