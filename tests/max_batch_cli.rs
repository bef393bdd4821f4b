//! `vramlab max-batch` on the software driver with a small limit returns a
//! batch that trains while batch + 1 runs out of memory, and the process
//! keeps training after every out-of-memory.

use crate::common;
use crate::common::cli::succeeds;

#[test]
fn max_batch_trains_and_the_next_batch_runs_out_of_memory() {
    let v = common::vramlab_json([
        "max-batch",
        "--model",
        "mlp",
        "--widths",
        "128,256,10",
        "--memory-limit",
        "24MiB",
        "--json",
    ]);
    let max = v["max_batch"].as_u64().unwrap();
    assert!(max > 1, "{v}");
    let device: Vec<&serde_json::Value> = v["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["on"] == "device")
        .collect();
    let at = |b: u64| {
        device
            .iter()
            .find(|t| t["batch"] == b)
            .map(|t| t["fits"].as_bool().unwrap())
    };
    assert_eq!(at(max), Some(true), "max batch trained on the device");
    assert_eq!(at(max + 1), Some(false), "max + 1 ran out of memory");
    // A trial that trained came after an out-of-memory: the process recovered.
    let first_oom = device
        .iter()
        .position(|t| t["fits"] == false)
        .expect("an OOM trial");
    assert!(
        device[first_oom..].iter().any(|t| t["fits"] == true),
        "recovered after OOM"
    );
    // Within the effective limit.
    // The estimate is exact, so the device confirms it in two trials.
    assert_eq!(v["estimated_max_batch"], v["max_batch"], "{v}");
    assert_eq!(device.len(), 2, "{v}");
    let eff = v["effective_limit_bytes"].as_u64().unwrap();
    let fit = device.iter().find(|t| t["batch"] == max).unwrap();
    assert!(fit["peak_reserved_bytes"].as_u64().unwrap() <= eff);
    let by = v["by_allocator"].as_array().unwrap();
    assert_eq!(by.len(), vramlab::lab::strategies::NAMES.len());
    assert!(
        by.iter().any(|r| r.to_string().contains("expandable")),
        "{by:?}"
    );
}

/// A search capped by `--max` says so, and does not name a larger batch
/// that failed: none was tried.
#[test]
fn a_batch_capped_by_max_is_reported_as_capped() {
    let args = [
        "max-batch",
        "--model",
        "mlp",
        "--widths",
        "4,4,2",
        "--memory-limit",
        "64MiB",
        "--max",
        "10",
    ];
    let text = succeeds(args);
    assert!(
        text.contains("max batch 10 (capped by --max 10: larger batches were not tried)"),
        "{text}"
    );
    assert!(!text.contains("batch 11 did not fit"), "{text}");
    let v = common::vramlab_json(args.iter().chain(&["--json"]));
    assert_eq!(
        (v["max_batch"].as_u64(), v["max"].as_u64()),
        (Some(10), Some(10))
    );
    // The estimate said 10 fits: one trial on the device confirms it.
    let device: Vec<_> = v["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["on"] == "device")
        .collect();
    assert_eq!(device.len(), 1, "{v}");
    assert_eq!(
        (device[0]["batch"].as_u64(), device[0]["fits"].as_bool()),
        (Some(10), Some(true))
    );
}

/// Fitting is not monotone in the batch: under 38 MiB simple-cnn's first
/// step fits at 1, 2 and 7 but not 3–6 (a new 20 MiB segment at 3 that 7's
/// sizes avoid). Bisection answered 2; the batches past its answer are
/// tried too, by the estimator and by every allocator's row, and the
/// device confirms 7.
#[test]
fn a_larger_batch_past_one_that_does_not_fit_is_found() {
    let v = common::vramlab_json([
        "max-batch",
        "--memory-limit",
        "40MiB",
        "--steps",
        "1",
        "--json",
    ]);
    assert_eq!(v["estimated_max_batch"], 7, "{v}");
    assert_eq!(v["max_batch"], 7, "{v}");
    let pytorch = v["by_allocator"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["allocator"] == "pytorch")
        .unwrap();
    assert_eq!(pytorch["max_batch"], 7, "{v}");
    let fits = |b: u64| {
        v["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["batch"] == b && t["on"] == "estimate")
            .map(|t| t["fits"].as_bool().unwrap())
    };
    assert_eq!(fits(3), Some(false), "{v}");
}
