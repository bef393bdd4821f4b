//! A snapshot's `segments` as they were when it was taken, per device: what
//! is reserved, what its live blocks requested, what is free inside
//! segments that hold live blocks (PyTorch's `inactive_split`, which
//! `empty_cache()` cannot return), whole free segments (which it can), the
//! largest free block, and which code holds the allocated bytes. Needs no
//! trace, so snapshots recorded without `_record_memory_history` (or with
//! `enabled="state"`) get it too. Figures follow memory_viz's `segsum`:
//! allocated is what active blocks requested, internal free is their
//! rounding, external free is every other block.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::error::LabError;
use crate::frames::user_frame;
use crate::memory::{AllocatorConfig, Snapshot};
use crate::peak::ranked;
use crate::pickle::{unpickle, PyValue};
use crate::snapshot_segments;
use crate::torch_snapshot::{apply_op, start_replay, Started, TorchSnapshot};

/// How many segments and frames a map lists.
pub const TOP: usize = 8;

/// One device's segments.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SegmentMap {
    pub device: usize,
    pub segments: usize,
    pub expandable_segments: usize,
    pub reserved_bytes: u64,
    /// What active blocks requested (memory_viz's `total_allocated`).
    pub requested_bytes: u64,
    /// Active blocks' sizes (PyTorch's `allocated_bytes`).
    pub allocated_bytes: u64,
    /// Active blocks' rounding (size − requested).
    pub free_internal_bytes: u64,
    /// Every block not active (memory_viz's external free).
    pub free_external_bytes: u64,
    /// Free blocks inside segments that also hold active ones.
    pub inactive_split_bytes: u64,
    /// Segments with no active block: `empty_cache()` would return them.
    pub free_segment_bytes: u64,
    pub largest_free_block: u64,
    /// The segments with the most free bytes, most first.
    pub most_free: Vec<SegmentRow>,
    /// Allocated bytes by the user's frame that allocated them.
    pub by_frame: Vec<(String, u64)>,
}

/// One segment of a map.
#[derive(Debug, Clone, Serialize)]
pub struct SegmentRow {
    pub address: u64,
    pub total_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_block: u64,
    pub blocks: usize,
    pub pool: String,
    pub expandable: bool,
}

/// The segment map of every device the file's `segments` mention.
pub fn segment_maps(bytes: &[u8], name: &str) -> Result<Vec<SegmentMap>, LabError> {
    let root = unpickle(bytes).map_err(|e| LabError::NotAPickle {
        name: name.to_string(),
        why: Box::new(e),
    })?;
    maps_of(&root)
}

/// [`segment_maps`] of an unpickled snapshot; segments no allocator could
/// have held are errors ([`snapshot_segments::read`]).
pub fn maps_of(root: &PyValue) -> Result<Vec<SegmentMap>, LabError> {
    Ok(maps_from(&snapshot_segments::read(root)?))
}

/// The map of segments already read (doctor reads them once for the map
/// and the replay alike).
pub fn maps_from(segments: &[snapshot_segments::Segment]) -> Vec<SegmentMap> {
    let mut maps: BTreeMap<usize, Builder> = BTreeMap::new();
    for seg in segments {
        maps.entry(seg.device)
            .or_insert_with(|| Builder::new(seg.device))
            .add(
                seg.address.unwrap_or(0),
                seg.total_size,
                seg.expandable,
                &seg.segment_type,
                seg.blocks.iter().map(|b| Blk {
                    size: b.size,
                    requested: b.requested,
                    active: b.active(),
                    frame: user_frame(b.frames),
                }),
            );
    }
    maps.into_values().map(Builder::finish).collect()
}

/// One block as a map counts it.
struct Blk {
    size: u64,
    requested: u64,
    active: bool,
    /// The user's frame that allocated it, where known.
    frame: Option<String>,
}

/// A map filled segment by segment, from a pickle or an allocator alike.
struct Builder {
    map: SegmentMap,
    rows: Vec<SegmentRow>,
    frames: HashMap<String, u64>,
}

impl Builder {
    fn new(device: usize) -> Builder {
        Builder {
            map: SegmentMap {
                device,
                ..SegmentMap::default()
            },
            rows: Vec::new(),
            frames: HashMap::new(),
        }
    }

    fn add(
        &mut self,
        address: u64,
        total: u64,
        expandable: bool,
        pool: &str,
        blocks: impl Iterator<Item = Blk>,
    ) {
        let m = &mut self.map;
        m.segments += 1;
        m.expandable_segments += expandable as usize;
        m.reserved_bytes += total;
        let (mut active, mut free, mut largest, mut n) = (0u64, 0u64, 0u64, 0usize);
        for b in blocks {
            n += 1;
            if b.active {
                active += b.size;
                m.requested_bytes += b.requested;
                m.free_internal_bytes += b.size.saturating_sub(b.requested);
                if let Some(f) = b.frame {
                    *self.frames.entry(f).or_default() += b.size;
                }
            } else {
                free += b.size;
                largest = largest.max(b.size);
            }
        }
        m.allocated_bytes += active;
        m.free_external_bytes += free;
        m.largest_free_block = m.largest_free_block.max(largest);
        if active == 0 {
            m.free_segment_bytes += total;
        } else {
            m.inactive_split_bytes += free;
        }
        self.rows.push(SegmentRow {
            address,
            total_bytes: total,
            allocated_bytes: active,
            free_bytes: free,
            largest_free_block: largest,
            blocks: n,
            pool: pool.to_string(),
            expandable,
        });
    }

    fn finish(mut self) -> SegmentMap {
        self.rows.sort_by(|a, b| {
            b.free_bytes
                .cmp(&a.free_bytes)
                .then(a.address.cmp(&b.address))
        });
        self.rows.truncate(TOP);
        self.map.most_free = self.rows;
        self.map.by_frame = ranked(self.frames, TOP);
        self.map
    }
}

/// The segments of a replay of `snap` under `config` right after trace
/// entry `upto`: what the allocator held at that moment (the peak, an
/// out-of-memory). Allocations the device refuses are left out, as in the
/// replay itself.
pub fn segments_at(
    snap: &TorchSnapshot,
    config: AllocatorConfig,
    capacity: Option<u64>,
    upto: usize,
) -> Result<SegmentMap, LabError> {
    let Started {
        allocator: mut a,
        mut handles,
        ..
    } = start_replay(snap, config, capacity, false)?;
    for op in snap.workload.ops.iter().take(upto.saturating_add(1)) {
        apply_op(&mut a, &mut handles, op, "");
    }
    Ok(from_allocator(snap.device, &a.snapshot()))
}

/// A segment map of an allocator's own snapshot (no frames: a replay has
/// none of its own).
pub fn from_allocator(device: usize, snap: &Snapshot) -> SegmentMap {
    let mut b = Builder::new(device);
    for seg in &snap.segments {
        b.add(
            seg.address,
            seg.total_size,
            seg.expandable,
            seg.segment_type.trim_end_matches("_pool"),
            seg.blocks.iter().map(|x| Blk {
                size: x.size,
                requested: x.requested_size,
                active: x.state == "active_allocated",
                frame: None,
            }),
        );
    }
    b.finish()
}
