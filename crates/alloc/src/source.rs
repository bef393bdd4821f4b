//! Where segments come from. The allocator only manages offsets inside
//! segments; a `SegmentSource` turns "give me N bytes" into something real: a
//! wgpu buffer (in `device/`), or just a count against a capacity
//! ([`SimulatedSource`]), so the same allocator code can replay a 40 GiB
//! workload on a laptop and be tested without a GPU.

/// Identifies one segment for the lifetime of an allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct SegmentId(pub u64);

/// Why a source could not provide a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The device (or simulated capacity) has no room: the allocator frees its
    /// cache and retries, as PyTorch does after a failed cudaMalloc.
    #[error("the device is out of memory")]
    OutOfMemory,
    /// Anything else (a lost device, a backend error): not retried.
    #[error("{0}")]
    Other(String),
}

/// A provider of device memory segments.
pub trait SegmentSource {
    /// Obtains a segment of exactly `size` bytes, to be known as `id`.
    fn allocate(&mut self, id: SegmentId, size: u64) -> Result<(), SourceError>;
    /// Returns a segment obtained with `allocate`.
    fn release(&mut self, id: SegmentId, size: u64);
    /// Total bytes of the device, when known.
    fn total_capacity(&self) -> Option<u64>;
    /// Bytes the device could still hand out, when known.
    fn free_capacity(&self) -> Option<u64>;
    /// The largest single segment the source can make (none on wgpu, which
    /// backs a segment past one buffer with several: u64::MAX).
    fn max_segment_size(&self) -> u64;
    /// A short name for messages ("simulated 16.00 GiB", "wgpu llvmpipe").
    fn describe(&self) -> String;
    /// Where the segment just obtained as `id` lies, if the source decides
    /// (a replay of a recording hands out the recorded addresses, so that
    /// best fit's ties between equal sizes break by address as they did);
    /// `None`: the allocator places it.
    fn address_of(&mut self, _id: SegmentId, _size: u64) -> Option<u64> {
        None
    }
    /// Whether pages can be mapped into a reserved virtual range, as
    /// `expandable_segments` needs (CUDA's cuMemMap). wgpu has no such call,
    /// so only a simulated device says yes.
    fn maps_pages(&self) -> bool {
        false
    }
}

/// A device that exists only as a capacity in bytes (or without limit).
#[derive(Debug, Clone)]
pub struct SimulatedSource {
    capacity: Option<u64>,
    used: u64,
    max_segment: u64,
}

impl SimulatedSource {
    pub fn new(capacity: u64) -> Self {
        SimulatedSource {
            capacity: Some(capacity),
            used: 0,
            max_segment: u64::MAX,
        }
    }

    /// A device that never runs out (limits come from the allocator's memory
    /// limit only).
    pub fn unlimited() -> Self {
        SimulatedSource {
            capacity: None,
            used: 0,
            max_segment: u64::MAX,
        }
    }

    /// Also limits single segments, like wgpu's `max_buffer_size`.
    pub fn with_max_segment_size(mut self, max: u64) -> Self {
        self.max_segment = max;
        self
    }

    pub fn used(&self) -> u64 {
        self.used
    }
}

impl SegmentSource for SimulatedSource {
    fn allocate(&mut self, _id: SegmentId, size: u64) -> Result<(), SourceError> {
        if size > self.max_segment {
            return Err(SourceError::Other(format!(
                "segment of {size} bytes exceeds the maximum of {}",
                self.max_segment
            )));
        }
        // "Unlimited" still stops at 2^62 bytes, so totals fit i64 stats.
        let cap = self
            .capacity
            .unwrap_or(super::constants::MAX_BYTES)
            .min(super::constants::MAX_BYTES);
        match self.used.checked_add(size) {
            Some(total) if total <= cap => {
                self.used = total;
                Ok(())
            }
            _ => Err(SourceError::OutOfMemory),
        }
    }

    fn release(&mut self, _id: SegmentId, size: u64) {
        self.used -= size;
    }

    fn total_capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn free_capacity(&self) -> Option<u64> {
        self.capacity.map(|c| c - self.used)
    }

    fn max_segment_size(&self) -> u64 {
        self.max_segment
    }

    fn maps_pages(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        match self.capacity {
            Some(c) => format!("simulated device of {}", super::size::format_size(c)),
            None => "simulated device without a capacity limit".to_string(),
        }
    }
}
