//! vramlab's caching allocator: PyTorch's CUDA caching allocator
//! (c10/cuda/CUDACachingAllocator.cpp), reproduced rule for rule over abstract
//! segments. This module never touches wgpu. What studies allocators rather
//! than being one (strategies, workloads, traces, snapshots) is
//! the lab (`vramlab-lab`).
//!
//! # Why a caching allocator
//! Asking a device for memory is slow and synchronizing (cudaMalloc, or
//! `wgpu::Device::create_buffer`), and tensors come and go thousands of times
//! per training step. So freed blocks are kept and reused; the device sees only
//! a few large *segments*, which the allocator carves into *blocks*.
//!
//! # The policy (PyTorch's, so its numbers can be reproduced to the byte)
//! - **Rounding**: every request rounds up to a multiple of 512 B
//!   (`K_MIN_BLOCK_SIZE`), or with `roundup_power2_divisions:d` to one of `d`
//!   steps between powers of two, trading waste for reuse.
//! - **Two pools**: rounded sizes ≤ 1 MiB live in 2 MiB small-pool segments, so
//!   many small tensors share one segment; larger ones in the large pool, in
//!   20 MiB segments below 10 MiB, else in a segment of their own rounded to
//!   2 MiB.
//! - **Best fit** by (size, address); **split** the rest off when it is ≥ 512 B
//!   (small) or > 1 MiB (large); **merge** free neighbours on free.
//! - **Release** a segment only when it is one whole free block, on
//!   `empty_cache`, on out-of-memory, or by garbage collection.
//! - **Out of memory** is a value: free oversize cached blocks, retry; free all
//!   cached whole segments, retry; then `AllocError::OutOfMemory` with what was
//!   asked, the limit, allocated and reserved-but-unallocated bytes.
//! - **Knobs**: `max_split_size_mb` (blocks at least this big are never split,
//!   which stops big blocks being whittled away by small requests),
//!   `roundup_power2_divisions`, `garbage_collection_threshold` (with a memory
//!   limit), and the memory limit itself (`set_per_process_memory_fraction`).
//! - **Placement hook** (`placement.rs`): not PyTorch's. Unset, nothing
//!   changes; a policy set there may choose a block's place, carve small
//!   requests from large blocks, or release free segments before growing.
//!   vramlab's own policies live in the lab (`vramlab-lab`).
//!
//! # Statistics
//! [`DeviceStats`] has PyTorch's counters and names: `allocated_bytes`,
//! `reserved_bytes`, `active_bytes`, `inactive_split_bytes`, `requested_bytes`,
//! `allocation`, `segment`, `active`, `inactive_split`, each for all / small /
//! large pools with current / peak / allocated / freed, and the event counters.
//! [`CachingAllocator::check_invariants`] recomputes them from a snapshot.
//!
//! # Differences from PyTorch, on purpose
//! - One stream: wgpu runs one ordered queue, so there are no cross-stream
//!   events, no `record_stream`, and `active` equals `allocated`.
//! - Expandable segments (`expandable.rs`) only on a simulated device: wgpu
//!   has no virtual memory mapping. No CUDA graph pools.
//! - Segment addresses are virtual (disjoint ranges handed out in order), since
//!   wgpu buffers have no addresses; ties in best fit break by them.

pub mod caching;
pub mod config;
pub mod constants;
pub mod error;
pub mod events;
pub mod expandable;
pub mod handle;
pub mod id_hash;
pub mod layout_key;
pub mod placement;
pub mod size;
pub mod snapshot;
pub mod source;
pub mod stats;
pub mod summary;
pub mod tag;

pub use caching::{round_size, Allocation, BlockHandle, CachingAllocator, PoolKind};
pub use config::{AllocatorConfig, ALLOC_CONF_ENV};
pub use error::{AllocError, OomReport};
pub use events::{EventKind, LiveBlocks, LiveSegments, MemEvent};
pub use placement::{AllocatorView, FreeBlock, Ghost, Place, Placement, Request};
pub use size::{format_size, mib, parse_size, Mib};
pub use snapshot::{BlockInfo, SegmentInfo, Snapshot};
pub use source::{SegmentId, SegmentSource, SimulatedSource, SourceError};
pub use stats::{DeviceStats, Stat, StatType};
pub use summary::memory_summary;
pub use tag::{Category, CATEGORIES};
