//! `pytorch`: the faithful caching allocator (see `caching.rs`), and
//! `vramlab`: the same allocator with vramlab's placement policy plugged
//! into its hook (`vramlab.rs`).

use super::{Category, DeviceCounts, Handle, Oom, Strategy};
use crate::memory::{AllocatorConfig, BlockHandle, CachingAllocator, SegmentSource};
use std::collections::HashMap;

pub struct Pytorch<S: SegmentSource> {
    inner: CachingAllocator<S>,
    handles: HashMap<Handle, BlockHandle>,
    next: Handle,
    name: &'static str,
}

impl<S: SegmentSource> Pytorch<S> {
    pub fn new(source: S, config: AllocatorConfig, name: &'static str) -> Self {
        Pytorch {
            inner: CachingAllocator::new(source, config),
            handles: HashMap::new(),
            next: 0,
            name,
        }
    }

    /// The caching allocator underneath (for its event log and statistics).
    pub fn allocator_mut(&mut self) -> &mut CachingAllocator<S> {
        &mut self.inner
    }

    /// vramlab's strategy.
    pub fn vramlab(source: S) -> Self {
        Self::new(source, super::vramlab::config(), "vramlab")
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
        self.handles.insert(self.next, a.handle);
        Ok(self.next)
    }

    fn free(&mut self, handle: Handle) {
        if let Some(h) = self.handles.remove(&handle) {
            let _ = self.inner.free(h);
        }
    }

    fn empty_cache(&mut self) {
        self.inner.empty_cache();
    }

    fn allocated(&self) -> u64 {
        self.inner.memory_allocated()
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
