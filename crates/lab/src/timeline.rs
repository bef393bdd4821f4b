//! A snapshot's replay summarised for a page of bounded size, however long
//! the trace: memory over time in at most `max_points` buckets of
//! consecutive trace operations (each bucket keeps its highest allocated
//! moment, with the bytes per category there, its lowest, its highest
//! reserved, and the largest allocation made in it, with where it came
//! from), and the live blocks of every segment at a few chosen moments.
//! A trace of up to `max_points` operations keeps every operation; a longer
//! one aggregates what is too small to see (a pixel column is hundreds of
//! operations) and stays a few megabytes.

use crate::error::LabError;
use crate::memory::tag::N_CATEGORIES;
use crate::memory::{AllocatorConfig, Category, SegmentId};
use crate::strategies::IdMap;
use crate::torch_snapshot::{start_replay, Started, TorchSnapshot};
use crate::workload::Op;
use std::collections::HashMap;

/// One bucket of consecutive operations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bucket {
    /// Index of its first operation.
    pub first_op: usize,
    pub allocated_max: u64,
    pub allocated_min: u64,
    pub reserved_max: u64,
    /// Bytes per category at the bucket's highest allocated moment; the
    /// last slot holds blocks from before the recording.
    pub by_category: [u64; N_CATEGORIES + 1],
    /// The largest allocation made in the bucket: bytes and origin index
    /// (into [`Timeline::origins`]; 0 for none known).
    pub largest: (u64, u32),
}

/// A live block at a captured moment.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveBlock {
    pub offset: u64,
    pub size: u64,
    pub category: Category,
    pub origin: u32,
}

/// One segment at a captured moment.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentAt {
    pub address: u64,
    pub size: u64,
    /// The largest blocks (up to [`BLOCKS_PER_MOMENT`] over the moment).
    pub blocks: Vec<LiveBlock>,
    /// Allocated bytes in blocks too many to list.
    pub other_allocated: u64,
}

/// The segments after operation `op`.
#[derive(Debug, Clone, PartialEq)]
pub struct Moment {
    pub op: usize,
    pub segments: Vec<SegmentAt>,
}

/// Blocks listed per captured moment; the rest are summed per segment.
pub const BLOCKS_PER_MOMENT: usize = 6000;

#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub ops: usize,
    /// Operations per bucket (1: every operation).
    pub per_bucket: usize,
    pub buckets: Vec<Bucket>,
    pub moments: Vec<Moment>,
    /// Origin descriptions; index 0 is "" (unknown).
    pub origins: Vec<String>,
    pub peak_op: usize,
}

/// Replays `snap` under `config` once, summarising as it goes; the segments
/// are captured after each operation in `capture` and at `even` moments
/// spread over the trace.
pub fn timeline(
    snap: &TorchSnapshot,
    config: AllocatorConfig,
    capacity: Option<u64>,
    max_points: usize,
    capture: &[usize],
    even: usize,
) -> Result<Timeline, LabError> {
    let Started {
        allocator: mut a,
        mut handles,
        pre_sizes,
        ..
    } = start_replay(snap, config, capacity, false)?;
    let ops = &snap.workload.ops;
    let n = ops.len();
    let per_bucket = n.div_ceil(max_points.max(1)).max(1);
    let mut origins = vec![String::new()];
    let mut origin_ids: HashMap<String, u32> = HashMap::new();
    let mut origin_of = |id: u64| -> u32 {
        let Some(d) = snap.origins.get(&id).and_then(|o| o.describe()) else {
            return 0;
        };
        *origin_ids.entry(d).or_insert_with_key(|d| {
            origins.push(d.clone());
            (origins.len() - 1) as u32
        })
    };
    // The trace's live blocks (a subset of `handles`, which also holds
    // those from before the recording): id → (segment, offset, size,
    // category, origin).
    let mut live: IdMap<u64, (SegmentId, u64, u64, Category, u32)> = IdMap::default();
    // Blocks from before the recording: their bytes count as "before".
    let mut cats = [0u64; N_CATEGORIES + 1];
    let before = N_CATEGORIES;
    cats[before] = a.memory_allocated();
    let mut want: Vec<usize> = capture.to_vec();
    if n > 0 {
        want.extend((1..=even).map(|k| (k * n / (even + 1)).min(n - 1)));
    }
    want.sort_unstable();
    want.dedup();
    let mut want = want.into_iter().peekable();
    let mut t = Timeline {
        ops: n,
        per_bucket,
        ..Timeline::default()
    };
    let mut peak = 0u64;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size, category } => {
                if let Ok(x) = a.malloc_tagged(size.max(1), "", category, None) {
                    handles.insert(id, x.handle);
                    let origin = origin_of(id);
                    cats[category.index()] += x.size;
                    live.insert(id, (x.segment, x.offset, x.size, category, origin));
                    let b = bucket(&mut t, i, per_bucket);
                    if x.size > b.largest.0 {
                        b.largest = (x.size, origin);
                    }
                }
            }
            Op::Free { id } => {
                if let Some(h) = handles.remove(&id) {
                    let _ = a.free(h);
                    match live.remove(&id) {
                        Some((.., size, c, _)) => cats[c.index()] -= size,
                        None => {
                            let s = pre_sizes.get(&id).copied().unwrap_or(0);
                            cats[before] = cats[before].saturating_sub(s);
                        }
                    }
                }
            }
            Op::EmptyCache => a.empty_cache(),
            Op::Probe { size } => {
                crate::torch_snapshot::probe(&mut a, size);
            }
        }
        let (alloc, reserved) = (a.memory_allocated(), a.memory_reserved());
        if alloc > peak {
            peak = alloc;
            t.peak_op = i;
        }
        let b = bucket(&mut t, i, per_bucket);
        if alloc >= b.allocated_max {
            b.allocated_max = alloc;
            b.by_category = cats;
        }
        b.allocated_min = b.allocated_min.min(alloc);
        b.reserved_max = b.reserved_max.max(reserved);
        while want.peek() == Some(&i) {
            want.next();
            t.moments.push(moment(&a, i, &live));
        }
    }
    t.origins = origins;
    Ok(t)
}

/// The bucket operation `i` falls in (opened when it is the first).
fn bucket(t: &mut Timeline, i: usize, per_bucket: usize) -> &mut Bucket {
    if i.is_multiple_of(per_bucket) && t.buckets.len() <= i / per_bucket {
        t.buckets.push(Bucket {
            first_op: i,
            allocated_min: u64::MAX,
            ..Bucket::default()
        });
    }
    t.buckets.last_mut().expect("opened above")
}

fn moment(
    a: &crate::memory::CachingAllocator<crate::recorded_source::RecordedSource>,
    op: usize,
    live: &IdMap<u64, (SegmentId, u64, u64, Category, u32)>,
) -> Moment {
    let snap = a.snapshot();
    let mut index: HashMap<SegmentId, usize> = HashMap::new();
    let mut segments: Vec<SegmentAt> = snap
        .segments
        .iter()
        .enumerate()
        .map(|(k, s)| {
            index.insert(s.segment_id, k);
            SegmentAt {
                address: s.address,
                size: s.total_size,
                blocks: Vec::new(),
                other_allocated: s.allocated_size,
            }
        })
        .collect();
    // The largest live blocks of the trace, listed; the rest (and blocks
    // from before the recording) stay in `other_allocated`.
    let mut blocks: Vec<_> = live.values().copied().collect();
    if blocks.len() > BLOCKS_PER_MOMENT {
        // Largest first, ties by place: the map's order decides nothing.
        blocks.select_nth_unstable_by(BLOCKS_PER_MOMENT, |x, y| {
            y.2.cmp(&x.2).then((x.0, x.1).cmp(&(y.0, y.1)))
        });
        blocks.truncate(BLOCKS_PER_MOMENT);
    }
    for (seg, offset, size, category, origin) in blocks {
        if let Some(&k) = index.get(&seg) {
            let s = &mut segments[k];
            s.other_allocated = s.other_allocated.saturating_sub(size);
            s.blocks.push(LiveBlock {
                offset,
                size,
                category,
                origin,
            });
        }
    }
    for s in &mut segments {
        s.blocks.sort_by_key(|b| b.offset);
    }
    Moment { op, segments }
}
