//! `expandable_segments:True` in the caching allocator (memory/expandable.rs),
//! checked rule by rule on hand-worked sequences, plus what PyTorch's
//! snapshot shows for it and the refusal on a device that cannot map pages.

use vramlab_lab::memory::*;

const MIB: u64 = 1 << 20;

fn expandable(capacity: Option<u64>) -> CachingAllocator<SimulatedSource> {
    let source = capacity.map_or_else(SimulatedSource::unlimited, SimulatedSource::new);
    CachingAllocator::new(
        source,
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
    )
}

fn ok(a: &CachingAllocator<SimulatedSource>) {
    a.check_invariants().unwrap();
}

/// Segment sizes as the snapshot shows them, by address.
fn shown(a: &CachingAllocator<SimulatedSource>) -> Vec<(u64, &'static str)> {
    a.snapshot()
        .segments
        .iter()
        .map(|s| (s.total_size / MIB, s.segment_type))
        .collect()
}

#[test]
fn pages_are_mapped_for_the_rounded_request_and_neighbours_share_a_segment() {
    let mut a = expandable(None);
    // 1 MiB is the small pool: one 2 MiB page.
    let s = a.malloc(MIB, "s").unwrap();
    assert_eq!(a.memory_reserved(), 2 * MIB);
    // 30 MiB: two 20 MiB pages; the 10 MiB rest stays free and split off
    // (an expandable block splits whenever ≥ 512 B remain, large pool too).
    let x = a.malloc(30 * MIB, "x").unwrap();
    assert_eq!(a.memory_reserved(), 42 * MIB);
    assert_eq!(x.size, 30 * MIB);
    // 6 MiB fits the mapped rest: no new page, and it lands right after x.
    let y = a.malloc(6 * MIB, "y").unwrap();
    assert_eq!(a.memory_reserved(), 42 * MIB);
    assert_eq!(y.segment, x.segment);
    assert_eq!(y.offset, x.offset + 30 * MIB);
    // 8 MiB: the 4 MiB free tail plus one more page, mapped right after it.
    let z = a.malloc(8 * MIB, "z").unwrap();
    assert_eq!(a.memory_reserved(), 62 * MIB);
    assert_eq!(z.offset, y.offset + 6 * MIB);
    ok(&a);
    // One segment per pool: 60 MiB large (three pages) and 2 MiB small.
    let mut segs = shown(&a);
    segs.sort();
    assert_eq!(segs, vec![(2, "small_pool"), (60, "large_pool")]);
    // PyTorch counts no segments for mapped ranges, but a device allocation
    // per map call: the small page, x's two pages at once, z's page.
    assert_eq!(a.stats().segment.get(StatType::Aggregate).current, 0);
    assert_eq!(a.stats().num_device_alloc, 3);
    for h in [s.handle, x.handle, y.handle, z.handle] {
        a.free(h).unwrap();
        ok(&a);
    }
    // Freeing gives nothing back; empty_cache unmaps every page.
    assert_eq!(a.memory_reserved(), 62 * MIB);
    a.empty_cache();
    ok(&a);
    assert_eq!((a.memory_reserved(), a.snapshot().segments.len()), (0, 0));
}

#[test]
fn empty_cache_unmaps_only_whole_free_pages_and_splits_the_range() {
    let mut a = expandable(None);
    let p: Vec<_> = (0..3)
        .map(|i| a.malloc(20 * MIB, &format!("p{i}")).unwrap())
        .collect();
    assert_eq!(a.memory_reserved(), 60 * MIB);
    assert_eq!(shown(&a), vec![(60, "large_pool")]);
    // Free the middle page and unmap it: two mapped ranges, two segments in
    // the snapshot, and reserved shrinks with what is mapped.
    a.free(p[1].handle).unwrap();
    a.empty_cache();
    ok(&a);
    assert_eq!(a.memory_reserved(), 40 * MIB);
    assert_eq!(shown(&a), vec![(20, "large_pool"), (20, "large_pool")]);
    // The hole is the lowest unmapped range: the next page goes there, and
    // the ranges join again.
    let q = a.malloc(20 * MIB, "q").unwrap();
    assert_eq!(q.offset, p[1].offset);
    assert_eq!(shown(&a), vec![(60, "large_pool")]);
    ok(&a);
    // A free block that covers no whole page unmaps nothing.
    a.free(p[0].handle).unwrap();
    let r = a.malloc(15 * MIB, "r").unwrap();
    a.free(q.handle).unwrap();
    a.empty_cache();
    ok(&a);
    // [r 0..15 | free 15..20 | unmapped 20..40 | p2 40..60]
    assert_eq!(a.memory_reserved(), 40 * MIB);
    assert_eq!(r.offset, 0);
}

/// PyTorch's best fit in an expandable segment counts a block as what it can
/// grow to: the free block at the growing end is taken last, even when it is
/// the tightest fit.
#[test]
fn best_fit_passes_over_the_block_that_can_grow() {
    let mut a = expandable(None);
    let x = a.malloc(4 * MIB, "x").unwrap();
    let _keep = a.malloc(MIB + 512, "keep").unwrap();
    // [x 0..4 | keep 4..5 | free 5..20 | unmapped]
    a.free(x.handle).unwrap();
    // Free: 4 MiB at 0 (can grow to 4) and 15 MiB at 5 (can grow to ~∞).
    // A 3 MiB request fits both; plain best fit takes the 4 MiB block too.
    let y = a.malloc(3 * MIB, "y").unwrap();
    assert_eq!(y.offset, 0);
    // 2 MiB: free blocks are 1 MiB at 3 (too small) and 15 MiB at the end.
    let z = a.malloc(2 * MIB, "z").unwrap();
    assert_eq!(z.offset, 5 * MIB + 512);
    // Now make the tightest fit the growing one: free 3 MiB at 0..3 and the
    // tail of 13 MiB − 512 B; a 3 MiB request takes the block at 0.
    a.free(y.handle).unwrap();
    let w = a.malloc(3 * MIB, "w").unwrap();
    assert_eq!(w.offset, 0);
    ok(&a);
}

#[test]
fn out_of_memory_unmaps_cached_pages_and_retries() {
    // 130 MiB device: six large pages at most.
    let mut a = expandable(Some(130 * MIB));
    let k = a.malloc(10 * MIB, "k").unwrap();
    let big = a.malloc(50 * MIB, "big").unwrap();
    let t = a.malloc(10 * MIB, "t").unwrap();
    let small = a.malloc(512, "s").unwrap();
    // [k 0..10 | big 10..60 | t 60..70 | free 70..80]: four pages + 2 MiB.
    assert_eq!(a.memory_reserved(), 82 * MIB);
    a.free(big.handle).unwrap();
    // 70 MiB fits no free block; growing from the free tail at 70 needs
    // three more pages (82 + 60 > 130), so the cached pages are unmapped —
    // 20..60, the whole pages of big's old place — and the retry maps.
    let c = a.malloc(70 * MIB, "c").unwrap();
    assert_eq!(c.offset, 70 * MIB);
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert_eq!(a.memory_reserved(), (82 - 40 + 60) * MIB);
    // Two mapped ranges now: 0..20 and 60..140.
    assert_eq!(
        shown(&a),
        vec![(20, "large_pool"), (80, "large_pool"), (2, "small_pool")]
    );
    ok(&a);
    // Nothing left: a clear out-of-memory, the state intact.
    let e = a.malloc(40 * MIB, "d").unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
    ok(&a);
    for h in [k, t, c, small] {
        a.free(h.handle).unwrap();
    }
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    ok(&a);
}

/// wgpu cannot map pages: a source that does not say it can refuses the
/// setting at the first allocation, naming what to do instead.
#[test]
fn a_device_without_page_mapping_refuses_expandable_segments() {
    struct NoMapping(SimulatedSource);
    impl SegmentSource for NoMapping {
        fn allocate(&mut self, id: SegmentId, size: u64) -> Result<(), SourceError> {
            self.0.allocate(id, size)
        }
        fn release(&mut self, id: SegmentId, size: u64) {
            self.0.release(id, size)
        }
        fn total_capacity(&self) -> Option<u64> {
            None
        }
        fn free_capacity(&self) -> Option<u64> {
            None
        }
        fn max_segment_size(&self) -> u64 {
            u64::MAX
        }
        fn describe(&self) -> String {
            "a GPU".into()
        }
    }
    let mut a = CachingAllocator::new(
        NoMapping(SimulatedSource::unlimited()),
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
    );
    let e = a.malloc(MIB, "x").unwrap_err().to_string();
    assert!(
        e.contains("virtual memory mapping") && e.contains("simulated"),
        "{e}"
    );
    assert_eq!(a.memory_reserved(), 0);
}

/// A deterministic stream of random numbers (no dependency needed).
fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// A run under expandable segments, exported as a PyTorch snapshot, with
/// its trace cut so that recording "began" mid-run: the replay rebuilds the
/// mapped ranges and live blocks from before the cut and ends with exactly
/// the recorded segments (one per mapped range), reserved and allocated
/// bytes — and the segments of the allocator that made the run.
#[test]
fn an_expandable_snapshot_recorded_mid_run_replays_to_its_recorded_totals() {
    use vramlab_lab::pickle::{pickle, unpickle, PyValue};
    use vramlab_lab::{snapshot_export, torch_snapshot};
    for seed in 1..=15u64 {
        let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let mut a = CachingAllocator::new(SimulatedSource::unlimited(), config.clone());
        a.start_recording();
        let mut rng = seed;
        let mut live = Vec::new();
        for step in 0..600 {
            let r = lcg(&mut rng);
            if !r.is_multiple_of(3) || live.is_empty() {
                let size = match lcg(&mut rng) % 4 {
                    0 => 1 + lcg(&mut rng) % 4096,
                    1 => 4096 + lcg(&mut rng) % MIB,
                    2 => MIB + lcg(&mut rng) % (12 * MIB),
                    _ => 12 * MIB + lcg(&mut rng) % (50 * MIB),
                };
                live.push(a.malloc(size, "t").unwrap().handle);
            } else {
                let k = (lcg(&mut rng) as usize) % live.len();
                a.free(live.swap_remove(k)).unwrap();
            }
            if step % 150 == 149 {
                a.empty_cache();
            }
        }
        let events = a.take_events();
        let own = a.snapshot();
        let full = snapshot_export::torch_snapshot(&events, &config);
        // Keep the last 80, 40 or 20% of the trace.
        let mut items: Vec<(PyValue, PyValue)> = full.as_dict().unwrap().to_vec();
        for (k, v) in items.iter_mut() {
            if k.as_str() == Some("device_traces") {
                let trace = v.as_list().unwrap()[0].as_list().unwrap();
                let from = trace.len() * [1, 3, 4][seed as usize % 3] / 5;
                let cut = trace[from..].to_vec();
                *v = PyValue::list(vec![PyValue::list(cut)]);
            }
        }
        let bytes = pickle(&PyValue::dict(items));
        assert!(unpickle(&bytes).is_ok());
        let file = torch_snapshot::read_all(&bytes, "cut").unwrap();
        assert!(file.expandable_setting);
        let snap = &file.devices[0];
        assert!(!snap.initial_expandable.is_empty(), "seed {seed}");
        let r = torch_snapshot::replay_from_state(snap, config.clone(), None).unwrap();
        assert!(r.segments_match, "seed {seed}: {:?}", r.differences);
        let mut want: Vec<u64> = own.segments.iter().map(|s| s.total_size).collect();
        want.sort_unstable();
        assert_eq!(r.replayed.segment_sizes, want, "seed {seed}");
        assert_eq!(r.replayed.reserved_bytes, a.memory_reserved());
        assert_eq!(r.replayed.allocated_bytes, a.memory_allocated());
    }
}
