//! `expandable`: PyTorch's `expandable_segments:True`, modelled on a
//! simulated device. Each pool has one segment of virtual address space that
//! grows by mapping pages (2 MiB in the small pool, 20 MiB in the large) at
//! its lowest unmapped address, instead of obtaining a new segment per miss.
//! A request with no fitting free block takes the lowest unmapped range
//! (together with a free mapped block just before it) and maps what is
//! missing, rounded up to whole pages. Blocks split whenever the remainder
//! is at least 512 B, in both pools. Free mapped neighbours merge. Pages are
//! unmapped only by `empty_cache` or when a mapping fails (then it retries
//! once): the whole pages inside each free block are returned, leaving
//! unmapped holes that later requests map again. Reserved memory is what is
//! mapped. A single stream, as everywhere in vramlab.
//! (PyTorch: CUDACachingAllocator.cpp, ExpandableSegment, map_block,
//! try_allocate_expandable_block, release_expandable_segment.)

use super::{Category, Device, DeviceCounts, Handle, Oom, Strategy};
use crate::memory::constants::{K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_SMALL_BUFFER};
use crate::memory::{round_size, AllocatorConfig, SegmentSource};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Allocated,
    Unmapped,
}

/// One pool's segment: blocks by address tile [0, ∞), the last unmapped.
struct Pool {
    page: u64,
    blocks: BTreeMap<u64, (u64, State)>,
    /// Free mapped blocks by (size, address): best fit.
    free: BTreeSet<(u64, u64)>,
    /// Page ranges mapped, each with its device id (page address → id).
    pages: BTreeMap<u64, u64>,
}

impl Pool {
    fn new(page: u64) -> Pool {
        let mut blocks = BTreeMap::new();
        blocks.insert(0, (u64::MAX / 2, State::Unmapped));
        Pool {
            page,
            blocks,
            free: BTreeSet::new(),
            pages: BTreeMap::new(),
        }
    }

    fn set(&mut self, addr: u64, size: u64, state: State) {
        if let Some((old, State::Free)) = self.blocks.get(&addr).copied() {
            self.free.remove(&(old, addr));
        }
        self.blocks.insert(addr, (size, state));
        if state == State::Free {
            self.free.insert((size, addr));
        }
    }

    fn remove(&mut self, addr: u64) {
        if let Some((size, State::Free)) = self.blocks.remove(&addr) {
            self.free.remove(&(size, addr));
        }
    }

    /// Merges the block at `addr` with neighbours of the same state (free
    /// with free, unmapped with unmapped); returns the merged block's address.
    fn merge(&mut self, mut addr: u64) -> u64 {
        let (mut size, state) = self.blocks[&addr];
        if state == State::Allocated {
            return addr;
        }
        if let Some((&p, &(psize, pstate))) = self.blocks.range(..addr).next_back() {
            if pstate == state && p + psize == addr {
                self.remove(addr);
                self.remove(p);
                addr = p;
                size += psize;
                self.set(addr, size, state);
            }
        }
        if let Some((&n, &(nsize, nstate))) = self.blocks.range(addr + 1..).next() {
            if nstate == state && addr + size == n {
                self.remove(n);
                self.remove(addr);
                size += nsize;
                self.set(addr, size, state);
            }
        }
        addr
    }

    /// Allocates `size` from the free block at `addr` (splitting ≥ 512 B).
    fn take(&mut self, addr: u64, size: u64) -> u64 {
        let (bsize, _) = self.blocks[&addr];
        self.remove(addr);
        if bsize - size >= K_MIN_BLOCK_SIZE {
            self.set(addr, size, State::Allocated);
            self.set(addr + size, bsize - size, State::Free);
            size
        } else {
            self.set(addr, bsize, State::Allocated);
            bsize
        }
    }
}

pub struct Expandable<S: SegmentSource> {
    dev: Device<S>,
    config: AllocatorConfig,
    small: Pool,
    large: Pool,
    /// handle → (small pool?, address, block size).
    live: HashMap<Handle, (bool, u64, u64)>,
    next: Handle,
    allocated: u64,
}

impl<S: SegmentSource> Expandable<S> {
    pub fn new(source: S) -> Self {
        Expandable {
            dev: Device::new(source),
            config: AllocatorConfig::default(),
            small: Pool::new(K_SMALL_BUFFER),
            large: Pool::new(K_LARGE_BUFFER),
            live: HashMap::new(),
            next: 0,
            allocated: 0,
        }
    }

    fn pool(&mut self, small: bool) -> &mut Pool {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    /// Maps whole pages to cover [start, start + len) where unmapped; false
    /// if the device refuses.
    fn map(&mut self, small: bool, start: u64, len: u64) -> bool {
        let page = self.pool(small).page;
        let first = start / page * page;
        let mut p = first;
        while p < start + len {
            if !self.pool(small).pages.contains_key(&p) {
                match self.dev.alloc(page) {
                    Ok(id) => {
                        self.pool(small).pages.insert(p, id);
                    }
                    Err(_) => return false,
                }
            }
            p += page;
        }
        true
    }

    /// Tries to place `size` bytes by mapping at the lowest unmapped range.
    fn grow(&mut self, small: bool, size: u64) -> Option<u64> {
        let page = self.pool(small).page;
        let pool = self.pool(small);
        // The lowest unmapped block (with a free mapped block just before
        // it) that has room.
        let mut found = None;
        for (&a, &(s, st)) in pool.blocks.iter() {
            if st != State::Unmapped {
                continue;
            }
            let (start, prefix) = match pool.blocks.range(..a).next_back() {
                Some((&p, &(ps, State::Free))) if p + ps == a => (p, ps),
                _ => (a, 0),
            };
            if prefix + s >= size {
                found = Some((start, prefix, a, s));
                break;
            }
        }
        let (start, prefix, unmapped_at, unmapped_size) = found?;
        // Map the missing bytes, in whole pages, but never past the hole.
        let need = size - prefix;
        let map_len = need.div_ceil(page).saturating_mul(page).min(unmapped_size);
        if !self.map(small, unmapped_at, map_len) {
            return None;
        }
        let pool = self.pool(small);
        pool.remove(unmapped_at);
        if unmapped_size > map_len {
            pool.set(
                unmapped_at + map_len,
                unmapped_size - map_len,
                State::Unmapped,
            );
        }
        pool.set(unmapped_at, map_len, State::Free);
        let merged = pool.merge(unmapped_at);
        debug_assert_eq!(merged, start);
        Some(merged)
    }

    /// Unmaps every whole page inside free blocks (empty_cache).
    fn release(&mut self) {
        for small in [true, false] {
            let page = self.pool(small).page;
            let frees: Vec<(u64, u64)> = self
                .pool(small)
                .blocks
                .iter()
                .filter(|(_, (_, st))| *st == State::Free)
                .map(|(&a, &(s, _))| (a, s))
                .collect();
            for (a, s) in frees {
                let lo = a.div_ceil(page) * page;
                let hi = (a + s) / page * page;
                if hi <= lo {
                    continue;
                }
                let ids: Vec<(u64, u64)> = self
                    .pool(small)
                    .pages
                    .range(lo..hi)
                    .map(|(&p, &id)| (p, id))
                    .collect();
                for (p, id) in ids {
                    self.pool(small).pages.remove(&p);
                    self.dev.release(id, page);
                }
                let pool = self.pool(small);
                pool.remove(a);
                if lo > a {
                    pool.set(a, lo - a, State::Free);
                }
                pool.set(lo, hi - lo, State::Unmapped);
                if a + s > hi {
                    pool.set(hi, a + s - hi, State::Free);
                }
                pool.merge(lo);
            }
        }
    }
}

impl<S: SegmentSource> Strategy for Expandable<S> {
    fn name(&self) -> &'static str {
        "expandable"
    }

    fn malloc(&mut self, size: u64, _category: Category) -> Result<Handle, Oom> {
        let size = round_size(size.max(1), &self.config);
        let small = size <= crate::memory::constants::K_SMALL_SIZE;
        let best = self
            .pool(small)
            .free
            .range((size, 0)..)
            .next()
            .map(|&(_, a)| a);
        let at = match best {
            Some(a) => a,
            None => match self.grow(small, size) {
                Some(a) => a,
                None => {
                    // Out of memory: return cached pages, then retry once.
                    self.release();
                    self.grow(small, size).ok_or(Oom)?
                }
            },
        };
        let bsize = self.pool(small).take(at, size);
        self.next += 1;
        self.live.insert(self.next, (small, at, bsize));
        self.allocated += bsize;
        Ok(self.next)
    }

    fn free(&mut self, handle: Handle) {
        if let Some((small, at, bsize)) = self.live.remove(&handle) {
            self.allocated -= bsize;
            let pool = self.pool(small);
            pool.set(at, bsize, State::Free);
            pool.merge(at);
        }
    }

    fn empty_cache(&mut self) {
        self.release();
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn device(&self) -> DeviceCounts {
        self.dev.counts()
    }
}
