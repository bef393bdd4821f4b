//! Faults found by checks run from outside the project, each as the command
//! a user ran: it must now succeed, or end with a clear error naming what
//! was wrong (exit 1 or 2, no panic, no signal), and leave no file behind.

use crate::common;
use common::cli::{
    command, fails_cleanly, stderr, stdout, succeeds, vramlab, vramlab_json as json_of,
};
use common::files::{
    char_device, fifo_with_reader, temporaries, write_trace, writer_caught_mid_write,
};
use std::path::PathBuf;
use vramlab::lab::pickle::{pickle, PyValue};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vramlab-outside-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `estimate --mode checkpoint` runs the precision table's autocast rows
/// too; resnet-mini's failed there ("conv2d: operands are f16 and f32").
#[test]
fn checkpoint_mode_estimates_every_model() {
    for model in [
        &["--model", "resnet-mini"][..],
        &["--model", "mlp", "--checkpoint-every", "1"],
        &["--model", "attention"],
        &["--model", "gpt"],
        &["--model", "simple-cnn"],
        &["--model", "resnet50", "--width", "4", "--resolution", "32"],
    ] {
        let mut args = vec![
            "estimate",
            "--batch",
            "2",
            "--optimizer",
            "adamw",
            "--mode",
            "checkpoint",
        ];
        args.extend_from_slice(model);
        let o = vramlab(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
}

/// `max-batch` takes the device's cap as every command does,
/// `--memory-limit`; `--limit` is a hidden alias.
#[test]
fn max_batch_takes_memory_limit() {
    let err = fails_cleanly(["max-batch", "--model", "mlp"]);
    assert!(err.contains("--memory-limit"), "{err}");
    let err = fails_cleanly([
        "max-batch",
        "--model",
        "mlp",
        "--memory-limit",
        "12 parsecs",
    ]);
    assert!(err.contains("--memory-limit"), "{err}");
    // The old spelling still parses (its value is checked as the new one's)
    // but not beside the new one.
    let err = fails_cleanly(["max-batch", "--model", "mlp", "--limit", "12 parsecs"]);
    assert!(err.contains("--memory-limit"), "{err}");
    let o = vramlab([
        "max-batch",
        "--model",
        "mlp",
        "--limit",
        "1MiB",
        "--memory-limit",
        "1MiB",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let help = stdout(&vramlab(["max-batch", "--help"]));
    assert!(
        help.contains("--memory-limit") && !help.contains("--limit "),
        "{help}"
    );
}

/// A PyTorch snapshot with one trace entry and one segment, sizes given.
fn snapshot(entry_size: i64, segment_size: i64, block_size: i64) -> Vec<u8> {
    let s = PyValue::str;
    let entry = PyValue::dict(vec![
        (s("action"), s("alloc")),
        (s("addr"), PyValue::Int(1 << 21)),
        (s("size"), PyValue::Int(entry_size)),
    ]);
    let block = PyValue::dict(vec![
        (s("address"), PyValue::Int(1 << 21)),
        (s("size"), PyValue::Int(block_size)),
        (s("requested_size"), PyValue::Int(512)),
        (s("state"), s("active_allocated")),
    ]);
    let segment = PyValue::dict(vec![
        (s("device"), PyValue::Int(0)),
        (s("address"), PyValue::Int(1 << 21)),
        (s("total_size"), PyValue::Int(segment_size)),
        (s("allocated_size"), PyValue::Int(512)),
        (s("segment_type"), s("small")),
        (s("blocks"), PyValue::list(vec![block])),
    ]);
    pickle(&PyValue::dict(vec![
        (s("segments"), PyValue::list(vec![segment])),
        (
            s("device_traces"),
            PyValue::list(vec![PyValue::list(vec![entry])]),
        ),
    ]))
}

/// Negative sizes and sizes past 2^62 in a pickle were clamped (a negative
/// allocation replayed as a 512-byte block, exit 0); now each is an error
/// naming the entry.
#[test]
fn snapshot_sizes_out_of_range_name_their_entry() {
    let dir = scratch("sizes");
    let ok = 2 << 20;
    for (bytes, want) in [
        (
            snapshot(-5, ok, 512),
            "device_traces[0][0] (\"alloc\"): size -5 is negative",
        ),
        (
            snapshot(i64::MAX, ok, 512),
            "device_traces[0][0] (\"alloc\"): size 9223372036854775807 is more than 2^62",
        ),
        (snapshot((1 << 62) + 1, ok, 512), "more than 2^62"),
        (
            snapshot(512, -1, 512),
            "segments[0]: total_size -1 is negative",
        ),
        (
            snapshot(512, ok, -3),
            "segments[0].blocks[0]: size -3 is negative",
        ),
    ] {
        let p = dir.join("s.pickle");
        std::fs::write(&p, bytes).unwrap();
        let err = fails_cleanly(["replay", p.to_str().unwrap()]);
        assert!(err.contains(want), "want {want:?}:\n{err}");
    }
    // The same snapshot with a sane size replays.
    let p = dir.join("s.pickle");
    std::fs::write(&p, snapshot(512, ok, 512)).unwrap();
    let o = vramlab(["replay", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The kind of file is decided from its bytes: protocol 0 and 1 pickles are
/// read as snapshots, as `doctor` reads them (they were parsed as JSON:
/// "expected value at line 1", then refused by name), and a JSON Lines
/// error says the file was read as JSON Lines.
#[test]
fn replay_says_what_kind_of_file_it_assumed() {
    let dir = scratch("kind");
    let p = dir.join("t");
    // pickle.dumps({'device_traces': [[]], 'segments': []}, protocol=0) and
    // protocol=1: snapshots with nothing recorded.
    for old in [
        &b"(dp0\nVdevice_traces\np1\n(lp2\n(lp3\nasVsegments\np4\n(lp5\ns."[..],
        b"}q\x00(X\r\x00\x00\x00device_tracesq\x01]q\x02]q\x03aX\x08\x00\x00\x00segmentsq\x04]q\x05u.",
    ] {
        std::fs::write(&p, old).unwrap();
        for cmd in ["replay", "doctor"] {
            let err = fails_cleanly([cmd, p.to_str().unwrap()]);
            assert!(err.contains("no allocation history"), "{cmd}: {err}");
        }
    }
    std::fs::write(&p, b"not a trace at all\n").unwrap();
    let err = fails_cleanly(["replay", p.to_str().unwrap()]);
    assert!(
        err.contains("read as a JSON Lines trace") && err.contains("0x80"),
        "{err}"
    );
    let err = fails_cleanly(["replay", p.to_str().unwrap(), "--allocators", "pytorch"]);
    assert!(err.contains("read as a JSON Lines trace"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ctrl-C (or SIGTERM) mid-write removes the temporary file: it was left
/// behind (`train --dump` left 4 MB). The previous file stays whole.
#[cfg(unix)]
#[test]
fn an_interrupted_write_leaves_no_temporary() {
    use std::os::unix::process::ExitStatusExt;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let dir = scratch(&format!("sig{signal}"));
        let trace = dir.join("t.jsonl");
        write_trace(&trace, 6000);
        let out = dir.join("snap.pickle");
        let args = [
            "replay",
            trace.to_str().unwrap(),
            "--export-snapshot",
            out.to_str().unwrap(),
        ];
        assert!(vramlab(args).status.success());
        let good = std::fs::read(&out).unwrap();
        let mut child = writer_caught_mid_write(&args, &dir);
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(signal), "{status:?}");
        assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));
        assert_eq!(std::fs::read(&out).unwrap(), good);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Outputs that are not regular files are written in place: the atomic
/// writer renamed its temporary over them, turning /dev/full (as root)
/// into a regular file and exiting 0. A full device is an error now, a
/// FIFO receives the bytes, and both stay what they were.
#[cfg(unix)]
#[test]
fn device_and_fifo_outputs_are_written_in_place() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("devices");
    let trace = dir.join("t.jsonl");
    write_trace(&trace, 50);
    let t = trace.to_str().unwrap();
    let kind = |p: &str| std::fs::symlink_metadata(p).unwrap().file_type();
    let null = char_device(&dir, "null", 3);
    let null = null.to_str().unwrap();
    let o = vramlab(["replay", t, "--export-snapshot", null]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(kind(null).is_char_device());
    let full = char_device(&dir, "full", 7);
    let full = full.to_str().unwrap();
    let err = fails_cleanly(["replay", t, "--export-snapshot", full]);
    assert!(err.contains(full) && err.contains("No space left"), "{err}");
    assert!(kind(full).is_char_device());

    let (fifo, reader) = fifo_with_reader(&dir, "pipe");
    let o = vramlab(["replay", t, "--export-snapshot", fifo.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = reader.join().unwrap();
    assert!(vramlab::lab::pickle::unpickle(&got).is_ok());
    assert!(kind(fifo.to_str().unwrap()).is_fifo());
    assert!(temporaries(&dir).is_empty());
    // A directory is refused by name.
    let err = fails_cleanly(["replay", t, "--export-snapshot", dir.to_str().unwrap()]);
    assert!(err.contains("directory"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A batch no device holds names the flag it came from.
#[test]
fn a_batch_too_large_names_its_flag() {
    for args in [
        &["train", "--batch", "18446744073709551615", "--steps", "1"][..],
        &["estimate", "--batch", "18446744073709551615"],
        &[
            "estimate",
            "--model",
            "gpt",
            "--batch",
            "4611686018427387904",
        ],
        &[
            "sweep",
            "--model",
            "mlp",
            "--batch",
            "1,18446744073709551615",
        ],
    ] {
        let err = fails_cleanly(args);
        let value = args[args.iter().position(|a| *a == "--batch").unwrap() + 1];
        let largest = value.rsplit(',').next().unwrap();
        assert!(
            err.contains(&format!("--batch {largest}")),
            "{args:?}: {err}"
        );
    }
}

/// The product points its users at the claims in its own repository, not
/// at a path outside it.
#[test]
fn the_claims_are_in_the_repository() {
    let o = vramlab(["lessons"]);
    let out = stdout(&o);
    assert!(out.contains("docs/claims.md"), "{out}");
    assert!(!out.contains("shared/"), "{out}");
    let claims =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/claims.md")).unwrap();
    // Each claim with its article and its numbers, e.g. C26's parameter count.
    assert!(claims.contains("- C26 (002)") && claims.contains("1,003,530"));
}

/// One of the adapter's limits, as `info` reports it.
fn adapter_limit(name: &str) -> u64 {
    let info = json_of(["info", "--json"]);
    info["limits"][name].as_u64().unwrap()
}

/// A batch whose input passes the adapter's binding limit runs, bound in
/// windows: `max-batch` finds the largest batch asked for (it once stopped
/// below the binding limit, and before that with an error).
#[test]
fn max_batch_runs_past_the_binding_limit() {
    let limit = adapter_limit("max_storage_buffer_binding_size");
    // An input row of 65,536 f32 values is 256 KiB: the limit holds this
    // many rows; the search may go to half as many again.
    let rows = (limit / (256 << 10)).min(1024);
    let max = (rows + rows / 2).to_string();
    let v = json_of([
        "max-batch",
        "--model",
        "mlp",
        "--widths",
        "65536,2",
        "--memory-limit",
        "8GiB",
        "--max",
        max.as_str(),
        "--json",
    ]);
    assert_eq!(v["max_batch"].as_u64().unwrap().to_string(), max, "{v}");
    assert!(v["trials"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.get("limit").is_none_or(|l| l.is_null())));
}

/// Sizes that would have been made on the host before the device refused
/// them abort no more (`memory allocation of 4294967296 bytes failed`,
/// exit 134): the device memory is allocated first. Past the binding limit
/// a tensor runs in windows, past the largest buffer in several buffers;
/// past the device's memory it is out of memory, named with its size.
#[test]
fn host_data_is_made_only_for_what_the_device_holds() {
    let info = json_of(["info", "--json"]);
    // A CPU adapter's memory is the host's; wgpu reports no GPU's, and
    // 1 TiB is past every one.
    let memory = info["limits"]["device_memory_bytes"]
        .as_u64()
        .unwrap_or(1 << 40);
    // A square of twice the device's memory, and a demo batch past it.
    let n = (((2 * memory / 4) as f64).sqrt() as u64 + 1).to_string();
    let batch = (2 * memory / (3 * 32 * 32 * 4) + 1).to_string();
    for args in [
        &[
            "bench",
            "--sizes",
            n.as_str(),
            "--models",
            "none",
            "--no-precision",
            "--reps",
            "1",
        ][..],
        &["demo", "--batch", batch.as_str(), "--steps", "1"],
    ] {
        let err = fails_cleanly(args);
        assert!(err.contains("out of memory"), "{args:?}: {err}");
    }
    let err = fails_cleanly(["bench", "--sizes", "4294967296", "--models", "none"]);
    assert!(err.contains("--sizes 4294967296"), "{err}");
}

/// A trace that stops with an error exports no snapshot: the file named
/// keeps what it held (it was replaced by a snapshot of part of the trace).
#[test]
fn a_failed_replay_leaves_its_export_target_alone() {
    let dir = scratch("export");
    let trace = dir.join("t.jsonl");
    std::fs::write(
        &trace,
        "{\"op\":\"alloc\",\"id\":1,\"size\":1200}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"free\",\"id\":1}\n",
    )
    .unwrap();
    let out = dir.join("s.pickle");
    std::fs::write(&out, b"ORIGINAL").unwrap();
    let err = fails_cleanly([
        "replay",
        trace.to_str().unwrap(),
        "--export-snapshot",
        out.to_str().unwrap(),
    ]);
    assert!(
        err.contains("line 3") && err.contains("was not written"),
        "{err}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"ORIGINAL");
    assert!(temporaries(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Kernel parameters are u32, but a simulated device sizes tensors from
/// their shapes: a batch of 2^32 was truncated to 0 rows ("empty: a tensor
/// of shape [0]"); its estimate now holds at least the input itself.
#[test]
fn an_estimate_past_2_pow_32_rows_is_not_truncated() {
    let batch: u64 = 1 << 32;
    let v = json_of([
        "estimate",
        "--model",
        "mlp",
        "--batch",
        &batch.to_string(),
        "--json",
    ]);
    let peak = v["estimate"]["peak_allocated_bytes"].as_u64().unwrap();
    assert!(peak >= batch * 784 * 4, "{peak}");
}

/// Flags that `replay --allocators` cannot honour are refused, not
/// silently dropped (no snapshot was written, no timeline printed), and so
/// is `--device` on a trace of one device.
#[test]
fn replay_refuses_flags_it_would_ignore() {
    let dir = scratch("conflicts");
    let trace = dir.join("t.jsonl");
    write_trace(&trace, 10);
    let out = dir.join("s.pickle");
    let t = trace.to_str().unwrap();
    for extra in [
        &["--export-snapshot", out.to_str().unwrap()][..],
        &["--timeline"],
    ] {
        let mut args = vec!["replay", t, "--allocators", "pytorch"];
        args.extend_from_slice(extra);
        let o = vramlab(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    }
    assert!(!out.exists());
    // --device picks a snapshot's device; a trace has one.
    let err = fails_cleanly(["replay", t, "--device", "3"]);
    assert!(
        err.contains("--device 3 picks a device of a PyTorch snapshot"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each model rule broken is named by its flag and value (gpt had one
/// message for all of them, "(got 64 and 4)" whatever was wrong), and a
/// sequence past the row kernels' longest row is refused up front.
#[test]
fn model_size_errors_name_the_flag() {
    for (args, want) in [
        (
            &["--dim", "10", "--heads", "3"][..],
            "--dim 10 is not a multiple of --heads 3",
        ),
        (&["--dropout", "NaN"], "--dropout NaN"),
        (&["--vocab", "0"], "--vocab must be at least 1"),
        (&["--seq-len", "4194305"], "--seq-len 4194305"),
    ] {
        let mut a = vec!["estimate", "--model", "gpt"];
        a.extend_from_slice(args);
        let err = fails_cleanly(&a);
        assert!(err.contains(want), "{a:?}: {err}");
    }
    let err = fails_cleanly(["estimate", "--model", "attention", "--seq-len", "5000000"]);
    assert!(err.contains("--seq-len 5000000"), "{err}");
    // Rows are walked by a whole workgroup, so sequences past 16,384 (the
    // old limit, one invocation a row) are estimated.
    let v = common::vramlab_json([
        "estimate",
        "--model",
        "gpt",
        "--seq-len",
        "20000",
        "--batch",
        "1",
        "--json",
    ]);
    assert!(
        v["estimate"]["peak_allocated_bytes"].as_u64().unwrap() > 0,
        "{v}"
    );
}

/// Output directories are made (or refused, naming the flag) before any
/// work: `sweep --out FILE` failed only after the whole sweep, and
/// `--export-snapshot` into a new directory failed where `--dump` made it.
#[test]
fn output_paths_are_checked_first_and_named() {
    let dir = scratch("outpaths");
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let f = file.to_str().unwrap();
    let err = fails_cleanly(["sweep", "--model", "mlp", "--batch", "1,2", "--out", f]);
    assert!(err.contains("--out") && err.contains(f), "{err}");
    let err = fails_cleanly(["lessons", "--report", f]);
    assert!(err.contains("--report"), "{err}");
    let trace = dir.join("t.jsonl");
    write_trace(&trace, 10);
    let snap = dir.join("new/dir/s.pickle");
    let o = vramlab([
        "replay",
        trace.to_str().unwrap(),
        "--export-snapshot",
        snap.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(snap.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sizes from files and sizes from flags must agree: `--data` with 9
/// input features silently turned `--widths 8,4,2` into 9→4→2.
#[test]
fn a_file_that_contradicts_a_size_flag_is_refused() {
    use vramlab::io::SafeTensors;
    let dir = scratch("sizes-agree");
    let data = dir.join("d.safetensors");
    let mut st = SafeTensors::new();
    st.insert_f32("x", &[2, 9], &[0.5; 18]).unwrap();
    st.insert_i64("y", &[2], &[0, 1]).unwrap();
    st.write(&data).unwrap();
    let d = data.to_str().unwrap();
    let err = fails_cleanly([
        "train", "--model", "mlp", "--widths", "8,4,2", "--data", d, "--steps", "1",
    ]);
    assert!(err.contains("--data") && err.contains("--widths"), "{err}");
    // Without the flag, the file decides.
    let o = vramlab(["train", "--model", "mlp", "--data", d, "--steps", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // With flags that agree, both are fine.
    let o = vramlab([
        "train", "--model", "mlp", "--widths", "9,4,2", "--data", d, "--steps", "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A device size or memory limit of no bytes is refused before any work,
/// naming the flag: it refused every allocation and reported empty figures
/// (a trace's lower bound of 0 MiB, "0 fit" with negative headroom).
#[test]
fn zero_memory_is_refused_naming_the_flag() {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/traces/split_merge.jsonl"
    );
    for (args, flag) in [
        (vec!["replay", trace, "--capacity", "0"], "--capacity 0"),
        (
            vec!["replay", trace, "--memory-limit", "0MiB"],
            "--memory-limit 0MiB",
        ),
        (
            vec!["bench-alloc", "--allocators", "pytorch", "--capacity", "0"],
            "--capacity 0",
        ),
        (
            vec![
                "plan", "--model", "gpt", "--preset", "gpt2", "--gpus", "8", "--memory", "0",
            ],
            "--memory 0",
        ),
        (
            vec!["max-batch", "--model", "mlp", "--memory-limit", "0"],
            "--memory-limit 0",
        ),
        (
            vec!["estimate", "--model", "mlp", "--memory-limit", "0b"],
            "--memory-limit 0b",
        ),
    ] {
        let err = fails_cleanly(&args);
        assert!(
            err.contains(flag) && err.contains("above 0"),
            "{args:?}: {err}"
        );
    }
}

/// An output file whose directory cannot be made is refused before any
/// training, naming its flag.
#[test]
fn train_outputs_are_checked_before_training() {
    for flag in ["--dump", "--record-trace"] {
        let err = fails_cleanly([
            "train",
            "--model",
            "mlp",
            "--batch",
            "2",
            "--steps",
            "1",
            flag,
            "/proc/no/such/out",
        ]);
        assert!(err.contains(&format!("{flag} /proc/no/such")), "{err}");
        assert!(!err.contains("step 1"), "{err}");
    }
}

/// A snapshot whose recorded allocator settings PyTorch's own parser
/// refuses is corrupt, and `replay` and `doctor` say which setting: a
/// garbage_collection_threshold of 5 was replayed as `:5`, a max_split_size
/// of 5 bytes shown as `max_split_size_mb:0`.
#[test]
fn recorded_settings_pytorch_refuses_are_errors() {
    let dir = scratch("settings");
    let with = |key: &str, value: PyValue| {
        trace_snapshot(
            &["alloc"],
            vec![(
                PyValue::str("allocator_settings"),
                PyValue::dict(vec![(PyValue::str(key), value)]),
            )],
        )
    };
    let p = dir.join("s.pickle");
    for (bytes, want) in [
        (
            with("garbage_collection_threshold", PyValue::Float(5.0)),
            "garbage_collection_threshold 5 is not 0 (off) or strictly between 0 and 1",
        ),
        (
            with("max_split_size", PyValue::Int(5)),
            "max_split_size 5 is not at least 20 MiB",
        ),
        // A division count PyTorch refuses (3), and one whose 512 ×
        // divisions would overflow the rounding (it was read as given).
        (
            with(
                "roundup_power2_divisions",
                PyValue::dict(vec![(PyValue::str("1"), PyValue::Int(3))]),
            ),
            "roundup_power2_divisions Int(3) is not 0 or a power of 2",
        ),
        (
            with(
                "roundup_power2_divisions",
                PyValue::dict(vec![(PyValue::str("2"), PyValue::Int(1 << 62))]),
            ),
            "roundup_power2_divisions Int(4611686018427387904) is not 0 or a power of 2",
        ),
    ] {
        std::fs::write(&p, bytes).unwrap();
        for cmd in ["replay", "doctor"] {
            let err = fails_cleanly([cmd, p.to_str().unwrap()]);
            assert!(err.contains(want), "{cmd}: want {want:?}:\n{err}");
        }
    }
    // What PyTorch writes passes: off, a threshold inside (0, 1), unset
    // (-1) and a size past 20 MiB.
    for (key, value) in [
        ("garbage_collection_threshold", PyValue::Float(0.0)),
        ("garbage_collection_threshold", PyValue::Float(0.6)),
        ("max_split_size", PyValue::Int(-1)),
        ("max_split_size", PyValue::Int(128 << 20)),
        ("max_split_size", PyValue::Int(20 << 20)),
        (
            "roundup_power2_divisions",
            PyValue::dict(vec![
                (PyValue::str("1"), PyValue::Int(0)),
                (PyValue::str("2"), PyValue::Int(4)),
            ]),
        ),
    ] {
        std::fs::write(&p, with(key, value)).unwrap();
        let o = vramlab(["replay", p.to_str().unwrap()]);
        assert!(o.status.success(), "{key}: {}", stderr(&o));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Trace entries whose action PyTorch's TraceEntry does not name are
/// skipped and said (`replay`'s note, `doctor`'s text and
/// `trace_counts.unknown_actions`); they were skipped without a word. The
/// real snapshots in the fixtures have none.
#[test]
fn unknown_trace_actions_are_skipped_and_said() {
    let dir = scratch("actions");
    let bytes = trace_snapshot(&["alloc", "bogus", "bogus", "free_completed"], vec![]);
    let p = dir.join("s.pickle");
    std::fs::write(&p, bytes).unwrap();
    let o = vramlab(["replay", p.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(o.status.success() && out.contains("\"bogus\" ×2"), "{out}");
    let o = vramlab(["doctor", p.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["devices"][0]["trace_counts"]["unknown_actions"],
        serde_json::json!([["bogus", 2]])
    );
    for real in ["ftcourse_memory_snapshot", "cs336_kkaitlyn_ctx128_fullstep"] {
        let f = format!(
            "{}/tests/fixtures/snapshots/{real}.pickle",
            env!("CARGO_MANIFEST_DIR")
        );
        let o = vramlab(["doctor", &f, "--no-planner", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(
            v["devices"][0]["trace_counts"]
                .get("unknown_actions")
                .is_none(),
            "{real}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot of no segments whose device-0 trace is `actions`, each on
/// one 512-byte block at 2 MiB, with `extra` top-level keys.
fn trace_snapshot(actions: &[&str], extra: Vec<(PyValue, PyValue)>) -> Vec<u8> {
    let entries = actions
        .iter()
        .map(|a| (*a, Some(PyValue::Int(1 << 21))))
        .collect::<Vec<_>>();
    trace_snapshot_at(&entries, extra)
}

/// `trace_snapshot` with each entry's `addr` given (`None`: no key).
fn trace_snapshot_at(
    actions: &[(&str, Option<PyValue>)],
    extra: Vec<(PyValue, PyValue)>,
) -> Vec<u8> {
    let s = PyValue::str;
    let entries = actions
        .iter()
        .map(|(a, addr)| {
            let mut d = vec![(s("action"), s(a)), (s("size"), PyValue::Int(512))];
            if let Some(addr) = addr {
                d.push((s("addr"), addr.clone()));
            }
            PyValue::dict(d)
        })
        .collect();
    let mut root = vec![
        (s("segments"), PyValue::list(vec![])),
        (
            s("device_traces"),
            PyValue::list(vec![PyValue::list(entries)]),
        ),
    ];
    root.extend(extra);
    pickle(&PyValue::dict(root))
}

/// `--backend` naming a backend this platform has no driver for says so,
/// instead of sending the user to install a Vulkan driver.
#[cfg(target_os = "linux")]
#[test]
fn a_backend_this_platform_lacks_is_named() {
    for (backend, want) in [
        ("metal", "Metal exists on macOS (and iOS) only"),
        ("dx12", "DX12 exists on Windows only"),
    ] {
        let err = fails_cleanly(["info", "--backend", backend]);
        assert!(err.contains(want) && !err.contains("apt-get"), "{err}");
    }
}

#[test]
fn a_one_class_loss_prints_as_zero() {
    let o = vramlab(["train", "--model", "mlp", "--widths", "8,1", "--steps", "1"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = out.lines().find(|l| l.starts_with("step   1")).unwrap();
    assert!(line.contains("loss 0.000000"), "{line}");
}

/// A trace entry that allocates or frees without a usable address, or an
/// alloc over a block the trace never freed, is a corrupt snapshot: named
/// by its entry, not replayed as a block at address 0 or a lost block.
#[test]
fn trace_entries_without_a_usable_address_are_refused() {
    let dir = scratch("addr");
    let p = dir.join("s.pickle");
    let at = |a: i64| Some(PyValue::Int(a));
    type Trace<'a> = Vec<(&'a str, Option<PyValue>)>;
    let cases: Vec<(Trace, &str)> = vec![
        (
            vec![("alloc", at(1 << 21)), ("alloc", None)],
            "device_traces[0][1] (\"alloc\"): no addr",
        ),
        (
            vec![("alloc", at(1 << 21)), ("free_completed", at(-5))],
            "device_traces[0][1] (\"free_completed\"): no addr",
        ),
        (
            vec![("segment_alloc", Some(PyValue::str("here")))],
            "device_traces[0][0] (\"segment_alloc\"): no addr",
        ),
        (
            vec![("alloc", at(1 << 21)), ("alloc", at(1 << 21))],
            "device_traces[0][1] (\"alloc\"): alloc at 0x200000, where the trace's block allocated at entry 0 was never freed",
        ),
        // A block freed twice was read as one from before the recording,
        // and its note said it lay in no segment.
        (
            vec![
                ("alloc", at(1 << 21)),
                ("free_completed", at(1 << 21)),
                ("free_completed", at(1 << 21)),
            ],
            "device_traces[0][2] (\"free_completed\"): free at 0x200000, whose block entry 1 already freed",
        ),
        (
            vec![
                ("free_completed", at(1 << 22)),
                ("free_completed", at(1 << 22)),
            ],
            "device_traces[0][1] (\"free_completed\"): free at 0x400000, whose block entry 0 already freed",
        ),
    ];
    for (entries, want) in cases {
        std::fs::write(&p, trace_snapshot_at(&entries, vec![])).unwrap();
        for cmd in ["replay", "doctor"] {
            let err = fails_cleanly([cmd, p.to_str().unwrap()]);
            assert!(err.contains(want), "{cmd}: {err}");
        }
    }
    // What changes no memory needs no address; a block freed and then
    // allocated again at its address is the normal case.
    let fine = vec![
        ("alloc", at(1 << 21)),
        ("snapshot", None),
        ("free_completed", at(1 << 21)),
        ("alloc", at(1 << 21)),
    ];
    std::fs::write(&p, trace_snapshot_at(&fine, vec![])).unwrap();
    let o = vramlab(["replay", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A bad VRAMLAB_ALLOC_CONF is refused by every command before any work,
/// as the docs say, including those that replay with their own settings
/// (doctor, bench-alloc), which ignored it.
#[test]
fn a_bad_alloc_conf_in_the_environment_is_refused_everywhere() {
    let snap = format!(
        "{}/tests/fixtures/snapshots/multi_device.pickle",
        env!("CARGO_MANIFEST_DIR")
    );
    for args in [
        vec!["bench-alloc"],
        vec!["doctor", snap.as_str()],
        vec!["models"],
        vec!["estimate", "--model", "mlp"],
    ] {
        let o = command(&args)
            .env("VRAMLAB_ALLOC_CONF", "bogus")
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("VRAMLAB_ALLOC_CONF") && err.contains("bogus"),
            "{args:?}: {err}"
        );
        assert!(o.stdout.is_empty(), "{args:?} did work first");
    }
    // vramlab's own options are settings too, not errors.
    let o = command(["models"])
        .env("VRAMLAB_ALLOC_CONF", "lookahead:True,small_from_large:True")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// From the second audit: a negative number reaches its flag's own check,
/// `plan` runs on its default model (gpt, the one with layouts), and a
/// strategy that ran out of memory shows no ratio that would compare a
/// workload with allocations missing.
#[test]
fn second_audit_flags_defaults_and_ratios() {
    let err = fails_cleanly([
        "plan",
        "--gpus",
        "8",
        "--memory",
        "80GiB",
        "--headroom",
        "-0.1",
    ]);
    assert!(err.contains("--headroom is a fraction"), "{err}");
    let v = json_of([
        "plan", "--gpus", "8", "--memory", "80GiB", "--top", "1", "--json",
    ]);
    assert!(v["layouts_fitting"].as_u64().unwrap() > 0, "{v}");
    let v = json_of(["bench-alloc", "--capacity", "64MiB", "--json"]);
    let (mut ooms, mut ran) = (0, 0);
    for w in v["workloads"].as_array().unwrap() {
        for r in w["results"].as_array().unwrap() {
            if r["oom"] == true {
                ooms += 1;
                assert!(
                    r["fragmentation"].is_null() && r["gap_to_planner"].is_null(),
                    "{r}"
                );
            } else {
                ran += 1;
                assert!(r["fragmentation"].as_f64().unwrap() >= 1.0, "{r}");
            }
        }
    }
    assert!(
        ooms > 0 && ran > 0,
        "{ooms} ran out of memory, {ran} did not"
    );
    // No workload run to its end: no mean of nothing.
    let v = json_of(["bench-alloc", "--capacity", "1MiB", "--json"]);
    for (name, g) in v["geomean_fragmentation"].as_object().unwrap() {
        assert!(g.is_null(), "{name}: {g}");
    }
    let o = vramlab([
        "sweep",
        "--model",
        "mlp",
        "--batch",
        "1,2",
        "--memory-limit",
        "5300KiB",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        out.contains("under the limit") && out.contains("out of memory"),
        "{out}"
    );
}

/// `models --json` lists parameter shapes only with --params, as the text
/// does, and in the state_dict's order; lesson ids take X1 as they take c7;
/// --only runs a lesson named twice once; --measure needs --report.
#[test]
fn models_params_and_lesson_ids_as_the_audit_found_them() {
    let plain = json_of(["models", "--json"]);
    assert!(plain[0].get("parameter_shapes").is_none(), "{}", plain[0]);
    let full = json_of(["models", "--params", "--json"]);
    let gpt = full
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "gpt")
        .unwrap();
    let names: Vec<&str> = gpt["parameter_shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(&names[..3], ["wte.weight", "wpe.weight", "h.0.ln_1.weight"]);
    assert_eq!(json_of(["lesson", "x1", "--json"])["id"], "X01");
    let dir = scratch("only-twice");
    let v = json_of([
        "lessons",
        "--report",
        dir.to_str().unwrap(),
        "--only",
        "C02,c2",
        "--json",
    ]);
    assert_eq!(v["lessons"].as_array().unwrap().len(), 1, "{v}");
    let err = fails_cleanly(["lessons", "--measure"]);
    assert!(err.contains("--report"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `doctor --at` past a shorter device's trace says it shows that device's
/// last operation (it did so silently); on a snapshot with no history it
/// is refused (it was ignored).
#[test]
fn doctor_at_says_where_it_stopped() {
    let f = |n: &str| {
        format!(
            "{}/tests/fixtures/snapshots/{n}.pickle",
            env!("CARGO_MANIFEST_DIR")
        )
    };
    let dir = std::env::temp_dir().join(format!("vramlab-outside-at-{}", std::process::id()));
    let uneven = crate::common::files::uneven_devices(&dir);
    let v = json_of([
        "doctor",
        uneven.to_str().unwrap(),
        "--at",
        "2",
        "--no-planner",
        "--json",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    let said: Vec<bool> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["advice"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a.as_str().unwrap().contains("past this device's trace"))
        })
        .collect();
    assert!(said.contains(&true) && said.contains(&false), "{said:?}");
    let err = fails_cleanly(["doctor", &f("state_only"), "--at", "0"]);
    assert!(err.contains("has none"), "{err}");
}

/// `doctor` given a JSON Lines trace says what it is and which command
/// reads it; `bench` refuses a size or model listed twice, as `sweep` does.
#[test]
fn doctor_names_a_trace_and_bench_refuses_repeats() {
    let f = format!(
        "{}/tests/fixtures/traces/double_free.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let err = fails_cleanly(["doctor", &f]);
    assert!(
        err.contains("JSON Lines trace, which `vramlab replay` reads"),
        "{err}"
    );
    // A JSON file that is not a trace (profile's snapshot.json) gets no
    // such hint.
    let dir = scratch("not-a-trace");
    let json = dir.join("snapshot.json");
    std::fs::write(&json, r#"{"event": 3, "segments": []}"#).unwrap();
    let err = fails_cleanly(["doctor", json.to_str().unwrap()]);
    assert!(!err.contains("replay"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    let err = fails_cleanly(["bench", "--sizes", "16,16"]);
    assert!(err.contains("--sizes 16 is given more than once"), "{err}");
    let err = fails_cleanly(["bench", "--models", "mlp,mlp"]);
    assert!(
        err.contains("--models mlp is given more than once"),
        "{err}"
    );
}

/// A ResNet-50 spec out of range names only what is wrong (it listed
/// `--depth … (got 50)` beside the resolution that failed).
#[test]
fn resnet50_sizes_name_only_what_is_wrong() {
    let err = fails_cleanly(["estimate", "--model", "resnet50", "--resolution", "8"]);
    assert!(err.contains("--resolution must be at least 32"), "{err}");
    assert!(!err.contains("--depth"), "{err}");
    let err = fails_cleanly([
        "estimate",
        "--model",
        "resnet50",
        "--depth",
        "34",
        "--resolution",
        "16",
    ]);
    assert!(
        err.contains("--depth must be 50, 101 or 152 (got 34)"),
        "{err}"
    );
    assert!(err.contains("(got 16)"), "{err}");
}

/// From an outside user's pass over `train`: a `--dump` file loads with
/// `--load` (its `param.` tensors), and going on from it is the next step
/// of one longer run; a `--dump` path that is a directory is refused
/// before training (it failed after, saying only "cannot write"); `--text`
/// beside `--data` is refused (it was ignored); a NaN loss names only the
/// files the run was given.
#[test]
fn train_dumps_reload_and_its_file_flags_say_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("vramlab-outside-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("d.safetensors");
    let d = dump.to_str().unwrap();
    let run = ["train", "--model", "mlp", "--optimizer", "sgd", "--json"];
    let loss = |v: &serde_json::Value, step: usize| v["steps"][step]["loss"].as_f64().unwrap();
    let two = json_of([&run[..], &["--steps", "2"]].concat());
    json_of([&run[..], &["--steps", "1", "--dump", d]].concat());
    let resumed = json_of([&run[..], &["--steps", "1", "--load", d]].concat());
    assert_eq!(loss(&resumed, 0), loss(&two, 1));
    let err = fails_cleanly([
        "train",
        "--model",
        "mlp",
        "--steps",
        "1",
        "--dump",
        dir.to_str().unwrap(),
    ]);
    assert!(err.contains("is a directory"), "{err}");
    let err = fails_cleanly([
        "train",
        "--model",
        "gpt",
        "--steps",
        "1",
        "--text",
        "README.md",
        "--data",
        d,
    ]);
    assert!(err.contains("give one of them"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// From the hostile-input pass: an output named as the input, or as
/// another output, is refused before anything is written (the trace was
/// overwritten, and a second read of it then failed; `--dump` and
/// `--record-trace` kept only the trace), and both files stay as they were.
#[test]
fn an_output_that_is_an_input_or_another_output_is_refused() {
    let dir = scratch("same-file");
    let trace = dir.join("t.jsonl");
    write_trace(&trace, 20);
    let before = std::fs::read(&trace).unwrap();
    let t = trace.to_str().unwrap();
    for flag in ["--export-snapshot", "--export-intervals"] {
        let err = fails_cleanly(["replay", t, flag, t]);
        assert!(err.contains("which this command reads"), "{err}");
    }
    let other = dir.join("o.out");
    let o = other.to_str().unwrap();
    let err = fails_cleanly(["replay", t, "--export-snapshot", o, "--export-intervals", o]);
    assert!(err.contains("both name"), "{err}");
    assert_eq!(std::fs::read(&trace).unwrap(), before);
    assert!(!other.exists());
    let err = fails_cleanly([
        "train",
        "--model",
        "mlp",
        "--batch",
        "2",
        "--steps",
        "1",
        "--dump",
        o,
        "--record-trace",
        o,
    ]);
    assert!(err.contains("--dump and --record-trace both name"), "{err}");
    assert!(!other.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// From the hostile-input pass: numbers past what a command can use are
/// refused naming the flag, before any work (10^8 GPT layers aborted the
/// process on the host; a denormal --tflops made every step time infinite;
/// --reps 2^64−1 ran forever; --momentum inf was taken by estimate, not by
/// train), and not even batch 1 fitting is an error, not "max batch 0".
#[test]
fn numbers_past_what_a_command_can_use_are_refused_naming_the_flag() {
    let err = fails_cleanly(["estimate", "--model", "gpt", "--layers", "100000000"]);
    assert!(
        err.contains("--layers 100000000") && err.contains("100000"),
        "{err}"
    );
    let err = fails_cleanly([
        "plan", "--model", "gpt", "--preset", "gpt2", "--gpus", "8", "--memory", "80GiB",
        "--tflops", "1e-320",
    ]);
    assert!(err.contains("--tflops 1e-320"), "{err}");
    let err = fails_cleanly([
        "max-batch",
        "--model",
        "mlp",
        "--memory-limit",
        "64MiB",
        "--max",
        "18446744073709551615",
    ]);
    assert!(
        err.contains("--max 18446744073709551615 is more than"),
        "{err}"
    );
    // Optimizer flags in inference mode would change nothing.
    let err = fails_cleanly([
        "estimate",
        "--model",
        "mlp",
        "--mode",
        "inference",
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
    ]);
    assert!(err.contains("--momentum sets the optimizer"), "{err}");
    let err = fails_cleanly(["bench", "--reps", "18446744073709551615"]);
    assert!(err.contains("--reps") && err.contains("10000"), "{err}");
    for cmd in [&["estimate"][..], &["sweep", "--batch", "1,2"]] {
        let sgd = ["--model", "mlp", "--optimizer", "sgd", "--momentum", "inf"];
        let err = fails_cleanly([cmd, &sgd].concat());
        assert!(
            err.contains("--momentum must be a finite number"),
            "{cmd:?}: {err}"
        );
    }
    let args = [
        "max-batch",
        "--model",
        "mlp",
        "--max",
        "4",
        "--memory-limit",
        "4MiB",
    ];
    let err = fails_cleanly(args);
    assert!(
        err.contains("not even batch 1 trains within 3.80 MiB"),
        "{err}"
    );
    let o = vramlab([&args[..], &["--json"]].concat());
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["max_batch"] == 0 && v["error"].as_str().unwrap().contains("not even batch 1"),
        "{v}"
    );
}

/// From the output-files pass, on a recording made under a memory limit
/// that ran out: `profile` prints its figures up to the refusal (text and
/// `--json` beside the error); `doctor` names the recorded limit and does
/// not say that no setting lowers the peak when one does; `replay
/// --alloc-conf` keeps the limit (it dropped it, so no replay ran out);
/// `replay --allocators all --out DIR` draws reserved.svg for a snapshot
/// too, with its lower bound in `--json`.
#[test]
fn a_recording_under_a_memory_limit_keeps_it_everywhere() {
    let dir = scratch("limit");
    let out = dir.join("p");
    let o = out.to_str().unwrap();
    let run = [
        "profile",
        "--model",
        "simple-cnn",
        "--batch",
        "4",
        "--steps",
        "2",
        "--memory-limit",
        "30MiB",
        "--out",
        o,
    ];
    let p = vramlab(run);
    assert_eq!(p.status.code(), Some(1), "{}", stderr(&p));
    assert!(
        stdout(&p).contains("events up to the refusal; peak allocated"),
        "{}",
        stdout(&p)
    );
    let p = vramlab([&run[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    assert!(
        v["peak_allocated_bytes"].as_u64().unwrap() > 0 && v["exit_code"] == 1,
        "{v}"
    );
    let snap = out.join("snapshot.pickle");
    let s = snap.to_str().unwrap();
    let text = stdout(&vramlab(["doctor", s]));
    assert!(text.contains("memory limit 30.00 MiB"), "{text}");
    assert!(
        !text.contains("None of the single changes tried lowers"),
        "{text}"
    );
    let v = json_of([
        "replay",
        s,
        "--alloc-conf",
        "max_split_size_mb:128",
        "--json",
    ]);
    assert_eq!(v["devices"][0]["replayed"]["ooms"], 1, "{v}");
    let svg = dir.join("svg");
    let v = json_of([
        "replay",
        s,
        "--allocators",
        "all",
        "--out",
        svg.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        v["devices"][0]["lower_bound_bytes"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(svg.join("reserved.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// From the hostile-input pass: a snapshot without a trace is read from its
/// segments alone, and segments no allocator could have held are errors
/// naming where (they printed "4.00 MiB free of 2.00 MiB", a 4 EiB request
/// against 2 MiB allocated, and totals that wrapped past 2^64 to 0), in
/// doctor and replay alike (replay once read them with its own parser,
/// which let all but the sizes through).
#[test]
fn segments_no_allocator_could_hold_are_refused() {
    let s = PyValue::str;
    let block = |size: i64, requested: i64| {
        PyValue::dict(vec![
            (s("size"), PyValue::Int(size)),
            (s("requested_size"), PyValue::Int(requested)),
            (s("state"), s("active_allocated")),
        ])
    };
    let segment = |address: i64, total: i64, blocks: Vec<PyValue>| {
        PyValue::dict(vec![
            (s("device"), PyValue::Int(0)),
            (s("address"), PyValue::Int(address)),
            (s("total_size"), PyValue::Int(total)),
            (s("segment_type"), s("large")),
            (s("blocks"), PyValue::list(blocks)),
        ])
    };
    let mib = 1i64 << 20;
    let big = 1i64 << 62;
    let dir = scratch("segments");
    let p = dir.join("s.pickle");
    for (segments, want) in [
        (
            vec![segment(0, 2 * mib, vec![block(4 * mib, 512)])],
            "segments[0].blocks[0]: the blocks so far hold 4194304 bytes, more than the segment's total_size 2097152",
        ),
        (
            vec![segment(0, 2 * mib, vec![block(2 * mib, big)])],
            "requested_size 4611686018427387904 is more than its size 2097152",
        ),
        (
            vec![segment(-4096, 2 * mib, vec![])],
            "segments[0]: address -4096 is negative",
        ),
        (
            vec![segment(0, 8 * mib, vec![]), segment(2 * mib, 8 * mib, vec![])],
            "segments[0] and segments[1]: they overlap",
        ),
        (
            vec![segment(0, big, vec![]), segment(big, big, vec![])],
            "device 0's segments hold more than 2^62 bytes",
        ),
        (vec![PyValue::Int(1)], "segments[0]: not a dict"),
    ] {
        // With a trace, so that replay reads the segments too: both
        // commands read them through one reader and refuse them alike.
        let alloc = PyValue::dict(vec![
            (s("action"), s("alloc")),
            (s("addr"), PyValue::Int(1 << 40)),
            (s("size"), PyValue::Int(512)),
        ]);
        let root = PyValue::dict(vec![
            (s("segments"), PyValue::list(segments)),
            (
                s("device_traces"),
                PyValue::list(vec![PyValue::list(vec![alloc])]),
            ),
        ]);
        std::fs::write(&p, pickle(&root)).unwrap();
        for command in ["doctor", "replay"] {
            let err = fails_cleanly([command, p.to_str().unwrap()]);
            assert!(
                err.contains(want) && err.contains("the snapshot is corrupt"),
                "{command}, want {want:?}:\n{err}"
            );
        }
    }
    // Segments that tile correctly are read.
    let ok = vec![
        segment(0, 2 * mib, vec![block(mib, 1000), block(mib, mib)]),
        segment(2 * mib, 2 * mib, vec![]),
    ];
    let root = PyValue::dict(vec![(s("segments"), PyValue::list(ok))]);
    std::fs::write(&p, pickle(&root)).unwrap();
    let v = json_of(["doctor", p.to_str().unwrap(), "--json"]);
    assert_eq!(
        v["devices"][0]["segments_at_snapshot"]["reserved_bytes"],
        4 * mib,
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// From the PyTorch-interop pass: a ResNet's `--dump` carries its running
/// statistics (`buffer.<name>`) and a run going on from it starts from
/// them; a state_dict with some running statistics but not all is refused
/// naming the missing one (it loaded, silently fresh); `--accumulate` with
/// `--data` says they do not go together (its message contradicted
/// itself); weights that disagree with `--data`'s input name the batch too.
#[test]
fn dumps_carry_running_statistics_and_partial_ones_are_refused() {
    use vramlab::io::SafeTensors;
    let dir = scratch("buffers");
    let dump = dir.join("d.safetensors");
    let d = dump.to_str().unwrap();
    let model = [
        "--model",
        "resnet50",
        "--width",
        "4",
        "--resolution",
        "32",
        "--classes",
        "5",
        "--batch",
        "2",
        "--steps",
        "1",
    ];
    succeeds([&["train"][..], &model, &["--dump", d]].concat());
    let st = SafeTensors::read(&dump).unwrap();
    let var = "buffer.layer1.0.bn1.running_var";
    let (values, _) = st.f32(var).unwrap();
    // One step of training moved them off the fresh 1.0.
    assert!(values.iter().any(|&v| v != 1.0), "{values:?}");
    let resumed = vramlab([
        "train",
        "--model",
        "resnet50",
        "--resolution",
        "32",
        "--batch",
        "2",
        "--steps",
        "1",
        "--load",
        d,
    ]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    // A state_dict missing one running_var.
    let mut w = SafeTensors::new();
    for (k, t) in &st.tensors {
        let name = k.strip_prefix("param.").or(k.strip_prefix("buffer."));
        if let Some(name) = name.filter(|n| *n != "layer1.0.bn1.running_var") {
            w.tensors.insert(name.to_string(), t.clone());
        }
    }
    let partial = dir.join("w.safetensors");
    w.write(&partial).unwrap();
    let p = partial.to_str().unwrap();
    let err = fails_cleanly([
        "train",
        "--model",
        "resnet50",
        "--resolution",
        "32",
        "--batch",
        "2",
        "--steps",
        "1",
        "--load",
        p,
    ]);
    assert!(
        err.contains("missing buffers") && err.contains("layer1.0.bn1.running_var"),
        "{err}"
    );
    // --accumulate with --data.
    let mut batch = SafeTensors::new();
    batch
        .insert_f32("x", &[4, 784], &vec![0.5; 4 * 784])
        .unwrap();
    batch.insert_i64("y", &[4], &[0, 1, 2, 3]).unwrap();
    let data = dir.join("b.safetensors");
    batch.write(&data).unwrap();
    let b = data.to_str().unwrap();
    let err = fails_cleanly(["train", "--model", "mlp", "--data", b, "--accumulate", "2"]);
    assert!(err.contains("--data's one batch is not cut"), "{err}");
    // mlp weights of input 784 against a batch of 20 features.
    let mlp = dir.join("mlp.safetensors");
    succeeds([
        "train",
        "--model",
        "mlp",
        "--batch",
        "2",
        "--steps",
        "1",
        "--dump",
        mlp.to_str().unwrap(),
    ]);
    let mut narrow = SafeTensors::new();
    narrow.insert_f32("x", &[2, 20], &[0.5; 40]).unwrap();
    narrow.insert_i64("y", &[2], &[0, 1]).unwrap();
    let n = dir.join("n.safetensors");
    narrow.write(&n).unwrap();
    let err = fails_cleanly([
        "train",
        "--model",
        "mlp",
        "--load",
        mlp.to_str().unwrap(),
        "--data",
        n.to_str().unwrap(),
    ]);
    assert!(
        err.contains("come from --data") && err.contains("[2, 20]"),
        "{err}"
    );
    // A layer missing from the middle of an mlp's state_dict (it read as a
    // shorter model, then named the later layer as unexpected).
    let dumped = SafeTensors::read(&mlp).unwrap();
    let mut gap = SafeTensors::new();
    for (k, t) in &dumped.tensors {
        if let Some(name) = k
            .strip_prefix("param.")
            .filter(|n| !n.starts_with("layers.1."))
        {
            gap.tensors.insert(name.to_string(), t.clone());
        }
    }
    let g = dir.join("gap.safetensors");
    gap.write(&g).unwrap();
    let err = fails_cleanly(["train", "--model", "mlp", "--load", g.to_str().unwrap()]);
    assert!(
        err.contains("layers.1.weight is missing, but layers.2 follows it"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// From the lessons pass: `lessons --report DIR` whose `lessons.json` was a
/// directory ran every lesson, wrote `index.html`, and then failed saying
/// "name a file instead" of a flag that takes a directory. Now the output
/// paths are checked first: nothing runs, nothing is written, and the
/// message names the path.
#[test]
fn a_report_that_cannot_be_written_is_refused_before_any_lesson_runs() {
    let dir = scratch("report");
    std::fs::create_dir_all(dir.join("lessons.json")).unwrap();
    let err = fails_cleanly(["lessons", "--report", dir.to_str().unwrap()]);
    assert!(
        err.contains("lessons.json is a directory") && !err.contains("[1/"),
        "{err}"
    );
    assert!(!dir.join("index.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// From the prediction pass: `estimate` under a limit the step cannot run
/// in printed only the out-of-memory message. It now also says what the
/// step needs without the limit, the figure an estimate is asked for,
/// equal to the unlimited estimate's.
#[test]
fn an_estimate_that_runs_out_says_what_the_step_needs() {
    let flags = ["--model", "simple-cnn", "--batch", "32"];
    let free = json_of([&["estimate", "--json"][..], &flags].concat());
    let need = |k: &str| free["estimate"][k].as_u64().unwrap() as f64 / 1048576.0;
    let err = fails_cleanly([&["estimate", "--memory-limit", "48MiB"][..], &flags].concat());
    let want = format!(
        "Without the limit the step needs {:.2} MiB allocated at its peak and {:.2} MiB reserved",
        need("peak_allocated_bytes"),
        need("peak_reserved_bytes")
    );
    assert!(
        err.contains("out of memory") && err.contains(&want),
        "{err}\nwant {want}"
    );
}

/// A full stdout (`> /dev/full`) panicked in `println!`; it is one line of
/// error and exit 1 now.
#[cfg(target_os = "linux")]
#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = command(["models"])
        .stdout(std::process::Stdio::from(full))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot write the output to stdout") && !err.contains("panicked"),
        "{err}"
    );
}

/// `bench` and `bench-alloc` flags found from outside: a product the
/// device cannot bind blamed a batch; --alloc-conf was named in the help
/// and did not exist; a strategy listed twice printed twice; a bad size
/// exited 1 where every refused flag exits 2; --amp with no model did
/// nothing.
#[test]
fn bench_flags_say_what_they_do() {
    let err = fails_cleanly([
        "bench",
        "--sizes",
        "512",
        "--models",
        "none",
        "--buffer-limit",
        "64KiB",
        "--reps",
        "1",
        "--no-precision",
    ]);
    assert!(
        err.contains("--sizes 512: the 512³ product") && err.contains("raise --buffer-limit"),
        "{err}"
    );
    let err = fails_cleanly(["bench", "--amp", "f16", "--models", "none"]);
    assert!(err.contains("--models none times no model"), "{err}");
    let err = fails_cleanly(["bench-alloc", "--allocators", "pytorch,pytorch"]);
    assert!(
        err.contains("--allocators pytorch is given more than once"),
        "{err}"
    );
    for args in [
        vec!["bench-alloc", "--capacity", "12XB"],
        vec!["doctor", "x.pickle", "--capacity", "-5"],
        vec!["replay", "x.jsonl", "--memory-limit", "abc"],
    ] {
        let o = vramlab(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    // The options change pytorch's rows, and the output says so.
    let run = |conf: Option<&str>| {
        let mut c = command(["bench-alloc", "--allocators", "pytorch", "--json"]);
        c.env_remove("VRAMLAB_ALLOC_CONF");
        if let Some(conf) = conf {
            c.args(["--alloc-conf", conf]);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let plain = run(None);
    let split = run(Some("expandable_segments:True"));
    assert!(plain["alloc_conf"].is_null());
    assert_eq!(
        split["alloc_conf"],
        serde_json::json!({"from": "--alloc-conf", "options": "expandable_segments:True"})
    );
    let reserved = |v: &serde_json::Value| -> Vec<u64> {
        v["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["results"][0]["peak_reserved_bytes"].as_u64().unwrap())
            .collect()
    };
    assert_ne!(reserved(&plain), reserved(&split));
}

/// `profile` and `train` outputs found from outside: a blocked output was
/// found after the whole run (a half-written directory, no figures); a
/// dump's write error lost the reason; an out-of-memory run wrote no trace;
/// profile's files at a refusal went on to the unwinding's frees.
#[test]
fn outputs_are_checked_first_and_a_refusal_keeps_what_led_to_it() {
    let dir = scratch("outputs-first");
    let out = dir.join("p");
    std::fs::create_dir_all(out.join("trace.json")).unwrap();
    let o = command([
        "profile", "--model", "mlp", "--batch", "2", "--steps", "1", "--out",
    ])
    .arg(&out)
    .output()
    .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("trace.json is a directory"), "{err}");
    assert!(!out.join("timeline.svg").exists() && !stdout(&o).contains("events"));
    #[cfg(target_os = "linux")]
    {
        // Nothing can be created in /proc: refused before step 1.
        let o = vramlab([
            "train",
            "--model",
            "mlp",
            "--batch",
            "2",
            "--steps",
            "1",
            "--dump",
            "/proc/vramlab-x.safetensors",
        ]);
        let err = stderr(&o);
        assert!(err.contains("cannot write there"), "{err}");
        assert!(!stdout(&o).contains("step   1"), "{}", stdout(&o));
        // A device is written in place; its error keeps the system's reason.
        let err = fails_cleanly([
            "train",
            "--model",
            "mlp",
            "--batch",
            "2",
            "--steps",
            "1",
            "--dump",
            "/dev/full",
        ]);
        assert!(err.contains("No space left on device"), "{err}");
    }
    // Out of memory: the trace up to the refusal is written and named.
    let trace = dir.join("t.jsonl");
    let o = command([
        "train",
        "--model",
        "simple-cnn",
        "--batch",
        "2",
        "--steps",
        "2",
        "--memory-limit",
        "24MiB",
        "--record-trace",
    ])
    .arg(&trace)
    .output()
    .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("up to the refusal, the refused one last, are in --record-trace"),
        "{err}"
    );
    // It ends with the refused request, so a replay under the run's limit
    // refuses that, and only that.
    let lines = std::fs::read_to_string(&trace).unwrap().lines().count();
    let v = json_of([
        "replay",
        trace.to_str().unwrap(),
        "--memory-limit",
        "24MiB",
        "--json",
    ]);
    let ooms = v["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1, "{v}");
    assert_eq!(ooms[0]["line"], lines, "{v}");
    // A trace holds no settings: train says what to replay it with.
    let t2 = dir.join("t2.jsonl");
    let out = succeeds([
        "train",
        "--model",
        "mlp",
        "--batch",
        "2",
        "--steps",
        "1",
        "--alloc-conf",
        "max_split_size_mb:64",
        "--record-trace",
        t2.to_str().unwrap(),
    ]);
    assert!(
        out.contains("replay it with --alloc-conf max_split_size_mb:64"),
        "{out}"
    );
    // Text that is mostly not ASCII is said to read as spaces.
    let cjk = dir.join("cjk.txt");
    std::fs::write(&cjk, "記憶".repeat(200)).unwrap();
    let o = command([
        "train", "--model", "gpt", "--steps", "1", "--batch", "2", "--json", "--text",
    ])
    .arg(&cjk)
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning: most of"), "{}", stderr(&o));
    // profile's snapshot ends at the refusal, its blocks still held.
    let p4 = dir.join("p4");
    let o = command([
        "profile",
        "--model",
        "simple-cnn",
        "--batch",
        "4",
        "--memory-limit",
        "30MiB",
        "--out",
    ])
    .arg(&p4)
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("of snapshot.pickle"), "{}", stdout(&o));
    let snap = vramlab::lab::pickle::unpickle(&std::fs::read(p4.join("snapshot.pickle")).unwrap())
        .unwrap();
    let trace = snap.get("device_traces").unwrap().as_list().unwrap()[0]
        .as_list()
        .unwrap();
    let last = trace
        .last()
        .unwrap()
        .get("action")
        .unwrap()
        .as_str()
        .unwrap();
    assert_eq!(last, "oom");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--load` and `--data` mistakes found from outside name the fix: a dump
/// of another model (six "no tensor named" lines, or a head count asked
/// for), an attention state_dict with PyTorch's key bias, an input of
/// another shape.
#[test]
fn load_and_data_mistakes_name_the_fix() {
    let dir = scratch("load-data");
    let dump = dir.join("mlp.safetensors");
    succeeds([
        "train",
        "--model",
        "mlp",
        "--batch",
        "2",
        "--steps",
        "1",
        "--dump",
        dump.to_str().unwrap(),
    ]);
    for model in ["simple-cnn", "gpt"] {
        let err = fails_cleanly(["train", "--model", model, "--load", dump.to_str().unwrap()]);
        assert!(
            err.contains("was dumped from mlp") && err.contains("pass --model mlp"),
            "{err}"
        );
    }
    // An attention state_dict with k_proj's bias, as nn.Linear makes it.
    let att = dir.join("att.safetensors");
    succeeds([
        "train",
        "--model",
        "attention",
        "--batch",
        "2",
        "--steps",
        "1",
        "--dump",
        att.to_str().unwrap(),
    ]);
    let st = vramlab::io::safetensors::SafeTensors::read(&att).unwrap();
    let mut sd = vramlab::io::safetensors::SafeTensors::new();
    for (name, t) in &st.tensors {
        if let Some(p) = name.strip_prefix("param.") {
            sd.tensors.insert(p.to_string(), t.clone());
        }
    }
    let dim = sd.tensors["attn.k_proj.weight"].shape[0];
    sd.insert_f32("attn.k_proj.bias", &[dim], &vec![0.0; dim])
        .unwrap();
    let biased = dir.join("biased.safetensors");
    sd.write(&biased).unwrap();
    let err = fails_cleanly([
        "train",
        "--model",
        "attention",
        "--load",
        biased.to_str().unwrap(),
    ]);
    assert!(err.contains("sd.pop('attn.k_proj.bias')"), "{err}");
    // simple-cnn takes 3×32×32 only.
    let mut data = vramlab::io::safetensors::SafeTensors::new();
    data.insert_f32("x", &[2, 3, 16, 16], &vec![0.5; 2 * 3 * 16 * 16])
        .unwrap();
    data.insert_i64("y", &[2], &[1, 2]).unwrap();
    let batch = dir.join("x16.safetensors");
    data.write(&batch).unwrap();
    let err = fails_cleanly([
        "train",
        "--model",
        "simple-cnn",
        "--data",
        batch.to_str().unwrap(),
    ]);
    assert!(
        err.contains("--data") && err.contains("takes samples of [3, 32, 32]"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--export-intervals /dev/stdout > FILE`: the file was opened a second
/// time from offset 0, so what the command printed after overwrote it (and
/// `>> log` lost the log). Written through the process's own stdout, both
/// are there, in order, after what the file held.
#[cfg(target_os = "linux")]
#[test]
fn dev_stdout_redirected_to_a_file_keeps_everything() {
    let dir = scratch("dev-stdout");
    let out = dir.join("out.txt");
    std::fs::write(&out, "earlier line\n").unwrap();
    let log = std::fs::OpenOptions::new().append(true).open(&out).unwrap();
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/traces/split_merge.jsonl"
    );
    let o = command(["replay", trace, "--export-intervals", "/dev/stdout"])
        .stdout(std::process::Stdio::from(log))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let intervals = text.find("id,lower,upper,size").expect(&text);
    let report = text.find("Replayed").expect(&text);
    assert!(
        text.starts_with("earlier line\n") && intervals < report,
        "{text}"
    );
    // A path ending in / names a directory: refused before the run.
    let err = fails_cleanly([
        "train", "--model", "mlp", "--steps", "1", "--dump", "nodir/",
    ]);
    assert!(err.contains("is a directory; name a file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
