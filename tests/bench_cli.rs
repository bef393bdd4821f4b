//! `vramlab bench --json` on the test adapter: the square product, every
//! product shape of simple-cnn's step (the fc forward split along K, conv's
//! weight gradient summed over the batch, the convolutions implicit), and
//! the step's device time per phase summing to its total. Figures are not
//! judged here (speed lives in benchmarks); shapes, plans and bookkeeping are.

use crate::common;
use crate::common::cli::{command, fails_cleanly, stderr, stdout, vramlab};
use common::*;

#[test]
fn bench_reports_shapes_plans_and_device_time() {
    let r = vramlab_json([
        "bench",
        "--sizes",
        "48",
        "--models",
        "simple-cnn",
        "--batch",
        "16",
        "--reps",
        "1",
        "--json",
    ]);
    // Whether f16 products run on tensor cores (false on bookworm's lavapipe).
    assert!(r["tensor_cores"].is_boolean(), "{r}");
    // The host's cost per dispatch, recorded with the timer off.
    let o = &r["dispatch_overhead"];
    assert_eq!(o["count"], 200);
    let (record, submit, total) = (
        o["record_micros"].as_f64().unwrap(),
        o["submit_micros"].as_f64().unwrap(),
        o["total_micros"].as_f64().unwrap(),
    );
    assert!(
        record > 0.0 && submit > 0.0 && total >= record + submit,
        "{o}"
    );
    // The same one-element fill 200 times: its bind group is made at most
    // once and reused for every other dispatch.
    assert!(o["bind_groups_made"].as_u64().unwrap() <= 1, "{o}");
    assert!(o["bind_groups_reused"].as_u64().unwrap() >= 199, "{o}");
    assert!(o["readback_micros"].as_f64().unwrap() > 0.0, "{o}");
    assert!(o["round_trip_micros"].as_f64().unwrap() > 0.0, "{o}");
    let sq = &r["square"][0];
    assert_eq!(sq["n"], 48);
    assert!(sq["gflops"].as_f64().unwrap() > 0.0, "{sq}");
    let model = &r["models"][0];
    assert_eq!(model["model"], "simple-cnn");
    let shapes = model["shapes"].as_array().unwrap();
    let find = |op: &str, m: u64, n: u64| {
        shapes
            .iter()
            .find(|s| s["shape"]["op"] == op && s["shape"]["m"] == m && s["shape"]["n"] == n)
            .unwrap_or_else(|| panic!("no {op} {m}×{n} in {shapes:?}"))
    };
    // fc forward: 16×10 outputs over K = 100,352 → split K, narrow class.
    let fc = find("fc.forward", 16, 10);
    assert_eq!(fc["shape"]["k"], 100_352);
    assert!(fc["splits"].as_u64().unwrap() > 1, "{fc}");
    assert_eq!(fc["class"], "narrow");
    assert!(fc["transposed"].is_boolean(), "{fc}");
    // Every shape carries the time to write its output alone (K = 1) and
    // the share of the square rate that bound allows (timings are not
    // compared here).
    // The share is taken against the 1024³ square timed beside each shape
    // (whatever --sizes holds), rep by rep.
    for s in shapes {
        let floor = s["write_floor_seconds"].as_f64().unwrap();
        let ceiling = s["ceiling_of_square"].as_f64().unwrap();
        assert!(floor > 0.0 && ceiling > 0.0, "{s}");
        let square = s["square_gflops"].as_f64().unwrap();
        let share = s["of_square"].as_f64().unwrap();
        assert!(square > 0.0 && share > 0.0, "{s}");
        let gflops = s["gflops"].as_f64().unwrap();
        // The median of per-rep ratios: with one rep, exactly the ratio.
        assert!(
            (share - gflops / square).abs() <= 1e-9 * share.max(1.0),
            "{s}"
        );
    }
    // conv2's weight gradient: 128×576 summed over the 16 samples, implicit.
    let dw = find("conv2.backward", 128, 576);
    assert_eq!(dw["shape"]["reduce_batch"], true);
    assert_eq!(dw["shape"]["batch"], 16);
    assert_eq!(dw["shape"]["conv"]["transposed"], true);
    // conv2's forward reads im2col in place.
    let fwd = find("conv2.forward", 128, 784);
    assert_eq!(fwd["shape"]["conv"]["transposed"], false);
    // Device time: where the adapter has timestamps (lavapipe does), the
    // phases add up to the total and every op row names an op.
    if let Some(dt) = model["device_time"].as_object() {
        let total = dt["total_seconds"].as_f64().unwrap();
        let phases: f64 = dt["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["seconds"].as_f64().unwrap())
            .sum();
        assert!(
            total > 0.0 && (phases - total).abs() <= 1e-9 * total.max(1.0),
            "{dt:?}"
        );
        let names: Vec<&str> = dt["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["forward", "backward", "optimizer"]);
        assert!(dt["ops"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["name"] == "conv2.backward"));
        // The untimed step beside the timed one's device time: the host's
        // share is their difference, rep by rep (one rep here).
        let f = |k: &str| model[k].as_f64().unwrap_or_else(|| panic!("{k}"));
        let (untimed, device, host) = (
            f("untimed_seconds_median"),
            f("device_seconds_median"),
            f("host_seconds_median"),
        );
        assert!(untimed > 0.0 && device > 0.0, "{model}");
        assert!((host - (untimed - device)).abs() <= 1e-9, "{model}");
    } else {
        assert_eq!(r["products_timed_by"], "wall clock with a wait");
    }
}

/// `bench --amp f16` runs the model steps under autocast: the same
/// products as the f32 step, each counted once (a 16-bit output of odd
/// width takes an f32 workspace, the same product and not a second), timed
/// in f16 and on tensor cores where the adapter has them; the step's device
/// time names the casts and the f16 kernels.
#[test]
fn bench_times_the_model_steps_under_autocast() {
    let run = |amp: &[&str]| {
        let mut args = vec![
            "bench",
            "--sizes",
            "16",
            "--models",
            "simple-cnn",
            "--batch",
            "2",
            "--reps",
            "1",
            "--no-precision",
            "--json",
        ];
        args.extend_from_slice(amp);
        vramlab_json(args)
    };
    let (plain, amp) = (run(&[]), run(&["--amp", "f16"]));
    let (p, a) = (&plain["models"][0], &amp["models"][0]);
    assert!(p["amp"].is_null(), "{p}");
    assert_eq!(a["amp"], "f16");
    let products = |m: &serde_json::Value| {
        let mut v: Vec<String> = m["shapes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let x = &s["shape"];
                format!(
                    "{} {}x{}x{} batch {} summed {} ×{}",
                    x["op"], x["m"], x["n"], x["k"], x["batch"], x["reduce_batch"], s["count"]
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(products(p), products(a));
    // conv1's weight gradient (27 columns: odd) is one product.
    assert!(
        products(a)
            .iter()
            .any(|s| s.contains("\"conv1.backward\" 64x27x900") && s.ends_with("×1")),
        "{:?}",
        products(a)
    );
    // f16 products run on tensor cores where the adapter has them (Mesa
    // 26's lavapipe, NVIDIA), split along K or not; f32 ones never.
    let cores = amp["tensor_cores"] == true;
    for (m, f16) in [(p, false), (a, true)] {
        for s in m["shapes"].as_array().unwrap() {
            assert_eq!(s["tile"] == "tensor cores", f16 && cores, "{s}");
        }
    }
    let kernels = |m: &serde_json::Value| -> Vec<String> {
        m["device_time"]["kernels"]
            .as_array()
            .map(|ks| {
                ks.iter()
                    .map(|k| k["name"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    if amp["products_timed_by"] == "device timestamps" {
        let (kp, ka) = (kernels(p), kernels(a));
        assert!(ka.iter().any(|k| k.starts_with("cast[f32→f16]")), "{ka:?}");
        assert!(ka.iter().any(|k| k.contains("f16→")), "{ka:?}");
        assert!(!kp.iter().any(|k| k.contains("f16")), "{kp:?}");
    }
}

/// `info` names the adapter's cooperative-matrix shapes (none on
/// bookworm's lavapipe; 8×8×8 f16 under Mesa 26; 16×16×16 on NVIDIA) in text
/// and JSON alike.
#[test]
fn info_names_the_cooperative_matrices() {
    let r = vramlab_json(["info", "--json"]);
    let shapes = r["cooperative_matrices"].as_array().unwrap();
    let offered = r["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "experimental-cooperative-matrix");
    assert_eq!(offered, !shapes.is_empty(), "{r}");
    // Used exactly where the kernel's shape is offered (native f16 too).
    let used = r["tensor_cores_used"].as_bool().unwrap();
    let f16 = r["enabled_features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "shader-f16");
    assert_eq!(
        used,
        f16 && shapes
            .iter()
            .any(|s| s == "8×8×8 f16→f32" || s == "16×16×16 f16→f32"),
        "{r}"
    );
    for s in shapes {
        let s = s.as_str().unwrap();
        assert!(s.contains('×') && s.contains('→'), "{s}");
    }
    let o = vramlab(["info"]);
    let text = stdout(&o);
    assert!(
        text.contains("cooperative matrices (tensor cores):"),
        "{text}"
    );
}

/// A `--binding-window` or `--buffer-limit` the adapter cannot take as
/// given is said to be capped or rounded, with what was used; one it takes
/// gets no note.
#[test]
fn size_flags_the_adapter_rounds_or_caps_are_noted() {
    let r = vramlab_json([
        "info",
        "--binding-window",
        "1000",
        "--buffer-limit",
        "4096GiB",
        "--json",
    ]);
    let window = r["limits"]["binding_window"].as_u64().unwrap();
    assert!(window < 1000 && window % 16 == 0, "{r}");
    let notes: Vec<&str> = r["option_notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(notes.len(), 2, "{r}");
    assert!(
        notes[0].starts_with("--binding-window 1000 bytes: used ")
            && notes[0].contains(&format!("used {window} bytes")),
        "{notes:?}"
    );
    assert!(
        notes[1].starts_with("--buffer-limit 4096.00 GiB") && notes[1].contains("max_buffer_size"),
        "{notes:?}"
    );
    let r = vramlab_json(["info", "--binding-window", "64KiB", "--json"]);
    assert_eq!(r["limits"]["binding_window"], 65536, "{r}");
    assert_eq!(r["option_notes"].as_array().map(Vec::len), Some(0), "{r}");
    // Commands that run on the device say it on stderr.
    let out = vramlab([
        "bench",
        "--sizes",
        "16",
        "--models",
        "none",
        "--no-precision",
        "--reps",
        "1",
        "--binding-window",
        "1000",
    ]);
    assert!(out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("note: --binding-window 1000 bytes: used "),
        "{err}"
    );
}

#[test]
fn bench_refuses_bad_flags_before_measuring() {
    let out = vramlab(["bench", "--models", "nope"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("unknown model \"nope\"") && err.contains("simple-cnn"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing measured before the error");
    // `none` beside models was ignored.
    let out = vramlab(["bench", "--models", "none,mlp"]);
    assert!(!out.status.success() && out.stdout.is_empty());
    let err = stderr(&out);
    assert!(err.contains("--models none times no model"), "{err}");
}

/// `bench --json` names the split settings a run used, so that runs timed
/// with other values (scripts/device_bench.sh's `ab`) tell themselves apart.
#[test]
fn bench_names_the_split_settings_it_ran_with() {
    let run = |groups: Option<&str>| {
        let mut cmd = command([
            "bench",
            "--sizes",
            "16",
            "--models",
            "none",
            "--reps",
            "1",
            "--no-precision",
            "--json",
        ]);
        cmd.env_remove("VRAMLAB_SPLIT_GROUPS")
            .env_remove("VRAMLAB_SPLIT_MIN_K");
        if let Some(g) = groups {
            cmd.env("VRAMLAB_SPLIT_GROUPS", g);
        }
        json_of(cmd.output().unwrap())["split"].clone()
    };
    assert_eq!(run(None), serde_json::json!({"groups": 128, "min_k": 256}));
    assert_eq!(
        run(Some("512")),
        serde_json::json!({"groups": 512, "min_k": 256})
    );
}

/// Every setting read from the environment refuses a value it does not
/// take, before any work, and says what it takes.
#[test]
fn bad_settings_are_refused_with_what_they_take() {
    for (var, value, takes) in [
        ("VRAMLAB_SUBMIT_FIRST", "soon", "a number of commands"),
        (
            "VRAMLAB_LIST_OPS",
            "1",
            "auto (lists except on CPU adapters",
        ),
        (
            "VRAMLAB_BIND_GROUP_CACHE",
            "maybe",
            "0 (create one per dispatch)",
        ),
        ("VRAMLAB_TILE_FAMILY", "xyz", "gpu (the GPU tile family"),
        (
            "VRAMLAB_READBACK_REUSE",
            "yes",
            "0 (a new buffer each read)",
        ),
        ("VRAMLAB_TUNE", "sometimes", "auto, on or off"),
        ("VRAMLAB_COOP_TILE", "2x2", "WMxWN,TMxTN"),
        ("VRAMLAB_COOP_LOADS", "fast", "direct, staged or wide"),
        ("VRAMLAB_COOP_STAGE_DEPTH", "5", "1, 2, 3 or 4"),
        ("VRAMLAB_COOP_PREFETCH", "yes", "1 (read the next step"),
        ("VRAMLAB_COOP_BUFFERS", "3", "1 or 2 copies"),
        ("VRAMLAB_COOP_HALVES", "2", "two 8-byte loads of halves"),
        ("VRAMLAB_SPLIT_GROUPS", "0", "a whole number of at least 1"),
        (
            "VRAMLAB_SPLIT_MIN_K",
            "lots",
            "a whole number of at least 1",
        ),
    ] {
        let out = command(["info"]).env(var, value).output().unwrap();
        assert!(!out.status.success(), "{var}={value} was taken");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{var}=\"{value}\"")) && err.contains(takes),
            "{var}: {err}"
        );
    }
}

/// A square size the device cannot hold names the size and the flag to
/// change, not the allocator's advice about batches.
#[test]
fn a_square_size_past_the_device_names_the_flag() {
    let e = fails_cleanly([
        "bench",
        "--sizes",
        "1000000",
        "--models",
        "none",
        "--no-precision",
    ]);
    assert!(
        e.contains("--sizes 1000000") && e.contains("give smaller --sizes"),
        "{e}"
    );
}

/// Found from outside: a row counted every product of its shape but named
/// only the first op (attention's `q_proj.forward ×4` stood for the q, k,
/// v and out projections).
#[test]
fn a_shape_row_says_how_many_ops_it_stands_for() {
    let r = vramlab_json([
        "bench",
        "--sizes",
        "16",
        "--models",
        "attention",
        "--batch",
        "1",
        "--reps",
        "1",
        "--no-precision",
        "--json",
    ]);
    let shapes = r["models"][0]["shapes"].as_array().unwrap();
    let proj = shapes
        .iter()
        .find(|s| s["shape"]["op"] == "attn.q_proj.forward +3 ops")
        .unwrap_or_else(|| panic!("{shapes:?}"));
    assert_eq!(proj["count"], 4, "{proj}");
    // A shape only one op issues keeps the op's own name.
    assert!(
        shapes
            .iter()
            .any(|s| s["count"] == 1 && !s["shape"]["op"].as_str().unwrap().contains(" ops")),
        "{shapes:?}"
    );
}

/// `bench --amp f16 --optimizer-impl fused`: the step's Adam is fused and
/// takes GradScaler's flag on the device (its kernel's `found_inf`
/// variant runs, no foreach phase does), and the JSON names the
/// implementation.
#[test]
fn bench_times_the_fused_optimizer_step_under_autocast() {
    let v = vramlab_json(vec![
        "bench",
        "--sizes",
        "16",
        "--models",
        "mlp",
        "--batch",
        "2",
        "--reps",
        "1",
        "--no-precision",
        "--json",
        "--amp",
        "f16",
        "--optimizer-impl",
        "fused",
    ]);
    let m = &v["models"][0];
    assert_eq!(m["optimizer_impl"], "fused", "{m}");
    let kernels: Vec<&str> = m["device_time"]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert!(kernels.contains(&"adam[f32 found_inf]"), "{kernels:?}");
    assert!(
        !kernels.iter().any(|k| k.starts_with("adam_phases")),
        "{kernels:?}"
    );
}
