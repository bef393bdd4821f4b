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
use crate::pickle::{unpickle, PyValue};
use crate::torch_snapshot::{start_replay, user_frame, Started, TorchSnapshot};
use crate::workload::Op;

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

fn int(v: &PyValue, key: &str) -> u64 {
    v.get(key).and_then(PyValue::as_i64).unwrap_or(0).max(0) as u64
}

/// The segment map of every device the file's `segments` mention.
pub fn segment_maps(bytes: &[u8], name: &str) -> Result<Vec<SegmentMap>, LabError> {
    let root = unpickle(bytes).map_err(|e| LabError::NotAPickle {
        name: name.to_string(),
        source: Box::new(e),
    })?;
    Ok(maps_of(&root))
}

/// [`segment_maps`] of an unpickled snapshot.
pub fn maps_of(root: &PyValue) -> Vec<SegmentMap> {
    let mut maps: BTreeMap<usize, SegmentMap> = BTreeMap::new();
    let mut frames: HashMap<usize, HashMap<String, u64>> = HashMap::new();
    let mut rows: HashMap<usize, Vec<SegmentRow>> = HashMap::new();
    let segments = root
        .get("segments")
        .and_then(PyValue::as_list)
        .unwrap_or(&[]);
    for seg in segments {
        let device = int(seg, "device") as usize;
        let m = maps.entry(device).or_insert_with(|| SegmentMap {
            device,
            ..SegmentMap::default()
        });
        let total = int(seg, "total_size");
        let expandable = seg.get("is_expandable").and_then(PyValue::as_bool) == Some(true);
        m.segments += 1;
        m.expandable_segments += expandable as usize;
        m.reserved_bytes += total;
        let (mut active, mut free, mut largest, mut n) = (0u64, 0u64, 0u64, 0usize);
        for b in seg.get("blocks").and_then(PyValue::as_list).unwrap_or(&[]) {
            n += 1;
            let size = int(b, "size");
            if b.get("state").and_then(PyValue::as_str) == Some("active_allocated") {
                let requested = b
                    .get("requested_size")
                    .and_then(PyValue::as_i64)
                    .map_or(size, |r| r.max(0) as u64);
                active += size;
                m.requested_bytes += requested;
                m.free_internal_bytes += size.saturating_sub(requested);
                if let Some(f) = user_frame(b.get("frames")) {
                    *frames.entry(device).or_default().entry(f).or_default() += size;
                }
            } else {
                free += size;
                largest = largest.max(size);
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
        let pool = seg
            .get("segment_type")
            .and_then(PyValue::as_str)
            .unwrap_or("")
            .to_string();
        rows.entry(device).or_default().push(SegmentRow {
            address: int(seg, "address"),
            total_bytes: total,
            allocated_bytes: active,
            free_bytes: free,
            largest_free_block: largest,
            blocks: n,
            pool,
            expandable,
        });
    }
    for (device, m) in maps.iter_mut() {
        let mut r = rows.remove(device).unwrap_or_default();
        r.sort_by(|a, b| {
            b.free_bytes
                .cmp(&a.free_bytes)
                .then(a.address.cmp(&b.address))
        });
        r.truncate(TOP);
        m.most_free = r;
        let mut f: Vec<(String, u64)> = frames
            .remove(device)
            .unwrap_or_default()
            .into_iter()
            .collect();
        f.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        f.truncate(TOP);
        m.by_frame = f;
    }
    maps.into_values().collect()
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
        match *op {
            Op::Alloc { id, size, category } => {
                if let Ok(x) = a.malloc_tagged(size.max(1), "", category, None) {
                    handles.insert(id, x.handle);
                }
            }
            Op::Free { id } => {
                if let Some(h) = handles.remove(&id) {
                    let _ = a.free(h);
                }
            }
            Op::EmptyCache => a.empty_cache(),
        }
    }
    Ok(from_allocator(snap.device, &a.snapshot()))
}

/// A segment map of an allocator's own snapshot (no frames: a replay has
/// none of its own).
pub fn from_allocator(device: usize, snap: &Snapshot) -> SegmentMap {
    let mut m = SegmentMap {
        device,
        ..SegmentMap::default()
    };
    let mut rows = Vec::new();
    for seg in &snap.segments {
        m.segments += 1;
        m.expandable_segments += seg.expandable as usize;
        m.reserved_bytes += seg.total_size;
        let (mut active, mut free, mut largest) = (0u64, 0u64, 0u64);
        for b in &seg.blocks {
            if b.state == "active_allocated" {
                active += b.size;
                m.requested_bytes += b.requested_size;
                m.free_internal_bytes += b.size.saturating_sub(b.requested_size);
            } else {
                free += b.size;
                largest = largest.max(b.size);
            }
        }
        m.allocated_bytes += active;
        m.free_external_bytes += free;
        m.largest_free_block = m.largest_free_block.max(largest);
        if active == 0 {
            m.free_segment_bytes += seg.total_size;
        } else {
            m.inactive_split_bytes += free;
        }
        rows.push(SegmentRow {
            address: seg.address,
            total_bytes: seg.total_size,
            allocated_bytes: active,
            free_bytes: free,
            largest_free_block: largest,
            blocks: seg.blocks.len(),
            pool: seg.segment_type.trim_end_matches("_pool").to_string(),
            expandable: seg.expandable,
        });
    }
    rows.sort_by(|a, b| {
        b.free_bytes
            .cmp(&a.free_bytes)
            .then(a.address.cmp(&b.address))
    });
    rows.truncate(TOP);
    m.most_free = rows;
    m
}
