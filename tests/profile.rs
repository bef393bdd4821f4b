//! The event log and what is drawn from it: category totals always add up
//! to the allocated total, the Chrome trace is valid JSON in time order, the
//! snapshot at the peak holds exactly the peak's bytes, and the HTML page
//! renders in headless Chromium without errors.

use crate::common;
use crate::common::cli::{command, stderr};
use common::*;
use vramlab::estimate::run::run_steps;
use vramlab::estimate::Plan;
use vramlab::memory::{AllocatorConfig, EventKind};
use vramlab::nn::ModelSpec;
use vramlab::profile::{chrome, live_at, Series};
use vramlab::train::{Mode, OptimizerConfig, OptimizerKind};

fn plan() -> Plan {
    Plan {
        model: ModelSpec::from(vramlab::nn::ResnetMiniSpec {
            width: 4,
            depth: 2,
            resolution: 12,
            classes: 5,
        }),
        batch: 3,
        optimizer: OptimizerConfig::new(OptimizerKind::Adam, None, None, None),
        mode: Mode::Train,
        amp: None,
        dtype: vramlab::tensor::DType::F32,
        loss: Default::default(),
        config: AllocatorConfig::default(),
    }
}

#[test]
fn categories_add_up_and_the_peak_snapshot_holds_the_peak() {
    let p = run_steps(engine(), &plan(), 0, 2).unwrap();
    let s = Series::of(&p.events);
    assert!(p.events.iter().any(|e| e.kind == EventKind::SegmentAlloc));
    assert_eq!(
        s.phases.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(),
        [
            "forward",
            "backward",
            "optimizer",
            "forward",
            "backward",
            "optimizer"
        ]
    );
    for (i, e) in p.events.iter().enumerate() {
        assert_eq!(
            s.by_category[i].iter().sum::<u64>(),
            e.allocated,
            "event {i} {e:?}"
        );
    }
    let peak = s.peak_index;
    let segs = live_at(&p.events, peak);
    let live: u64 = segs.iter().flat_map(|s| &s.blocks).map(|b| b.size).sum();
    let reserved: u64 = segs.iter().map(|s| s.total_size).sum();
    assert_eq!(live, s.allocated[peak]);
    assert_eq!(reserved, s.reserved[peak]);
    // Every block at the peak has a category and an op.
    for b in segs.iter().flat_map(|s| &s.blocks) {
        assert!(!b.op.is_empty(), "{b:?}");
    }
}

#[test]
fn chrome_trace_is_json_in_time_order() {
    let p = run_steps(engine(), &plan(), 0, 1).unwrap();
    let s = Series::of(&p.events);
    let text = serde_json::to_string(&chrome::render(&p.events, &s)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    let ts: Vec<f64> = evs.iter().filter_map(|e| e["ts"].as_f64()).collect();
    assert!(ts.len() > p.events.len(), "counters and instants");
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "time order");
    assert!(evs.iter().any(|e| e["ph"] == "C" && e["name"] == "memory"));
    assert!(evs
        .iter()
        .any(|e| e["ph"] == "X" && e["name"] == "backward"));
}

/// Headless Chromium loads timeline.html with no script error and the page
/// reports it drew (scripts/test.sh installs Debian's chromium).
#[test]
fn timeline_html_renders_in_headless_chromium() {
    let dir = std::env::temp_dir().join(format!("vramlab-profile-{}", std::process::id()));
    let status = command([
        "profile", "--model", "mlp", "--widths", "20,30,5", "--batch", "4",
    ])
    .arg("--out")
    .arg(&dir)
    .stdout(std::process::Stdio::null())
    .status()
    .unwrap();
    assert!(status.success());
    rendered_dom(&dir.join("timeline.html"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The run as a PyTorch snapshot: read back by vramlab's own reader, its
/// segments and blocks are the allocator's own end state, and replaying it
/// from its recorded start reaches exactly that state again. (Python's
/// pickle and `torch.cuda._memory_viz` read it too:
/// `scripts/torch_reference.py snapshot-check FILE`.)
#[test]
fn the_exported_pytorch_snapshot_is_the_allocators_state() {
    use vramlab::lab::{pickle, snapshot_export, torch_snapshot};
    let e = engine();
    e.allocator().start_recording();
    // The model stays alive, so the log's end is the allocator's state now.
    let (mut trainer, batch) = plan().trainer(&e, 0).unwrap();
    for _ in 0..2 {
        trainer.step(&batch).unwrap();
    }
    e.synchronize().unwrap();
    let events = e.allocator().take_events();
    let bytes = pickle::pickle(&snapshot_export::torch_snapshot(
        &events,
        &AllocatorConfig::default(),
    ));
    let root = pickle::unpickle(&bytes).unwrap();
    let own = e.allocator().snapshot();
    let segs = root.get("segments").unwrap().as_list().unwrap();
    assert_eq!(segs.len(), own.segments.len());
    for (got, want) in segs.iter().zip(&own.segments) {
        let int = |v: &pickle::PyValue, k: &str| v.get(k).unwrap().as_i64().unwrap() as u64;
        assert_eq!(int(got, "total_size"), want.total_size);
        assert_eq!(int(got, "allocated_size"), want.allocated_size);
        let blocks = got.get("blocks").unwrap().as_list().unwrap();
        assert_eq!(blocks.len(), want.blocks.len(), "blocks tile the segment");
        for (b, w) in blocks.iter().zip(&want.blocks) {
            assert_eq!(int(b, "size"), w.size);
            assert_eq!(b.get("state").unwrap().as_str(), Some(w.state));
        }
    }
    let file = torch_snapshot::read_all(&bytes, "export").unwrap();
    let r = torch_snapshot::replay_from_state(&file.devices[0], AllocatorConfig::default(), None)
        .unwrap();
    assert!(r.segments_match, "{:?}", r.differences);
    assert_eq!(r.replayed.reserved_bytes, e.allocator().memory_reserved());
}

/// A step that runs out of memory still leaves its timeline: the events up
/// to the refusal are written (the moment a profile is for), and the error
/// names the files; the snapshot pickle replays.
#[test]
fn a_profile_that_runs_out_of_memory_writes_what_led_to_it() {
    let dir = std::env::temp_dir().join(format!("vramlab-profile-oom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = command(["profile", "--model", "mlp", "--batch", "4", "--steps", "1"])
        .args(["--memory-limit", "2MiB", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the step ran out of memory; the") && err.contains("out of memory. Tried"),
        "{err}"
    );
    for f in [
        "timeline.svg",
        "timeline.html",
        "trace.json",
        "snapshot.json",
        "snapshot.pickle",
    ] {
        let p = dir.join(f);
        assert!(
            std::fs::metadata(&p).is_ok_and(|m| m.len() > 0),
            "{f} missing"
        );
    }
    vramlab_json([
        "replay".as_ref(),
        dir.join("snapshot.pickle").as_os_str(),
        "--json".as_ref(),
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// vramlab's categories survive its own snapshot: each alloc carries its
/// category in `user_metadata` (as `vramlab_torch` writes it), so replaying
/// the exported pickle finds, live at its peak, the bytes per category the
/// run itself had there, for every small zoo model, with and without
/// autocast, over generated batches.
#[test]
fn exported_snapshots_keep_the_categories_at_the_peak() {
    use vramlab::lab::{pickle, snapshot_export, torch_snapshot};
    use vramlab::memory::events::LiveBlocks;
    use vramlab::tensor::{DType, Engine};
    let mut rng = Rng::new(41);
    for name in ["mlp", "resnet-mini", "attention", "simple-cnn", "gpt"] {
        for amp in [None, Some(DType::F16)] {
            let batch = 1 + rng.below(4) as usize;
            let plan = Plan {
                model: small(name),
                batch,
                amp,
                ..plan()
            };
            let engine = Engine::simulated(AllocatorConfig::default(), None);
            let events = run_steps(engine, &plan, 0, 2).unwrap().events;
            let (mut live, mut most, mut want) = (LiveBlocks::default(), 0, Vec::new());
            let mut peak_event = 0;
            for (i, e) in events.iter().enumerate() {
                live.apply(e);
                if e.allocated > most {
                    most = e.allocated;
                    want = live.by_category.to_vec();
                    peak_event = i;
                }
            }
            let bytes = pickle::pickle(&snapshot_export::torch_snapshot(
                &events,
                &AllocatorConfig::default(),
            ));
            let file = torch_snapshot::read_all(&bytes, "export").unwrap();
            let r = torch_snapshot::replay_from_state(
                &file.devices[0],
                AllocatorConfig::default(),
                None,
            )
            .unwrap();
            let what = format!("{name} batch {batch} amp {amp:?}");
            assert_eq!(r.at_peak.allocated_bytes, most, "{what}");
            // The peak's event is the operation the replay names (what
            // `profile` prints for `doctor --at`).
            assert_eq!(
                snapshot_export::operation_of(&events, peak_event, &AllocatorConfig::default()),
                Some(r.at_peak.after_op),
                "{what}"
            );
            let mut want: Vec<(String, u64)> = vramlab::memory::tag::CATEGORIES
                .iter()
                .zip(want)
                .filter(|(_, b)| *b > 0)
                .map(|(c, b)| (c.name().to_string(), b))
                .collect();
            let mut got = r.at_peak.by_category.clone();
            want.sort();
            got.sort();
            assert_eq!(got, want, "{what}");
            // Every block names its module (vramlab's op), and JSON lists
            // them all: they sum to the peak.
            let modules: u64 = r.at_peak.by_module.iter().map(|(_, b)| b).sum();
            assert_eq!(modules, most, "{what}: {:?}", r.at_peak.by_module);
            // At least the parameters and what the step saved are named.
            assert!(got.iter().any(|(c, _)| c == "parameter"), "{what}: {got:?}");
            assert!(!got.iter().any(|(c, _)| c == "untagged"), "{what}: {got:?}");
        }
    }
}
