//! `pytorch`: the faithful caching allocator (see `caching.rs`), and
//! `expandable`: the same with `expandable_segments:True`. Either runs
//! vramlab's placement options (`vramlab.rs`) when `--alloc-conf` names
//! them.

use super::{Category, DeviceCounts, Handle, Oom, Strategy};
use crate::memory::{AllocatorConfig, BlockHandle, CachingAllocator, SegmentSource};

pub struct Pytorch<S: SegmentSource> {
    inner: CachingAllocator<S>,
    /// Handle `h` (handed out in order from 1) is `handles[h - 1]` while
    /// live: a slot per allocation ever made, indexed instead of hashed.
    handles: Vec<Option<BlockHandle>>,
    next: Handle,
    name: &'static str,
}

impl<S: SegmentSource> Pytorch<S> {
    pub fn new(source: S, config: AllocatorConfig, name: &'static str) -> Self {
        Pytorch {
            inner: CachingAllocator::new(source, config),
            handles: Vec::new(),
            next: 0,
            name,
        }
    }

    /// The caching allocator underneath (for its event log and statistics).
    pub fn allocator_mut(&mut self) -> &mut CachingAllocator<S> {
        &mut self.inner
    }
}

impl<S: SegmentSource> Strategy for Pytorch<S> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn malloc(&mut self, size: u64, category: Category) -> Result<Handle, Oom> {
        let a = self
            .inner
            .malloc_tagged(size, "", category, None)
            .map_err(|_| Oom)?;
        self.next += 1;
        debug_assert_eq!(self.handles.len() as u64, self.next - 1);
        self.handles.push(Some(a.handle));
        Ok(self.next)
    }

    fn free(&mut self, handle: Handle) {
        let slot = handle
            .checked_sub(1)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.handles.get_mut(i));
        if let Some(h) = slot.and_then(Option::take) {
            let _ = self.inner.free(h);
        }
    }

    fn empty_cache(&mut self) {
        self.inner.empty_cache();
    }

    fn allocated(&self) -> u64 {
        self.inner.memory_allocated()
    }

    fn reserved(&self) -> u64 {
        self.inner.memory_reserved()
    }

    fn device(&self) -> DeviceCounts {
        let s = self.inner.stats();
        DeviceCounts {
            reserved: self.inner.memory_reserved(),
            allocs: s.num_device_alloc.max(0) as u64,
            frees: s.num_device_free.max(0) as u64,
        }
    }
}
