//! `vramlab replay` on traces derived from PyTorch's allocator tests
//! (test_cuda.py), checked against the numbers PyTorch asserts, through the
//! real binary and its `--json` output.

use crate::common::cli::{command, stderr, stdout, vramlab};
use serde_json::Value;

const MIB: i64 = 1 << 20;

fn replay(trace: &str, extra: &[&str]) -> (i32, Value, String) {
    let out = command([
        "replay",
        &format!("tests/fixtures/traces/{trace}"),
        "--json",
    ])
    .args(extra)
    .env_remove("VRAMLAB_ALLOC_CONF")
    .output()
    .expect("run vramlab");
    let stdout = stdout(&out);
    let json: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {stdout}"));
    (out.status.code().unwrap_or(-1), json, stderr(&out))
}

fn stat(v: &Value, key: &str) -> i64 {
    v["stats"][key]
        .as_i64()
        .unwrap_or_else(|| panic!("missing {key}"))
}

#[test]
fn roundup_power2_divisions_gives_pytorchs_numbers() {
    // PyTorch: pow2_div4_mem - reg_mem == power2_div(nbytes, 4) == 96 MiB,
    // current_requested - start_requested == nbytes == 84 MiB.
    let (rc, v, _) = replay(
        "roundup_power2_divisions.jsonl",
        &["--alloc-conf", "roundup_power2_divisions:4"],
    );
    assert_eq!(rc, 0);
    assert_eq!(stat(&v, "active_bytes.all.allocated"), 96 * MIB);
    assert_eq!(stat(&v, "requested_bytes.all.allocated"), 84 * MIB);
    assert_eq!(stat(&v, "reserved_bytes.all.current"), 96 * MIB);
    // Without the option: exactly nbytes, in an 84 MiB segment.
    let (_, v, _) = replay("roundup_power2_divisions.jsonl", &[]);
    assert_eq!(stat(&v, "allocated_bytes.all.current"), 84 * MIB);
    assert_eq!(stat(&v, "segment.large_pool.current"), 1);
}

#[test]
fn memory_fraction_gives_oom_past_the_limit() {
    let (rc, v, _) = replay(
        "memory_fraction.jsonl",
        &["--capacity", "1000MiB", "--memory-fraction", "0.5"],
    );
    assert_eq!(rc, 0);
    let ooms = v["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1, "{v}");
    assert_eq!(ooms[0]["line"], 4);
    assert_eq!(ooms[0]["size"], 500 * MIB + 1);
    assert_eq!(stat(&v, "num_ooms"), 1);
    // The small allocation after the OOM succeeded: one 2 MiB segment is left.
    assert_eq!(stat(&v, "reserved_bytes.all.current"), 2 * MIB);
    assert_eq!(stat(&v, "allocation.all.current"), 1);
    assert_eq!(v["memory_limit"], 500 * MIB);
}

#[test]
fn split_merge_counts_like_pytorch() {
    let (rc, v, _) = replay("split_merge.jsonl", &[]);
    assert_eq!(rc, 0);
    // Small pool: a, (free b), c, free rest: two non-releasable blocks.
    assert_eq!(stat(&v, "inactive_split.small_pool.current"), 2);
    assert_eq!(
        stat(&v, "inactive_split_bytes.small_pool.current"),
        2 * MIB - 2048
    );
    // empty_cache could not release the split small segment.
    assert_eq!(stat(&v, "segment.small_pool.current"), 1);
    // 19 MiB in a 20 MiB segment: the 1 MiB rest is not split off.
    assert_eq!(stat(&v, "allocated_bytes.large_pool.current"), 20 * MIB);
    assert_eq!(stat(&v, "requested_bytes.large_pool.current"), 19 * MIB);
    // reset_peak after the last alloc: peaks equal current.
    assert_eq!(
        stat(&v, "allocated_bytes.all.peak"),
        stat(&v, "allocated_bytes.all.current")
    );
    // a, b, c live (3000 B), then b freed before the 19 MiB tensor.
    assert_eq!(v["peak_live_requested_bytes"], 19 * MIB + 2000);
}

#[test]
fn oom_retry_frees_the_cache() {
    let (rc, v, _) = replay("oom_retry.jsonl", &["--capacity", "64MiB"]);
    assert_eq!(rc, 0);
    assert_eq!(stat(&v, "num_alloc_retries"), 2, "{}", v["stats"]);
    assert_eq!(stat(&v, "num_device_free"), 1);
    // id 3 (40 MiB beside 50 MiB) ran out; id 4 fit after id 2 was freed.
    let ooms = v["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0]["id"], 3);
    // id 4 reuses the cached 50 MiB block, split (the 10 MiB rest is > 1 MiB).
    assert_eq!(stat(&v, "reserved_bytes.all.current"), 50 * MIB);
    assert_eq!(stat(&v, "allocated_bytes.all.current"), 40 * MIB);
    assert_eq!(stat(&v, "inactive_split_bytes.all.current"), 10 * MIB);
}

#[test]
fn timeline_has_one_point_per_event() {
    let (_, v, _) = replay("split_merge.jsonl", &["--timeline"]);
    let t = v["timeline"].as_array().unwrap();
    assert_eq!(t.len(), 7);
    assert_eq!(t[0]["reserved_bytes"], 2 * MIB);
    assert_eq!(t[5]["allocated_bytes"], 20 * MIB + 2048);
}

#[test]
fn malformed_line_is_named_and_earlier_stats_kept() {
    let (rc, v, stderr) = replay("bad_line.jsonl", &[]);
    assert_eq!(rc, 1);
    assert_eq!(v["error_line"], 4);
    assert_eq!(v["events"], 3);
    // The failure document's shape, the statistics beside it.
    assert_eq!(v["exit_code"], 1);
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("line 4") && stderr.contains(error),
        "{error}\n{stderr}"
    );
    assert!(v["causes"].as_array().is_some_and(|c| !c.is_empty()));
    assert_eq!(stat(&v, "allocation.all.current"), 1);
    assert!(stderr.contains("line 4"), "{stderr}");
}

#[test]
fn double_free_is_named() {
    let (rc, v, stderr) = replay("double_free.jsonl", &[]);
    assert_eq!(rc, 1);
    assert_eq!(v["error_line"], 4);
    assert!(stderr.contains("not live"), "{stderr}");
}

#[test]
fn bad_flags_say_what_is_wrong() {
    let run = |args: &[&str]| {
        let out = vramlab(args);
        (out.status.code().unwrap_or(-1), stderr(&out))
    };
    let (rc, err) = run(&[
        "replay",
        "tests/fixtures/traces/split_merge.jsonl",
        "--alloc-conf",
        "max_split_size_md:128",
    ]);
    assert_eq!(rc, 1);
    assert!(
        err.contains("max_split_size_md") && err.contains("known options"),
        "{err}"
    );
    let (rc, err) = run(&[
        "replay",
        "tests/fixtures/traces/split_merge.jsonl",
        "--memory-fraction",
        "0.8",
    ]);
    assert_eq!(rc, 1);
    assert!(err.contains("--capacity"), "{err}");
    let (rc, err) = run(&[
        "replay",
        "tests/fixtures/traces/split_merge.jsonl",
        "--memory-limit",
        "2 parsecs",
    ]);
    // Refused as clap refuses a flag, before any work.
    assert_eq!(rc, 2);
    assert!(err.contains("parsecs"), "{err}");
    let (rc, err) = run(&["replay", "no/such/trace.jsonl"]);
    assert_eq!(rc, 1);
    assert!(err.contains("cannot open no/such/trace.jsonl"), "{err}");
    // A directory is named as one, by replay and doctor alike.
    for command in ["replay", "doctor"] {
        let (rc, err) = run(&[command, "tests/fixtures"]);
        assert_eq!(rc, 1, "{command}");
        assert!(
            err.contains("tests/fixtures: is a directory"),
            "{command}: {err}"
        );
    }
}

/// `vramlab replay` run on a file outside the fixtures.
fn replay_path(path: &std::path::Path, extra: &[&str]) -> (i32, Value, String) {
    let out = command(["replay"])
        .arg(path)
        .arg("--json")
        .args(extra)
        .env_remove("VRAMLAB_ALLOC_CONF")
        .output()
        .expect("run vramlab");
    let stdout = stdout(&out);
    let json: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr(&out))
}

#[test]
fn interval_files_replay_and_any_trace_is_written_as_one() {
    let dir = std::env::temp_dir().join(format!("vramlab-intervals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Three buffers: 0 and 1 overlap in time, 2 starts when 0 ends (half
    // open: it may take 0's memory), so at most 3 MiB + 1 MiB are live.
    let csv = dir.join("three.csv");
    std::fs::write(
        &csv,
        format!(
            "id,lower,upper,size\n10,0,5,{}\n11,0,9,{}\n12,5,9,{}\n",
            3 * MIB,
            MIB,
            2 * MIB
        ),
    )
    .unwrap();
    let (code, v, err) = replay_path(&csv, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["events"], 6, "{v}");
    assert_eq!(v["peak_live_requested_bytes"], 4 * MIB, "{v}");
    assert_eq!(stat(&v, "allocated_bytes.all.peak"), 4 * MIB);

    // A JSON Lines trace out as intervals, and the intervals replayed: the
    // same peaks (a trace without empty_cache or reset_peak, which
    // intervals do not carry).
    let trace = dir.join("trace.jsonl");
    let mut lines = String::new();
    for i in 0..40u64 {
        lines += &format!(
            "{{\"op\":\"alloc\",\"id\":{i},\"size\":{}}}\n",
            (i % 7 + 1) * 300_000 + i * 512
        );
        if i % 3 == 2 {
            lines += &format!("{{\"op\":\"free\",\"id\":{}}}\n", i - 1);
        }
    }
    std::fs::write(&trace, lines).unwrap();
    let out = dir.join("trace.csv");
    let (code, direct, err) = replay_path(&trace, &["--export-intervals", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("id,lower,upper,size\n"), "{text}");
    assert_eq!(text.lines().count(), 41, "{text}");
    let (code, again, err) = replay_path(&out, &[]);
    assert_eq!(code, 0, "{err}");
    for key in [
        "allocated_bytes.all.peak",
        "reserved_bytes.all.peak",
        "num_alloc_retries",
    ] {
        assert_eq!(stat(&again, key), stat(&direct, key), "{key}");
    }
    assert_eq!(
        again["peak_live_requested_bytes"],
        direct["peak_live_requested_bytes"]
    );

    // A broken interval file names its line and the format it was read as.
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "id,lower,upper,size\n0,5,2,64\n").unwrap();
    let (code, _, err) = replay_path(&bad, &[]);
    assert_ne!(code, 0);
    assert!(
        err.contains("line 2") && err.contains("interval file"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A refused request is said in its own unit: 1000 bytes, not 0.00 MiB.
#[test]
fn a_small_refused_request_is_said_in_bytes() {
    let p = std::env::temp_dir().join(format!("vramlab-small-{}.jsonl", std::process::id()));
    std::fs::write(&p, "{\"op\":\"alloc\",\"id\":1,\"size\":1000}\n").unwrap();
    let out = vramlab(["replay", p.to_str().unwrap(), "--memory-limit", "512"]);
    std::fs::remove_file(&p).unwrap();
    let text = stdout(&out);
    assert!(text.contains("id 1 asked for 1000 bytes"), "{text}");
}

/// A scratch directory of its own for one test.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vramlab-replay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// 30 MiB allocated and freed, the cache emptied, then `reset_peak` and one
/// 1000-byte allocation: the peak live requested bytes restarted with the
/// allocator's peaks (it stayed 30 MiB, so "fragmentation" came out 0.067),
/// and `--allocators` measures from the reset too (its rows said 30 MiB).
#[test]
fn reset_peak_resets_every_peak_plain_and_compared() {
    let dir = scratch("reset-peak");
    let p = dir.join("rp.jsonl");
    std::fs::write(
        &p,
        concat!(
            "{\"op\":\"alloc\",\"id\":1,\"size\":31457280}\n",
            "{\"op\":\"free\",\"id\":1}\n",
            "{\"op\":\"empty_cache\"}\n",
            "{\"op\":\"reset_peak\"}\n",
            "{\"op\":\"alloc\",\"id\":2,\"size\":1000}\n",
        ),
    )
    .unwrap();
    let (rc, v, err) = replay_path(&p, &[]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(v["peak_live_requested_bytes"], 1000);
    assert_eq!(stat(&v, "allocated_bytes.all.peak"), 1024);
    assert_eq!(stat(&v, "reserved_bytes.all.peak"), 2 * MIB);
    let (rc, v, err) = replay_path(&p, &["--allocators", "pytorch,expandable,planner"]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(v["lower_bound_bytes"], 1000);
    assert_eq!(v["measured_from_operation"], 3);
    let results = v["results"].as_array().unwrap();
    // The pytorch row agrees with the plain replay.
    assert_eq!(results[0]["allocator"], "pytorch");
    assert_eq!(results[0]["peak_allocated_bytes"], 1024);
    assert_eq!(results[0]["peak_reserved_bytes"], 2 * MIB);
    for r in results {
        assert!(r["fragmentation"].as_f64().unwrap() >= 1.0, "{r}");
    }
    assert!(
        v["notes"][0].as_str().unwrap().contains("reset_peak"),
        "{v}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A trace of blank lines replayed 0 events with exit 0, while an empty
/// file is an error: both are now, and so is an interval header alone.
#[test]
fn a_trace_without_events_is_refused() {
    let dir = scratch("no-events");
    for (name, text, want) in [
        ("ws.jsonl", " \n\n\t\n", "no events: every line is blank"),
        ("h.csv", "id,lower,upper,size\n\n", "header and no buffers"),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        for extra in [&[][..], &["--allocators", "pytorch"]] {
            let (rc, _, err) = replay_path(&p, extra);
            assert_eq!(rc, 1, "{name} {extra:?}: {err}");
            assert!(err.contains(want), "{name} {extra:?}: {err}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A JSON Lines error quoted serde's position within the one line ("line
/// 2: ... at line 1 column 14"): only the column is said now.
#[test]
fn a_json_error_names_the_column_only() {
    let dir = scratch("column");
    let p = dir.join("bad.jsonl");
    std::fs::write(
        &p,
        "{\"op\":\"alloc\",\"id\":1,\"size\":3}\n{\"op\":\"free\" \"id\":1}\n",
    )
    .unwrap();
    let (rc, _, err) = replay_path(&p, &[]);
    assert_eq!(rc, 1);
    assert!(
        err.contains("line 2: expected `,` or `}` at column 14;"),
        "{err}"
    );
    assert!(!err.contains("line 1"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An interval file: an integer too large for its column is said to be
/// one (it was "not an integer"), and a header with an extra column is an
/// interval file whose extra column is ignored (it was read as JSON Lines:
/// "expected value at line 1 column 1").
#[test]
fn interval_files_out_of_range_and_with_extra_columns() {
    let dir = scratch("interval-columns");
    let big = dir.join("big.csv");
    std::fs::write(&big, "id,lower,upper,size\n0,0,18446744073709551615,5\n").unwrap();
    let (rc, _, err) = replay_path(&big, &[]);
    assert_eq!(rc, 1);
    assert!(
        err.contains("`upper` is `18446744073709551615`, an integer out of range; the largest accepted is 9223372036854775807"),
        "{err}"
    );
    let extra = dir.join("extra.csv");
    std::fs::write(
        &extra,
        "id,lower,upper,size,extra\n0,0,2,4096,x\n1,1,3,8192,y\n",
    )
    .unwrap();
    let (rc, v, err) = replay_path(&extra, &[]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(v["events"], 4);
    assert_eq!(v["peak_live_requested_bytes"], 4096 + 8192);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// garbage_collection_threshold without a memory limit does nothing (as in
/// PyTorch, which collects only under a memory fraction): the replay says
/// so instead of silently differing from --memory-limit.
#[test]
fn an_inert_garbage_collection_threshold_is_noted() {
    let gc = ["--alloc-conf", "garbage_collection_threshold:0.8"];
    let (rc, v, err) = replay(
        "oom_retry.jsonl",
        &[&gc[..], &["--capacity", "64MiB"]].concat(),
    );
    assert_eq!(rc, 0, "{err}");
    let note = v["notes"][0].as_str().unwrap_or_default();
    assert!(
        note.contains("only under a memory limit") && note.contains("--memory-limit"),
        "{v}"
    );
    let (_, v, _) = replay(
        "oom_retry.jsonl",
        &[&gc[..], &["--memory-limit", "64MiB"]].concat(),
    );
    assert_eq!(v["notes"], serde_json::json!([]));
    let (_, v, _) = replay(
        "oom_retry.jsonl",
        &[&gc[..], &["--allocators", "pytorch"]].concat(),
    );
    assert!(
        v["notes"][0]
            .as_str()
            .unwrap_or_default()
            .contains("only under a memory limit"),
        "{v}"
    );
    // The text says it too.
    let out = command(["replay", "tests/fixtures/traces/oom_retry.jsonl"])
        .args(gc)
        .env_remove("VRAMLAB_ALLOC_CONF")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(
        text.contains("note: garbage_collection_threshold:0.8 acts only under a memory limit"),
        "{text}"
    );
}

/// PyTorch keys that concern locking or pinned host memory replay (a real
/// PYTORCH_CUDA_ALLOC_CONF pasted as it is); cudaMallocAsync is refused.
#[test]
fn a_pasted_pytorch_alloc_conf_replays() {
    let conf = "backend:native,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8,expandable_segments:True";
    let (rc, v, err) = replay("oom_retry.jsonl", &["--alloc-conf", conf]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(v["alloc_conf"], "expandable_segments:True");
    let out = command(["replay", "tests/fixtures/traces/oom_retry.jsonl"])
        .args(["--alloc-conf", "backend:cudaMallocAsync"])
        .env_remove("VRAMLAB_ALLOC_CONF")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("native caching allocator only"), "{err}");
}

/// Found from outside: fields the format does not read passed in silence
/// (a misspelt `categroy` lost the category; a `stream` merged two pools).
#[test]
fn fields_the_format_does_not_read_are_noted() {
    let dir = scratch("ignored-fields");
    let p = dir.join("t.jsonl");
    std::fs::write(
        &p,
        [
            r#"{"op":"alloc","id":1,"size":1000,"categroy":"parameter","phase":"forward"}"#,
            r#"{"op":"alloc","id":2,"size":2000,"stream":7}"#,
            r#"{"op":"free","id":2,"stream":7}"#,
            r#"{"op":"free","id":1,"where":"x.py:3"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    for extra in [&[][..], &["--allocators", "pytorch"][..]] {
        let (rc, v, err) = replay_path(&p, extra);
        assert_eq!(rc, 0, "{err}");
        let notes = v["notes"].to_string();
        assert!(notes.contains("`categroy` on alloc (line 1)"), "{notes}");
        assert!(notes.contains("`stream` on alloc (line 2)"), "{notes}");
        assert!(notes.contains("`stream` on free (line 3)"), "{notes}");
        assert!(notes.contains("one stream's pool"), "{notes}");
        // The recorder's own fields are expected, not noted.
        assert!(
            !notes.contains("`phase`") && !notes.contains("`where`"),
            "{notes}"
        );
    }
    std::fs::write(&p, r#"{"op":"alloc","id":1,"size":1000,"label":"x"}"#).unwrap();
    let (_, v, _) = replay_path(&p, &[]);
    assert_eq!(v["notes"], serde_json::json!([]), "{v}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A refused request counts toward the least any allocator needs: 50 MiB
/// live and 40 MiB refused is 90 MiB, more than the 64 MiB device.
#[test]
fn refused_requests_count_toward_the_lower_bound() {
    let (rc, v, _) = replay("oom_retry.jsonl", &["--capacity", "64MiB"]);
    assert_eq!(rc, 0);
    assert_eq!(v["ooms"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["peak_live_requested_bytes"], 90 * MIB);
    // --allocators counts the same demand.
    let (_, c, _) = replay("oom_retry.jsonl", &["--allocators", "pytorch"]);
    assert_eq!(c["lower_bound_bytes"], 90 * MIB);
    let (_, v, _) = replay("oom_retry.jsonl", &[]);
    assert!(v["ooms"].as_array().unwrap().is_empty());
    assert_eq!(v["peak_live_requested_bytes"], 90 * MIB);
}

/// Settings PyTorch refuses are refused, and a limit past the device too.
#[test]
fn settings_pytorch_refuses_and_a_limit_past_the_device_are_errors() {
    for (args, says) in [
        (
            &["--alloc-conf", "expandable_segments:true"][..],
            "PyTorch refuses `true`",
        ),
        (
            &["--memory-limit", "200MiB", "--capacity", "30MiB"][..],
            "more than the --capacity 30.00 MiB",
        ),
    ] {
        let (rc, _, err) = replay("oom_retry.jsonl", args);
        assert_eq!(rc, 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Found from outside: settings from VRAMLAB_ALLOC_CONF were said to come
/// from --alloc-conf, and what they were was not said.
#[test]
fn a_snapshots_settings_name_their_source_and_value() {
    let file = "tests/fixtures/snapshots/multi_device.pickle";
    let run = |env: Option<&str>, extra: &[&str]| {
        let mut c = command(["replay", file, "--json"]);
        c.args(extra).env_remove("VRAMLAB_ALLOC_CONF");
        if let Some(v) = env {
            c.env("VRAMLAB_ALLOC_CONF", v);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["settings_from"].as_str().unwrap().to_string()
    };
    let from = run(Some("expandable_segments:True"), &[]);
    assert!(
        from.starts_with("VRAMLAB_ALLOC_CONF (expandable_segments:True)"),
        "{from}"
    );
    let from = run(
        Some("expandable_segments:True"),
        &["--alloc-conf", "max_split_size_mb:64"],
    );
    assert!(
        from.starts_with("--alloc-conf (max_split_size_mb:64)"),
        "{from}"
    );
    let from = run(None, &[]);
    assert!(
        from.starts_with("PyTorch's defaults (the snapshot records no"),
        "{from}"
    );
}
