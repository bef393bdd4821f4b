//! `expandable_segments:True`, rule for rule (PyTorch's
//! CUDACachingAllocator.cpp: ExpandableSegment, find_expandable_block,
//! map_block, try_allocate_expandable_block, unmap_block, release_blocks).
//!
//! Why it exists: with fixed segments, a request that fits in no cached
//! block costs a new segment even when the free space is there but split
//! across segments; PyTorch's out-of-memory message recommends this setting
//! for exactly that. Instead of one device allocation per segment, each pool
//! reserves one range of virtual addresses (1⅛ × the device's memory) and
//! maps physical pages into it — 2 MiB pages in the small pool, 20 MiB in the
//! large — so neighbouring allocations share one growing segment.
//!
//! The rules:
//! 1. A request with no fitting free block takes the lowest unmapped range
//!    that, together with the free mapped block just before it, has room,
//!    and maps what is missing, rounded up to whole pages (all pages or
//!    none: a page the device refuses undoes the call's earlier pages).
//! 2. Any block splits when at least 512 B would remain, in both pools.
//! 3. For best fit, a free block counts as what it can grow to (itself plus
//!    the unmapped space right after it), so the block at the growing end is
//!    chosen last.
//! 4. Pages are unmapped only by `empty_cache` and the out-of-memory retry
//!    (both `release_cached_blocks`): every whole page inside a free block.
//!    A segment with nothing mapped is released.
//! 5. Reserved bytes are mapped bytes. A snapshot shows one segment per
//!    contiguous mapped range. `inactive_split` leaves expandable blocks out.
//!
//! Mapping needs virtual memory (CUDA's cuMemMap); wgpu has none, so only a
//! simulated source ([`SegmentSource::maps_pages`]) accepts the setting.

use super::caching::{Block, CachingAllocator, PoolKind, Segment};
use super::constants::{K_LARGE_BUFFER, K_ROUND_LARGE, K_SMALL_BUFFER};
use super::error::AllocError;
use super::events::EventKind;
use super::source::{SegmentId, SegmentSource, SourceError};
use super::tag::Category;

/// Address space reserved per expandable segment when the device reports
/// no capacity (an unlimited simulated device): 16 TiB.
const UNLIMITED_ADDRESS_SPACE: u64 = 16 << 40;

/// The page size of a pool's expandable segments.
pub fn page_size(pool: PoolKind) -> u64 {
    match pool {
        PoolKind::Small => K_SMALL_BUFFER,
        PoolKind::Large => K_LARGE_BUFFER,
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// PyTorch's `alloc_block` when expandable segments are on: the memory
    /// limit is checked against `alloc_size` (what a fixed segment would
    /// have been), then the pool's address space grows by `size`. Fixed
    /// segments otherwise.
    pub(crate) fn grow(
        &mut self,
        kind: PoolKind,
        alloc_size: u64,
        size: u64,
        is_retry: bool,
    ) -> Result<Option<usize>, AllocError> {
        if !self.config().expandable_segments {
            return self.alloc_block(kind, alloc_size, is_retry);
        }
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(limit) = self.config().memory_limit {
            if self.total_reserved.saturating_add(alloc_size) > limit {
                return Ok(None);
            }
        }
        self.try_allocate_expandable_block(kind, size)
    }

    /// The size a free block could grow to: itself plus the unmapped block
    /// right after it.
    pub(crate) fn expandable_size(&self, index: usize) -> u64 {
        let b = &self.blocks[index];
        let after = b
            .next
            .map(|n| &self.blocks[n])
            .filter(|n| !n.mapped)
            .map_or(0, |n| n.size);
        b.size.saturating_add(after)
    }

    /// Rebuilds an expandable segment that existed before a recording began
    /// (a PyTorch snapshot taken with `expandable_segments:True`): `mapped`
    /// ranges and `live` blocks (offset, block size, requested bytes) as
    /// offsets from the segment's first page. Returns a handle per live
    /// block, in `live`'s order.
    pub fn adopt_expandable(
        &mut self,
        kind: PoolKind,
        mapped: &[(u64, u64)],
        live: &[(u64, u64, u64)],
    ) -> Result<Vec<super::caching::BlockHandle>, AllocError> {
        let bad = |what: String| AllocError::InvalidFree(what);
        let page = page_size(kind);
        let mut ranges = mapped.to_vec();
        ranges.sort_unstable();
        let end = ranges
            .iter()
            .map(|r| r.0.saturating_add(r.1))
            .max()
            .unwrap_or(0);
        if end > super::constants::MAX_BYTES {
            return Err(bad(format!(
                "recorded mapped ranges reach {end} bytes into their segment, past the 2^62 vramlab models"
            )));
        }
        for w in ranges.windows(2) {
            if w[0].0.saturating_add(w[0].1) > w[1].0 {
                return Err(bad(format!(
                    "recorded mapped ranges at offsets {} and {} overlap",
                    w[0].0, w[1].0
                )));
            }
        }
        if let Some(r) = ranges
            .iter()
            .find(|r| !r.0.is_multiple_of(page) || !r.1.is_multiple_of(page) || r.1 == 0)
        {
            return Err(bad(format!(
                "a recorded mapped range (offset {}, {} bytes) is not whole {page}-byte pages",
                r.0, r.1
            )));
        }
        let head = self.new_expandable_segment(kind, end.saturating_add(page));
        let segment = self.blocks[head].segment;
        let base = self.blocks[head].address;
        // Map each range: split the unmapped block at the range's start,
        // then map from there.
        let mut cursor = head;
        for &(offset, len) in &ranges {
            let at = base + offset;
            let mut block = cursor;
            if self.blocks[block].address < at {
                block = self.split_unmapped(block, at - self.blocks[block].address);
            }
            if !self.map_block(block, len)? {
                return Err(AllocError::Device(format!(
                    "no room to rebuild {len} mapped bytes recorded before the trace"
                )));
            }
            // The unmapped rest follows the mapped range.
            cursor = self.blocks[block]
                .next
                .filter(|&n| !self.blocks[n].mapped)
                .ok_or_else(|| bad("a mapped range reaches the end of its segment".into()))?;
        }
        // Carve the live blocks out of the free mapped blocks.
        let mut order: Vec<usize> = (0..live.len()).collect();
        order.sort_by_key(|&i| live[i].0);
        let mut handles = vec![None; live.len()];
        let mut gaps = Vec::new();
        for &i in &order {
            let (offset, bsize, requested) = live[i];
            let at = base.saturating_add(offset);
            let free = self
                .free_blocks(kind)
                .find(|&f| {
                    let b = &self.blocks[f];
                    b.segment == segment
                        && b.address <= at
                        && at.saturating_add(bsize) <= b.address + b.size
                })
                .filter(|_| bsize > 0)
                .ok_or_else(|| bad(format!(
                    "a recorded block at offset {offset} of {bsize} bytes lies outside the mapped ranges or overlaps another"
                )))?;
            self.remove_from_pool(free);
            let mut current = free;
            if self.blocks[current].address < at {
                let gap_size = at - self.blocks[current].address;
                let gap = self.alloc_found_block(current, false, gap_size, gap_size, true, "");
                gaps.push(gap);
                current = self.blocks[gap]
                    .next
                    .ok_or_else(|| bad("no block after a gap".into()))?;
                self.remove_from_pool(current);
            }
            let split = self.blocks[current].size > bsize;
            let b = self.alloc_found_block(current, false, bsize, requested.max(1), split, "");
            handles[i] = Some(super::caching::BlockHandle::new(
                b,
                self.blocks[b].generation,
            ));
        }
        for g in gaps {
            let h = super::caching::BlockHandle::new(g, self.blocks[g].generation);
            self.free(h)?;
        }
        handles
            .into_iter()
            .map(|h| h.ok_or_else(|| bad("a recorded block could not be placed".into())))
            .collect()
    }

    /// Splits unmapped block `index` at `offset` bytes into it; returns the
    /// block that starts there.
    fn split_unmapped(&mut self, index: usize, offset: u64) -> usize {
        let (segment, address, size, kind, next) = {
            let b = &self.blocks[index];
            (b.segment, b.address, b.size, b.pool, b.next)
        };
        let rest = self.new_block(Block {
            prev: Some(index),
            next,
            ..Block::unmapped(segment, address + offset, size - offset, kind)
        });
        if let Some(n) = next {
            self.blocks[n].prev = Some(rest);
        }
        self.blocks[index].next = Some(rest);
        self.blocks[index].size = offset;
        self.pool_mut(kind)
            .unmapped
            .insert((address + offset, rest));
        rest
    }

    /// The lowest-address run of free and unmapped blocks with `size` bytes
    /// of room; a new expandable segment when none has.
    fn find_expandable_block(&mut self, kind: PoolKind, size: u64) -> usize {
        let allocatable = |i: Option<usize>| i.filter(|&i| !self.blocks[i].allocated);
        let found = self.pool(kind).unmapped.iter().find_map(|&(_, c)| {
            let start = allocatable(self.blocks[c].prev).unwrap_or(c);
            let (mut bytes, mut cursor) = (0u64, Some(start));
            while bytes < size {
                let Some(i) = allocatable(cursor) else {
                    break;
                };
                bytes = bytes.saturating_add(self.blocks[i].size);
                cursor = self.blocks[i].next;
            }
            (bytes >= size).then_some(start)
        });
        match found {
            Some(start) => start,
            None => self.new_expandable_segment(kind, size),
        }
    }

    /// A new segment of 1⅛ × the device's memory in address space (at least
    /// `size`); its one unmapped block.
    fn new_expandable_segment(&mut self, kind: PoolKind, size: u64) -> usize {
        let page = page_size(kind);
        let total = self
            .source()
            .total_capacity()
            .or(self.config().memory_limit)
            .unwrap_or(UNLIMITED_ADDRESS_SPACE);
        let pages = total
            .saturating_add(total / 8)
            .div_ceil(page)
            .max(size.div_ceil(page));
        let virtual_size = pages.saturating_mul(page);
        let id = SegmentId(self.next_segment_id);
        self.next_segment_id += 1;
        let address = self.next_address;
        self.next_address = self
            .next_address
            .saturating_add(virtual_size.div_ceil(K_ROUND_LARGE) * K_ROUND_LARGE + K_ROUND_LARGE);
        self.segments.insert(
            id,
            Segment {
                address,
                size: virtual_size,
                pool: kind,
                expandable: true,
            },
        );
        self.expandable_count += 1;
        let index = self.new_block(Block::unmapped(id, address, virtual_size, kind));
        self.pool_mut(kind).unmapped.insert((address, index));
        index
    }

    /// Maps the pages covering the first `size` bytes of unmapped block
    /// `index`; false if the device refused a page (nothing stays mapped).
    fn map_block(&mut self, index: usize, size: u64) -> Result<bool, AllocError> {
        let (segment, address, bsize, kind) = {
            let b = &self.blocks[index];
            (b.segment, b.address, b.size, b.pool)
        };
        debug_assert!(!self.blocks[index].mapped && size <= bsize);
        let page = page_size(kind);
        let base = self.segments[&segment].address;
        let first = (address - base) / page;
        let last = (address - base + size).div_ceil(page);
        let mapped = (last - first) * page;
        // All the pages or none, in runs of whole pages no longer than the
        // source's largest segment: one device allocation a run, however
        // many pages it holds.
        let run = (self.source.max_segment_size() / page).max(1) * page;
        let mut made = Vec::new();
        let (mut at, end) = (base + first * page, base + last * page);
        while at < end {
            let bytes = run.min(end - at);
            let id = SegmentId(self.next_segment_id);
            if let Err(e) = self.source.allocate(id, bytes) {
                for (_, (id, bytes)) in made {
                    self.source.release(id, bytes);
                }
                return match e {
                    SourceError::OutOfMemory => Ok(false),
                    SourceError::Other(msg) => Err(AllocError::Device(msg)),
                };
            }
            self.next_segment_id += 1;
            made.push((at, (id, bytes)));
            at += bytes;
        }
        self.pages.extend(made);
        self.pool_mut(kind).unmapped.remove(&(address, index));
        self.blocks[index].mapped = true;
        if mapped < bsize {
            // The rest of the range stays unmapped, after the mapped part.
            self.split_unmapped(index, mapped);
        }
        let (prev, next) = (self.blocks[index].prev, self.blocks[index].next);
        self.try_merge_blocks(index, prev);
        self.try_merge_blocks(index, next);
        self.insert_into_pool(index);
        self.total_reserved += mapped;
        let st = kind.stat_type();
        self.stats.reserved_bytes.increase(st, mapped as i64);
        self.stats.num_device_alloc += 1;
        self.record_segment(EventKind::SegmentMap, mapped, address, segment);
        Ok(true)
    }

    /// A free block of at least `size` bytes made by mapping pages, taken
    /// out of the pool; `None` if the device is out of pages.
    fn try_allocate_expandable_block(
        &mut self,
        kind: PoolKind,
        size: u64,
    ) -> Result<Option<usize>, AllocError> {
        let mut candidate = self.find_expandable_block(kind, size);
        if !self.blocks[candidate].mapped {
            let len = self.blocks[candidate].size.min(size);
            if !self.map_block(candidate, len)? {
                return Ok(None);
            }
        }
        while self.blocks[candidate].size < size {
            // Invariant: free → unmapped → …; mapping the unmapped block
            // merges it with the free one before it.
            let remaining = size - self.blocks[candidate].size;
            let Some(next) = self.blocks[candidate].next else {
                return Ok(None);
            };
            let len = remaining.min(self.blocks[next].size);
            if !self.map_block(next, len)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.remove_from_pool(candidate);
        Ok(Some(candidate))
    }

    /// Gives back every whole page inside free block `index`; the block
    /// becomes the unmapped part, with free remainders before and after.
    pub(crate) fn unmap_block(&mut self, index: usize) {
        let (segment, address, size, kind) = {
            let b = &self.blocks[index];
            (b.segment, b.address, b.size, b.pool)
        };
        let page = page_size(kind);
        let base = self.segments[&segment].address;
        let first = (address - base).div_ceil(page);
        let last = (address - base + size) / page;
        if first >= last {
            return;
        }
        let (lo, hi) = (base + first * page, base + last * page);
        self.unmap_pages(lo, hi);
        self.remove_from_pool(index);
        if lo > address {
            // prev? → before → block
            let prev = self.blocks[index].prev;
            let before = self.new_block(Block {
                prev,
                next: Some(index),
                ..Block::unmapped(segment, address, lo - address, kind)
            });
            self.blocks[before].mapped = true;
            if let Some(p) = prev {
                self.blocks[p].next = Some(before);
            }
            self.blocks[index].prev = Some(before);
            self.insert_into_pool(before);
        }
        if address + size > hi {
            // block → after → next?
            let next = self.blocks[index].next;
            let after = self.new_block(Block {
                prev: Some(index),
                next,
                ..Block::unmapped(segment, hi, address + size - hi, kind)
            });
            self.blocks[after].mapped = true;
            if let Some(n) = next {
                self.blocks[n].prev = Some(after);
            }
            self.blocks[index].next = Some(after);
            self.insert_into_pool(after);
        }
        {
            let b = &mut self.blocks[index];
            b.address = lo;
            b.size = hi - lo;
            b.mapped = false;
        }
        let (prev, next) = (self.blocks[index].prev, self.blocks[index].next);
        self.try_merge_blocks(index, prev);
        self.try_merge_blocks(index, next);
        let at = self.blocks[index].address;
        self.pool_mut(kind).unmapped.insert((at, index));
        let unmapped = hi - lo;
        self.total_reserved -= unmapped;
        self.stats
            .reserved_bytes
            .decrease(kind.stat_type(), unmapped as i64);
        self.stats.num_device_free += 1;
        self.record_segment(EventKind::SegmentUnmap, unmapped, lo, segment);
    }

    /// Gives back the mapped pages in [lo, hi) (whole pages): runs inside it
    /// go back whole; a run reaching past either end goes back and its
    /// pages outside are mapped again as runs of their own.
    fn unmap_pages(&mut self, lo: u64, hi: u64) {
        // Runs are disjoint and sorted: walking down from hi, those ending
        // past lo overlap.
        let cut: Vec<(u64, (SegmentId, u64))> = self
            .pages
            .range(..hi)
            .rev()
            .take_while(|(&at, &(_, bytes))| at + bytes > lo)
            .map(|(&at, &v)| (at, v))
            .collect();
        for (at, (id, bytes)) in cut {
            self.pages.remove(&at);
            self.source.release(id, bytes);
            for (start, len) in [
                (at, lo.saturating_sub(at)),
                (hi, (at + bytes).saturating_sub(hi)),
            ] {
                if len == 0 {
                    continue;
                }
                let keep = SegmentId(self.next_segment_id);
                // Fewer bytes than were just released: a source counting
                // bytes cannot refuse them.
                let kept = self.source.allocate(keep, len).is_ok();
                debug_assert!(kept, "the source refused pages it had just released");
                if kept {
                    self.next_segment_id += 1;
                    self.pages.insert(start, (keep, len));
                }
            }
        }
    }

    /// Forgets an expandable segment with nothing mapped (its one block).
    pub(crate) fn release_expandable_segment(&mut self, index: usize) {
        let (segment, address, kind) = {
            let b = &self.blocks[index];
            (b.segment, b.address, b.pool)
        };
        self.pool_mut(kind).unmapped.remove(&(address, index));
        if self.segments.remove(&segment).is_some_and(|s| s.expandable) {
            self.expandable_count -= 1;
        }
        self.delete_block(index);
    }
}

impl Block {
    /// A free, mapped block of its own (a new segment's first block).
    pub(crate) fn free(segment: SegmentId, address: u64, size: u64, pool: PoolKind) -> Block {
        Block {
            segment,
            address,
            size,
            requested: 0,
            allocated: false,
            pool,
            prev: None,
            next: None,
            label: None,
            category: Category::Untagged,
            op: None,
            gc_count_base: 0,
            generation: 0,
            live: true,
            mapped: true,
            expandable: false,
        }
    }

    /// A free block of unmapped address space.
    pub(crate) fn unmapped(segment: SegmentId, address: u64, size: u64, pool: PoolKind) -> Block {
        Block {
            mapped: false,
            expandable: true,
            ..Block::free(segment, address, size, pool)
        }
    }
}
