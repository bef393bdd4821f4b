//! Running totals along an event log: allocated, reserved and bytes per
//! category after every event, phase marks, and the blocks and segments
//! alive at any event (a snapshot reconstructed from the log).

use crate::memory::{Category, EventKind, MemEvent, CATEGORIES};
use serde::Serialize;
use std::collections::BTreeMap;

/// Totals after each event.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub allocated: Vec<u64>,
    pub reserved: Vec<u64>,
    /// `[event][category index]`.
    pub by_category: Vec<[u64; 9]>,
    /// (event index, phase name).
    pub phases: Vec<(usize, String)>,
    /// Event index where allocated memory peaks (first time).
    pub peak_index: usize,
}

impl Series {
    pub fn of(events: &[MemEvent]) -> Series {
        let mut totals = [0u64; 9];
        let mut live: BTreeMap<u64, (u64, Category)> = BTreeMap::new();
        let mut s = Series {
            allocated: Vec::with_capacity(events.len()),
            reserved: Vec::with_capacity(events.len()),
            by_category: Vec::with_capacity(events.len()),
            phases: Vec::new(),
            peak_index: 0,
        };
        let mut peak = 0;
        for (i, e) in events.iter().enumerate() {
            match e.kind {
                EventKind::Alloc => {
                    totals[e.category.index()] += e.size;
                    live.insert(e.address, (e.size, e.category));
                }
                EventKind::Free => {
                    if let Some((size, c)) = live.remove(&e.address) {
                        totals[c.index()] -= size;
                    }
                }
                EventKind::Retag => {
                    if let Some(entry) = live.get_mut(&e.address) {
                        totals[entry.1.index()] -= entry.0;
                        entry.1 = e.category;
                        totals[e.category.index()] += entry.0;
                    }
                }
                EventKind::Phase => s.phases.push((i, e.op.to_string())),
                _ => {}
            }
            if e.allocated > peak {
                peak = e.allocated;
                s.peak_index = i;
            }
            s.allocated.push(e.allocated);
            s.reserved.push(e.reserved);
            s.by_category.push(totals);
        }
        s
    }

    pub fn category_names() -> Vec<&'static str> {
        CATEGORIES.iter().map(|c| c.name()).collect()
    }
}

/// One block alive at an event.
#[derive(Debug, Clone, Serialize)]
pub struct LiveBlock {
    pub address: u64,
    pub offset: u64,
    pub size: u64,
    pub requested_size: u64,
    pub category: Category,
    pub op: String,
    pub label: String,
}

/// One segment alive at an event, with its live blocks (the rest is free).
#[derive(Debug, Clone, Serialize)]
pub struct LiveSegment {
    pub segment_id: u64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub blocks: Vec<LiveBlock>,
}

/// The segments and blocks alive right after event `index`.
pub fn live_at(events: &[MemEvent], index: usize) -> Vec<LiveSegment> {
    let mut segments: BTreeMap<u64, LiveSegment> = BTreeMap::new();
    let mut blocks: BTreeMap<u64, (u64, MemEvent)> = BTreeMap::new();
    for e in events.iter().take(index + 1) {
        match e.kind {
            EventKind::SegmentAlloc => {
                segments.insert(
                    e.segment,
                    LiveSegment {
                        segment_id: e.segment,
                        address: e.address,
                        total_size: e.size,
                        allocated_size: 0,
                        blocks: Vec::new(),
                    },
                );
            }
            EventKind::SegmentFree => {
                segments.remove(&e.segment);
            }
            EventKind::Alloc => {
                blocks.insert(e.address, (e.segment, e.clone()));
            }
            EventKind::Free => {
                blocks.remove(&e.address);
            }
            EventKind::Retag => {
                if let Some(b) = blocks.get_mut(&e.address) {
                    b.1.category = e.category;
                }
            }
            _ => {}
        }
    }
    for (seg, e) in blocks.into_values() {
        if let Some(s) = segments.get_mut(&seg) {
            s.allocated_size += e.size;
            s.blocks.push(LiveBlock {
                address: e.address,
                offset: e.address - s.address,
                size: e.size,
                requested_size: e.requested,
                category: e.category,
                op: e.op.to_string(),
                label: e.label.to_string(),
            });
        }
    }
    segments.into_values().collect()
}
