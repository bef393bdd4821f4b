//! The placement hook: where a policy other than PyTorch's may decide.
//!
//! With no hook the allocator is PyTorch's, rule for rule. A [`Placement`]
//! is consulted at three points of `malloc` and told of every allocation and
//! free, so a policy can keep a history:
//! 1. before best fit, where the block goes ([`Placement::place`]; not
//!    consulted with expandable segments, whose blocks grow in place);
//! 2. when a small request finds no free small block but a free large one
//!    would serve it, whether to carve it from that block rather than open a
//!    2 MiB small segment ([`Placement::carve_small_from_large`]);
//! 3. before a new segment, whether to first give back the pool's whole free
//!    segments too small for the request ([`Placement::release_before_grow`]).
//!
//! The hook reads the allocator through [`AllocatorView`]; to try a decision
//! it can copy the allocator into a [`ghost`](AllocatorView::ghost) over a
//! simulated device and allocate there with
//! [`CachingAllocator::malloc_at`]. An [`AllocatorConfig`] carries a hook as
//! a prototype, so an allocator built from a configuration anywhere (an
//! engine, a replay) gets a fresh one.

use super::handle::{BlockHandle, PoolKind};
use super::tag::Category;
use std::any::Any;
use std::fmt;

/// A request, as the allocator sees it when it consults the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Bytes asked for.
    pub requested: u64,
    /// The block size: `requested` rounded ([`crate::round_size`]).
    pub size: u64,
    /// The pool `size` belongs to.
    pub pool: PoolKind,
    /// The segment a miss would obtain (PyTorch's `get_allocation_size`,
    /// capped by the device's largest segment).
    pub segment_size: u64,
    /// What the block will hold.
    pub category: Category,
}

/// A free block, as [`AllocatorView::fitting_free_blocks`] lists it. It
/// names the block until the allocator next changes; the allocator checks
/// it before use, so a stale one (taken, split or merged since) is ignored,
/// never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeBlock {
    pub(crate) index: u32,
    pub(crate) generation: u32,
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) pool: PoolKind,
}

impl FreeBlock {
    /// The block's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The pool it is cached in.
    pub fn pool(&self) -> PoolKind {
        self.pool
    }
}

/// Where a block goes instead of the best fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// This free block, split as best fit would split it. It must be one
    /// best fit could have taken for the request (at least as large, and
    /// allowed by `max_split_size`); otherwise best fit decides.
    Block(FreeBlock),
    /// A new segment of `size` bytes (at least the request's block size)
    /// in `pool`. If the device refuses it, best fit decides.
    NewSegment { pool: PoolKind, size: u64 },
}

/// A ghost allocator (see [`AllocatorView::ghost`]): PyTorch's allocator
/// over a simulated device, to replay allocations on.
pub trait Ghost {
    /// Allocates `size` bytes of `category`; `None` when it runs out.
    fn malloc(&mut self, size: u64, category: Category) -> Option<BlockHandle>;
    /// Allocates `size` bytes of `category` at `place`; `None` when the
    /// place cannot take it.
    fn malloc_at(&mut self, place: Place, size: u64, category: Category) -> Option<BlockHandle>;
    /// Frees `handle`; `false` for a handle it does not hold.
    fn free(&mut self, handle: BlockHandle) -> bool;
    /// The peak of reserved bytes since the ghost was made.
    fn max_memory_reserved(&self) -> u64;
    /// Gives the ghost a hook of its own (a ghost is made without one).
    fn set_placement(&mut self, placement: Option<Box<dyn Placement>>);
}

/// What a hook may read of the allocator consulting it. Implemented by every
/// [`crate::CachingAllocator`].
pub trait AllocatorView {
    /// Bytes held in segments (`torch.cuda.memory_reserved()`).
    fn memory_reserved(&self) -> u64;
    /// The free blocks of `pool` that may take a block of `size` (rounded)
    /// bytes, best fit first: what best fit would choose from, in its order.
    fn fitting_free_blocks(
        &self,
        pool: PoolKind,
        size: u64,
    ) -> Box<dyn Iterator<Item = FreeBlock> + '_>;
    /// Every allocated block with its category, in slot order.
    fn allocated_blocks(&self) -> Box<dyn Iterator<Item = (BlockHandle, Category)> + '_>;
    /// A copy of the bookkeeping over a simulated device of the same
    /// capacity, holding the same segments, with peaks reset, no recording
    /// and no hook: a place to try a decision without touching real memory.
    /// Handles and [`FreeBlock`]s of this allocator are valid on it.
    fn ghost(&self) -> Box<dyn Ghost>;
}

/// A placement policy. Every method but [`describe`](Placement::describe)
/// and [`fresh`](Placement::fresh) has a default that keeps PyTorch's rule.
pub trait Placement: Any + Send + Sync {
    /// The policy in alloc-conf syntax (`key:True,…`), for
    /// [`AllocatorConfig::describe`]; two policies with the same description
    /// are the same policy.
    fn describe(&self) -> String;

    /// A new hook with the same settings and an empty history: what each
    /// allocator built from a configuration holding this one gets.
    fn fresh(&self) -> Box<dyn Placement>;

    /// Where a block goes, before best fit; `None` keeps best fit.
    fn place(&mut self, _view: &dyn AllocatorView, _request: &Request) -> Option<Place> {
        None
    }

    /// Whether a small request with no free small block is carved from the
    /// free large `block` (the one best fit would take from the large pool)
    /// instead of opening a new small segment. PyTorch: never.
    fn carve_small_from_large(
        &mut self,
        _view: &dyn AllocatorView,
        _request: &Request,
        _block: FreeBlock,
    ) -> bool {
        false
    }

    /// Whether, before asking the device for a new segment, the pool's whole
    /// free segments smaller than the request go back to it. PyTorch: no,
    /// they stay cached until an out-of-memory or `empty_cache`.
    fn release_before_grow(&mut self, _view: &dyn AllocatorView, _request: &Request) -> bool {
        false
    }

    /// A block was allocated for `request`.
    fn on_alloc(&mut self, _handle: BlockHandle, _request: &Request) {}

    /// The block `handle` was freed.
    fn on_free(&mut self, _handle: BlockHandle) {}
}

impl fmt::Debug for dyn Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Placement({})", self.describe())
    }
}

impl PartialEq for dyn Placement {
    fn eq(&self, other: &Self) -> bool {
        self.describe() == other.describe()
    }
}
