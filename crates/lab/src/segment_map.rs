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
use crate::memory::{AllocatorConfig, Snapshot};
use crate::peak::ranked;
use crate::pickle::{unpickle, PyValue};
use crate::torch_snapshot::{
    apply_op, int, size_of, start_replay, user_frame, Started, TorchSnapshot,
};

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

/// [`segment_maps`] of an unpickled snapshot. Segments no allocator could
/// have held are errors that say where, not figures: sizes negative or
/// past 2^62, blocks that hold more than their segment or requested more
/// than their size, segments that overlap, a device's segments past 2^62
/// in all (so no sum wraps).
pub fn maps_of(root: &PyValue) -> Result<Vec<SegmentMap>, LabError> {
    let corrupt = |at: String, what: String| LabError::CorruptSegments { at, what };
    let segments = match root.get("segments") {
        None => &[][..],
        Some(v) => v
            .as_list()
            .ok_or_else(|| corrupt("segments".into(), "not a list".into()))?,
    };
    // (device) → (address, end, index) of its segments, to find overlaps.
    let mut spans: BTreeMap<usize, Vec<(u64, u64, usize)>> = BTreeMap::new();
    let mut maps: BTreeMap<usize, Builder> = BTreeMap::new();
    for (si, seg) in segments.iter().enumerate() {
        let at = || format!("segments[{si}]");
        if seg.as_dict().is_none() {
            return Err(corrupt(at(), "not a dict of a segment's fields".into()));
        }
        let device = int(seg, "device") as usize;
        // No address (an old or hand-made file): placed nowhere, so it
        // overlaps nothing.
        let address = match seg.get("address").map(PyValue::as_i64) {
            Some(Some(a)) if a < 0 => {
                return Err(corrupt(at(), format!("address {a} is negative")))
            }
            Some(Some(a)) => Some(a as u64),
            _ => None,
        };
        let total = size_of(seg, "total_size", at)?;
        let blocks = match seg.get("blocks") {
            None => &[][..],
            Some(v) => v
                .as_list()
                .ok_or_else(|| corrupt(at(), "blocks is not a list".into()))?,
        };
        let mut blks = Vec::with_capacity(blocks.len());
        let mut held = 0u64;
        for (bi, b) in blocks.iter().enumerate() {
            let at = || format!("segments[{si}].blocks[{bi}]");
            let size = size_of(b, "size", at)?;
            let active = b.get("state").and_then(PyValue::as_str) == Some("active_allocated");
            // Read as replay reads it: absent is the block's size, a
            // negative one 0.
            let requested = b
                .get("requested_size")
                .and_then(PyValue::as_i64)
                .map_or(size, |r| r.max(0) as u64);
            // A free block keeps its last request (PyTorch does not reset
            // it), which may be a larger block's before a split.
            if active && requested > size {
                return Err(corrupt(
                    at(),
                    format!("requested_size {requested} is more than its size {size}"),
                ));
            }
            held += size;
            if held > total {
                return Err(corrupt(
                    at(),
                    format!("the blocks so far hold {held} bytes, more than the segment's total_size {total}"),
                ));
            }
            blks.push(Blk {
                size,
                requested,
                active,
                frame: user_frame(b.get("frames")),
            });
        }
        if let Some(a) = address {
            spans
                .entry(device)
                .or_default()
                .push((a, a.saturating_add(total), si));
        }
        let builder = maps.entry(device).or_insert_with(|| Builder::new(device));
        if builder.map.reserved_bytes + total > crate::memory::constants::MAX_BYTES {
            return Err(corrupt(
                at(),
                format!("device {device}'s segments hold more than 2^62 bytes (4 EiB) in all, the most vramlab models"),
            ));
        }
        builder.add(
            address.unwrap_or(0),
            total,
            seg.get("is_expandable").and_then(PyValue::as_bool) == Some(true),
            seg.get("segment_type")
                .and_then(PyValue::as_str)
                .unwrap_or(""),
            blks.into_iter(),
        );
    }
    for list in spans.values_mut() {
        list.sort_unstable();
        for w in list.windows(2) {
            let ((_, end, a), (next, _, b)) = (w[0], w[1]);
            if end > next {
                return Err(corrupt(
                    format!("segments[{a}] and segments[{b}]"),
                    "they overlap on one device".into(),
                ));
            }
        }
    }
    Ok(maps.into_values().map(Builder::finish).collect())
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
