//! `nocache`: one device buffer per tensor, released on free — PyTorch with
//! `PYTORCH_NO_CUDA_MEMORY_CACHING=1`. Reserved equals allocated; every
//! allocation is a device call.

use super::{align, Category, Device, DeviceCounts, Handle, Oom, Strategy};
use crate::memory::constants::K_MIN_BLOCK_SIZE;
use crate::memory::SegmentSource;
use std::collections::HashMap;

pub struct NoCache<S: SegmentSource> {
    dev: Device<S>,
    live: HashMap<Handle, (u64, u64)>,
    allocated: u64,
}

impl<S: SegmentSource> NoCache<S> {
    pub fn new(source: S) -> Self {
        NoCache {
            dev: Device::new(source),
            live: HashMap::new(),
            allocated: 0,
        }
    }
}

impl<S: SegmentSource> Strategy for NoCache<S> {
    fn name(&self) -> &'static str {
        "nocache"
    }

    fn malloc(&mut self, size: u64, _category: Category) -> Result<Handle, Oom> {
        let size = align(size.max(1), K_MIN_BLOCK_SIZE);
        let id = self.dev.alloc(size)?;
        self.live.insert(id, (id, size));
        self.allocated += size;
        Ok(id)
    }

    fn free(&mut self, handle: Handle) {
        if let Some((id, size)) = self.live.remove(&handle) {
            self.dev.release(id, size);
            self.allocated -= size;
        }
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn device(&self) -> DeviceCounts {
        self.dev.counts()
    }
}
