//! Property test: random sequences of thousands of allocator operations, under
//! several configurations and a tight capacity (so out-of-memory, retries and
//! cache flushes happen). After every operation the statistics recomputed from
//! a snapshot must equal the running counters, blocks must tile their
//! segments exactly, and free neighbours must be merged.

use proptest::prelude::*;
use vramlab_alloc::*;

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone)]
enum Op {
    /// Size, and whether the block lives for the run (a parameter).
    Alloc(u64, bool),
    Free(usize),
    EmptyCache,
    ResetPeak,
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,                // tiny: small pool, 512 B rounding
        3 => 4096u64..(MIB + 4096),     // around the small/large boundary
        2 => MIB..(12 * MIB),           // 20 MiB segments, and the 10 MiB edge
        1 => (12 * MIB)..(90 * MIB),    // own segments, oversize with max_split
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size_strategy(), prop::bool::weighted(0.2)).prop_map(|(s, p)| Op::Alloc(s, p)),
        8 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeak),
    ]
}

const CONFIGS: &[&str] = &[
    "",
    "max_split_size_mb:32",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:2,4:8,>:4],max_split_size_mb:64",
    "garbage_collection_threshold:0.6",
    "max_split_size_mb:32,roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,max_split_size_mb:64",
    "expandable_segments:True",
    "expandable_segments:True,roundup_power2_divisions:4,garbage_collection_threshold:0.6",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn stats_match_snapshot_after_every_op(
        ops in prop::collection::vec(op_strategy(), 1000..2500),
        conf in 0usize..CONFIGS.len(),
        limited in any::<bool>(),
    ) {
        let capacity = 400 * MIB;
        let mut a = CachingAllocator::new(
            SimulatedSource::new(capacity),
            AllocatorConfig::parse(CONFIGS[conf]).unwrap(),
        );
        if limited || CONFIGS[conf].contains("garbage") {
            a.set_memory_limit(Some(300 * MIB));
        }
        let mut live: Vec<(BlockHandle, u64)> = Vec::new();
        let mut ooms = 0;
        for (step, op) in ops.iter().enumerate() {
            match op {
                Op::Alloc(size, persistent) => match a.malloc_tagged(
                    *size,
                    "t",
                    if *persistent { Category::Parameter } else { Category::Temporary },
                    None,
                ) {
                    Ok(x) => {
                        prop_assert!(x.size >= *size);
                        prop_assert_eq!(x.offset % 512, 0);
                        live.push((x.handle, *size));
                    }
                    Err(e) => {
                        prop_assert!(e.is_oom(), "unexpected error {}", e);
                        ooms += 1;
                    }
                },
                Op::Free(k) if !live.is_empty() => {
                    let (h, _) = live.swap_remove(k % live.len());
                    a.free(h).unwrap();
                }
                Op::Free(_) => {}
                Op::EmptyCache => a.empty_cache(),
                Op::ResetPeak => a.reset_peak_memory_stats(),
            }
            if let Err(msg) = a.check_invariants() {
                return Err(TestCaseError::fail(format!("after op {step} ({op:?}): {msg}")));
            }
            prop_assert!(a.source().used() <= capacity);
            prop_assert_eq!(a.source().used(), a.memory_reserved());
            if let Some(limit) = a.config().memory_limit {
                // PyTorch checks the limit against what a fixed segment would
                // be; expandable segments then map whole 20 MiB pages, which
                // can pass it by less than a page.
                let slack = if a.config().expandable_segments { 20 * MIB } else { 0 };
                prop_assert!(a.memory_reserved() <= limit + slack);
            }
            let requested: u64 = live.iter().map(|(_, s)| s).sum();
            prop_assert_eq!(a.stats().flat()["requested_bytes.all.current"] as u64, requested);
        }
        prop_assert_eq!(a.stats().num_ooms, ooms);
        for (h, _) in live.drain(..) {
            a.free(h).unwrap();
        }
        a.empty_cache();
        prop_assert_eq!(a.memory_reserved(), 0);
        prop_assert!(a.snapshot().segments.is_empty());
        if !a.config().expandable_segments {
            // One map can be unmapped in pieces; segments go back whole.
            prop_assert_eq!(a.stats().num_device_alloc, a.stats().num_device_free);
        }
        a.check_invariants().unwrap();
    }
}
