//! `buckets`: power-of-two size classes, one device buffer per block, freed
//! blocks cached per class and reused only by requests of the same class
//! (like cubecl's exclusive pages). Simple and fast; rounding to a power of
//! two wastes up to half of each block.

use super::{Category, Device, DeviceCounts, Handle, Oom, Strategy};
use crate::memory::constants::K_MIN_BLOCK_SIZE;
use crate::memory::SegmentSource;
use std::collections::HashMap;

pub struct Buckets<S: SegmentSource> {
    dev: Device<S>,
    /// Cached buffers per size class: (segment id).
    free: HashMap<u64, Vec<u64>>,
    live: HashMap<Handle, (u64, u64)>,
    allocated: u64,
    next: Handle,
}

impl<S: SegmentSource> Buckets<S> {
    pub fn new(source: S) -> Self {
        Buckets {
            dev: Device::new(source),
            free: HashMap::new(),
            live: HashMap::new(),
            allocated: 0,
            next: 0,
        }
    }
}

impl<S: SegmentSource> Strategy for Buckets<S> {
    fn name(&self) -> &'static str {
        "buckets"
    }

    fn malloc(&mut self, size: u64, _category: Category) -> Result<Handle, Oom> {
        let class = size.max(K_MIN_BLOCK_SIZE).next_power_of_two();
        let id = match self.free.get_mut(&class).and_then(Vec::pop) {
            Some(id) => id,
            None => match self.dev.alloc(class) {
                Ok(id) => id,
                Err(Oom) => {
                    // Give every cached buffer back and try once more.
                    self.empty_cache();
                    self.dev.alloc(class)?
                }
            },
        };
        self.next += 1;
        self.live.insert(self.next, (id, class));
        self.allocated += class;
        Ok(self.next)
    }

    fn free(&mut self, handle: Handle) {
        if let Some((id, class)) = self.live.remove(&handle) {
            self.allocated -= class;
            self.free.entry(class).or_default().push(id);
        }
    }

    fn empty_cache(&mut self) {
        for (class, ids) in std::mem::take(&mut self.free) {
            for id in ids {
                self.dev.release(id, class);
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
