//! `vramlab sweep --json`: activation memory grows linearly with the batch
//! and about quadratically with resolution (resnet-mini) and sequence length
//! (attention), as the fits report; an out-of-memory point is recorded and
//! the sweep goes on.

use crate::common;
use crate::common::cli::{fails_cleanly, stderr, stdout, vramlab};
use serde_json::Value;

fn sweep(args: &[&str]) -> Value {
    let mut all = vec!["sweep"];
    all.extend(args);
    all.push("--json");
    common::vramlab_json(all)
}

#[test]
fn batch_sweep_of_simple_cnn_is_a_line() {
    let v = sweep(&["--model", "simple-cnn", "--batch", "8,16,32,64,128,256"]);
    let r2 = v["fit"]["r2"].as_f64().unwrap();
    assert!(r2 > 0.999, "R² {r2}");
    assert_eq!(v["points"].as_array().unwrap().len(), 6);
    // About 1.4 MiB per sample (saved ReLU outputs 0.6 MiB plus backward's temporaries).
    let slope = v["fit"]["slope"].as_f64().unwrap();
    assert!((1.0e6..2.0e6).contains(&slope), "slope {slope}");
}

/// Memory grows linearly in the batch, and the growing part's fit says so
/// from batch 1 on. Counting what was live at the step's peak (in the
/// optimizer at small batches, among Adam's parameter-sized temporaries)
/// fit attention's batches 1-16 an exponent of 1.31; counting weights'
/// gradients as the temporaries they are made as held simple-cnn's to 0.54.
#[test]
fn the_batch_exponent_is_one_from_batch_one() {
    for model in ["attention", "simple-cnn"] {
        let v = sweep(&["--model", model, "--batch", "1,2,4,8,16"]);
        let k = v["fit"]["exponent"].as_f64().unwrap();
        assert!((0.97..1.03).contains(&k), "{model}: batch exponent {k}");
    }
    // A tied head's second weight gradient (vocabulary × dim, whatever the
    // batch) is not part of what grows: with it the exponent was 0.30.
    let v = sweep(&[
        "--model",
        "gpt",
        "--dim",
        "256",
        "--vocab",
        "50257",
        "--seq-len",
        "16",
        "--batch",
        "1,2,4,8",
    ]);
    let k = v["fit"]["exponent"].as_f64().unwrap();
    assert!((0.97..1.03).contains(&k), "gpt: batch exponent {k}");
}

#[test]
fn resolution_and_sequence_length_grow_quadratically() {
    let r = sweep(&[
        "--model",
        "resnet-mini",
        "--batch",
        "4",
        "--resolution",
        "16,32,64,128",
    ]);
    let k = r["fit"]["exponent"].as_f64().unwrap();
    assert!((1.8..2.3).contains(&k), "resolution exponent {k}");
    let s = sweep(&[
        "--model",
        "attention",
        "--batch",
        "1",
        "--seq-len",
        "512,1024,2048,4096",
    ]);
    let k = s["fit"]["exponent"].as_f64().unwrap();
    assert!((1.7..2.2).contains(&k), "sequence exponent {k}");
}

#[test]
fn an_out_of_memory_point_is_recorded_and_the_sweep_goes_on() {
    let v = sweep(&[
        "--model",
        "mlp",
        "--widths",
        "64,256,10",
        "--batch",
        "8,512,16",
        "--measure",
        "--memory-limit",
        "3MiB",
    ]);
    let p = v["points"].as_array().unwrap();
    assert!(p[0]["measured_peak_bytes"].as_u64().is_some(), "{v}");
    assert_eq!(p[1]["oom"], true, "{v}");
    assert!(p[2]["measured_peak_bytes"].as_u64().is_some(), "{v}");
    // Estimated and measured agree where it ran.
    assert_eq!(p[0]["measured_peak_bytes"], p[0]["estimated_peak_bytes"]);
}

/// Under `--memory-limit`, a point whose step does not fit is recorded as
/// out of memory without `--measure` too (simulated under the limit),
/// beside its estimated demand.
#[test]
fn a_point_past_the_memory_limit_is_out_of_memory_without_measuring() {
    let v = crate::common::vramlab_json([
        "sweep",
        "--model",
        "simple-cnn",
        "--batch",
        "1,1000",
        "--memory-limit",
        "1GiB",
        "--json",
    ]);
    let points = v["points"].as_array().unwrap();
    assert!(points[0].get("oom").is_none(), "{v}");
    assert_eq!(points[1]["oom"], true, "{v}");
    assert!(
        points[1]["estimated_peak_bytes"].as_u64().unwrap() > 1 << 30,
        "{v}"
    );
}

/// A value listed twice is refused: a fit needs distinct points (three 2s
/// gave a line through one point, R² = 1).
#[test]
fn a_repeated_value_is_refused() {
    let err = fails_cleanly(["sweep", "--model", "mlp", "--batch", "2,4,2"]);
    assert!(err.contains("--batch 2 is given more than once"), "{err}");
}

/// Each point shows the peak reserved its out-of-memory verdict is about
/// beside the peak allocated (simple-cnn at batch 3 allocates less than at
/// 7 but reserves more than 38 MiB), and --capacity is the simulated
/// device's size as in `estimate`.
#[test]
fn a_point_shows_the_reserved_memory_its_verdict_is_about() {
    for flag in ["--memory-limit", "--capacity"] {
        let v = sweep(&["--batch", "3,7", flag, "38MiB"]);
        let p = v["points"].as_array().unwrap();
        let reserved = |i: usize| p[i]["estimated_reserved_bytes"].as_u64().unwrap();
        assert!(reserved(0) > 38 << 20 && p[0]["oom"] == true, "{flag}: {v}");
        assert!(
            reserved(1) <= 38 << 20 && p[1].get("oom").is_none(),
            "{flag}: {v}"
        );
        assert!(reserved(0) >= p[0]["estimated_peak_bytes"].as_u64().unwrap());
    }
    let o = vramlab(["sweep", "--batch", "3,7", "--memory-limit", "38MiB"]);
    let text = stdout(&o);
    assert!(text.contains("reserved (MiB)"), "{text}");
    // A measured point runs on the GPU, whose size --capacity is not.
    let o = vramlab(["sweep", "--batch", "3,7", "--measure", "--capacity", "1GiB"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--memory-limit"));
}

/// Each point is the estimate of as many steps as `--steps` gives: the
/// first step's by default, the peak over two with `--steps 2` (Adam's
/// state then live through forward and backward), and the JSON says which.
#[test]
fn each_point_is_the_estimate_of_the_steps_it_names() {
    for steps in ["1", "2"] {
        let v = sweep(&["--model", "simple-cnn", "--batch", "2,5", "--steps", steps]);
        assert_eq!(v["steps"].as_u64(), steps.parse().ok(), "{v}");
        // What the sweep holds fixed: the first point's step.
        assert_eq!(v["step"]["batch"], 2, "{v}");
        assert_eq!(v["step"]["optimizer"]["kind"], "adam", "{v}");
        assert!(v["memory_limit"].is_null(), "{v}");
        for p in v["points"].as_array().unwrap() {
            let batch = p["value"].to_string();
            let e = common::vramlab_json([
                "estimate",
                "--model",
                "simple-cnn",
                "--batch",
                &batch,
                "--steps",
                steps,
                "--json",
            ]);
            assert_eq!(
                p["estimated_peak_bytes"], e["estimate"]["peak_allocated_bytes"],
                "--steps {steps}, batch {batch}"
            );
            assert_eq!(
                p["estimated_reserved_bytes"], e["estimate"]["peak_reserved_bytes"],
                "--steps {steps}, batch {batch}"
            );
        }
    }
    // At batch 32 the second step peaks above the first, with Adam's
    // state live through its backward (at batch 2 the first step's peak,
    // in the optimizer, is the higher).
    let one = sweep(&["--model", "simple-cnn", "--batch", "16,32"]);
    let two = sweep(&["--model", "simple-cnn", "--batch", "16,32", "--steps", "2"]);
    assert!(
        two["points"][1]["estimated_peak_bytes"].as_u64()
            > one["points"][1]["estimated_peak_bytes"].as_u64()
    );
}
