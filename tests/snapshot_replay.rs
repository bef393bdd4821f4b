//! `vramlab replay snapshot.pickle`: PyTorch memory snapshots (the pickle
//! `torch.cuda.memory._dump_snapshot()` writes) replay from the state they
//! recorded to exactly the end state they recorded: scenario.pickle is built
//! by scripts/make_snapshot_fixture.py following the documented format; the
//! two others are real recordings from CUDA GPUs.

use crate::common::cli::{command, stderr};
use serde_json::Value;
use std::path::Path;

fn replay(path: &Path, extra: &[&str]) -> (bool, Value, String) {
    let out = command(["replay"])
        .arg(path)
        .args(extra)
        .arg("--json")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), v, stderr(&out))
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots")
        .join(name)
}

#[test]
fn snapshot_replays_with_the_recorded_segments_and_peak() {
    let (ok, v, err) = replay(
        &fixture("scenario.pickle"),
        &["--allocators", "pytorch,vramlab,planner"],
    );
    assert!(ok, "{err}");
    let d = &v["devices"][0];
    assert_eq!(d["allocations"], 10);
    assert_eq!(d["pre_existing_segments"], 0);
    assert_eq!(d["segments_match"], true);
    let mib = 1u64 << 20;
    assert_eq!(d["replayed"]["peak_allocated_bytes"], 61 * mib);
    assert_eq!(d["replayed"]["reserved_bytes"], 90 * mib);
    // The scenario's frames are its own script's: no lifetime hints.
    assert_eq!(d["categories_from_frames"], serde_json::json!({}));
    let results = d["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(
        results[2]["peak_reserved_bytes"],
        61 * mib,
        "the planner packs to the peak"
    );
}

/// Real snapshots recorded by PyTorch users on CUDA GPUs (see
/// tests/fixtures/snapshots/README.md): recording began mid-run, frames are
/// shared through the pickle memo. Replayed from the rebuilt start state,
/// each ends with exactly the recorded segments, reserved and allocated
/// bytes.
#[test]
fn real_snapshots_replay_to_their_recorded_end_state() {
    for (file, pre, segments, reserved, allocated) in [
        (
            "cs336_kkaitlyn_ctx128_fullstep.pickle",
            227,
            1010,
            61_111_009_280u64,
            54_873_829_888u64,
        ),
        (
            "ftcourse_memory_snapshot.pickle",
            63,
            215,
            6_471_811_072,
            2_297_283_072,
        ),
    ] {
        let (ok, v, err) = replay(&fixture(file), &[]);
        assert!(ok, "{file}: {err}");
        let d = &v["devices"][0];
        assert_eq!(d["pre_existing_segments"], pre, "{file}");
        for side in ["recorded", "replayed"] {
            assert_eq!(d[side]["segments"], segments, "{file} {side}");
            assert_eq!(d[side]["reserved_bytes"], reserved, "{file} {side}");
            assert_eq!(d[side]["allocated_bytes"], allocated, "{file} {side}");
        }
        assert_eq!(d["segments_match"], true, "{file}: {}", d["differences"]);
    }
}

/// Two devices, recording begun mid-run, an older PyTorch's "free" action,
/// a free of a block no recorded segment holds, and a recorded OOM
/// (multi_device.pickle, written by Python's pickle at protocol 2).
#[test]
fn every_device_is_replayed_and_odd_traces_are_reported_not_fatal() {
    let (ok, v, err) = replay(&fixture("multi_device.pickle"), &[]);
    assert!(ok, "{err}");
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs[0]["pre_existing_segments"], 1);
    for d in devs {
        assert_eq!(d["segments_match"], true, "{}", d["differences"]);
    }
    assert!(devs[0]["differences"][0]
        .as_str()
        .unwrap()
        .contains("no recorded segment"));
    assert_eq!(
        devs[1]["ooms_recorded"],
        serde_json::json!([{"size": 80u64 << 20, "device_free": 10u64 << 20}])
    );
    let (ok, v, _) = replay(&fixture("multi_device.pickle"), &["--device", "1"]);
    assert!(ok);
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
    assert_eq!(v["devices"][0]["device"], 1);
}

#[test]
fn a_missing_device_is_an_error_that_lists_the_others() {
    let (ok, _, err) = replay(&fixture("scenario.pickle"), &["--device", "3"]);
    assert!(!ok);
    assert!(err.contains("device 3") && err.contains("0"), "{err}");
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

/// `--timeline` on a snapshot printed no timeline and no `timeline` key,
/// silently; it is refused with where to find one instead.
#[test]
fn timeline_of_a_snapshot_says_where_to_look() {
    let (ok, v, err) = replay(&fixture("scenario.pickle"), &["--timeline"]);
    assert!(!ok, "{v}");
    assert!(
        err.contains("--timeline") && err.contains("vramlab doctor") && err.contains("--out DIR"),
        "{err}"
    );
}

/// An entry error named where in the file but not the file
/// ("device_traces[0][0] (\"alloc\"): size is not an integer"): the name
/// goes in front, as in the snapshot's other errors.
#[test]
fn entry_errors_name_the_file() {
    use vramlab::lab::pickle::{pickle, PyValue};
    let s = PyValue::str;
    let entry = PyValue::dict(vec![
        (s("action"), s("alloc")),
        (s("addr"), PyValue::Int(1 << 21)),
        (s("size"), s("big")),
    ]);
    let snapshot = PyValue::dict(vec![
        (s("segments"), PyValue::list(vec![])),
        (
            s("device_traces"),
            PyValue::list(vec![PyValue::list(vec![entry])]),
        ),
    ]);
    let dir = std::env::temp_dir().join(format!("vramlab-snap-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.pickle");
    std::fs::write(&p, pickle(&snapshot)).unwrap();
    let (ok, _, err) = replay(&p, &[]);
    assert!(!ok);
    let want = format!(
        "{}: device_traces[0][0] (\"alloc\"): size is not an integer",
        p.display()
    );
    assert!(err.contains(&want), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
