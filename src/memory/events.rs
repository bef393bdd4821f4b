//! The allocator's event log, when recording: every block allocation and
//! free, every segment obtained from or returned to the device, every
//! out-of-memory, every change of a block's category, and phase marks
//! (forward / backward / optimizer) — each with a timestamp and the
//! allocated and reserved totals right after it. `profile` turns it into
//! timelines; the estimator reads per-category live bytes from it.

use super::tag::Category;
use serde::Serialize;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Alloc,
    Free,
    SegmentAlloc,
    SegmentFree,
    Oom,
    /// The block's category changed (saved for backward, became `.grad`).
    Retag,
    /// A phase begins; `op` names it.
    Phase,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemEvent {
    pub seq: u64,
    /// Microseconds since recording started.
    pub t_us: f64,
    pub kind: EventKind,
    /// Block (or segment) size in bytes.
    pub size: u64,
    /// Bytes the tensor asked for (allocs and frees).
    pub requested: u64,
    pub address: u64,
    pub segment: u64,
    pub category: Category,
    /// For `Retag`: the category before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<Category>,
    pub op: Arc<str>,
    pub label: Arc<str>,
    /// Totals right after the event.
    pub allocated: u64,
    pub reserved: u64,
}
