//! The allocator lab: what studies allocators rather than being one.
//! Workloads (allocation traces) and the harness that runs them through
//! competing strategies (`strategies/`: pytorch, expandable, nocache,
//! buckets, sliced, buddy, planner, and vramlab's own: expandable segments
//! over 2 MiB granules mapped under live blocks) and compares peaks and
//! fragmentation; the
//! synthetic suite; vramlab's JSON Lines trace format and its replay; and
//! PyTorch's memory snapshots in and out (a plain-data unpickler and
//! pickler, the snapshot as a workload with its recorded start and end
//! state, vramlab runs as snapshots). The allocator itself is
//! [`crate::memory`]; vramlab's placement options (`lookahead`,
//! `small_from_large`, `release_before_grow`, what the engine runs as
//! `vramlab`) plug into its placement hook from here
//! (`strategies/vramlab.rs`). Like it, nothing here touches wgpu.

/// The allocator the strategies are measured against (`crate::memory::…`).
pub use vramlab_alloc as memory;

pub mod buffer;
pub mod error;
pub mod exact_planner;
pub mod file_kind;
pub mod frames;
pub mod interval_trace;
pub mod intervals;
mod lookahead;
pub mod peak;
pub mod pickle;
pub mod recorded_source;
pub mod replay;
pub mod replay_events;
pub mod segment_map;
pub mod snapshot_export;
mod snapshot_fields;
pub mod snapshot_segments;
pub mod strategies;
pub mod synthetic;
pub mod timeline;
pub mod torch_snapshot;
pub mod trace;
pub mod trace_entries;
pub mod workload;

pub use error::LabError;
pub use replay::{replay, ReplayOutcome};
pub use trace::TraceEvent;
