//! The segment source behind an engine: real wgpu buffers, or — for an
//! engine that simulates a device — only byte counts. The allocator on top
//! is the same code either way, so a simulated run makes exactly the
//! allocation decisions a real one makes (what `estimate` relies on).

use super::buffer_source::WgpuSource;
use super::segment_buffers::SegmentBuffers;
use crate::memory::{SegmentId, SegmentSource, SimulatedSource, SourceError};

pub enum EngineSource {
    Wgpu(WgpuSource),
    Simulated(SimulatedSource),
}

impl EngineSource {
    /// The buffers behind a segment (none on a simulated device).
    pub fn buffers(&self, id: SegmentId) -> Option<&SegmentBuffers> {
        match self {
            EngineSource::Wgpu(w) => w.buffers(id),
            EngineSource::Simulated(_) => None,
        }
    }

    fn inner(&self) -> &dyn SegmentSource {
        match self {
            EngineSource::Wgpu(w) => w,
            EngineSource::Simulated(s) => s,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn SegmentSource {
        match self {
            EngineSource::Wgpu(w) => w,
            EngineSource::Simulated(s) => s,
        }
    }
}

impl SegmentSource for EngineSource {
    fn allocate(&mut self, id: SegmentId, size: u64) -> Result<(), SourceError> {
        self.inner_mut().allocate(id, size)
    }

    fn release(&mut self, id: SegmentId, size: u64) {
        self.inner_mut().release(id, size)
    }

    fn total_capacity(&self) -> Option<u64> {
        self.inner().total_capacity()
    }

    fn free_capacity(&self) -> Option<u64> {
        self.inner().free_capacity()
    }

    fn max_segment_size(&self) -> u64 {
        self.inner().max_segment_size()
    }

    fn describe(&self) -> String {
        self.inner().describe()
    }

    fn maps_pages(&self) -> bool {
        self.inner().maps_pages()
    }
}
