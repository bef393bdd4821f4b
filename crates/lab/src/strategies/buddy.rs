//! `buddy`: a binary buddy allocator. Arenas of 64 MiB (or a request's own
//! power of two when larger) split into power-of-two blocks of at least
//! 512 B; a freed block merges with its buddy whenever both are free. Fast
//! and fragmentation-bounded, at the cost of rounding every request to a
//! power of two.

use super::{Category, Device, DeviceCounts, Handle, Oom, Strategy};
use crate::memory::constants::K_MIN_BLOCK_SIZE;
use crate::memory::SegmentSource;
use std::collections::{BTreeSet, HashMap};

const ARENA: u64 = 64 << 20;

struct Arena {
    id: u64,
    size: u64,
    /// Free block offsets per order (block size = 512 << order).
    free: Vec<BTreeSet<u64>>,
}

fn order_of(size: u64) -> usize {
    (size.max(K_MIN_BLOCK_SIZE).next_power_of_two() / K_MIN_BLOCK_SIZE).trailing_zeros() as usize
}

impl Arena {
    fn new(id: u64, size: u64) -> Arena {
        let top = order_of(size);
        let mut free = vec![BTreeSet::new(); top + 1];
        free[top].insert(0);
        Arena { id, size, free }
    }

    fn take(&mut self, order: usize) -> Option<u64> {
        let from = (order..self.free.len()).find(|&o| !self.free[o].is_empty())?;
        let off = self.free[from].pop_first()?;
        for o in (order..from).rev() {
            self.free[o].insert(off + (K_MIN_BLOCK_SIZE << o));
        }
        Some(off)
    }

    fn give(&mut self, mut off: u64, mut order: usize) {
        while order + 1 < self.free.len() {
            let buddy = off ^ (K_MIN_BLOCK_SIZE << order);
            if !self.free[order].remove(&buddy) {
                break;
            }
            off = off.min(buddy);
            order += 1;
        }
        self.free[order].insert(off);
    }
}

pub struct Buddy<S: SegmentSource> {
    dev: Device<S>,
    arenas: Vec<Option<Arena>>,
    live: HashMap<Handle, (usize, u64, usize)>,
    allocated: u64,
    next: Handle,
}

impl<S: SegmentSource> Buddy<S> {
    pub fn new(source: S) -> Self {
        Buddy {
            dev: Device::new(source),
            arenas: Vec::new(),
            live: HashMap::new(),
            allocated: 0,
            next: 0,
        }
    }

    fn place(&mut self, order: usize) -> Option<(usize, u64)> {
        self.arenas.iter_mut().enumerate().find_map(|(i, a)| {
            let a = a.as_mut()?;
            (order < a.free.len())
                .then(|| a.take(order))
                .flatten()
                .map(|o| (i, o))
        })
    }

    fn grow(&mut self, order: usize) -> Result<(), Oom> {
        let size = ARENA.max(K_MIN_BLOCK_SIZE << order);
        let id = self.dev.alloc(size)?;
        self.arenas.push(Some(Arena::new(id, size)));
        Ok(())
    }
}

impl<S: SegmentSource> Strategy for Buddy<S> {
    fn name(&self) -> &'static str {
        "buddy"
    }

    fn malloc(&mut self, size: u64, _category: Category) -> Result<Handle, Oom> {
        let order = order_of(size);
        let (arena, off) = match self.place(order) {
            Some(p) => p,
            None => {
                if self.grow(order).is_err() {
                    self.empty_cache();
                    self.grow(order)?;
                }
                self.place(order).ok_or(Oom)?
            }
        };
        self.next += 1;
        self.live.insert(self.next, (arena, off, order));
        self.allocated += K_MIN_BLOCK_SIZE << order;
        Ok(self.next)
    }

    fn free(&mut self, handle: Handle) {
        if let Some((arena, off, order)) = self.live.remove(&handle) {
            self.allocated -= K_MIN_BLOCK_SIZE << order;
            if let Some(a) = self.arenas[arena].as_mut() {
                a.give(off, order);
            }
        }
    }

    fn empty_cache(&mut self) {
        for slot in &mut self.arenas {
            let whole = slot.as_ref().is_some_and(|a| {
                a.free.last().is_some_and(|top| top.contains(&0))
                    && order_of(a.size) + 1 == a.free.len()
            });
            if whole {
                if let Some(a) = slot.take() {
                    self.dev.release(a.id, a.size);
                }
            }
        }
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn device(&self) -> DeviceCounts {
        self.dev.counts()
    }
}
