//! The allocator's named constants, with PyTorch's values and names
//! (c10/cuda/CUDACachingAllocator.cpp), so a reader can line the two up.

/// All sizes are rounded to at least this many bytes. It also keeps every block
/// offset a multiple of 512, above any `min_storage_buffer_offset_alignment` wgpu
/// allows (at most 256), so any block can be bound directly.
pub const K_MIN_BLOCK_SIZE: u64 = 512;
/// Requests of at most this size (after rounding) use the small pool.
pub const K_SMALL_SIZE: u64 = 1 << 20;
/// Small-pool requests get segments of this size.
pub const K_SMALL_BUFFER: u64 = 2 << 20;
/// Large requests below [`K_MIN_LARGE_ALLOC`] get segments of this size.
pub const K_LARGE_BUFFER: u64 = 20 << 20;
/// Large requests at least this size get a segment of their own size, rounded.
pub const K_MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Granularity of segments for large requests.
pub const K_ROUND_LARGE: u64 = 2 << 20;
/// `roundup_power2_divisions` has one entry per power-of-two interval from 1 MiB
/// up to 32 GiB (index = log2(size in MiB), clamped).
pub const K_ROUNDUP_POWER2_INTERVALS: usize = 16;
/// `max_split_size_mb` must exceed this many MiB, as in PyTorch.
pub const K_MIN_MAX_SPLIT_SIZE_MB: u64 = K_LARGE_BUFFER >> 20;
/// vramlab's own bound, not PyTorch's: no request, device or sum of
/// segments may pass 2^62 bytes (4 EiB), so every size, rounded size and
/// running total fits the `i64` statistics PyTorch keeps. A trace or flag
/// asking for more is corrupt, and says so instead of wrapping around.
pub const MAX_BYTES: u64 = 1 << 62;
