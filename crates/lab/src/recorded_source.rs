//! A simulated device that hands out a recording's own segment addresses:
//! PyTorch's best fit orders free blocks by (size, address), so a replay
//! whose segments lie where CUDA put them breaks ties between equal-sized
//! blocks as the recording did, and ends in the recorded state where
//! increasing simulated addresses did not (a real snapshot's cudaMalloc
//! addresses are not in order).

use std::collections::HashMap;

use crate::memory::{SegmentId, SegmentSource, SimulatedSource, SourceError};

/// Past every user-space address CUDA hands out: segments the recording
/// has no address for go here, so they never overlap a recorded one.
const FRESH_BASE: u64 = 1 << 56;
/// Between fresh segments, so neighbours never look contiguous.
const GAP: u64 = 2 << 20;

#[derive(Debug, Clone)]
pub struct RecordedSource {
    inner: SimulatedSource,
    /// Recorded (size, address) not yet handed out, in the order the
    /// recording obtained them.
    queue: Vec<(u64, u64)>,
    live: HashMap<SegmentId, (u64, u64)>,
    next_fresh: u64,
}

impl RecordedSource {
    pub fn new(inner: SimulatedSource, recorded: Vec<(u64, u64)>) -> RecordedSource {
        RecordedSource {
            inner,
            queue: recorded,
            live: HashMap::new(),
            next_fresh: FRESH_BASE,
        }
    }

    fn overlaps(&self, address: u64, size: u64) -> bool {
        self.live
            .values()
            .any(|&(a, s)| address < a.saturating_add(s) && a < address.saturating_add(size))
    }
}

impl SegmentSource for RecordedSource {
    fn allocate(&mut self, id: SegmentId, size: u64) -> Result<(), SourceError> {
        self.inner.allocate(id, size)
    }

    fn release(&mut self, id: SegmentId, size: u64) {
        self.live.remove(&id);
        self.inner.release(id, size);
    }

    fn total_capacity(&self) -> Option<u64> {
        self.inner.total_capacity()
    }

    fn free_capacity(&self) -> Option<u64> {
        self.inner.free_capacity()
    }

    fn max_segment_size(&self) -> u64 {
        self.inner.max_segment_size()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn maps_pages(&self) -> bool {
        self.inner.maps_pages()
    }

    /// The first recorded segment of this size not yet handed out whose
    /// range is free now; else a fresh address past all recorded ones.
    fn address_of(&mut self, id: SegmentId, size: u64) -> Option<u64> {
        let found = self
            .queue
            .iter()
            .position(|&(s, a)| s == size && !self.overlaps(a, s));
        let address = match found {
            Some(i) => self.queue.remove(i).1,
            None => {
                let a = self.next_fresh;
                self.next_fresh = a.saturating_add(size).saturating_add(GAP);
                a
            }
        };
        self.live.insert(id, (address, size));
        Some(address)
    }
}
