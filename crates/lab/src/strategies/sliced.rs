//! `sliced`: fixed pages (64 MiB, or a request's own size rounded to 2 MiB
//! when larger) carved into slices, first fit across pages in the order they
//! were made, neighbours merged on free (like cubecl's sliced pools). Pages
//! are given back only by `empty_cache` or on out-of-memory.

use super::{align, Category, Device, DeviceCounts, Handle, Oom, Strategy};
use crate::memory::constants::{K_MIN_BLOCK_SIZE, K_SMALL_BUFFER};
use crate::memory::SegmentSource;
use std::collections::{BTreeMap, HashMap};

const PAGE: u64 = 64 << 20;

struct Page {
    id: u64,
    size: u64,
    /// Free ranges: offset → length, merged.
    free: BTreeMap<u64, u64>,
}

impl Page {
    fn take(&mut self, size: u64) -> Option<u64> {
        let (&off, &len) = self.free.iter().find(|(_, &len)| len >= size)?;
        self.free.remove(&off);
        if len > size {
            self.free.insert(off + size, len - size);
        }
        Some(off)
    }

    fn give(&mut self, mut off: u64, mut len: u64) {
        if let Some((&p, &plen)) = self.free.range(..off).next_back() {
            if p + plen == off {
                self.free.remove(&p);
                off = p;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nlen;
        }
        self.free.insert(off, len);
    }

    fn is_empty(&self) -> bool {
        self.free.get(&0) == Some(&self.size)
    }
}

pub struct Sliced<S: SegmentSource> {
    dev: Device<S>,
    pages: Vec<Page>,
    live: HashMap<Handle, (usize, u64, u64)>,
    allocated: u64,
    next: Handle,
}

impl<S: SegmentSource> Sliced<S> {
    pub fn new(source: S) -> Self {
        Sliced {
            dev: Device::new(source),
            pages: Vec::new(),
            live: HashMap::new(),
            allocated: 0,
            next: 0,
        }
    }

    fn place(&mut self, size: u64) -> Option<(usize, u64)> {
        self.pages
            .iter_mut()
            .enumerate()
            .find_map(|(i, p)| p.take(size).map(|off| (i, off)))
    }

    fn new_page(&mut self, size: u64) -> Result<(), Oom> {
        let page = PAGE.max(align(size, K_SMALL_BUFFER));
        let id = self.dev.alloc(page)?;
        let mut free = BTreeMap::new();
        free.insert(0, page);
        // Reuse the slot of a released page, keeping creation order otherwise.
        self.pages.push(Page {
            id,
            size: page,
            free,
        });
        Ok(())
    }
}

impl<S: SegmentSource> Strategy for Sliced<S> {
    fn name(&self) -> &'static str {
        "sliced"
    }

    fn malloc(&mut self, size: u64, _category: Category) -> Result<Handle, Oom> {
        let size = align(size.max(1), K_MIN_BLOCK_SIZE);
        let (page, off) = match self.place(size) {
            Some(p) => p,
            None => {
                if self.new_page(size).is_err() {
                    self.empty_cache();
                    self.new_page(size)?;
                }
                self.place(size).ok_or(Oom)?
            }
        };
        self.next += 1;
        self.live.insert(self.next, (page, off, size));
        self.allocated += size;
        Ok(self.next)
    }

    fn free(&mut self, handle: Handle) {
        if let Some((page, off, size)) = self.live.remove(&handle) {
            self.allocated -= size;
            self.pages[page].give(off, size);
        }
    }

    fn empty_cache(&mut self) {
        // Empty pages go back; live handles keep their page indices valid by
        // leaving a zero-size placeholder in the slot.
        for p in &mut self.pages {
            if p.size > 0 && p.is_empty() {
                self.dev.release(p.id, p.size);
                p.size = 0;
                p.free.clear();
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
