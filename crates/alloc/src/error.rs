//! What can go wrong when asking the allocator for memory, as values, never
//! panics. The out-of-memory message follows PyTorch's wording so people who
//! know "CUDA out of memory. Tried to allocate ..." can read it at a glance.

use super::size::format_size;
use std::fmt;

/// Everything the allocator knew when it gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomReport {
    /// Bytes asked for.
    pub requested: u64,
    /// The request after rounding (the block size it would have had).
    pub rounded: u64,
    /// The segment size it tried to obtain from the device.
    pub alloc_size: u64,
    /// The memory limit in force (`--memory-limit` / `--memory-fraction`).
    pub limit: Option<u64>,
    /// The device's total capacity, when the source knows it.
    pub capacity: Option<u64>,
    /// The device's free bytes, when the source knows it.
    pub device_free: Option<u64>,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes held in segments.
    pub reserved: u64,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // PyTorch's figure is the segment asked of the device; the request
        // (and its rounding, where it changed it) says where it came from.
        let request = if self.rounded == self.requested {
            format!("a request of {}", format_size(self.requested))
        } else {
            format!(
                "a request of {} rounded to {}",
                format_size(self.requested),
                format_size(self.rounded)
            )
        };
        write!(
            f,
            "out of memory. Tried to allocate {} ({request}).",
            format_size(self.alloc_size),
        )?;
        if let (Some(cap), Some(free)) = (self.capacity, self.device_free) {
            write!(
                f,
                " Device has a total capacity of {} of which {} is free.",
                format_size(cap),
                format_size(free)
            )?;
        }
        if let Some(limit) = self.limit {
            write!(f, " {} allowed (memory limit).", format_size(limit))?;
        }
        write!(
            f,
            " Of the allocated memory {} is allocated by vramlab, and {} is reserved by vramlab but unallocated.",
            format_size(self.allocated),
            format_size(self.reserved.saturating_sub(self.allocated)),
        )?;
        // What bounded it: the limit given, the device's size, the 2^62
        // bytes a simulated device without a limit still stops at, or a GPU
        // of a size wgpu does not report, which refused below that.
        let past_model =
            self.reserved.saturating_add(self.alloc_size) > super::constants::MAX_BYTES;
        let bound = match (self.limit, self.capacity) {
            (Some(_), _) => ", or raise --memory-limit",
            (None, Some(_)) => " (the device's memory is the bound)",
            (None, None) if past_model => {
                ": this device has no limit but the 2^62 bytes (4 EiB) vramlab models, so the sizes are probably far larger than meant"
            }
            (None, None) => {
                " (the device refused it: its memory is full, and wgpu does not report its size). To see a step's peak before running it, give `vramlab estimate` the same flags and --capacity SIZE (this GPU's memory, as nvidia-smi or the vendor's tool shows it), or ask `vramlab max-batch --memory-limit SIZE` for the largest batch that fits"
            }
        };
        write!(
            f,
            " To fit: free tensors or use a smaller batch{bound}; if reserved but unallocated memory is large, try VRAMLAB_ALLOC_CONF=max_split_size_mb:128 to limit fragmentation."
        )
    }
}

/// What can go wrong in this crate: an allocation or a free that failed,
/// or an alloc-conf string that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    #[error("cannot allocate {requested} bytes: it needs a segment of {segment} bytes, larger than this device's largest buffer ({max} bytes, max_buffer_size); split the tensor or use a smaller batch")]
    TooLarge {
        requested: u64,
        segment: u64,
        max: u64,
    },
    #[error("cannot allocate {0} bytes: more than the 2^62 bytes (4 EiB) vramlab models for any device; the size is probably corrupt (an overflow, or a wrong unit)")]
    Unrepresentable(u64),
    #[error("the recording passed {0} allocator events, the most kept in memory: a training step this long (very many layers, or a very large --batch whose convolutions run in many chunks) needs fewer layers or a smaller batch; a trace this long (replay --export-snapshot) needs splitting")]
    RecordingFull(usize),
    #[error("cannot allocate 0 bytes: a tensor needs at least one element")]
    ZeroSize,
    #[error("invalid free: {0}")]
    InvalidFree(String),
    #[error("the device failed to allocate memory: {0}")]
    Device(String),
    /// What [`crate::CachingAllocator::check_invariants`] found broken.
    #[error("allocator invariant broken: {0}")]
    InvariantBroken(String),
    /// An alloc-conf option without `:value`.
    #[error("allocator config {input:?}: option {option:?} has no value; write key:value")]
    MissingValue { input: String, option: String },
    /// An alloc-conf key PyTorch does not have: a silently ignored typo
    /// would make every measurement lie.
    #[error("allocator config {input:?}: unknown option {key:?}; known options: {}", .known.join(", "))]
    UnknownKey {
        input: String,
        key: String,
        known: &'static [&'static str],
    },
    /// `backend:cudaMallocAsync`: CUDA's stream-ordered allocator, which
    /// vramlab does not model.
    #[error("allocator config {input:?}: backend:cudaMallocAsync selects CUDA's stream-ordered allocator, which vramlab does not model: it replays PyTorch's native caching allocator only (drop the option or write backend:native)")]
    AsyncBackend { input: String },
    /// An alloc-conf value PyTorch would refuse (`value` is the offending
    /// part of it).
    #[error("allocator config {input:?}: {key} wants {expected}, got {value:?}")]
    BadValue {
        input: String,
        key: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl AllocError {
    pub fn is_oom(&self) -> bool {
        matches!(self, AllocError::OutOfMemory(_))
    }
}

#[cfg(test)]
mod oom_advice {
    use super::OomReport;

    /// The advice names what bounded the request: the limit given, the
    /// device's size, the 2^62 bytes an unlimited simulated device stops at,
    /// or a GPU of unreported size that refused below them.
    #[test]
    fn the_advice_names_what_bounded_the_request() {
        let report = |limit, capacity| OomReport {
            requested: 1 << 20,
            rounded: 1 << 20,
            alloc_size: 2 << 20,
            limit,
            capacity,
            device_free: capacity,
            allocated: 0,
            reserved: 0,
        };
        // Either side of the 2^62 bytes: past them only the model refuses.
        let max = crate::constants::MAX_BYTES;
        for (reserved, alloc_size) in [(512, max), (1 << 20, max - (1 << 20) + 512), (max, 512)] {
            let r = OomReport {
                alloc_size,
                reserved,
                ..report(None, None)
            }
            .to_string();
            assert!(r.contains("2^62") && !r.contains("--capacity"), "{r}");
        }
        for (reserved, alloc_size) in [(0, 2 << 20), (80 << 30, 1 << 30), (max - 512, 512)] {
            let r = OomReport {
                alloc_size,
                reserved,
                ..report(None, None)
            }
            .to_string();
            assert!(
                !r.contains("2^62") && r.contains("--capacity") && r.contains("max-batch"),
                "{r}"
            );
        }
        let limited = report(Some(1 << 20), None).to_string();
        assert!(limited.contains("raise --memory-limit"), "{limited}");
        let device = report(None, Some(1 << 30)).to_string();
        assert!(
            !device.contains("--memory-limit") && device.contains("the device's memory"),
            "{device}"
        );
        let gpu = report(None, None).to_string();
        assert!(
            !gpu.contains("raise --memory-limit") && gpu.contains("the device refused it"),
            "{gpu}"
        );
    }
}
