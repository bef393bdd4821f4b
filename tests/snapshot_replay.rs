//! `vramlab replay snapshot.pickle`: a PyTorch memory snapshot (the pickle
//! `torch.cuda.memory._dump_snapshot()` writes; this fixture is built by
//! scripts/make_snapshot_fixture.py following the documented format, since
//! no GPU was available to record one) replays through the `pytorch`
//! strategy with exactly the segments and the peak the snapshot records.

use serde_json::Value;
use std::path::Path;

fn replay(path: &Path, extra: &[&str]) -> (bool, Value, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .arg("replay")
        .arg(path)
        .args(extra)
        .arg("--json")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.success(),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn snapshot_replays_with_the_recorded_segments_and_peak() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/scenario.pickle");
    let (ok, v, err) = replay(&p, &["--allocators", "pytorch,vramlab,planner"]);
    assert!(ok, "{err}");
    assert_eq!(v["allocations"], 10);
    let mib = 1u64 << 20;
    let want: Vec<u64> = [2, 20, 14, 32, 22].iter().map(|m| m * mib).collect();
    assert_eq!(v["snapshot"]["segment_allocs"], serde_json::json!(want));
    assert_eq!(
        v["replay"]["segment_allocs"],
        v["snapshot"]["segment_allocs"]
    );
    assert_eq!(v["segments_match"], true);
    assert_eq!(v["replay"]["peak_allocated_bytes"], 61 * mib);
    assert_eq!(v["peak_allocated_matches"], true);
    // The scenario's frames are its own script's: no lifetime hints.
    assert_eq!(v["categories_from_frames"], serde_json::json!({}));
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(
        results[2]["peak_reserved_bytes"],
        61 * mib,
        "the planner packs to the peak"
    );
}

#[test]
fn a_pickle_without_history_says_how_to_record_one() {
    let dir = std::env::temp_dir().join(format!("vramlab-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // pickle.dumps({'segments': [], 'device_traces': [[]]}, protocol=4)
    let p = dir.join("empty.pickle");
    std::fs::write(
        &p,
        b"\x80\x04\x95'\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94]\x94au.",
    )
    .unwrap();
    let (ok, _, err) = replay(&p, &[]);
    assert!(!ok);
    assert!(err.contains("_record_memory_history"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
