//! The `vramlab` strategy (strategies/granules.rs): expandable segments
//! whose physical memory is 2 MiB granules mapped only under live blocks.
//! What it relies on — the same decisions as `expandable`, and so never
//! more reserved at any step — on generated traces and on every PyTorch
//! snapshot in the repository.

use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};
use vramlab_lab::memory::{AllocatorConfig, Category, SimulatedSource};
use vramlab_lab::strategies::granules::{Vramlab, GRANULE};
use vramlab_lab::strategies::{online, online_configured, Strategy as _};
use vramlab_lab::torch_snapshot::read_all;
use vramlab_lab::workload::{compare_with, Op, Workload};

const MIB: u64 = 1 << 20;

/// Granules overlapped by the allocated blocks underneath, counted from
/// the allocator's snapshot (addresses: segments start 2 MiB-aligned).
fn granules_by_snapshot(v: &Vramlab<SimulatedSource>) -> u64 {
    let mut set = BTreeSet::new();
    for s in v.allocator().snapshot().segments {
        for b in s.blocks.iter().filter(|b| b.state == "active_allocated") {
            for g in b.address / GRANULE..=(b.address + b.size - 1) / GRANULE {
                set.insert(g);
            }
        }
    }
    set.len() as u64
}

#[derive(Debug, Clone)]
enum TraceOp {
    Alloc(u64),
    Free(usize),
    EmptyCache,
}

fn trace_op() -> impl Strategy<Value = TraceOp> {
    prop_oneof![
        10 => crate::vramlab::request_size().prop_map(TraceOp::Alloc),
        8 => any::<usize>().prop_map(TraceOp::Free),
        1 => Just(TraceOp::EmptyCache),
    ]
}

const CONFIGS: &[&str] = &[
    "",
    "roundup_power2_divisions:4",
    "max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:8]",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Side by side with `expandable` on the same trace: the same blocks
    /// (allocated bytes equal), never more reserved after any operation,
    /// the granules it counts equal those the live blocks overlap, and
    /// what it holds covers what is allocated.
    #[test]
    fn vramlab_never_reserves_more_than_expandable(
        ops in prop::collection::vec(trace_op(), 200..1200),
        conf in 0usize..CONFIGS.len(),
    ) {
        let config = AllocatorConfig::parse(CONFIGS[conf]).unwrap();
        let mut e = online_configured("expandable", None, &config).unwrap();
        let mut v = Vramlab::new(SimulatedSource::unlimited(), config);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let (mut peak_e, mut peak_v) = (0, 0);
        for (step, op) in ops.iter().enumerate() {
            match *op {
                TraceOp::Alloc(size) => {
                    let he = e.malloc(size, Category::Untagged).unwrap();
                    let hv = v.malloc(size, Category::Untagged).unwrap();
                    live.push((he, hv));
                }
                TraceOp::Free(k) if !live.is_empty() => {
                    let (he, hv) = live.swap_remove(k % live.len());
                    e.free(he);
                    v.free(hv);
                }
                TraceOp::Free(_) => {}
                TraceOp::EmptyCache => {
                    e.empty_cache();
                    v.empty_cache();
                }
            }
            let what = format!("after op {step} ({op:?})");
            prop_assert_eq!(v.allocated(), e.allocated(), "{}", what);
            prop_assert!(v.reserved() <= e.reserved(), "{}: {} > {}", what, v.reserved(), e.reserved());
            prop_assert!(v.allocated() <= v.mapped_granules() * GRANULE, "{}", what);
            prop_assert!(v.mapped_granules() * GRANULE <= v.reserved(), "{}", what);
            prop_assert_eq!(v.mapped_granules(), granules_by_snapshot(&v), "{}", what);
            peak_e = peak_e.max(e.reserved());
            peak_v = peak_v.max(v.reserved());
        }
        prop_assert!(peak_v <= peak_e);
        for (he, hv) in live.drain(..) {
            e.free(he);
            v.free(hv);
        }
        prop_assert_eq!(v.mapped_granules(), 0);
        v.empty_cache();
        prop_assert_eq!(v.reserved(), 0);
        let m = v.mappings().unwrap();
        prop_assert_eq!(m.maps, m.unmaps);
    }
}

/// A device of `capacity` bytes: granules past it are refused, the
/// allocation fails as out of memory and nothing of it stays held.
#[test]
fn a_capacity_refuses_granules_and_undoes_the_allocation() {
    let mut v = online("vramlab", Some(10 * MIB)).unwrap();
    let a = v.malloc(3 * MIB, Category::Untagged).unwrap();
    assert_eq!(v.reserved(), 2 * GRANULE);
    assert!(v.malloc(9 * MIB, Category::Untagged).is_err());
    assert_eq!(v.allocated(), 3 * MIB);
    assert_eq!(v.reserved(), 2 * GRANULE, "the refused call keeps nothing");
    let b = v.malloc(5 * MIB, Category::Untagged).unwrap();
    v.free(a);
    v.free(b);
    v.empty_cache();
    assert_eq!(v.reserved(), 0);
}

/// Every PyTorch snapshot in the repository: real recordings and the
/// recorder's fixtures.
fn snapshots() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut out = Vec::new();
    for dir in ["snapshots", "recorder", "recorder/zoo"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "pickle") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The real recordings (on CUDA GPUs); the rest were written by the
/// recorder on the meta device, or by hand for the tests.
const REAL: [&str; 3] = [
    "cs336_kkaitlyn_ctx128_fullstep.pickle",
    "ftcourse_memory_snapshot.pickle",
    "h200-torch2.11-gpt2-bf16.cuda.pickle",
];

#[test]
fn on_every_snapshot_vramlab_peaks_at_most_at_expandable_and_below_on_real_ones() {
    let mut lower = HashMap::new();
    let mut devices = 0;
    for path in snapshots() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(&path).unwrap();
        let Ok(file) = read_all(&bytes, &name) else {
            continue;
        };
        for snap in &file.devices {
            let config = file.settings.clone().unwrap_or_default();
            let r =
                compare_with(&snap.workload, &["expandable", "vramlab"], None, &config).unwrap();
            let (e, v) = (r[0].peak_reserved_bytes, r[1].peak_reserved_bytes);
            assert!(
                v <= e,
                "{name} device {}: vramlab {v} > expandable {e}",
                snap.device
            );
            assert!(v >= snap.workload.lower_bound(), "{name}");
            *lower.entry(name.clone()).or_insert(0) += (v < e) as usize;
            devices += 1;
            // At every step, not only at the peak.
            every_step(&snap.workload, &config, &name);
        }
    }
    assert!(devices >= 12, "{devices} devices");
    for real in REAL {
        assert_eq!(
            lower.get(real),
            Some(&1),
            "{real}: vramlab below expandable"
        );
    }
    let below = lower.values().filter(|&&n| n > 0).count();
    assert!(below * 2 >= lower.len(), "{lower:?}");
}

fn every_step(w: &Workload, config: &AllocatorConfig, name: &str) {
    let mut e = online_configured("expandable", None, config).unwrap();
    let mut v = online_configured("vramlab", None, config).unwrap();
    let mut handles = HashMap::new();
    for (i, op) in w.ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size, category } => {
                let he = e.malloc(size.max(1), category).unwrap();
                let hv = v.malloc(size.max(1), category).unwrap();
                handles.insert(id, (he, hv));
            }
            Op::Free { id } => {
                if let Some((he, hv)) = handles.remove(&id) {
                    e.free(he);
                    v.free(hv);
                }
            }
            Op::EmptyCache => {
                e.empty_cache();
                v.empty_cache();
            }
            // No limit here: a probe asks nothing (workload::run).
            Op::Probe { .. } => {}
        }
        assert_eq!(v.allocated(), e.allocated(), "{name} op {i}");
        assert!(v.reserved() <= e.reserved(), "{name} op {i}");
    }
}
