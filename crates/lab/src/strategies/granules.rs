//! `vramlab`: PyTorch's expandable segments, with physical memory managed
//! in 2 MiB granules instead of 20 MiB pages that stay mapped.
//!
//! On CUDA's virtual memory API (cuMemCreate / cuMemMap / cuMemUnmap) the
//! physical memory behind a virtual range is a set of handles, each a
//! multiple of the device's granularity (2 MiB), that can be mapped at any
//! granule-aligned address and unmapped again. PyTorch's
//! `expandable_segments:True` (memory/expandable.rs) maps 20 MiB pages in
//! the large pool (2 MiB in the small) and unmaps nothing until
//! `empty_cache`, so every page a segment ever grew to stays reserved, even
//! where its blocks have long been freed.
//!
//! This strategy runs PyTorch's expandable-segments allocator unchanged for
//! every decision — which block, which address — over virtual address
//! space only ([`VirtualSpace`]: it never refuses), and backs it with
//! physical granules of its own:
//! - a granule is mapped while some live block overlaps it, and unmapped
//!   (back into a pool of handles) when the last one is freed — GMLake's
//!   stitching, at granule level: the pool's handles are mapped wherever the
//!   next block needs them, so free space anywhere serves any request;
//! - the pool grows (one cuMemCreate per granule, counted as a device
//!   allocation; the simulated source sees one call per batch made at once)
//!   only when every handle is mapped, and is given back by `empty_cache`;
//! - reserved = handles held = the most granules mapped at once since the
//!   last `empty_cache`.
//!
//! Why it never reserves more than `expandable`: the placements are the
//! same, every granule overlapping a live block lies inside a page
//! expandable has mapped (pages are whole granules from a 2 MiB-aligned
//! base), and expandable's mapped bytes never shrink between two
//! `empty_cache`s — so at every step the most granules needed so far is at
//! most what expandable holds. It is strictly less whenever a whole granule
//! is free at the peak, or expandable's 20 MiB growth step overshoots.
//!
//! What it costs on a real device, and what the simulation leaves out: each
//! granule mapped or unmapped is one cuMemMap / cuMemUnmap (plus an access
//! update), microseconds each, where expandable maps once per growth; the
//! strategy counts them ([`Strategy::mappings`]) so a table can show it.
//! The work per operation here is O(1) in the number of blocks: a block's
//! interior granules are its own, and only its two boundary granules can be
//! shared with neighbours (a reference count per shared granule).
//!
//! A device without page mapping (wgpu) refuses it, as it refuses
//! `expandable`.

use super::{Category, DeviceCounts, Handle, IdMap, Mappings, Oom, Strategy};
use crate::memory::constants::MAX_BYTES;
use crate::memory::source::{SegmentId, SegmentSource, SourceError};
use crate::memory::{AllocatorConfig, BlockHandle, CachingAllocator};

/// The granularity of physical memory: CUDA's minimum for cuMemCreate on
/// current GPUs, and the small pool's page.
pub const GRANULE: u64 = 2 << 20;
const GRANULE_SHIFT: u32 = GRANULE.trailing_zeros();

/// Virtual address space for the allocator underneath: it refuses only
/// past the 2^62 bytes vramlab models, and reports the real device's
/// capacity so that expandable segments reserve the same address ranges as
/// on that device.
#[derive(Debug, Clone)]
pub struct VirtualSpace {
    capacity: Option<u64>,
    maps_pages: bool,
    used: u64,
}

impl SegmentSource for VirtualSpace {
    fn allocate(&mut self, _id: SegmentId, size: u64) -> Result<(), SourceError> {
        match self.used.checked_add(size) {
            Some(total) if total <= MAX_BYTES => {
                self.used = total;
                Ok(())
            }
            _ => Err(SourceError::OutOfMemory),
        }
    }

    fn release(&mut self, _id: SegmentId, size: u64) {
        self.used -= size;
    }

    fn total_capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn free_capacity(&self) -> Option<u64> {
        None
    }

    fn max_segment_size(&self) -> u64 {
        u64::MAX
    }

    fn describe(&self) -> String {
        "virtual address space".to_string()
    }

    fn maps_pages(&self) -> bool {
        self.maps_pages
    }
}

/// A live block: its handle underneath and the granules it overlaps.
#[derive(Debug, Clone, Copy)]
struct Live {
    handle: BlockHandle,
    /// Its first granule: virtual address / 2 MiB (segments start
    /// 2 MiB-aligned and never share an address range).
    first: u64,
    /// Granules after the first that it overlaps (0: one granule).
    span: u64,
}

/// The `vramlab` strategy (see the module docs).
pub struct Vramlab<S: SegmentSource> {
    inner: CachingAllocator<VirtualSpace>,
    /// Where physical granules come from (a cuMemCreate each).
    source: S,
    /// Handle `h` is `live[h - 1]` while live.
    live: Vec<Option<Live>>,
    /// Granules overlapped by more than their one block's interior: the
    /// number of live blocks overlapping each (no entry: none).
    shared: IdMap<u64, u32>,
    /// Granules mapped now.
    mapped: u64,
    /// Granules held (mapped, or unmapped in the pool).
    held: u64,
    /// The source's allocations behind them: (id, granules), one per batch
    /// of granules made at once, so a huge request is one call, not one
    /// per 2 MiB.
    batches: Vec<(SegmentId, u64)>,
    next_id: u64,
    device_allocs: u64,
    device_frees: u64,
    maps: u64,
    unmaps: u64,
}

impl<S: SegmentSource> Vramlab<S> {
    /// PyTorch's expandable segments under `config` (its other options,
    /// a placement hook included, apply as they do to `expandable`) over
    /// granules from `source`; the memory limit is the source's capacity.
    pub fn new(source: S, config: AllocatorConfig) -> Self {
        let space = VirtualSpace {
            capacity: source.total_capacity(),
            maps_pages: source.maps_pages(),
            used: 0,
        };
        let config = AllocatorConfig {
            expandable_segments: true,
            memory_limit: None,
            ..config
        };
        Vramlab {
            inner: CachingAllocator::new(space, config),
            source,
            live: Vec::new(),
            shared: IdMap::default(),
            mapped: 0,
            held: 0,
            batches: Vec::new(),
            next_id: 0,
            device_allocs: 0,
            device_frees: 0,
            maps: 0,
            unmaps: 0,
        }
    }

    /// The expandable-segments allocator making the decisions.
    pub fn allocator(&self) -> &CachingAllocator<VirtualSpace> {
        &self.inner
    }

    /// Granules mapped now (what a live block overlaps).
    pub fn mapped_granules(&self) -> u64 {
        self.mapped
    }

    /// Has `n` more granules mapped, creating handles when the pool has too
    /// few; false (nothing changed) if the device refuses one.
    fn map(&mut self, n: u64) -> bool {
        let pooled = self.held - self.mapped;
        if n > pooled {
            let more = n - pooled;
            let id = SegmentId(self.next_id);
            let bytes = more.checked_mul(GRANULE).ok_or(());
            if bytes
                .and_then(|b| self.source.allocate(id, b).map_err(|_| ()))
                .is_err()
            {
                return false;
            }
            self.next_id += 1;
            self.batches.push((id, more));
            self.held += more;
            self.device_allocs += more;
        }
        self.mapped += n;
        self.maps += n;
        true
    }

    /// Gives `n` unmapped granules back to the source, newest first.
    fn give_back(&mut self, mut n: u64) {
        self.held -= n;
        self.device_frees += n;
        while n > 0 {
            let Some(last) = self.batches.last_mut() else {
                break;
            };
            let k = last.1.min(n);
            self.source.release(last.0, k * GRANULE);
            last.1 -= k;
            n -= k;
            if last.1 == 0 {
                self.batches.pop();
            }
        }
    }

    fn unmap(&mut self, n: u64) {
        self.mapped -= n;
        self.unmaps += n;
    }

    /// Granules of `live` not mapped yet: its interior, and its boundary
    /// granules that no other live block overlaps.
    fn missing(&self, live: &Live) -> u64 {
        let unshared = |g: u64| !self.shared.contains_key(&g) as u64;
        match live.span {
            0 => unshared(live.first),
            s => (s - 1) + unshared(live.first) + unshared(live.first + s),
        }
    }

    fn hold(&mut self, g: u64) {
        *self.shared.entry(g).or_insert(0) += 1;
    }

    /// Drops one reference to boundary granule `g`; true if it is now free.
    fn release(&mut self, g: u64) -> bool {
        match self.shared.get_mut(&g) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.shared.remove(&g);
                true
            }
        }
    }
}

impl<S: SegmentSource> Strategy for Vramlab<S> {
    fn name(&self) -> &'static str {
        "vramlab"
    }

    fn malloc(&mut self, size: u64, category: Category) -> Result<Handle, Oom> {
        // A request the device cannot hold even sharing two granules with
        // its neighbours fails before the address space maps pages for it
        // (virtual space refuses nothing, so a huge request would map page
        // after page).
        if let Some(free) = self.source.free_capacity() {
            let pooled = (self.held - self.mapped) * GRANULE;
            if size.saturating_sub(2 * GRANULE) > free.saturating_add(pooled) {
                return Err(Oom);
            }
        }
        let a = self
            .inner
            .malloc_tagged(size, "", category, None)
            .map_err(|_| Oom)?;
        let first = a.address >> GRANULE_SHIFT;
        let last = (a.address + a.size - 1) >> GRANULE_SHIFT;
        let live = Live {
            handle: a.handle,
            first,
            span: last - first,
        };
        let missing = self.missing(&live);
        if !self.map(missing) {
            let _ = self.inner.free(a.handle);
            return Err(Oom);
        }
        self.hold(live.first);
        if live.span > 0 {
            self.hold(live.first + live.span);
        }
        self.live.push(Some(live));
        Ok(self.live.len() as Handle)
    }

    fn free(&mut self, handle: Handle) {
        let slot = handle
            .checked_sub(1)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.live.get_mut(i));
        let Some(live) = slot.and_then(Option::take) else {
            return;
        };
        let _ = self.inner.free(live.handle);
        let mut freed = self.release(live.first) as u64;
        if live.span > 0 {
            freed += live.span - 1;
            freed += self.release(live.first + live.span) as u64;
        }
        self.unmap(freed);
    }

    fn empty_cache(&mut self) {
        self.inner.empty_cache();
        self.give_back(self.held - self.mapped);
    }

    fn allocated(&self) -> u64 {
        self.inner.memory_allocated()
    }

    fn reserved(&self) -> u64 {
        self.held * GRANULE
    }

    fn device(&self) -> DeviceCounts {
        DeviceCounts {
            reserved: self.reserved(),
            allocs: self.device_allocs,
            frees: self.device_frees,
        }
    }

    fn mappings(&self) -> Option<Mappings> {
        Some(Mappings {
            maps: self.maps,
            unmaps: self.unmaps,
        })
    }
}
