//! `max-batch --record` and `sweep --record` on a recorder command: a
//! stand-in recorder (tests/fixtures/recorder/fake_recorder.py, no PyTorch)
//! whose step needs max(4 + 3·B, 12) MiB at batch B.

use crate::common::cli::{fails_cleanly, stderr, vramlab};
use crate::common::json_of;

const RECORD: &str = "python3 tests/fixtures/recorder/fake_recorder.py --batch {batch}";

#[test]
fn max_batch_searches_the_recorded_step_under_the_limit() {
    let out = vramlab([
        "max-batch",
        "--record",
        RECORD,
        "--capacity",
        "64MiB",
        "--margin",
        "0",
        "--json",
    ]);
    let v = json_of(out);
    let n = v["max_batch"].as_u64().unwrap();
    let probes = v["probes"].as_array().unwrap();
    let fits = |b: u64| {
        probes
            .iter()
            .find(|p| p["batch"].as_u64() == Some(b))
            .map(|p| p["fits"].as_bool().unwrap())
    };
    assert_eq!(fits(n), Some(true), "{v}");
    assert_eq!(fits(n + 1), Some(false), "{v}");
    // 4 + 3·B MiB of live bytes within 64 MiB: B ≤ 20, less what the
    // segments' rounding takes.
    assert!((10..=20).contains(&n), "max batch {n}");
    for p in probes {
        let b = p["batch"].as_u64().unwrap();
        let want = (4 + 3 * b).max(12) << 20;
        if p["fits"].as_bool().unwrap() {
            assert_eq!(p["peak_allocated_bytes"].as_u64(), Some(want), "batch {b}");
        }
    }
}

#[test]
fn sweep_fits_a_line_through_the_recorded_peaks() {
    let v = json_of(vramlab([
        "sweep", "--record", RECORD, "--batch", "4,8,16", "--json",
    ]));
    let slope = v["fit"]["slope"].as_f64().unwrap();
    assert!(
        (slope - 3.0 * 1048576.0).abs() < 1.0,
        "3 MiB per sample: {slope}"
    );
    assert!(v["fit"]["r2"].as_f64().unwrap() > 0.999999);
}

#[test]
fn a_recorder_that_fails_or_a_command_without_batch_is_an_error_that_says_so() {
    let out = vramlab(["sweep", "--record", "python3 x.py", "--batch", "1,2"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("has no {batch}"));
    let failing = format!("{RECORD} --fail");
    let err = fails_cleanly(["sweep", "--record", &failing, "--batch", "1,2"]);
    assert!(
        err.contains("the recorder failed for batch 1") && err.contains("failing as asked"),
        "{err}"
    );
    let out = vramlab([
        "max-batch",
        "--record",
        RECORD,
        "--width",
        "8",
        "--capacity",
        "1GiB",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--width sizes a zoo model"));
}

/// From the hostile-input pass: an interrupted `--record` search leaves no
/// recordings' folder behind (SIGTERM while the recorder ran left an empty
/// /tmp/vramlab-record-PID).
#[cfg(unix)]
#[test]
fn an_interrupted_search_removes_its_recordings_folder() {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};
    let mut command =
        crate::common::cli::command(["sweep", "--record", "sleep 30; : {batch}", "--batch", "1,2"]);
    // SAFETY: only async-signal-safe calls, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("vramlab-record-{}", child.id()));
    let t0 = Instant::now();
    while !dir.exists() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no folder made");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(!dir.exists(), "{} left behind", dir.display());
}
