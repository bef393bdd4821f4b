//! The caching allocator against PyTorch's own expectations
//! (test/test_cuda.py: test_allocator_settings, test_set_per_process_memory_fraction,
//! and the rules of CUDACachingAllocator.cpp), on the simulated source.

use vramlab_alloc::*;

const MIB: u64 = 1 << 20;

fn alloc(capacity: u64, conf: &str) -> CachingAllocator<SimulatedSource> {
    CachingAllocator::new(
        SimulatedSource::new(capacity),
        AllocatorConfig::parse(conf).expect("valid config"),
    )
}

fn flat(a: &CachingAllocator<SimulatedSource>, key: &str) -> i64 {
    a.stats().flat()[key]
}

/// PyTorch's helper from test_allocator_settings.
fn power2_div(size: u64, div_factor: u64) -> u64 {
    let mut pow2 = 1u64;
    while pow2 < size {
        pow2 *= 2;
    }
    if pow2 == size {
        return pow2;
    }
    let step = pow2 / 2 / div_factor;
    let mut ret = pow2 / 2;
    while ret < size {
        ret += step;
    }
    ret
}

#[test]
fn roundup_power2_divisions_matches_test_allocator_settings() {
    let nbytes = 4 * 21 * MIB;
    let nbytes_big = 4 * 100 * MIB;
    let key = "active_bytes.all.allocated";

    let mut a = alloc(64 << 30, "");
    let start = flat(&a, key);
    a.malloc(nbytes, "x").unwrap();
    assert_eq!((flat(&a, key) - start) as u64, nbytes);

    let mut a = alloc(64 << 30, "roundup_power2_divisions:4");
    let start_req = flat(&a, "requested_bytes.all.allocated");
    a.malloc(nbytes, "y").unwrap();
    assert_eq!(flat(&a, key) as u64, power2_div(nbytes, 4));
    assert_eq!(power2_div(nbytes, 4), 96 * MIB);
    assert_eq!(
        (flat(&a, "requested_bytes.all.allocated") - start_req) as u64,
        nbytes
    );

    let mut a = alloc(
        64 << 30,
        "garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
    );
    a.malloc(nbytes, "w").unwrap();
    assert_eq!(flat(&a, key) as u64, power2_div(nbytes, 8));
    a.empty_cache();
    let start = flat(&a, key);
    a.malloc(nbytes_big, "v").unwrap();
    assert_eq!((flat(&a, key) - start) as u64, power2_div(nbytes_big, 2));
}

#[test]
fn pool_choice_and_segment_sizes() {
    let cases = [
        (1, PoolKind::Small, 2 * MIB),
        (MIB, PoolKind::Small, 2 * MIB),
        (MIB + 1, PoolKind::Large, 20 * MIB),
        (10 * MIB - 512, PoolKind::Large, 20 * MIB),
        // 10 MiB - 1 rounds up to exactly 10 MiB: a segment of its own.
        (10 * MIB - 1, PoolKind::Large, 10 * MIB),
        (10 * MIB, PoolKind::Large, 10 * MIB),
        (10 * MIB + 1, PoolKind::Large, 12 * MIB),
        (100 * MIB + 3, PoolKind::Large, 102 * MIB),
    ];
    for (size, pool, segment) in cases {
        let mut a = alloc(1 << 40, "");
        a.malloc(size, "t").unwrap();
        assert_eq!(a.memory_reserved(), segment, "segment for {size}");
        let snap = a.snapshot();
        let want = match pool {
            PoolKind::Small => "small_pool",
            PoolKind::Large => "large_pool",
        };
        assert_eq!(snap.segments[0].segment_type, want, "pool for {size}");
        a.check_invariants().unwrap();
    }
}

#[test]
fn small_blocks_share_a_segment() {
    let mut a = alloc(1 << 30, "");
    for _ in 0..4096 {
        a.malloc(512, "s").unwrap();
    }
    assert_eq!(a.memory_reserved(), 2 * MIB);
    assert_eq!(a.memory_allocated(), 2 * MIB);
    assert_eq!(flat(&a, "segment.small_pool.current"), 1);
    a.malloc(1, "s").unwrap();
    assert_eq!(a.memory_reserved(), 4 * MIB);
    a.check_invariants().unwrap();
}

#[test]
fn large_pool_split_threshold_is_more_than_1_mib() {
    // 19 MiB rounds to a 20 MiB segment; the 1 MiB rest is not > 1 MiB: no split,
    // so the whole 20 MiB counts as allocated.
    let mut a = alloc(1 << 30, "");
    a.malloc(19 * MIB, "t").unwrap();
    assert_eq!(a.memory_allocated(), 20 * MIB);
    assert_eq!(flat(&a, "requested_bytes.all.current") as u64, 19 * MIB);
    assert_eq!(a.snapshot().segments[0].blocks.len(), 1);

    // 512 B less leaves 1 MiB + 512 B: split.
    let mut a = alloc(1 << 30, "");
    a.malloc(19 * MIB - 512, "t").unwrap();
    assert_eq!(a.memory_allocated(), 19 * MIB - 512);
    assert_eq!(
        flat(&a, "inactive_split_bytes.large_pool.current") as u64,
        MIB + 512
    );
    assert_eq!(flat(&a, "inactive_split.large_pool.current"), 1);
    a.check_invariants().unwrap();
}

#[test]
fn small_pool_split_threshold_is_512_bytes() {
    let mut a = alloc(1 << 30, "");
    a.malloc(MIB, "a").unwrap();
    a.malloc(MIB - 512, "b").unwrap();
    // 512 B rest: split (>= 512).
    let snap = a.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 3);
    a.malloc(512, "c").unwrap();
    assert_eq!(a.memory_reserved(), 2 * MIB);
    assert_eq!(a.memory_allocated(), 2 * MIB);
    assert_eq!(flat(&a, "inactive_split.all.current"), 0);
    a.check_invariants().unwrap();
}

#[test]
fn free_merges_neighbours_and_empty_cache_releases_only_whole_segments() {
    let mut a = alloc(1 << 30, "");
    let x = a.malloc(1000, "x").unwrap();
    let y = a.malloc(1000, "y").unwrap();
    let z = a.malloc(1000, "z").unwrap();
    a.free(y.handle).unwrap();
    assert_eq!(flat(&a, "inactive_split.small_pool.current"), 2);
    a.free(x.handle).unwrap();
    // x merged with y: one free block before z, one after.
    assert_eq!(flat(&a, "inactive_split.small_pool.current"), 2);
    assert_eq!(a.snapshot().segments[0].blocks.len(), 3);
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 2 * MIB, "split segment must stay");
    a.free(z.handle).unwrap();
    assert_eq!(a.snapshot().segments[0].blocks.len(), 1);
    assert_eq!(flat(&a, "inactive_split.small_pool.current"), 0);
    assert_eq!(flat(&a, "inactive_split_bytes.small_pool.current"), 0);
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(flat(&a, "num_device_free"), 1);
    a.check_invariants().unwrap();
}

#[test]
fn best_fit_takes_smallest_fitting_block() {
    let mut a = alloc(1 << 30, "");
    let big = a.malloc(30 * MIB, "big").unwrap();
    let small = a.malloc(12 * MIB, "small").unwrap();
    a.free(big.handle).unwrap();
    a.free(small.handle).unwrap();
    let again = a.malloc(11 * MIB, "again").unwrap();
    assert_eq!(again.segment, small.segment);
    assert_eq!(flat(&a, "num_device_alloc"), 2);
}

#[test]
fn oom_then_success_after_a_free() {
    let mut a = alloc(64 * MIB, "");
    let first = a.malloc(40 * MIB, "first").unwrap();
    let err = a.malloc(40 * MIB, "second").unwrap_err();
    let msg = err.to_string();
    assert!(err.is_oom());
    assert!(msg.contains("Tried to allocate 40.00 MiB"), "{msg}");
    assert!(msg.contains("40.00 MiB is allocated by vramlab"), "{msg}");
    assert!(
        msg.contains("0 bytes is reserved by vramlab but unallocated"),
        "{msg}"
    );
    assert!(msg.contains("total capacity of 64.00 MiB"), "{msg}");
    assert_eq!(flat(&a, "num_ooms"), 1);
    assert_eq!(flat(&a, "num_alloc_retries"), 1);
    a.free(first.handle).unwrap();
    a.malloc(40 * MIB, "second").unwrap();
    assert_eq!(
        flat(&a, "num_device_alloc"),
        1,
        "the cached block was reused"
    );
    a.check_invariants().unwrap();
}

#[test]
fn oom_frees_the_cache_and_retries() {
    let mut a = alloc(64 * MIB, "");
    let x = a.malloc(30 * MIB, "x").unwrap();
    a.free(x.handle).unwrap();
    assert_eq!(a.memory_reserved(), 30 * MIB);
    a.malloc(50 * MIB, "y").unwrap();
    assert_eq!(a.memory_reserved(), 50 * MIB);
    assert_eq!(flat(&a, "num_alloc_retries"), 1);
    assert_eq!(flat(&a, "num_device_free"), 1);
    assert_eq!(flat(&a, "num_ooms"), 0);
}

#[test]
fn memory_limit_like_set_per_process_memory_fraction() {
    let total = 1000 * MIB;
    let mut a = alloc(total, "");
    a.set_memory_limit(Some(total / 2));
    let t = a.malloc((total as f64 * 0.499) as u64, "ok").unwrap();
    a.free(t.handle).unwrap();
    a.empty_cache();
    // Exactly the limit fits; one more byte needs 2 MiB more and does not.
    let t = a.malloc(total / 2, "exact").unwrap();
    a.free(t.handle).unwrap();
    a.empty_cache();
    let err = a.malloc(total / 2 + 1, "over").unwrap_err();
    assert!(err.to_string().contains("500.00 MiB allowed"), "{err}");
    // The allocator keeps working after an OOM.
    a.malloc(MIB, "after").unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let mut a = alloc(1 << 30, "max_split_size_mb:40");
    let big = a.malloc(50 * MIB, "big").unwrap();
    assert_eq!(flat(&a, "oversize_segments.current"), 1);
    assert_eq!(flat(&a, "oversize_allocations.current"), 1);
    a.free(big.handle).unwrap();
    // A small request may not split the cached oversize block.
    a.malloc(5 * MIB, "small").unwrap();
    assert_eq!(a.memory_reserved(), 70 * MIB);
    // An oversize request within 20 MiB of it reuses it, unsplit.
    a.malloc(45 * MIB, "reuse").unwrap();
    assert_eq!(a.memory_reserved(), 70 * MIB);
    assert_eq!(a.memory_allocated(), 55 * MIB);
    // One 20 MiB smaller does not: a new segment.
    let mut a = alloc(1 << 30, "max_split_size_mb:40");
    let big = a.malloc(70 * MIB, "big").unwrap();
    a.free(big.handle).unwrap();
    a.malloc(50 * MIB, "other").unwrap();
    assert_eq!(a.memory_reserved(), 120 * MIB);
    a.check_invariants().unwrap();
}

#[test]
fn max_split_size_releases_oversize_blocks_before_flushing_all() {
    // One cached oversize block big enough: it alone is released, no retry.
    let mut a = alloc(100 * MIB, "max_split_size_mb:40");
    let big = a.malloc(90 * MIB, "big").unwrap();
    a.free(big.handle).unwrap();
    // 90 >= 60 + 20: too big to hand out, and 90 + 60 > 100: no room.
    a.malloc(60 * MIB, "x").unwrap();
    assert_eq!(flat(&a, "num_alloc_retries"), 0);
    assert_eq!(flat(&a, "num_device_free"), 1);
    assert_eq!(a.memory_reserved(), 60 * MIB);

    // Several oversize blocks, largest first, until the request is covered.
    let mut a = alloc(100 * MIB, "max_split_size_mb:40");
    let p = a.malloc(50 * MIB, "p").unwrap();
    let q = a.malloc(44 * MIB, "q").unwrap();
    a.free(p.handle).unwrap();
    a.free(q.handle).unwrap();
    a.malloc(60 * MIB, "x").unwrap();
    assert_eq!(flat(&a, "num_alloc_retries"), 0);
    assert_eq!(flat(&a, "num_device_free"), 2);

    // Released blocks that do not add up to the request count as failure
    // (PyTorch's rule), so the full flush and a counted retry follow.
    let mut a = alloc(100 * MIB, "max_split_size_mb:40");
    let big = a.malloc(70 * MIB, "big").unwrap();
    a.free(big.handle).unwrap();
    let keep = a.malloc(MIB / 2, "keep").unwrap();
    a.free(keep.handle).unwrap();
    a.malloc(80 * MIB, "y").unwrap();
    assert_eq!(flat(&a, "num_alloc_retries"), 1);
    assert_eq!(a.memory_reserved(), 80 * MIB);
    a.check_invariants().unwrap();
}

#[test]
fn garbage_collection_releases_old_cached_segments() {
    let run = |conf: &str| {
        let mut a = alloc(1 << 30, conf);
        a.set_memory_limit(Some(100 * MIB));
        let x = a.malloc(30 * MIB, "x").unwrap();
        let y = a.malloc(30 * MIB, "y").unwrap();
        a.free(x.handle).unwrap();
        a.free(y.handle).unwrap();
        a.malloc(40 * MIB, "z").unwrap();
        a.check_invariants().unwrap();
        (a.memory_reserved(), flat(&a, "num_device_free"))
    };
    assert_eq!(run(""), (100 * MIB, 0));
    assert_eq!(run("garbage_collection_threshold:0.5"), (40 * MIB, 2));
}

#[test]
fn peaks_reset_like_reset_peak_memory_stats() {
    let mut a = alloc(1 << 30, "");
    let x = a.malloc(30 * MIB, "x").unwrap();
    a.free(x.handle).unwrap();
    assert_eq!(a.max_memory_allocated(), 30 * MIB);
    a.reset_peak_memory_stats();
    assert_eq!(a.max_memory_allocated(), 0);
    assert_eq!(a.max_memory_reserved(), 30 * MIB, "reserved is still held");
}

#[test]
fn errors_are_values() {
    let mut a = CachingAllocator::new(
        SimulatedSource::new(1 << 30).with_max_segment_size(64 * MIB),
        AllocatorConfig::default(),
    );
    let e = a.malloc(100 * MIB, "huge").unwrap_err();
    assert!(matches!(e, AllocError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("max_buffer_size"));
    assert_eq!(a.malloc(0, "empty").unwrap_err(), AllocError::ZeroSize);
    let x = a.malloc(10, "x").unwrap();
    a.free(x.handle).unwrap();
    assert!(matches!(a.free(x.handle), Err(AllocError::InvalidFree(_))));
    // The slot may be reused; the stale handle must still be refused.
    let y = a.malloc(10, "y").unwrap();
    assert!(a.free(x.handle).is_err());
    a.free(y.handle).unwrap();
}

#[test]
fn snapshot_names_tensors_and_offsets_are_aligned() {
    let mut a = alloc(1 << 30, "");
    let mut handles = Vec::new();
    for (i, size) in [1usize, 7, 33, 257, 4000, 70_000, 2_000_001]
        .iter()
        .enumerate()
    {
        handles.push(a.malloc(*size as u64 * 4, &format!("t{i}")).unwrap());
    }
    for h in &handles {
        assert_eq!(h.offset % 256, 0, "offset must satisfy wgpu's alignment");
    }
    let snap = a.snapshot();
    let labels: Vec<_> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter_map(|b| b.label.clone())
        .collect();
    assert_eq!(labels.len(), 7);
    assert!(labels.contains(&"t6".to_string()));
    let summary = memory_summary(a.stats(), "simulated", false);
    assert!(summary.contains("Allocated memory"));
}

// ----- the placement hook (no policy of PyTorch's: vramlab's is in the lab) -----

/// A hook that sends every large request to a segment of its own and
/// offers places that cannot serve: the allocator checks what it is given.
#[derive(Debug)]
struct Odd(usize);

impl Placement for Odd {
    fn describe(&self) -> String {
        "odd".into()
    }

    fn fresh(&self) -> Box<dyn Placement> {
        Box::new(Odd(0))
    }

    fn place(&mut self, view: &dyn AllocatorView, request: &Request) -> Option<Place> {
        self.0 += 1;
        match self.0 % 3 {
            0 => Some(Place::NewSegment {
                pool: request.pool,
                size: request.segment_size,
            }),
            // Too small for the request: ignored.
            1 => Some(Place::NewSegment {
                pool: request.pool,
                size: request.size / 2,
            }),
            // A block too small for the request, if any: ignored.
            _ => view
                .fitting_free_blocks(request.pool, 512)
                .find(|b| b.size() < request.size)
                .map(Place::Block),
        }
    }
}

/// Sizes from 700 KiB to 4.8 MiB, a third freed as it goes; the device
/// allocations made and whether every invariant held throughout.
fn run_with(config: AllocatorConfig) -> (i64, Vec<BlockHandle>, CachingAllocator<SimulatedSource>) {
    let mut a = CachingAllocator::new(SimulatedSource::new(1 << 30), config);
    let mut live = Vec::new();
    for i in 0..60u64 {
        let size = (i % 7 + 1) * 700 * 1024;
        live.push(a.malloc(size, "t").unwrap().handle);
        if i % 3 == 2 {
            a.free(live.remove(0)).unwrap();
        }
        a.check_invariants().unwrap();
    }
    (a.stats().num_device_alloc, live, a)
}

#[test]
fn a_placement_hook_is_consulted_and_checked() {
    let config = AllocatorConfig {
        placement: Some(std::sync::Arc::new(Odd(0))),
        ..Default::default()
    };
    assert_eq!(config.describe(), "odd");
    let (plain, _, _) = run_with(AllocatorConfig::default());
    let (hooked, live, mut a) = run_with(config);
    // Every third large request got a segment of its own.
    assert!(hooked > plain, "{hooked} vs {plain}");
    // A ghost is a copy: what it does leaves the allocator as it was.
    let before = a.snapshot();
    let mut g = a.ghost();
    let fresh = Place::NewSegment {
        pool: PoolKind::Large,
        size: 20 * MIB,
    };
    assert!(g.malloc_at(fresh, 5 * MIB, Category::Parameter).is_some());
    g.check_invariants().unwrap();
    assert_eq!(a.snapshot(), before);
    // A free block named once and taken since is refused, not followed.
    let block = a
        .fitting_free_blocks(PoolKind::Large, 2 * MIB)
        .next()
        .unwrap();
    let mut g = a.ghost();
    assert!(g
        .malloc_at(Place::Block(block), 2 * MIB, Category::Untagged)
        .is_some());
    assert!(g
        .malloc_at(Place::Block(block), 2 * MIB, Category::Untagged)
        .is_none());
    g.check_invariants().unwrap();
    for h in live {
        a.free(h).unwrap();
    }
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
}

/// Expandable segments map a request's pages as runs (one device
/// allocation each), so a request of 2^61 bytes maps at once rather than
/// page by page (10^11 pages); unmapping part of a run gives back exactly
/// those pages and keeps the rest mapped, the device's count of bytes in
/// step with `memory_reserved` throughout.
#[test]
fn expandable_pages_map_in_runs_and_unmap_in_part() {
    let conf = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let mut huge = CachingAllocator::new(SimulatedSource::unlimited(), conf.clone());
    let x = huge.malloc(1 << 61, "x").unwrap();
    assert_eq!(
        huge.memory_reserved(),
        (1u64 << 61).div_ceil(20 * MIB) * 20 * MIB
    );
    huge.free(x.handle).unwrap();
    huge.empty_cache();
    assert_eq!(huge.memory_reserved(), 0);

    let cap = 1024 * MIB;
    let mut a = CachingAllocator::new(SimulatedSource::new(cap), conf);
    let in_use = |a: &CachingAllocator<SimulatedSource>| cap - a.source().free_capacity().unwrap();
    // One run of five 20 MiB pages, then a 30 MiB block at its start: the
    // free 70 MiB after it holds three whole pages.
    let x = a.malloc(100 * MIB, "x").unwrap();
    assert_eq!((a.memory_reserved(), in_use(&a)), (100 * MIB, 100 * MIB));
    a.free(x.handle).unwrap();
    let y = a.malloc(30 * MIB, "y").unwrap();
    a.empty_cache();
    assert_eq!((a.memory_reserved(), in_use(&a)), (40 * MIB, 40 * MIB));
    // What stays mapped is still usable: 10 MiB more fit without mapping.
    let z = a.malloc(10 * MIB, "z").unwrap();
    assert_eq!(a.memory_reserved(), 40 * MIB);
    for h in [y.handle, z.handle] {
        a.free(h).unwrap();
    }
    a.empty_cache();
    assert_eq!((a.memory_reserved(), in_use(&a)), (0, 0));
}
