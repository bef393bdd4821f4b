//! A snapshot's `segments` (its end state), read once and checked, for
//! replay's rewind and doctor's segment map alike: both then see the same
//! figures, and a segment no allocator could hold is refused for both.

use std::collections::BTreeMap;

use crate::error::LabError;
use crate::memory::constants::MAX_BYTES;
use crate::pickle::PyValue;
use crate::snapshot_fields::{int, size_of};

/// One recorded segment, as the file states it.
#[derive(Debug, Clone)]
pub struct Segment<'a> {
    /// Its index in `segments`, for errors that say where.
    pub index: usize,
    pub device: usize,
    /// `None` in old or hand-made files: placed nowhere, it overlaps
    /// nothing.
    pub address: Option<u64>,
    pub total_size: u64,
    /// `segment_type` ("small", "large"), empty where absent.
    pub segment_type: String,
    pub expandable: bool,
    /// `allocated_size`: PyTorch's allocated bytes in this segment.
    pub allocated_size: u64,
    pub blocks: Vec<Block<'a>>,
}

/// One block of a recorded segment.
#[derive(Debug, Clone)]
pub struct Block<'a> {
    /// `None` in older files, whose blocks tile their segment in order.
    pub address: Option<u64>,
    pub size: u64,
    /// `requested_size`; absent is the block's size, negative 0. A free
    /// block keeps its last request (PyTorch does not reset it), which may
    /// be a larger block's before a split.
    pub requested: u64,
    pub state: String,
    /// Its recorded `frames`, read only by what names the user's code
    /// (doctor's map), not by replay.
    pub frames: Option<&'a PyValue>,
}

impl Block<'_> {
    /// Held by the user (memory_viz's `active_allocated`).
    pub fn active(&self) -> bool {
        self.state == "active_allocated"
    }

    /// Held by the allocator for a user: active, or freed but waiting on
    /// another stream's work (`active_pending_free`).
    pub fn allocated(&self) -> bool {
        self.state.starts_with("active")
    }
}

/// Every segment of the snapshot, in file order. Segments no allocator
/// could have held are errors that say where: sizes negative or past 2^62,
/// blocks that hold more than their segment, an allocated block that
/// requested more than its size, segments that overlap on a device, a device's
/// segments past 2^62 in all (so no sum of them wraps).
pub fn read(root: &PyValue) -> Result<Vec<Segment<'_>>, LabError> {
    let corrupt = |at: String, what: String| LabError::CorruptSegments { at, what };
    let segments = match root.get("segments") {
        None => &[][..],
        Some(v) => v
            .as_list()
            .ok_or_else(|| corrupt("segments".into(), "not a list".into()))?,
    };
    let mut out = Vec::with_capacity(segments.len());
    // Device → reserved bytes so far.
    let mut reserved: BTreeMap<usize, u64> = BTreeMap::new();
    for (si, seg) in segments.iter().enumerate() {
        let at = || format!("segments[{si}]");
        if seg.as_dict().is_none() {
            return Err(corrupt(at(), "not a dict of a segment's fields".into()));
        }
        let device = int(seg, "device") as usize;
        let address = match seg.get("address").map(PyValue::as_i64) {
            Some(Some(a)) if a < 0 => {
                return Err(corrupt(at(), format!("address {a} is negative")))
            }
            Some(Some(a)) => Some(a as u64),
            _ => None,
        };
        let total_size = size_of(seg, "total_size", at)?;
        let listed = match seg.get("blocks") {
            None => &[][..],
            Some(v) => v
                .as_list()
                .ok_or_else(|| corrupt(at(), "blocks is not a list".into()))?,
        };
        let mut blocks = Vec::with_capacity(listed.len());
        let mut held = 0u64;
        for (bi, b) in listed.iter().enumerate() {
            let at = || format!("segments[{si}].blocks[{bi}]");
            let size = size_of(b, "size", at)?;
            let requested = b
                .get("requested_size")
                .and_then(PyValue::as_i64)
                .map_or(size, |r| r.max(0) as u64);
            let block = Block {
                address: b
                    .get("address")
                    .and_then(PyValue::as_i64)
                    .map(|a| (a.max(0) as u64).min(MAX_BYTES)),
                size,
                requested,
                state: b
                    .get("state")
                    .and_then(PyValue::as_str)
                    .unwrap_or("")
                    .to_string(),
                frames: b.get("frames"),
            };
            if block.allocated() && requested > size {
                return Err(corrupt(
                    at(),
                    format!("requested_size {requested} is more than its size {size}"),
                ));
            }
            held += size;
            if held > total_size {
                return Err(corrupt(
                    at(),
                    format!("the blocks so far hold {held} bytes, more than the segment's total_size {total_size}"),
                ));
            }
            blocks.push(block);
        }
        let sum = reserved.entry(device).or_default();
        *sum += total_size;
        if *sum > MAX_BYTES {
            return Err(corrupt(
                at(),
                format!("device {device}'s segments hold more than 2^62 bytes (4 EiB) in all, the most vramlab models"),
            ));
        }
        out.push(Segment {
            index: si,
            device,
            address,
            total_size,
            segment_type: seg
                .get("segment_type")
                .and_then(PyValue::as_str)
                .unwrap_or("")
                .to_string(),
            expandable: seg.get("is_expandable").and_then(PyValue::as_bool) == Some(true),
            allocated_size: int(seg, "allocated_size"),
            blocks,
        });
    }
    no_overlaps(&out)?;
    Ok(out)
}

/// Segments placed on one device must not share an address.
fn no_overlaps(segments: &[Segment]) -> Result<(), LabError> {
    let mut spans: BTreeMap<usize, Vec<(u64, u64, usize)>> = BTreeMap::new();
    for s in segments {
        if let Some(a) = s.address {
            spans
                .entry(s.device)
                .or_default()
                .push((a, a.saturating_add(s.total_size), s.index));
        }
    }
    for list in spans.values_mut() {
        list.sort_unstable();
        for w in list.windows(2) {
            let ((_, end, a), (next, _, b)) = (w[0], w[1]);
            if end > next {
                return Err(LabError::CorruptSegments {
                    at: format!("segments[{a}] and segments[{b}]"),
                    what: "they overlap on one device".into(),
                });
            }
        }
    }
    Ok(())
}
