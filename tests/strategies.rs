//! Allocator strategies on random and recorded workloads: every strategy
//! keeps allocated ≤ reserved and returns everything; the planner never
//! overlaps live tensors and never beats the lower bound; capacity limits
//! produce OOMs; the suite's numbers have the shape `bench-alloc --json`
//! promises, and `vramlab` reserves less than `pytorch` and `expandable` on
//! every workload.

use crate::common;
use common::Rng;
use vramlab::lab::strategies::planner::{plan, Lifetime};
use vramlab::lab::strategies::{online, NAMES};
use vramlab::lab::workload::{compare, run, Op, Workload};
use vramlab::memory::Category;

fn random_workload(seed: u64, ops: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let mut live: Vec<u64> = Vec::new();
    let mut out = Vec::new();
    let mut next = 0;
    for _ in 0..ops {
        if live.is_empty() || rng.below(100) < 55 {
            next += 1;
            // Sizes from 1 byte to ~48 MiB, skewed small.
            let size = match rng.below(10) {
                0..=5 => 1 + rng.below(1 << 20),
                6..=8 => 1 + rng.below(12 << 20),
                _ => 1 + rng.below(48 << 20),
            };
            // Some blocks say they live for the run (what `vramlab` keeps apart).
            let category = if rng.below(5) == 0 {
                Category::Parameter
            } else {
                Category::Temporary
            };
            out.push(Op::Alloc {
                id: next,
                size,
                category,
            });
            live.push(next);
        } else {
            let k = rng.below(live.len() as u64) as usize;
            out.push(Op::Free {
                id: live.swap_remove(k),
            });
        }
        if rng.below(500) == 0 {
            out.push(Op::EmptyCache);
        }
    }
    for id in live {
        out.push(Op::Free { id });
    }
    Workload {
        name: format!("random {seed}"),
        ops: out,
        measure_from: 0,
    }
}

#[test]
fn every_strategy_keeps_allocated_within_reserved_and_returns_everything() {
    for seed in 0..6 {
        let w = random_workload(seed, 1500);
        let lb = w.lower_bound();
        for name in NAMES.iter().filter(|n| **n != "planner") {
            let mut s = online(name, None).unwrap();
            let mut handles = std::collections::HashMap::new();
            for op in &w.ops {
                match *op {
                    Op::Alloc { id, size, category } => {
                        handles.insert(id, s.malloc(size, category).unwrap());
                    }
                    Op::Free { id } => s.free(handles.remove(&id).unwrap()),
                    Op::EmptyCache => s.empty_cache(),
                    // Generated workloads have no out-of-memory entries.
                    Op::Probe { .. } => unreachable!(),
                }
                assert!(s.allocated() <= s.reserved(), "{name} seed {seed}");
            }
            assert_eq!(s.allocated(), 0, "{name}");
            s.empty_cache();
            assert_eq!(
                s.reserved(),
                0,
                "{name}: empty_cache returns every free segment"
            );
            let r = run(online(name, None).unwrap().as_mut(), &w);
            assert!(r.peak_reserved_bytes >= lb, "{name} below the lower bound");
            assert!(!r.oom);
        }
    }
}

/// The same strategies over real GPU buffers (each segment a wgpu buffer):
/// the numbers equal the simulated run's, since only the source differs.
#[test]
fn strategies_run_on_wgpu_buffers_with_the_simulated_numbers() {
    use vramlab::device::{AdapterOptions, Gpu, WgpuSource};
    use vramlab::lab::strategies::online_on;
    let gpu = Gpu::new(&AdapterOptions::default()).expect("GPU tests need an adapter");
    let w = random_workload(42, 400);
    // Expandable segments (and vramlab's granules under them) need page
    // mapping, which wgpu lacks: refused.
    for name in ["expandable", "vramlab"] {
        let src = WgpuSource::of(&gpu);
        let mut s = online_on(name, src).unwrap();
        assert!(s.malloc(1 << 20, Category::Untagged).is_err(), "{name}");
        assert_eq!(s.reserved(), 0, "{name}");
    }
    for name in NAMES
        .iter()
        .filter(|n| !matches!(**n, "planner" | "expandable" | "vramlab"))
    {
        let src = WgpuSource::of(&gpu);
        let real = run(online_on(name, src).unwrap().as_mut(), &w);
        let sim = run(online(name, None).unwrap().as_mut(), &w);
        assert_eq!(real.peak_reserved_bytes, sim.peak_reserved_bytes, "{name}");
        assert_eq!(real.device_allocs, sim.device_allocs, "{name}");
        assert!(!real.oom, "{name}");
    }
}

#[test]
fn the_planner_never_overlaps_live_tensors() {
    for seed in 0..5 {
        let w = random_workload(100 + seed, 600);
        let t: Vec<Lifetime> = w.lifetimes();
        let p = plan(&t);
        for i in 0..t.len() {
            for j in i + 1..t.len() {
                let overlap_in_time = t[i].first <= t[j].last && t[j].first <= t[i].last;
                let (a, b) = (p.offsets[i], p.offsets[j]);
                let disjoint = a + t[i].size <= b || b + t[j].size <= a;
                assert!(!overlap_in_time || disjoint, "tensors {i} and {j}");
            }
            assert!(p.offsets[i] + t[i].size <= p.arena);
        }
        assert!(p.arena >= w.lower_bound());
    }
}

#[test]
fn a_capacity_produces_out_of_memory_and_the_run_goes_on() {
    let w = random_workload(7, 1500);
    let lb = w.lower_bound();
    let r = compare(&w, &NAMES, Some(lb / 2)).unwrap();
    for x in &r {
        assert!(x.oom, "{} at half the lower bound", x.allocator);
        // What a strategy reports holding fits the device, the offline
        // planner's refused arena included.
        assert!(x.peak_reserved_bytes <= lb / 2, "{}", x.allocator);
    }
    // nocache needs only the live bytes (rounded to 512 B each).
    let ok = compare(&w, &["nocache"], Some(lb + (1 << 20))).unwrap();
    assert!(!ok[0].oom, "nocache fits just above the lower bound");
}

#[test]
fn bench_alloc_json_reports_every_workload_and_vramlab_beats_pytorch_on_each() {
    let v = common::vramlab_json(["bench-alloc", "--json"]);
    let workloads = v["workloads"].as_array().unwrap();
    assert!(workloads.len() >= 7);
    for w in workloads {
        let lb = w["lower_bound_bytes"].as_u64().unwrap();
        let results = w["results"].as_array().unwrap();
        assert_eq!(results.len(), NAMES.len());
        let get = |name: &str| results.iter().find(|r| r["allocator"] == name).unwrap();
        for r in results {
            for key in [
                "peak_allocated_bytes",
                "peak_reserved_bytes",
                "device_allocs",
            ] {
                assert!(r[key].as_u64().is_some(), "{key}");
            }
            assert!(r["fragmentation"].as_f64().unwrap() >= 0.999);
            assert!(r["ns_per_op"].as_f64().unwrap() > 0.0);
            assert!(r["oom"].is_boolean());
            assert!(r["peak_reserved_bytes"].as_u64().unwrap() >= lb);
        }
        let (p, e, m) = (get("pytorch"), get("expandable"), get("vramlab"));
        let (pr, er, mr) = (
            p["peak_reserved_bytes"].as_u64().unwrap(),
            e["peak_reserved_bytes"].as_u64().unwrap(),
            m["peak_reserved_bytes"].as_u64().unwrap(),
        );
        assert!(mr < pr, "{}: vramlab {mr} >= pytorch {pr}", w["name"]);
        assert!(mr < er, "{}: vramlab {mr} >= expandable {er}", w["name"]);
        // vramlab's device allocations are its 2 MiB granules, each mapped
        // and unmapped as blocks come and go: counted, never fewer maps
        // than granules made.
        let maps = m["mappings"]["maps"].as_u64().unwrap();
        assert!(
            maps >= m["device_allocs"].as_u64().unwrap(),
            "{}",
            w["name"]
        );
        assert!(p.get("mappings").is_none());
    }
}

#[test]
fn on_the_grid_vramlab_never_reserves_more_than_pytorch() {
    let v = common::vramlab_json(["bench-alloc", "--grid", "--json"]);
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(
        cells.len(),
        vramlab::nn::ZOO.len() * 2 * 8,
        "zoo × optimizers × batches"
    );
    let count = |pred: &dyn Fn(u64, u64) -> bool| {
        cells
            .iter()
            .filter(|c| {
                pred(
                    c["vramlab_reserved_bytes"].as_u64().unwrap(),
                    c["pytorch_reserved_bytes"].as_u64().unwrap(),
                )
            })
            .count()
    };
    let (wins, losses) = (count(&|v, p| v < p), count(&|v, p| v > p));
    assert_eq!(v["wins"], wins);
    assert_eq!(v["losses"], losses);
    assert!(wins >= 10, "{wins} wins");
    // The models lookahead was designed on never lose. The ones added
    // later (gpt, resnet50) do lose a few cells (README: bench-alloc
    // --grid); any loss elsewhere fails here.
    let lost: Vec<String> = cells
        .iter()
        .filter(|c| {
            c["vramlab_reserved_bytes"].as_u64().unwrap()
                > c["pytorch_reserved_bytes"].as_u64().unwrap()
        })
        .map(|c| format!("{} {} {}", c["model"], c["optimizer"], c["batch"]))
        .collect();
    for l in &lost {
        assert!(
            l.starts_with("\"gpt\"") || l.starts_with("\"resnet50\""),
            "vramlab reserves more than pytorch on {l} (all losses: {lost:?})"
        );
    }
    for c in cells {
        assert!(
            c["vramlab_device_allocs"].as_i64() <= c["pytorch_device_allocs"].as_i64(),
            "{c}"
        );
    }
}

#[test]
fn a_recorded_training_trace_replays_to_the_same_reserved_peak() {
    let dir = std::env::temp_dir().join(format!("vramlab-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.jsonl");
    let mut train: Vec<std::ffi::OsString> = [
        "train",
        "--model",
        "mlp",
        "--widths",
        "300,500,10",
        "--batch",
        "64",
        "--steps",
        "2",
        "--json",
        "--record-trace",
    ]
    .iter()
    .map(Into::into)
    .collect();
    train.push(trace.clone().into());
    let trained = common::vramlab_json(train.clone());
    // The same run under the vramlab strategy's options.
    train.extend([
        "--alloc-conf".into(),
        "small_from_large:True,lookahead:True".into(),
    ]);
    let trained_vramlab = common::vramlab_json(train);
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.contains(r#""category":"parameter""#),
        "the trace says what each block holds"
    );
    assert!(text.contains(r#""category":"optimizer_state""#));
    let replay: Vec<std::ffi::OsString> = vec![
        "replay".into(),
        trace.clone().into(),
        "--allocators".into(),
        "pytorch,planner,vramlab".into(),
        "--json".into(),
    ];
    let replayed = common::vramlab_json(replay);
    let results = replayed["results"].as_array().unwrap();
    assert_eq!(
        results[0]["peak_reserved_bytes"], trained["memory_stats"]["reserved_bytes.all.peak"],
        "the trace through pytorch reserves what training reserved"
    );
    assert!(
        results[1]["peak_reserved_bytes"].as_u64() <= results[0]["peak_reserved_bytes"].as_u64()
    );
    assert_eq!(
        results[2]["peak_reserved_bytes"],
        trained_vramlab["memory_stats"]["reserved_bytes.all.peak"],
        "the categories in the trace let vramlab place blocks as it did in training"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `expandable` (expandable_segments:True): one growing segment per pool,
/// mapped in 20 MiB pages (large pool); `empty_cache` unmaps only pages with
/// nothing allocated; freed space between live blocks is reused before a new
/// page is mapped.
#[test]
fn expandable_segments_map_pages_and_unmap_only_whole_free_ones() {
    let mib = 1u64 << 20;
    let mut s = online("expandable", None).unwrap();
    let a = s.malloc(15 * mib, Category::Untagged).unwrap();
    let b = s.malloc(15 * mib, Category::Untagged).unwrap();
    // [A 0..15 | B 15..30 | free 30..40]: two pages.
    assert_eq!(s.reserved(), 40 * mib);
    s.free(a);
    s.empty_cache();
    // Page 0 still holds B's first 5 MiB: nothing to unmap.
    assert_eq!(s.reserved(), 40 * mib);
    // A 12 MiB request fits A's old place: no new page.
    let c = s.malloc(12 * mib, Category::Untagged).unwrap();
    assert_eq!(s.reserved(), 40 * mib);
    // 20 MiB does not fit anywhere mapped: the 10 MiB free tail plus one
    // new page (the lowest unmapped range, right after it).
    let d = s.malloc(20 * mib, Category::Untagged).unwrap();
    assert_eq!(s.reserved(), 60 * mib);
    assert_eq!(s.allocated(), (15 + 12 + 20) * mib);
    for h in [b, c, d] {
        s.free(h);
    }
    s.empty_cache();
    assert_eq!((s.reserved(), s.allocated()), (0, 0));
    // Not always a win: PyTorch gives each request over 10 MiB a segment of
    // its own size (16, 16, 20 MiB here), 52 MiB against 60 in pages.
    let mut p = online("pytorch", None).unwrap();
    let a = p.malloc(15 * mib, Category::Untagged).unwrap();
    let _b = p.malloc(15 * mib, Category::Untagged).unwrap();
    p.free(a);
    let _c = p.malloc(12 * mib, Category::Untagged).unwrap();
    let _d = p.malloc(20 * mib, Category::Untagged).unwrap();
    assert_eq!(p.reserved(), 52 * mib);
}
