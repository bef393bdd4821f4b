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
    /// Pages mapped into an expandable segment (`address`, `size`: the range).
    SegmentMap,
    /// Pages of an expandable segment given back.
    SegmentUnmap,
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
    /// For `Oom`: the bytes free to the allocator when it gave up, the
    /// device's where it is known, else what the memory limit left (a
    /// snapshot's `device_free`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
}

/// The blocks alive along an event log, and their bytes per category: the
/// one replay of alloc / free / retag events that every report of a log
/// (per-category timelines, estimates, snapshots at an event) builds on.
#[derive(Debug, Clone, Default)]
pub struct LiveBlocks {
    /// Live block bytes per category, indexed by [`Category::index`].
    pub by_category: [u64; crate::tag::N_CATEGORIES],
    /// Each live block's allocation event (its category kept current), by address.
    blocks: std::collections::HashMap<u64, MemEvent>,
}

impl LiveBlocks {
    /// Applies one event; returns the block a `Free` released.
    pub fn apply(&mut self, e: &MemEvent) -> Option<MemEvent> {
        match e.kind {
            EventKind::Alloc => {
                self.by_category[e.category.index()] += e.size;
                self.blocks.insert(e.address, e.clone());
                None
            }
            EventKind::Free => {
                let b = self.blocks.remove(&e.address)?;
                self.by_category[b.category.index()] -= b.size;
                Some(b)
            }
            EventKind::Retag => {
                if let Some(b) = self.blocks.get_mut(&e.address) {
                    self.by_category[b.category.index()] -= b.size;
                    b.category = e.category;
                    self.by_category[e.category.index()] += b.size;
                }
                None
            }
            _ => None,
        }
    }

    /// The live blocks, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &MemEvent> {
        self.blocks.values()
    }
}

/// The segments alive along an event log as PyTorch's snapshot shows them:
/// each fixed segment, and each contiguous mapped range of an expandable
/// segment (pages mapped next to a mapped range join it; an unmap can split
/// one in two). By address: (size, segment id).
#[derive(Debug, Clone, Default)]
pub struct LiveSegments {
    pub by_address: std::collections::BTreeMap<u64, (u64, u64)>,
}

impl LiveSegments {
    /// Applies one event (only segment events change anything).
    pub fn apply(&mut self, e: &MemEvent) {
        let ranges = &mut self.by_address;
        match e.kind {
            EventKind::SegmentAlloc => {
                ranges.insert(e.address, (e.size, e.segment));
            }
            EventKind::SegmentFree => {
                ranges.remove(&e.address);
            }
            EventKind::SegmentMap => {
                let (mut at, mut size) = (e.address, e.size);
                if let Some((&p, &(psize, seg))) = ranges.range(..at).next_back() {
                    if seg == e.segment && p.checked_add(psize) == Some(at) {
                        ranges.remove(&p);
                        (at, size) = (p, size + psize);
                    }
                }
                let end = e.address.saturating_add(e.size);
                if let Some(&(nsize, seg)) = ranges.get(&end) {
                    if seg == e.segment {
                        ranges.remove(&end);
                        size += nsize;
                    }
                }
                ranges.insert(at, (size, e.segment));
            }
            EventKind::SegmentUnmap => {
                let Some((&p, &(psize, seg))) = ranges.range(..=e.address).next_back() else {
                    return;
                };
                let (end, pend) = (e.address.saturating_add(e.size), p.saturating_add(psize));
                if e.address >= pend {
                    return;
                }
                ranges.remove(&p);
                if e.address > p {
                    ranges.insert(p, (e.address - p, seg));
                }
                if pend > end {
                    ranges.insert(end, (pend - end, seg));
                }
            }
            _ => {}
        }
    }

    /// The range holding `address`: (start, size, segment id).
    pub fn containing(&self, address: u64) -> Option<(u64, u64, u64)> {
        let (&p, &(size, seg)) = self.by_address.range(..=address).next_back()?;
        (address < p.saturating_add(size)).then_some((p, size, seg))
    }
}
