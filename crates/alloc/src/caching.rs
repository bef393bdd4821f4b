//! The caching allocator: PyTorch's CUDA caching allocator, rule for rule, over
//! any [`SegmentSource`].
//!
//! The rules (see the module docs of `memory` for the why):
//! 1. A request of `n` bytes is rounded up to a multiple of 512 B, or with
//!    `roundup_power2_divisions` to the next of `d` equal steps between powers of
//!    two ([`round_size`]).
//! 2. Rounded sizes ≤ 1 MiB use the small pool, larger ones the large pool.
//! 3. The free block with the smallest (size, address) at least as large is
//!    taken (best fit). A block of at least `max_split_size` is never given to a
//!    smaller request, nor to a request more than 20 MiB smaller than it.
//! 4. With no fitting block, a new segment is obtained: 2 MiB for the small pool,
//!    20 MiB for requests under 10 MiB, else the request rounded to 2 MiB. If the
//!    device refuses (or the memory limit would be passed): free oversize cached
//!    blocks and retry, then free every cached whole segment and retry once more
//!    (counted in `num_alloc_retries`), then fail with out-of-memory.
//! 5. A found block is split when the rest is ≥ 512 B (small pool) or > 1 MiB
//!    (large pool, and only for requests under `max_split_size`).
//! 6. A freed block merges with free neighbours; a segment goes back to the
//!    device only when it is one whole free block and the cache is emptied.
//! 7. With a memory limit and `garbage_collection_threshold`, cached whole
//!    segments older than average are released before growing past the threshold.
//!
//! A [`Placement`] hook, when set, may decide otherwise at three points (see
//! placement.rs); without one these rules are all there is.

use super::config::AllocatorConfig;
use super::constants::*;
use super::error::{AllocError, OomReport};
use super::events::{EventKind, MemEvent};
pub use super::handle::{BlockHandle, PoolKind};
use super::placement::{AllocatorView, FreeBlock, Ghost, Place, Placement, Request};
use super::source::SimulatedSource;
use super::source::{SegmentId, SegmentSource, SourceError};
use super::stats::{DeviceStats, StatType};
use super::tag::Category;
use std::collections::BTreeSet;
use std::sync::Arc;

/// PyTorch's `round_size`: the block size a request of `size` bytes gets.
pub fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size < K_MIN_BLOCK_SIZE {
        return K_MIN_BLOCK_SIZE;
    }
    let divisions = config.divisions_for(size);
    if divisions > 1 && size > K_MIN_BLOCK_SIZE * divisions {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
    }
}

/// Rounds `size` up to the next of `divisions` equal steps between the powers of
/// two around it: 1200 with 4 divisions lies between 1024 and 2048, whose steps
/// are 1024, 1280, 1536, 1792, so it becomes 1280.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size <= 4 || divisions <= 1 || size.is_power_of_two() {
        return size;
    }
    let power2_floor = 1u64 << (63 - size.leading_zeros());
    let power2_division = power2_floor >> (63 - divisions.leading_zeros());
    if power2_division == 0 {
        return power2_floor << 1;
    }
    let floor = size & !(power2_division - 1);
    if floor == size {
        size
    } else {
        floor + power2_division
    }
}

/// PyTorch's `get_allocation_size`: the segment size for a rounded request.
pub fn allocation_size(size: u64) -> u64 {
    if size <= K_SMALL_SIZE {
        K_SMALL_BUFFER
    } else if size < K_MIN_LARGE_ALLOC {
        K_LARGE_BUFFER
    } else {
        size.div_ceil(K_ROUND_LARGE) * K_ROUND_LARGE
    }
}

/// Whether a free block of `bsize` bytes may serve a request of `size`:
/// an oversize block (≥ `max_split`) is not handed to a request that would
/// split it, nor to an oversize request much smaller than itself.
fn may_serve(bsize: u64, size: u64, max_split: u64) -> bool {
    if size < max_split {
        bsize < max_split
    } else {
        bsize < size.saturating_add(K_LARGE_BUFFER)
    }
}

/// Which pool a rounded size belongs to.
pub fn pool_for(size: u64) -> PoolKind {
    if size <= K_SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// A live allocation: which block, and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub handle: BlockHandle,
    pub segment: SegmentId,
    /// The block's virtual address (segments get disjoint ranges).
    pub address: u64,
    /// Byte offset of the block inside its segment.
    pub offset: u64,
    /// The block's size (the request rounded).
    pub size: u64,
    /// The bytes asked for.
    pub requested: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(crate) segment: SegmentId,
    /// A virtual address: segments get disjoint ranges so (size, address)
    /// ordering works across segments as cudaMalloc pointers do.
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) requested: u64,
    pub(crate) allocated: bool,
    pub(crate) pool: PoolKind,
    pub(crate) prev: Option<usize>,
    pub(crate) next: Option<usize>,
    /// `None` for a free block, and for an allocated one labelled "".
    pub(crate) label: Option<Arc<str>>,
    pub(crate) category: Category,
    pub(crate) op: Option<Arc<str>>,
    pub(crate) gc_count_base: u64,
    pub(crate) generation: u32,
    pub(crate) live: bool,
    /// False for the unmapped address space of an expandable segment.
    pub(crate) mapped: bool,
    /// Whether it lies in an expandable segment (blocks never change
    /// segment).
    pub(crate) expandable: bool,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) address: u64,
    /// For an expandable segment, its whole virtual range (mapped or not).
    pub(crate) size: u64,
    pub(crate) pool: PoolKind,
    /// A range of virtual addresses that grows by mapping pages
    /// (`expandable_segments:True`, see expandable.rs).
    pub(crate) expandable: bool,
}

/// The segments held, by id: a slot per id ever handed out (ids count up
/// from 0), so finding a block's segment is an index, not a tree search.
#[derive(Debug, Default, Clone)]
pub(crate) struct SegmentTable {
    slots: Vec<Option<Segment>>,
}

impl SegmentTable {
    pub(crate) fn insert(&mut self, id: SegmentId, segment: Segment) {
        let i = id.0 as usize;
        if i >= self.slots.len() {
            self.slots.resize(i + 1, None);
        }
        self.slots[i] = Some(segment);
    }

    pub(crate) fn remove(&mut self, id: &SegmentId) -> Option<Segment> {
        self.slots.get_mut(id.0 as usize).and_then(Option::take)
    }

    #[inline]
    pub(crate) fn get(&self, id: &SegmentId) -> Option<&Segment> {
        self.slots.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// The segments in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SegmentId, &Segment)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (SegmentId(i as u64), s)))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Segment> + '_ {
        self.slots.iter().flatten()
    }
}

impl std::ops::Index<&SegmentId> for SegmentTable {
    type Output = Segment;

    #[inline]
    fn index(&self, id: &SegmentId) -> &Segment {
        self.get(id).expect("a live block's segment is held")
    }
}

/// Mapped runs of whole pages: first page's address → (device allocation,
/// bytes). One entry a mapping (split where unmapping cuts it), not one a
/// page, so a huge request costs no more host memory than a small one.
pub(crate) type PageMap = std::collections::BTreeMap<u64, (SegmentId, u64)>;

/// Free blocks ordered by (size, address, index), the order best fit
/// searches: sorted runs of at most [`RUN`] entries, found by binary search
/// over each run's first entry. A pool holds tens to a few thousand free
/// blocks, so an insert or removal moves a few hundred bytes inside one run
/// and never rebalances a tree; `std`'s B-tree spent most of the replay
/// loop's instructions here.
#[derive(Debug, Default, Clone)]
pub(crate) struct FreeSet {
    /// Non-empty, each sorted, in order: every entry of a run is below
    /// every entry of the next.
    runs: Vec<Vec<FreeKey>>,
    /// `runs[i][0]` for each run.
    firsts: Vec<FreeKey>,
    len: usize,
    /// (run, position) of the entry `at_least` found last: best fit takes
    /// that block next, and its removal or replacement starts there
    /// instead of searching again (checked, so a stale hint costs nothing).
    hint: std::cell::Cell<(usize, usize)>,
}

/// (size, address, block index).
type FreeKey = (u64, u64, usize);

/// Most entries a run holds before it splits in two.
const RUN: usize = 32;

/// Size and address as one integer: ordering entries by it is ordering by
/// (size, address), compared without branches.
#[inline]
fn packed(e: &FreeKey) -> u128 {
    ((e.0 as u128) << 64) | e.1 as u128
}

/// How many entries of sorted `slice` are below `key` (`or_equal`: at most
/// `key`). Equal (size, address) pairs are told apart by index, which only
/// a corrupt pool would have.
#[inline]
fn rank(slice: &[FreeKey], key: &FreeKey, or_equal: bool) -> usize {
    let k = packed(key);
    let mut p = slice.partition_point(|e| packed(e) < k);
    while p < slice.len()
        && packed(&slice[p]) == k
        && (slice[p].2 < key.2 || (or_equal && slice[p].2 == key.2))
    {
        p += 1;
    }
    p
}

/// Where `key` is in sorted `slice`, or where it would go.
#[inline]
fn search(slice: &[FreeKey], key: &FreeKey) -> Result<usize, usize> {
    let p = rank(slice, key, false);
    if slice.get(p) == Some(key) {
        Ok(p)
    } else {
        Err(p)
    }
}

impl FreeSet {
    /// The run that holds `key` or would: the last whose first entry is at
    /// most `key` (the first run when there is none).
    #[inline]
    fn run_of(&self, key: &FreeKey) -> usize {
        rank(&self.firsts, key, true).saturating_sub(1)
    }

    pub(crate) fn insert(&mut self, size: u64, address: u64, index: usize) -> bool {
        let key = (size, address, index);
        if self.runs.is_empty() {
            self.runs.push(vec![key]);
            self.firsts.push(key);
            self.len = 1;
            return true;
        }
        let r = self.run_of(&key);
        let run = &mut self.runs[r];
        let Err(at) = search(run, &key) else {
            return false;
        };
        run.insert(at, key);
        if at == 0 {
            self.firsts[r] = key;
        }
        if run.len() > RUN {
            let rest = run.split_off(RUN / 2);
            self.firsts.insert(r + 1, rest[0]);
            self.runs.insert(r + 1, rest);
        }
        self.len += 1;
        true
    }

    /// (run, position) of `key`, if it is here.
    #[inline]
    fn locate(&self, key: &FreeKey) -> Option<(usize, usize)> {
        let (r, i) = self.hint.get();
        if self.runs.get(r).and_then(|run| run.get(i)) == Some(key) {
            return Some((r, i));
        }
        if self.runs.is_empty() {
            return None;
        }
        let r = self.run_of(key);
        search(&self.runs[r], key).ok().map(|i| (r, i))
    }

    pub(crate) fn remove(&mut self, size: u64, address: u64, index: usize) -> bool {
        let key = (size, address, index);
        let Some((r, at)) = self.locate(&key) else {
            return false;
        };
        let run = &mut self.runs[r];
        run.remove(at);
        self.len -= 1;
        if run.is_empty() {
            self.runs.remove(r);
            self.firsts.remove(r);
            return true;
        }
        if at == 0 {
            self.firsts[r] = run[0];
        }
        // Keep runs from thinning out: a short run takes in the next when
        // both fit in one.
        let short = run.len();
        if short < RUN / 4 && r + 1 < self.runs.len() && short + self.runs[r + 1].len() <= RUN {
            let next = self.runs.remove(r + 1);
            self.firsts.remove(r + 1);
            self.runs[r].extend(next);
        }
        true
    }

    /// Replaces entry `old` by `new`: moves the entries between their
    /// places by one when both lie in the same run. False (nothing
    /// changed) if `old` is not here.
    pub(crate) fn replace(&mut self, old: FreeKey, new: FreeKey) -> bool {
        let Some((r, i)) = self.locate(&old) else {
            return false;
        };
        let fits_here = (r == 0 || self.firsts[r] <= new)
            && self.firsts.get(r + 1).is_none_or(|next| new < *next);
        if !fits_here {
            self.remove(old.0, old.1, old.2);
            return self.insert(new.0, new.1, new.2);
        }
        let run = &mut self.runs[r];
        if new < old {
            let j = rank(&run[..i], &new, false);
            run[j..=i].rotate_right(1);
            run[j] = new;
        } else {
            let j = i + rank(&run[i + 1..], &new, false);
            run[i..=j].rotate_left(1);
            run[j] = new;
        }
        self.firsts[r] = run[0];
        true
    }

    pub(crate) fn contains(&self, size: u64, address: u64, index: usize) -> bool {
        let key = (size, address, index);
        !self.runs.is_empty() && search(&self.runs[self.run_of(&key)], &key).is_ok()
    }

    /// (size, address, index) of every block, smallest first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, u64, usize)> + '_ {
        self.runs.iter().flatten().copied()
    }

    /// The blocks of at least `size` bytes, smallest first.
    #[inline]
    pub(crate) fn at_least(&self, size: u64) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        let key = (size, 0, 0);
        let (r, at) = if self.runs.is_empty() {
            (0, 0)
        } else {
            let r = self.run_of(&key);
            (r, rank(&self.runs[r], &key, false))
        };
        self.hint.set((r, at));
        let first = self.runs.get(r).map_or(&[][..], |run| &run[at..]);
        let rest = self.runs.get(r + 1..).unwrap_or(&[]);
        first.iter().chain(rest.iter().flatten()).copied()
    }

    /// The blocks smaller than `size` bytes, smallest first.
    pub(crate) fn below(&self, size: u64) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        self.iter().take_while(move |e| e.0 < size)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Free blocks of one pool, ordered by (size, address) for best fit.
#[derive(Debug, Default, Clone)]
pub(crate) struct BlockPool {
    blocks: FreeSet,
    /// Unmapped blocks of expandable segments, by address (PyTorch's
    /// `BlockPool::unmapped`): where a segment can grow.
    pub(crate) unmapped: BTreeSet<(u64, usize)>,
    /// Calls of `get_free_block` on this pool: the clock that ages blocks for
    /// garbage collection.
    get_free_blocks_call_count: u64,
}

/// The caching allocator.
pub struct CachingAllocator<S: SegmentSource> {
    config: AllocatorConfig,
    pub(crate) source: S,
    pub(crate) blocks: Vec<Block>,
    free_slots: Vec<usize>,
    small: BlockPool,
    large: BlockPool,
    pub(crate) segments: SegmentTable,
    /// How many of `segments` are expandable (spares a lookup per block
    /// when there are none).
    pub(crate) expandable_count: usize,
    pub(crate) stats: DeviceStats,
    /// Bytes held in segments (PyTorch's `total_allocated_memory`).
    pub(crate) total_reserved: u64,
    pub(crate) next_segment_id: u64,
    pub(crate) next_address: u64,
    /// The event log, while recording (see `start_recording`).
    recorder: Option<Recorder>,
    /// The placement hook (placement.rs); `None` is PyTorch's allocator.
    placement: Option<Box<dyn Placement>>,
    /// Pages mapped into expandable segments: page address → the device
    /// allocation behind it.
    pub(crate) pages: PageMap,
}

struct Recorder {
    start: std::time::Instant,
    events: Vec<MemEvent>,
}

/// Most events one recording keeps (about 250 MB): a longer one is an
/// error, not memory that grows with whatever size was asked for.
pub const MAX_RECORDED_EVENTS: usize = 2_000_000;

/// First virtual address handed out; looks like a device pointer in reports.
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;

impl<S: SegmentSource> CachingAllocator<S> {
    pub fn new(source: S, config: AllocatorConfig) -> Self {
        let stats = DeviceStats {
            max_split_size: config.max_split_size.min(i64::MAX as u64) as i64,
            ..Default::default()
        };
        let placement = config.placement.as_ref().map(|p| p.fresh());
        CachingAllocator {
            config,
            source,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            segments: SegmentTable::default(),
            expandable_count: 0,
            stats,
            total_reserved: 0,
            next_segment_id: 0,
            next_address: BASE_ADDRESS,
            recorder: None,
            placement,
            pages: PageMap::default(),
        }
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Replaces the placement hook (`None`: PyTorch's rules only). The
    /// configuration keeps the policy it was built with.
    pub fn set_placement(&mut self, placement: Option<Box<dyn Placement>>) {
        self.placement = placement;
    }

    /// Calls the hook with a view of this allocator; `None` without a hook.
    fn consult<R>(
        &mut self,
        ask: impl FnOnce(&mut dyn Placement, &dyn AllocatorView) -> R,
    ) -> Option<R> {
        // Taken out for the call: the hook reads the allocator it sits in.
        let mut hook = self.placement.take()?;
        let answer = ask(hook.as_mut(), &*self);
        self.placement = Some(hook);
        Some(answer)
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// `torch.cuda.memory_allocated()`.
    pub fn memory_allocated(&self) -> u64 {
        self.stats.allocated_bytes.get(StatType::Aggregate).current as u64
    }

    /// `torch.cuda.memory_reserved()`.
    pub fn memory_reserved(&self) -> u64 {
        self.stats.reserved_bytes.get(StatType::Aggregate).current as u64
    }

    /// `torch.cuda.max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.stats.allocated_bytes.get(StatType::Aggregate).peak as u64
    }

    /// `torch.cuda.max_memory_reserved()`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.stats.reserved_bytes.get(StatType::Aggregate).peak as u64
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_memory_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_memory_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// `torch.cuda.empty_cache()`: returns every cached whole segment.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    /// Sets or clears the memory limit (`set_per_process_memory_fraction`).
    pub fn set_memory_limit(&mut self, limit: Option<u64>) {
        self.config.memory_limit = limit;
    }

    /// The label of an allocated block.
    pub fn label(&self, handle: BlockHandle) -> Option<&str> {
        self.blocks
            .get(handle.index as usize)
            .filter(|b| b.live && b.generation == handle.generation)
            .and_then(|b| b.label.as_deref().or(b.allocated.then_some("")))
    }

    /// Starts (or restarts) the event log.
    pub fn start_recording(&mut self) {
        self.recorder = Some(Recorder {
            start: std::time::Instant::now(),
            events: Vec::new(),
        });
    }

    /// Stops recording and returns the events.
    pub fn take_events(&mut self) -> Vec<MemEvent> {
        self.recorder.take().map(|r| r.events).unwrap_or_default()
    }

    pub fn is_recording(&self) -> bool {
        self.recorder.is_some()
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        kind: EventKind,
        size: u64,
        requested: u64,
        address: u64,
        segment: SegmentId,
        category: Category,
        previous: Option<Category>,
        op: Option<&Arc<str>>,
        label: Option<&Arc<str>>,
    ) {
        let (allocated, reserved) = (self.memory_allocated(), self.memory_reserved());
        let device_free = (kind == EventKind::Oom)
            .then(|| {
                self.source
                    .free_capacity()
                    .or_else(|| self.config.memory_limit.map(|l| l.saturating_sub(reserved)))
            })
            .flatten();
        if let Some(r) = &mut self.recorder {
            r.events.push(MemEvent {
                seq: r.events.len() as u64,
                t_us: r.start.elapsed().as_secs_f64() * 1e6,
                kind,
                size,
                requested,
                address,
                segment: segment.0,
                category,
                previous,
                op: op.cloned().unwrap_or_else(|| Arc::from("")),
                label: label.cloned().unwrap_or_else(|| Arc::from("")),
                allocated,
                reserved,
                device_free,
            });
        }
    }

    /// Records a segment event (obtained, returned, pages mapped or unmapped).
    pub(crate) fn record_segment(
        &mut self,
        kind: EventKind,
        size: u64,
        address: u64,
        segment: SegmentId,
    ) {
        self.record(
            kind,
            size,
            0,
            address,
            segment,
            Category::Untagged,
            None,
            None,
            None,
        );
    }

    /// Marks the start of a phase (forward, backward, optimizer) in the log.
    pub fn mark_phase(&mut self, name: &str) {
        let name: Arc<str> = Arc::from(name);
        self.record(
            EventKind::Phase,
            0,
            0,
            0,
            SegmentId(0),
            Category::Untagged,
            None,
            Some(&name),
            None,
        );
    }

    /// The category and op of an allocated block.
    pub fn tag(&self, handle: BlockHandle) -> Option<(Category, Option<&str>)> {
        self.blocks
            .get(handle.index as usize)
            .filter(|b| b.live && b.generation == handle.generation && b.allocated)
            .map(|b| (b.category, b.op.as_deref()))
    }

    /// Changes an allocated block's category (a forward output saved for
    /// backward becomes an activation; a gradient moved into `.grad` becomes
    /// a gradient). Stale handles are ignored.
    pub fn retag(&mut self, handle: BlockHandle, category: Category) {
        let index = handle.index as usize;
        let Some(b) = self
            .blocks
            .get_mut(index)
            .filter(|b| b.live && b.generation == handle.generation && b.allocated)
        else {
            return;
        };
        if b.category == category {
            return;
        }
        let previous = std::mem::replace(&mut b.category, category);
        let b = b.clone();
        self.record(
            EventKind::Retag,
            b.size,
            b.requested,
            b.address,
            b.segment,
            category,
            Some(previous),
            b.op.as_ref(),
            b.label.as_ref(),
        );
    }

    /// Allocates `size` bytes for a tensor called `label`.
    pub fn malloc(&mut self, orig_size: u64, label: &str) -> Result<Allocation, AllocError> {
        self.malloc_tagged(orig_size, label, Category::Untagged, None)
    }

    /// Allocates `size` bytes for a tensor called `label`, of `category`,
    /// made by `op`.
    pub fn malloc_tagged(
        &mut self,
        orig_size: u64,
        label: &str,
        category: Category,
        op: Option<Arc<str>>,
    ) -> Result<Allocation, AllocError> {
        if orig_size == 0 {
            return Err(AllocError::ZeroSize);
        }
        if orig_size > MAX_BYTES {
            return Err(AllocError::Unrepresentable(orig_size));
        }
        if self
            .recorder
            .as_ref()
            .is_some_and(|r| r.events.len() >= MAX_RECORDED_EVENTS)
        {
            return Err(AllocError::RecordingFull(MAX_RECORDED_EVENTS));
        }
        let size = round_size(orig_size, &self.config);
        let pool = pool_for(size);
        let alloc_size = allocation_size(size);
        let expandable = self.config.expandable_segments;
        if expandable && !self.source.maps_pages() {
            return Err(AllocError::Device(format!(
                "expandable_segments:True needs virtual memory mapping, which {} does not have (wgpu cannot map pages into a reserved range); leave expandable_segments out, or use it where the device is simulated (estimate, sweep, replay, bench-alloc)",
                self.source.describe()
            )));
        }
        let max_segment = self.source.max_segment_size();
        if !expandable && alloc_size > max_segment && size > max_segment {
            return Err(AllocError::TooLarge {
                requested: orig_size,
                segment: alloc_size,
                max: max_segment,
            });
        }
        // A 20 MiB segment may be too big for a small device even though the
        // request itself fits: ask for exactly the request then.
        let alloc_size = alloc_size.min(max_segment);

        let request = Request {
            requested: orig_size,
            size,
            pool,
            segment_size: alloc_size,
            category,
        };
        let mut found = None;
        if !expandable {
            if let Some(place) = self.consult(|p, v| p.place(v, &request)).flatten() {
                found = self.take_place(place, size)?;
            }
        }
        // A block found by best fit stays in its pool until it is split
        // or taken (`alloc_found_block`): one update of the pool, not two.
        let mut in_pool = false;
        if found.is_none() {
            found = self.get_free_block(pool, size);
            in_pool = found.is_some();
        }
        if found.is_none() && pool == PoolKind::Small && self.placement.is_some() {
            if let Some(index) = self.peek_free_block(PoolKind::Large, size) {
                let block = self.free_block_info(index);
                let carve = self.consult(|p, v| p.carve_small_from_large(v, &request, block));
                if carve == Some(true) {
                    found = self.get_free_block(PoolKind::Large, size);
                    in_pool = found.is_some();
                }
            }
        }
        if found.is_none() {
            if self.config.memory_limit.is_some() && self.config.garbage_collection_threshold > 0.0
            {
                self.garbage_collect_cached_blocks();
            }
            if self.consult(|p, v| p.release_before_grow(v, &request)) == Some(true) {
                self.release_free_segments_smaller_than(pool, size);
            }
            found = self.grow(pool, alloc_size, size, false)?;
            if found.is_none() && self.release_available_cached_blocks(pool, size) {
                found = self.grow(pool, alloc_size, size, false)?;
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.grow(pool, alloc_size, size, true)?;
            }
        }
        let Some(index) = found else {
            self.stats.num_ooms += 1;
            let label: Arc<str> = Arc::from(label);
            self.record(
                EventKind::Oom,
                size,
                orig_size,
                0,
                SegmentId(0),
                category,
                None,
                op.as_ref(),
                Some(&label),
            );
            return Err(AllocError::OutOfMemory(Box::new(OomReport {
                requested: orig_size,
                rounded: size,
                alloc_size,
                limit: self.config.memory_limit,
                capacity: self.source.total_capacity(),
                device_free: self.source.free_capacity(),
                allocated: self.memory_allocated(),
                reserved: self.memory_reserved(),
            })));
        };
        Ok(self.finish_alloc(index, in_pool, &request, label, op))
    }

    /// Splits the found block `index` as PyTorch does, marks it allocated
    /// for `request`, tells the hook and records the event.
    /// `in_pool`: the block is still in its pool (found by best fit).
    fn finish_alloc(
        &mut self,
        index: usize,
        in_pool: bool,
        request: &Request,
        label: &str,
        op: Option<Arc<str>>,
    ) -> Allocation {
        let split = self.should_split(index, request.size);
        let index = self.alloc_found_block(
            index,
            in_pool,
            request.size,
            request.requested,
            split,
            label,
        );
        let b = &mut self.blocks[index];
        b.category = request.category;
        if op.is_some() || b.op.is_some() {
            b.op = op;
        }
        let handle = BlockHandle {
            index: index as u32,
            generation: self.blocks[index].generation,
        };
        if let Some(p) = &mut self.placement {
            p.on_alloc(handle, request);
        }
        if self.recorder.is_some() {
            let b = self.blocks[index].clone();
            self.record(
                EventKind::Alloc,
                b.size,
                b.requested,
                b.address,
                b.segment,
                request.category,
                None,
                b.op.as_ref(),
                b.label.as_ref(),
            );
        }
        let b = &self.blocks[index];
        let seg = &self.segments[&b.segment];
        Allocation {
            handle,
            segment: b.segment,
            address: b.address,
            offset: b.address - seg.address,
            size: b.size,
            requested: b.requested,
        }
    }

    /// Allocates `orig_size` bytes at `place` instead of by best fit, as if
    /// the hook had chosen it: for trying a place on a ghost. `None` when the
    /// place cannot take the request or the device refuses the segment; no
    /// cache is flushed and nothing retried.
    pub fn malloc_at(
        &mut self,
        place: Place,
        orig_size: u64,
        category: Category,
    ) -> Option<Allocation> {
        let full = |r: &Recorder| r.events.len() >= MAX_RECORDED_EVENTS;
        if orig_size == 0 || orig_size > MAX_BYTES || self.recorder.as_ref().is_some_and(full) {
            return None;
        }
        let size = round_size(orig_size, &self.config);
        let index = self.take_place(place, size).ok()??;
        let request = Request {
            requested: orig_size,
            size,
            pool: pool_for(size),
            segment_size: allocation_size(size).min(self.source.max_segment_size()),
            category,
        };
        Some(self.finish_alloc(index, false, &request, "", None))
    }

    /// Takes `place` for a block of `size` (rounded) bytes out of the pool
    /// or from the device; `Ok(None)` if it cannot serve (see [`Place`]).
    fn take_place(&mut self, place: Place, size: u64) -> Result<Option<usize>, AllocError> {
        match place {
            Place::Block(b) => {
                let index = b.index as usize;
                let usable = self.blocks.get(index).is_some_and(|x| {
                    x.live
                        && x.generation == b.generation
                        && (x.address, x.size) == (b.address, b.size)
                        && !x.allocated
                        && x.mapped
                        && may_serve(x.size, size, self.config.max_split_size)
                        && x.size >= size
                }) && self.in_pool(index);
                if !usable {
                    return Ok(None);
                }
                self.remove_from_pool(index);
                Ok(Some(index))
            }
            Place::NewSegment { pool, size: bytes } if bytes >= size => {
                self.alloc_block(pool, bytes, false)
            }
            Place::NewSegment { .. } => Ok(None),
        }
    }

    /// The free block `index` as the hook sees it.
    fn free_block_info(&self, index: usize) -> FreeBlock {
        let b = &self.blocks[index];
        FreeBlock {
            index: index as u32,
            generation: b.generation,
            address: b.address,
            size: b.size,
            pool: b.pool,
        }
    }

    /// Rebuilds a segment that existed before a recording began (a PyTorch
    /// snapshot whose history starts mid-run): a `size`-byte segment in
    /// `pool` whose allocated blocks are `live` (offset, block size,
    /// requested bytes), the gaps between them free and cached as PyTorch
    /// holds them. Returns a handle per live block, in `live`'s order.
    pub fn adopt_segment(
        &mut self,
        pool: PoolKind,
        size: u64,
        live: &[(u64, u64, u64)],
    ) -> Result<Vec<BlockHandle>, AllocError> {
        let mut order: Vec<usize> = (0..live.len()).collect();
        order.sort_by_key(|&i| live[i].0);
        let mut pos = 0;
        for &i in &order {
            let (offset, bsize, _) = live[i];
            if offset < pos || bsize == 0 || offset.checked_add(bsize).is_none_or(|e| e > size) {
                return Err(AllocError::InvalidFree(format!(
                    "a recorded block at offset {offset} of {bsize} bytes overlaps another or leaves its {size}-byte segment"
                )));
            }
            pos = offset + bsize;
        }
        let mut current = self.alloc_block(pool, size, false)?.ok_or_else(|| {
            AllocError::Device(format!("no room to rebuild a {size}-byte segment"))
        })?;
        let handle = |a: &Self, index: usize| BlockHandle {
            index: index as u32,
            generation: a.blocks[index].generation,
        };
        let mut handles = vec![None; live.len()];
        let mut gaps = Vec::new();
        let mut pos = 0;
        let mut rest = Some(current);
        for &i in &order {
            let (offset, bsize, requested) = live[i];
            let Some(c) = rest else { break };
            current = c;
            if offset > pos {
                // The free gap before this block: carve it, free it below.
                let gap =
                    self.alloc_found_block(current, false, offset - pos, offset - pos, true, "");
                gaps.push(gap);
                current = self.blocks[gap].next.expect("a block follows the gap");
                self.remove_from_pool(current);
            }
            let split = self.blocks[current].size > bsize;
            let b = self.alloc_found_block(current, false, bsize, requested.max(1), split, "");
            handles[i] = Some(handle(self, b));
            pos = offset + bsize;
            rest = if split {
                let r = self.blocks[b].next.expect("split leaves a remainder");
                self.remove_from_pool(r);
                Some(r)
            } else {
                None
            };
        }
        if let Some(r) = rest {
            self.insert_into_pool(r);
        }
        for g in gaps {
            let h = handle(self, g);
            self.free(h)?;
        }
        // Validation above leaves room for every block; a file that slips
        // past it is an error, not a crash.
        handles
            .into_iter()
            .map(|h| {
                h.ok_or_else(|| {
                    AllocError::InvalidFree("a recorded block lies past its segment's end".into())
                })
            })
            .collect()
    }

    /// Returns a block to the cache.
    pub fn free(&mut self, handle: BlockHandle) -> Result<(), AllocError> {
        let index = handle.index as usize;
        match self.blocks.get(index) {
            Some(b) if b.live && b.generation == handle.generation && b.allocated => {}
            _ => return Err(AllocError::InvalidFree(
                "this block is not allocated (freed twice, or never allocated by this allocator)"
                    .into(),
            )),
        }
        let before = self.recorder.is_some().then(|| self.blocks[index].clone());
        let (size, pool) = {
            let b = &mut self.blocks[index];
            b.allocated = false;
            b.label = None;
            b.op = None;
            (b.size, b.pool)
        };
        let st = pool.stat_type();
        self.stats.allocation.decrease(st, 1);
        self.stats.allocated_bytes.decrease(st, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if let Some(b) = before {
            self.record(
                EventKind::Free,
                b.size,
                b.requested,
                b.address,
                b.segment,
                b.category,
                None,
                b.op.as_ref(),
                b.label.as_ref(),
            );
        }
        self.blocks[index].category = Category::Untagged;
        self.free_block(index);
        if let Some(p) = &mut self.placement {
            p.on_free(handle);
        }
        Ok(())
    }

    /// Every allocated block with its category, in slot order.
    pub fn allocated_blocks(&self) -> impl Iterator<Item = (BlockHandle, Category)> + '_ {
        self.live_blocks()
            .filter(|(_, b)| b.allocated)
            .map(|(i, b)| {
                let handle = BlockHandle {
                    index: i as u32,
                    generation: b.generation,
                };
                (handle, b.category)
            })
    }

    /// A copy of the bookkeeping over a simulated device (the same capacity
    /// and segments), to try a placement without touching real memory. It
    /// has no hook (give it one with [`Self::set_placement`]), records
    /// nothing, and its peaks start at its current values.
    pub fn ghost(&self) -> CachingAllocator<SimulatedSource> {
        let mut source = match self.source.total_capacity() {
            Some(c) => SimulatedSource::new(c),
            None => SimulatedSource::unlimited(),
        }
        .with_max_segment_size(self.source.max_segment_size());
        for (id, seg) in self.segments.iter() {
            if !seg.expandable {
                let _ = source.allocate(id, seg.size);
            }
        }
        for &(id, size) in self.pages.values() {
            let _ = source.allocate(id, size);
        }
        let mut stats = self.stats.clone();
        stats.reset_peak();
        CachingAllocator {
            config: AllocatorConfig {
                placement: None,
                ..self.config.clone()
            },
            source,
            blocks: self.blocks.clone(),
            free_slots: self.free_slots.clone(),
            small: self.small.clone(),
            large: self.large.clone(),
            segments: self.segments.clone(),
            expandable_count: self.expandable_count,
            stats,
            total_reserved: self.total_reserved,
            next_segment_id: self.next_segment_id,
            next_address: self.next_address,
            recorder: None,
            placement: None,
            pages: self.pages.clone(),
        }
    }

    /// The free blocks of `kind` that may take `size` (rounded) bytes, best
    /// fit first (best fit takes the first).
    pub fn fitting_free_blocks(
        &self,
        kind: PoolKind,
        size: u64,
    ) -> impl Iterator<Item = FreeBlock> + '_ {
        let max_split = self.config.max_split_size;
        self.pool(kind)
            .blocks
            .at_least(size)
            .take_while(move |&(bsize, _, _)| may_serve(bsize, size, max_split))
            .map(|(_, _, i)| self.free_block_info(i))
    }

    // ----- internals, named after their PyTorch counterparts -----

    pub(crate) fn pool(&self, kind: PoolKind) -> &BlockPool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    pub(crate) fn pool_mut(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    pub(crate) fn insert_into_pool(&mut self, index: usize) {
        let (size, address, kind) = {
            let b = &self.blocks[index];
            (b.size, b.address, b.pool)
        };
        let clock = self.pool_mut(kind).get_free_blocks_call_count;
        self.blocks[index].gc_count_base = clock;
        let inserted = self.pool_mut(kind).blocks.insert(size, address, index);
        debug_assert!(inserted);
    }

    /// Block `index`, in its pool as (`was.0` bytes, at `was.1`), has
    /// changed size and address: its entry moves to where it now belongs.
    fn move_in_pool(&mut self, index: usize, was: (u64, u64)) {
        let (size, address, kind) = {
            let b = &self.blocks[index];
            (b.size, b.address, b.pool)
        };
        let pool = self.pool_mut(kind);
        let clock = pool.get_free_blocks_call_count;
        if !pool
            .blocks
            .replace((was.0, was.1, index), (size, address, index))
        {
            debug_assert!(false, "block {index} was not in its pool");
            pool.blocks.insert(size, address, index);
        }
        self.blocks[index].gc_count_base = clock;
    }

    /// Block `index` (in no pool) takes over the pool entry `old` of a
    /// block merged into it.
    fn take_over_entry(&mut self, index: usize, old: (u64, u64, usize)) {
        let (size, address, kind) = {
            let b = &self.blocks[index];
            (b.size, b.address, b.pool)
        };
        let pool = self.pool_mut(kind);
        let clock = pool.get_free_blocks_call_count;
        if !pool.blocks.replace(old, (size, address, index)) {
            debug_assert!(false, "block {} was not in its pool", old.2);
            pool.blocks.insert(size, address, index);
        }
        self.blocks[index].gc_count_base = clock;
    }

    pub(crate) fn remove_from_pool(&mut self, index: usize) {
        let (size, address, kind) = {
            let b = &self.blocks[index];
            (b.size, b.address, b.pool)
        };
        let removed = self.pool_mut(kind).blocks.remove(size, address, index);
        debug_assert!(removed);
    }

    pub(crate) fn new_block(&mut self, block: Block) -> usize {
        if let Some(i) = self.free_slots.pop() {
            let generation = self.blocks[i].generation.wrapping_add(1);
            self.blocks[i] = Block {
                generation,
                ..block
            };
            i
        } else {
            self.blocks.push(block);
            self.blocks.len() - 1
        }
    }

    pub(crate) fn delete_block(&mut self, index: usize) {
        self.blocks[index].live = false;
        self.blocks[index].label = None;
        self.free_slots.push(index);
    }

    fn gc_count(&self, index: usize) -> u64 {
        let b = &self.blocks[index];
        self.pool(b.pool).get_free_blocks_call_count - b.gc_count_base
    }

    /// PyTorch's `get_free_block`: the best-fitting block, left in its
    /// pool for `alloc_found_block` to take out.
    fn get_free_block(&mut self, kind: PoolKind, size: u64) -> Option<usize> {
        let gc_on =
            self.config.memory_limit.is_some() && self.config.garbage_collection_threshold > 0.0;
        if gc_on {
            self.pool_mut(kind).get_free_blocks_call_count += 1;
        }
        self.peek_free_block(kind, size)
    }

    /// The block `get_free_block` would take, left in its pool. In an
    /// expandable segment a block's size for best fit is what it can grow
    /// to (itself plus the unmapped space after it), so PyTorch walks on to
    /// larger blocks while they can grow less (see `expandable_size`).
    fn peek_free_block(&self, kind: PoolKind, size: u64) -> Option<usize> {
        let max_split = self.config.max_split_size;
        let mut it = self.pool(kind).blocks.at_least(size);
        let (_, _, mut index) = it.next()?;
        if self.config.expandable_segments && self.is_expandable(index) {
            for (_, _, next) in it {
                if !self.is_expandable(index)
                    || self.expandable_size(next) >= self.expandable_size(index)
                {
                    break;
                }
                index = next;
            }
        }
        may_serve(self.blocks[index].size, size, max_split).then_some(index)
    }

    fn garbage_collect_cached_blocks(&mut self) {
        let Some(limit) = self.config.memory_limit else {
            return;
        };
        let gc_threshold = (self.config.garbage_collection_threshold * limit as f64) as u64;
        if self.total_reserved <= gc_threshold {
            return;
        }
        let target = self.total_reserved - gc_threshold;
        let mut reclaimed = 0u64;
        let candidates: Vec<usize> = self
            .large
            .blocks
            .iter()
            .map(|(_, _, i)| i)
            .filter(|&i| !self.blocks[i].is_split() && !self.is_expandable(i))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let mut total_age: f64 = candidates.iter().map(|&i| self.gc_count(i) as f64).sum();
        let mut count = candidates.len();
        let mut released = vec![false; candidates.len()];
        let mut block_freed = true;
        while reclaimed < target && block_freed && count > 0 {
            let age_threshold = total_age / count as f64;
            block_freed = false;
            for (k, &i) in candidates.iter().enumerate() {
                if released[k] {
                    continue;
                }
                let age = self.gc_count(i) as f64;
                if age >= age_threshold {
                    block_freed = true;
                    reclaimed += self.blocks[i].size;
                    total_age -= age;
                    count -= 1;
                    released[k] = true;
                    self.release_block(i);
                }
            }
        }
    }

    /// Obtains a new segment; `Ok(None)` means the device (or the limit) said no.
    pub(crate) fn alloc_block(
        &mut self,
        kind: PoolKind,
        size: u64,
        is_retry: bool,
    ) -> Result<Option<usize>, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(limit) = self.config.memory_limit {
            if self.total_reserved + size > limit {
                return Ok(None);
            }
        }
        let id = SegmentId(self.next_segment_id);
        match self.source.allocate(id, size) {
            Ok(()) => {}
            Err(SourceError::OutOfMemory) => return Ok(None),
            Err(SourceError::Other(msg)) => return Err(AllocError::Device(msg)),
        }
        self.next_segment_id += 1;
        self.total_reserved += size;
        let address = match self.source.address_of(id, size) {
            Some(a) => a,
            None => {
                let a = self.next_address;
                // Leave a gap so neighbouring segments never look contiguous.
                self.next_address += size.div_ceil(K_ROUND_LARGE) * K_ROUND_LARGE + K_ROUND_LARGE;
                a
            }
        };
        self.segments.insert(
            id,
            Segment {
                address,
                size,
                pool: kind,
                expandable: false,
            },
        );
        let index = self.new_block(Block::free(id, address, size, kind));
        let st = kind.stat_type();
        self.stats.segment.increase(st, 1);
        self.stats.reserved_bytes.increase(st, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.record_segment(EventKind::SegmentAlloc, size, address, id);
        Ok(Some(index))
    }

    /// Frees oversize cached blocks, largest first, until `size` is covered.
    fn release_available_cached_blocks(&mut self, kind: PoolKind, size: u64) -> bool {
        let max_split = self.config.max_split_size;
        // Expandable blocks are never released whole (PyTorch's
        // `release_block` asserts it); their pages go back below.
        if max_split == u64::MAX || self.config.expandable_segments {
            return false;
        }
        let key = size.max(max_split);
        let pool = self.pool(kind);
        let first = pool.blocks.at_least(key).next();
        if let Some((_, _, index)) = first {
            self.release_block(index);
            return true;
        }
        let descending: Vec<(u64, usize)> =
            pool.blocks.iter().rev().map(|(s, _, i)| (s, i)).collect();
        if descending.is_empty() {
            return false;
        }
        let mut total = 0u64;
        for (bsize, index) in descending {
            if total >= key || bsize < max_split {
                break;
            }
            total += bsize;
            self.release_block(index);
        }
        total >= key
    }

    /// Gives back the whole free segments of `kind` smaller than `size`:
    /// they could not have served the request (the hook's
    /// `release_before_grow`).
    fn release_free_segments_smaller_than(&mut self, kind: PoolKind, size: u64) {
        let pool = self.pool(kind);
        let whole: Vec<usize> = pool
            .blocks
            .below(size)
            .map(|(_, _, i)| i)
            .filter(|&i| !self.blocks[i].is_split() && !self.is_expandable(i))
            .collect();
        for i in whole {
            self.release_block(i);
        }
    }

    /// Frees every cached whole segment (`empty_cache`).
    fn release_cached_blocks(&mut self) {
        // PyTorch synchronizes all streams here and counts it.
        self.stats.num_sync_all_streams += 1;
        for kind in [PoolKind::Large, PoolKind::Small] {
            let pool = self.pool(kind);
            let (expandable, fixed): (Vec<usize>, Vec<usize>) = pool
                .blocks
                .iter()
                .map(|(_, _, i)| i)
                .partition(|&i| self.is_expandable(i));
            for i in fixed {
                if !self.blocks[i].is_split() {
                    self.release_block(i);
                }
            }
            // Unmapping changes the pool: gathered first, as PyTorch does.
            for i in expandable {
                self.unmap_block(i);
                let b = &self.blocks[i];
                if !b.mapped && b.prev.is_none() && b.next.is_none() {
                    self.release_expandable_segment(i);
                }
            }
        }
    }

    /// Gives a whole free segment back to the device.
    fn release_block(&mut self, index: usize) {
        debug_assert!(!self.blocks[index].is_split() && !self.blocks[index].allocated);
        let (segment, size, kind) = {
            let b = &self.blocks[index];
            (b.segment, b.size, b.pool)
        };
        self.remove_from_pool(index);
        self.stats.num_device_free += 1;
        self.source.release(segment, size);
        self.total_reserved -= size;
        let st = kind.stat_type();
        self.stats.segment.decrease(st, 1);
        self.stats.reserved_bytes.decrease(st, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        let removed = self.segments.remove(&segment);
        if removed.as_ref().is_some_and(|s| s.expandable) {
            self.expandable_count -= 1;
        }
        let address = removed.map(|s| s.address).unwrap_or(0);
        self.delete_block(index);
        self.record_segment(EventKind::SegmentFree, size, address, segment);
    }

    fn should_split(&self, index: usize, size: u64) -> bool {
        let b = &self.blocks[index];
        let remaining = b.size - size;
        if self.config.expandable_segments {
            return remaining >= K_MIN_BLOCK_SIZE;
        }
        match b.pool {
            PoolKind::Small => remaining >= K_MIN_BLOCK_SIZE,
            PoolKind::Large => size < self.config.max_split_size && remaining > K_SMALL_SIZE,
        }
    }

    /// Marks the first `size` bytes of free block `index` allocated,
    /// splitting the rest off when `split`. `in_pool`: the block is still
    /// in its pool; it leaves it here (or its remainder takes its place).
    pub(crate) fn alloc_found_block(
        &mut self,
        index: usize,
        in_pool: bool,
        size: u64,
        orig_size: u64,
        split: bool,
        label: &str,
    ) -> usize {
        if in_pool && !split {
            self.remove_from_pool(index);
        }
        let already_split = self.blocks[index].is_split();
        // PyTorch leaves expandable blocks out of `inactive_split`: their
        // free whole pages can always be given back.
        let counts_split = !self.is_expandable(index);
        let st = self.blocks[index].pool.stat_type();
        let mut block = index;
        if split {
            let remaining = index;
            let (segment, address, pool, prev) = {
                let r = &self.blocks[remaining];
                (r.segment, r.address, r.pool, r.prev)
            };
            let expandable = self.blocks[remaining].expandable;
            block = self.new_block(Block {
                prev,
                next: Some(remaining),
                expandable,
                ..Block::free(segment, address, size, pool)
            });
            if let Some(p) = prev {
                self.blocks[p].next = Some(block);
            }
            let was = {
                let r = &mut self.blocks[remaining];
                let was = (r.size, r.address);
                r.prev = Some(block);
                r.address += size;
                r.size -= size;
                was
            };
            if in_pool {
                self.move_in_pool(remaining, was);
            } else {
                self.insert_into_pool(remaining);
            }
            if !counts_split {
            } else if already_split {
                // An already-split inactive block shrinks by `size`.
                self.stats.inactive_split_bytes.decrease(st, size as i64);
            } else {
                // A new inactive split block appears.
                let rsize = self.blocks[remaining].size as i64;
                self.stats.inactive_split_bytes.increase(st, rsize);
                self.stats.inactive_split.increase(st, 1);
            }
        } else if already_split && counts_split {
            let bsize = self.blocks[block].size as i64;
            self.stats.inactive_split_bytes.decrease(st, bsize);
            self.stats.inactive_split.decrease(st, 1);
        }
        let bsize = {
            let b = &mut self.blocks[block];
            b.allocated = true;
            b.requested = orig_size;
            // An empty label is kept as `None` (no allocation per block);
            // `label` and snapshots read it back as "".
            b.label = (!label.is_empty()).then(|| Arc::from(label));
            b.size
        };
        self.stats.allocation.increase(st, 1);
        self.stats.allocated_bytes.increase(st, bsize as i64);
        self.stats.active.increase(st, 1);
        self.stats.active_bytes.increase(st, bsize as i64);
        self.stats.requested_bytes.increase(st, orig_size as i64);
        if bsize >= self.config.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        block
    }

    fn free_block(&mut self, index: usize) {
        let (orig_size, requested, st) = {
            let b = &self.blocks[index];
            (b.size, b.requested, b.pool.stat_type())
        };
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        let candidates = [self.blocks[index].prev, self.blocks[index].next];
        // The first neighbour merged leaves its pool entry for the merged
        // block to take over (one update of the pool instead of two).
        let mut entry = None;
        for candidate in candidates {
            let subsumed = self.merge_free_neighbour(index, candidate, &mut entry);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        match entry {
            Some((size, address, old)) => self.take_over_entry(index, (size, address, old)),
            None => self.insert_into_pool(index),
        }
        if self.blocks[index].is_split() {
            net_blocks += 1;
            net_bytes += self.blocks[index].size as i64;
        }
        if self.is_expandable(index) {
            (net_blocks, net_bytes) = (0, 0);
        }
        if net_blocks > 0 {
            self.stats.inactive_split.increase(st, net_blocks);
        } else if net_blocks < 0 {
            self.stats.inactive_split.decrease(st, -net_blocks);
        }
        if net_bytes > 0 {
            self.stats.inactive_split_bytes.increase(st, net_bytes);
        } else if net_bytes < 0 {
            self.stats.inactive_split_bytes.decrease(st, -net_bytes);
        }
        self.stats.active.decrease(st, 1);
        self.stats.active_bytes.decrease(st, orig_size as i64);
        self.stats.requested_bytes.decrease(st, requested as i64);
    }

    /// `try_merge_blocks` for a block being freed (mapped, in no pool): the
    /// first mapped neighbour merged stays in its pool, its entry (size,
    /// address, index) left in `entry` for the merged block to take over.
    fn merge_free_neighbour(
        &mut self,
        dst: usize,
        src: Option<usize>,
        entry: &mut Option<(u64, u64, usize)>,
    ) -> u64 {
        let Some(s) = src else { return 0 };
        let b = &self.blocks[s];
        if entry.is_none() && !b.allocated && b.mapped && self.blocks[dst].mapped {
            *entry = Some((b.size, b.address, s));
            return self.merge_blocks(dst, s);
        }
        self.try_merge_blocks(dst, src)
    }

    /// Merges free neighbour `src` into `dst` (both mapped, or both
    /// unmapped); returns the bytes taken over.
    pub(crate) fn try_merge_blocks(&mut self, dst: usize, src: Option<usize>) -> u64 {
        let Some(src) = src else { return 0 };
        if self.blocks[src].allocated || self.blocks[src].mapped != self.blocks[dst].mapped {
            return 0;
        }
        if self.blocks[src].mapped {
            self.remove_from_pool(src);
        } else {
            let (address, kind) = (self.blocks[src].address, self.blocks[src].pool);
            self.pool_mut(kind).unmapped.remove(&(address, src));
        }
        self.merge_blocks(dst, src)
    }

    /// Merges free neighbour `src`, already out of its pool's order, into
    /// `dst`; returns the bytes taken over.
    fn merge_blocks(&mut self, dst: usize, src: usize) -> u64 {
        let (s_addr, s_size, s_prev, s_next) = {
            let s = &self.blocks[src];
            (s.address, s.size, s.prev, s.next)
        };
        if self.blocks[dst].prev == Some(src) {
            self.blocks[dst].address = s_addr;
            self.blocks[dst].prev = s_prev;
            if let Some(p) = s_prev {
                self.blocks[p].next = Some(dst);
            }
        } else {
            self.blocks[dst].next = s_next;
            if let Some(n) = s_next {
                self.blocks[n].prev = Some(dst);
            }
        }
        self.blocks[dst].size += s_size;
        self.delete_block(src);
        s_size
    }

    pub(crate) fn live_blocks(&self) -> impl Iterator<Item = (usize, &Block)> {
        self.blocks.iter().enumerate().filter(|(_, b)| b.live)
    }

    pub(crate) fn in_pool(&self, index: usize) -> bool {
        let b = &self.blocks[index];
        let pool = self.pool(b.pool);
        if b.mapped {
            pool.blocks.contains(b.size, b.address, index)
        } else {
            pool.unmapped.contains(&(b.address, index))
        }
    }

    /// The free mapped blocks of `kind`, smallest first.
    pub(crate) fn free_blocks(&self, kind: PoolKind) -> impl Iterator<Item = usize> + '_ {
        self.pool(kind).blocks.iter().map(|(_, _, i)| i)
    }

    pub(crate) fn pool_len(&self) -> usize {
        self.small.blocks.len()
            + self.large.blocks.len()
            + self.small.unmapped.len()
            + self.large.unmapped.len()
    }

    /// Whether a block lies in an expandable segment.
    #[inline]
    pub(crate) fn is_expandable(&self, index: usize) -> bool {
        self.blocks[index].expandable
    }

    pub(crate) fn total_reserved(&self) -> u64 {
        self.total_reserved
    }
}

impl<S: SegmentSource> AllocatorView for CachingAllocator<S> {
    fn memory_reserved(&self) -> u64 {
        CachingAllocator::memory_reserved(self)
    }

    fn fitting_free_blocks(
        &self,
        pool: PoolKind,
        size: u64,
    ) -> Box<dyn Iterator<Item = FreeBlock> + '_> {
        Box::new(CachingAllocator::fitting_free_blocks(self, pool, size))
    }

    fn allocated_blocks(&self) -> Box<dyn Iterator<Item = (BlockHandle, Category)> + '_> {
        Box::new(CachingAllocator::allocated_blocks(self))
    }

    fn ghost(&self) -> Box<dyn Ghost> {
        Box::new(CachingAllocator::ghost(self))
    }
}

impl Ghost for CachingAllocator<SimulatedSource> {
    fn malloc(&mut self, size: u64, category: Category) -> Option<BlockHandle> {
        self.malloc_tagged(size, "", category, None)
            .ok()
            .map(|a| a.handle)
    }

    fn malloc_at(&mut self, place: Place, size: u64, category: Category) -> Option<BlockHandle> {
        CachingAllocator::malloc_at(self, place, size, category).map(|a| a.handle)
    }

    fn free(&mut self, handle: BlockHandle) -> bool {
        CachingAllocator::free(self, handle).is_ok()
    }

    fn max_memory_reserved(&self) -> u64 {
        CachingAllocator::max_memory_reserved(self)
    }

    fn set_placement(&mut self, placement: Option<Box<dyn Placement>>) {
        CachingAllocator::set_placement(self, placement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The free set against `std`'s ordered set: the same members in the
    /// same order after any mix of inserts, removals and replacements,
    /// through splits and merges of its runs.
    #[test]
    fn the_free_set_orders_as_a_btree_set_does() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..40 {
            let mut set = FreeSet::default();
            let mut model: BTreeSet<(u64, u64, usize)> = BTreeSet::new();
            // Few distinct sizes and addresses, so equal sizes, equal
            // (size, address) pairs and runs of 32 all occur.
            let spread = [4u64, 40, 400][round % 3];
            for _ in 0..3000 {
                let key = (
                    next() % spread,
                    next() % (spread * 3),
                    (next() % 50) as usize,
                );
                match next() % 4 {
                    0 | 1 => assert_eq!(set.insert(key.0, key.1, key.2), model.insert(key)),
                    2 => assert_eq!(set.remove(key.0, key.1, key.2), model.remove(&key)),
                    _ => {
                        let old = model
                            .iter()
                            .nth((next() as usize) % model.len().max(1))
                            .copied();
                        if let Some(old) = old.filter(|_| !model.contains(&key)) {
                            assert!(set.replace(old, key));
                            model.remove(&old);
                            model.insert(key);
                        }
                    }
                }
                assert_eq!(set.len(), model.len());
                let size = next() % (spread + 1);
                assert_eq!(
                    set.at_least(size).collect::<Vec<_>>(),
                    model.range((size, 0, 0)..).copied().collect::<Vec<_>>()
                );
                assert_eq!(set.contains(key.0, key.1, key.2), model.contains(&key));
            }
            assert_eq!(
                set.iter().collect::<Vec<_>>(),
                model.iter().copied().collect::<Vec<_>>()
            );
            assert_eq!(
                set.iter().rev().collect::<Vec<_>>(),
                model.iter().rev().copied().collect::<Vec<_>>()
            );
            let size = spread / 2;
            assert_eq!(
                set.below(size).collect::<Vec<_>>(),
                model.range(..(size, 0, 0)).copied().collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn roundup_examples_from_pytorch_comments() {
        // "1200 ... 4 divisions ... 1024, 1280, 1536, 1792 ... return 1280"
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1024, 4), 1024);
        assert_eq!(roundup_power2_next_division(1537, 4), 1792);
        assert_eq!(roundup_power2_next_division(1793, 4), 2048);
    }

    #[test]
    fn default_rounding_is_512() {
        let c = AllocatorConfig::default();
        assert_eq!(round_size(1, &c), 512);
        assert_eq!(round_size(512, &c), 512);
        assert_eq!(round_size(513, &c), 1024);
        assert_eq!(round_size(1200, &c), 1536);
    }

    #[test]
    fn segment_sizes() {
        assert_eq!(allocation_size(512), 2 << 20);
        assert_eq!(allocation_size(1 << 20), 2 << 20);
        assert_eq!(allocation_size((1 << 20) + 512), 20 << 20);
        assert_eq!(allocation_size((10 << 20) - 512), 20 << 20);
        assert_eq!(allocation_size(10 << 20), 10 << 20);
        assert_eq!(allocation_size((10 << 20) + 1), 12 << 20);
    }
}
