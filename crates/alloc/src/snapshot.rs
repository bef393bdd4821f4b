//! A picture of every segment and block (`torch.cuda.memory_snapshot()`), and
//! the check PyTorch's tests run after every step
//! (`_check_memory_stat_consistency`): statistics recomputed from the picture
//! must equal the running counters, and blocks must tile their segments.

use super::caching::{CachingAllocator, PoolKind};
use super::error::AllocError;
use super::source::{SegmentId, SegmentSource};
use super::stats::StatType;
use serde::Serialize;
use std::collections::BTreeMap;

/// One block inside a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockInfo {
    /// Virtual address (segment address + offset).
    pub address: u64,
    /// Offset inside the segment's buffer.
    pub offset: u64,
    pub size: u64,
    /// Bytes the tensor asked for (0 for a free block).
    pub requested_size: u64,
    /// PyTorch's states: `active_allocated` or `inactive`.
    pub state: &'static str,
    /// The tensor held, if any.
    pub label: Option<String>,
    /// Why it is held, and the op that made it (allocated blocks only).
    pub category: Option<super::tag::Category>,
    pub op: Option<String>,
}

/// One segment (one device buffer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentInfo {
    pub segment_id: SegmentId,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    /// `small_pool` or `large_pool`, as PyTorch's `segment_type`.
    pub segment_type: &'static str,
    /// A mapped range of an expandable segment (PyTorch's `is_expandable`).
    pub expandable: bool,
    pub blocks: Vec<BlockInfo>,
}

/// Every segment, ordered by address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub segments: Vec<SegmentInfo>,
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// A snapshot of every segment and its blocks. An expandable segment
    /// shows as one segment per contiguous mapped range, as PyTorch's
    /// snapshot does; its unmapped address space is not shown.
    pub fn snapshot(&self) -> Snapshot {
        let info = |b: &super::caching::Block, base: u64| BlockInfo {
            address: b.address,
            offset: b.address - base,
            size: b.size,
            requested_size: if b.allocated { b.requested } else { 0 },
            state: if b.allocated {
                "active_allocated"
            } else {
                "inactive"
            },
            label: if b.allocated {
                // An allocated block's empty label is kept as `None`.
                Some(b.label.as_deref().unwrap_or("").to_string())
            } else {
                None
            },
            category: b.allocated.then_some(b.category),
            op: if b.allocated {
                b.op.as_deref().map(str::to_string)
            } else {
                None
            },
        };
        // (segment id, range start, range size, pool) → blocks
        let mut groups: BTreeMap<(SegmentId, u64), (u64, PoolKind, Vec<BlockInfo>)> =
            BTreeMap::new();
        for (i, b) in self.live_blocks() {
            let seg = &self.segments[&b.segment];
            if !seg.expandable {
                let g = groups.entry((b.segment, seg.address)).or_insert((
                    seg.size,
                    seg.pool,
                    Vec::new(),
                ));
                g.2.push(info(b, seg.address));
                continue;
            }
            let head = b.mapped && b.prev.is_none_or(|p| !self.blocks[p].mapped);
            if !head {
                continue;
            }
            let (mut blocks, mut total, mut cursor) = (Vec::new(), 0, Some(i));
            while let Some(c) = cursor.filter(|&c| self.blocks[c].mapped) {
                let cb = &self.blocks[c];
                blocks.push(info(cb, b.address));
                total += cb.size;
                cursor = cb.next;
            }
            groups.insert((b.segment, b.address), (total, seg.pool, blocks));
        }
        let mut segments: Vec<SegmentInfo> = groups
            .into_iter()
            .map(|((id, address), (total_size, pool, mut blocks))| {
                blocks.sort_by_key(|b| b.address);
                let allocated_size = blocks
                    .iter()
                    .filter(|b| b.state == "active_allocated")
                    .map(|b| b.size)
                    .sum();
                SegmentInfo {
                    segment_id: id,
                    address,
                    total_size,
                    allocated_size,
                    active_size: allocated_size,
                    requested_size: blocks.iter().map(|b| b.requested_size).sum(),
                    segment_type: match pool {
                        PoolKind::Small => "small_pool",
                        PoolKind::Large => "large_pool",
                    },
                    expandable: self.segments[&id].expandable,
                    blocks,
                }
            })
            .collect();
        segments.sort_by_key(|s| s.address);
        Snapshot { segments }
    }

    /// Checks every invariant: blocks tile their segments exactly, free
    /// neighbours are merged, the free pools hold exactly the free blocks, and
    /// the statistics recomputed from a snapshot equal the running counters.
    /// Returns a description of the first violation.
    pub fn check_invariants(&self) -> Result<(), AllocError> {
        let broken = AllocError::InvariantBroken;
        let snap = self.snapshot();
        let fixed = self.segments.values().filter(|s| !s.expandable).count();
        let shown = snap.segments.iter().filter(|s| !s.expandable).count();
        if shown != fixed {
            return Err(broken(format!(
                "{fixed} segments known but {shown} have blocks"
            )));
        }
        let mapped: u64 = self.pages.values().map(|p| p.1).sum();
        let shown_mapped: u64 = snap
            .segments
            .iter()
            .filter(|s| s.expandable)
            .map(|s| s.total_size)
            .sum();
        if mapped != shown_mapped {
            return Err(broken(format!(
                "{mapped} bytes of pages mapped but {shown_mapped} bytes shown in expandable segments"
            )));
        }
        for seg in &snap.segments {
            let mut cursor = seg.address;
            let mut prev_free = false;
            for b in &seg.blocks {
                if b.address != cursor {
                    return Err(broken(format!(
                        "segment {:?}: block at {:#x} but previous block ended at {cursor:#x} (gap or overlap)",
                        seg.segment_id, b.address
                    )));
                }
                let free = b.state == "inactive";
                if free && prev_free {
                    return Err(broken(format!(
                        "segment {:?}: two free neighbours at {:#x} were not merged",
                        seg.segment_id, b.address
                    )));
                }
                prev_free = free;
                cursor += b.size;
            }
            if cursor != seg.address + seg.total_size {
                return Err(broken(format!(
                    "segment {:?}: blocks cover {} of {} bytes",
                    seg.segment_id,
                    cursor - seg.address,
                    seg.total_size
                )));
            }
        }
        // Links agree with addresses, and the pools hold exactly the free blocks.
        let mut free_count = 0;
        for (i, b) in self.live_blocks() {
            if let Some(n) = b.next {
                let nb = &self.blocks[n];
                if !nb.live || nb.prev != Some(i) || nb.address != b.address + b.size {
                    return Err(broken(format!("block {i}: next link is inconsistent")));
                }
            }
            if let Some(p) = b.prev {
                let pb = &self.blocks[p];
                if !pb.live || pb.next != Some(i) {
                    return Err(broken(format!("block {i}: prev link is inconsistent")));
                }
            }
            if !b.allocated {
                free_count += 1;
                if !self.in_pool(i) {
                    return Err(broken(format!("free block {i} is missing from its pool")));
                }
            } else if self.in_pool(i) {
                return Err(broken(format!("allocated block {i} is in a free pool")));
            }
            let expected_pool = self.segments[&b.segment].pool;
            if b.pool != expected_pool {
                return Err(broken(format!("block {i} is in the wrong pool")));
            }
        }
        if free_count != self.pool_len() {
            return Err(broken(format!(
                "pools hold {} blocks but {free_count} blocks are free",
                self.pool_len()
            )));
        }
        // Statistics recomputed from the snapshot.
        let stats = self.stats();
        for t in StatType::ALL {
            let segs = snap.segments.iter().filter(|s| match t {
                StatType::Aggregate => true,
                StatType::SmallPool => s.segment_type == "small_pool",
                StatType::LargePool => s.segment_type == "large_pool",
            });
            let (mut reserved, mut segments, mut allocated, mut allocations) =
                (0i64, 0i64, 0i64, 0i64);
            let (mut requested, mut inactive_split, mut inactive_split_bytes) = (0i64, 0i64, 0i64);
            for s in segs {
                // PyTorch counts neither mapped ranges as segments nor
                // expandable blocks as inactive splits.
                segments += i64::from(!s.expandable);
                reserved += s.total_size as i64;
                for b in &s.blocks {
                    if b.state == "active_allocated" {
                        allocations += 1;
                        allocated += b.size as i64;
                        requested += b.requested_size as i64;
                    } else if s.blocks.len() > 1 && !s.expandable {
                        inactive_split += 1;
                        inactive_split_bytes += b.size as i64;
                    }
                }
            }
            let checks = [
                (
                    "reserved_bytes",
                    reserved,
                    stats.reserved_bytes.get(t).current,
                ),
                ("segment", segments, stats.segment.get(t).current),
                (
                    "allocated_bytes",
                    allocated,
                    stats.allocated_bytes.get(t).current,
                ),
                ("active_bytes", allocated, stats.active_bytes.get(t).current),
                ("allocation", allocations, stats.allocation.get(t).current),
                ("active", allocations, stats.active.get(t).current),
                (
                    "requested_bytes",
                    requested,
                    stats.requested_bytes.get(t).current,
                ),
                (
                    "inactive_split",
                    inactive_split,
                    stats.inactive_split.get(t).current,
                ),
                (
                    "inactive_split_bytes",
                    inactive_split_bytes,
                    stats.inactive_split_bytes.get(t).current,
                ),
            ];
            for (name, from_snapshot, counter) in checks {
                if from_snapshot != counter {
                    return Err(broken(format!(
                        "{name}.{}: snapshot says {from_snapshot}, counter says {counter}",
                        t.key()
                    )));
                }
            }
        }
        if self.total_reserved() as i64 != stats.reserved_bytes.get(StatType::Aggregate).current {
            return Err(broken(
                "total reserved bytes disagree with reserved_bytes.all.current".into(),
            ));
        }
        Ok(())
    }
}
