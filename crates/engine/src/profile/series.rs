//! Running totals along an event log: allocated, reserved and bytes per
//! category after every event, phase marks, and the blocks and segments
//! alive at any event (a snapshot reconstructed from the log).

use crate::memory::{Category, EventKind, LiveBlocks, LiveSegments, MemEvent, CATEGORIES};
use serde::Serialize;
use std::collections::BTreeMap;

/// Totals after each event.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub allocated: Vec<u64>,
    pub reserved: Vec<u64>,
    /// `[event][category index]`.
    pub by_category: Vec<[u64; crate::memory::tag::N_CATEGORIES]>,
    /// (event index, phase name).
    pub phases: Vec<(usize, String)>,
    /// Event index where allocated memory peaks (first time).
    pub peak_index: usize,
}

impl Series {
    pub fn of(events: &[MemEvent]) -> Series {
        let mut live = LiveBlocks::default();
        let mut s = Series {
            allocated: Vec::with_capacity(events.len()),
            reserved: Vec::with_capacity(events.len()),
            by_category: Vec::with_capacity(events.len()),
            phases: Vec::new(),
            peak_index: 0,
        };
        let mut peak = 0;
        for (i, e) in events.iter().enumerate() {
            live.apply(e);
            if e.kind == EventKind::Phase {
                s.phases.push((i, e.op.to_string()));
            }
            if e.allocated > peak {
                peak = e.allocated;
                s.peak_index = i;
            }
            s.allocated.push(e.allocated);
            s.reserved.push(e.reserved);
            s.by_category.push(live.by_category);
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
    let mut ranges = LiveSegments::default();
    let mut blocks = LiveBlocks::default();
    for e in events.iter().take(index + 1) {
        blocks.apply(e);
        ranges.apply(e);
    }
    let mut segments: BTreeMap<u64, LiveSegment> = ranges
        .by_address
        .iter()
        .map(|(&address, &(total_size, segment_id))| {
            (
                address,
                LiveSegment {
                    segment_id,
                    address,
                    total_size,
                    allocated_size: 0,
                    blocks: Vec::new(),
                },
            )
        })
        .collect();
    let mut live: Vec<&MemEvent> = blocks.iter().collect();
    live.sort_by_key(|e| e.address);
    for e in live {
        let Some((start, ..)) = ranges.containing(e.address) else {
            continue;
        };
        if let Some(s) = segments.get_mut(&start) {
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
