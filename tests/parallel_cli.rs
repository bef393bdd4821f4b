//! `estimate --dp/--zero/--tp/--pp` and `plan` from the command line: the
//! transformer they shard is the one the engine builds, the per-rank
//! figures equal the closed forms they print beside them, `plan`'s
//! shortened replays equal `estimate`'s whole ones, and impossible layouts
//! are errors that say what to change.

use crate::common::cli::{command, stderr, stdout, vramlab};
use crate::common::vramlab_json;

/// The parameters the layouts shard are the engine's GPT's, preset by
/// preset (vramlab's GPT splits q, k and v: 16 tensors a block).
#[test]
fn the_sharded_transformer_is_the_engines_gpt() {
    for name in ["tiny", "gpt2", "gpt2-medium", "7b", "70b", "175b"] {
        let spec = vramlab::nn::ModelSpec::from(vramlab::nn::GptSpec::preset(name).unwrap());
        let shapes = spec.parameter_shapes();
        let built: usize = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        let (model, _) = vramlab::cli::layout_args::transformer(&spec).unwrap();
        assert_eq!(model.params(), built as u64, "{name}");
        assert_eq!(shapes.len() as u64, 16 * model.layers + 4, "{name}");
    }
}

fn stderr_of(args: &[&str]) -> String {
    let out = vramlab(args);
    assert!(!out.status.success(), "{args:?} should fail");
    stderr(&out)
}

#[test]
fn a_rank_of_each_zero_stage_equals_the_papers_model_states() {
    for (flags, stage) in [
        (vec!["--dp", "8"], 0),
        (vec!["--dp", "8", "--zero", "1"], 1),
        (vec!["--dp", "8", "--zero", "2"], 2),
        (vec!["--dp", "8", "--zero", "3"], 3),
        (vec!["--dp", "8", "--fsdp"], 3),
    ] {
        let mut args = vec![
            "estimate", "--model", "gpt", "--preset", "gpt2", "--batch", "1", "--amp", "bf16",
            "--json",
        ];
        args.extend(flags);
        let v = vramlab_json(&args);
        let s = &v["stages"][0];
        assert_eq!(
            s["model_states"].as_f64().unwrap(),
            s["zero_paper_model_states"].as_f64().unwrap(),
            "stage {stage}: {s}"
        );
        assert_eq!(v["layout"]["precision"], "mixed");
    }
}

#[test]
fn plans_fit_and_their_figures_are_estimates_per_rank() {
    let v = vramlab_json([
        "plan",
        "--model",
        "gpt",
        "--preset",
        "gpt2-xl",
        "--gpus",
        "16",
        "--memory",
        "24GiB",
        "--global-batch",
        "64",
        "--top",
        "3",
        "--json",
    ]);
    assert!(v["layouts_fitting"].as_u64().unwrap() > 0, "{v}");
    let limit = 24.0 * (1u64 << 30) as f64 * 0.9;
    for c in v["layouts"].as_array().unwrap() {
        let l = &c["layout"];
        let dims = ["dp", "tp", "pp"].map(|k| l[k].as_u64().unwrap());
        assert_eq!(dims.iter().product::<u64>(), 16);
        assert!(c["fits"].as_bool().unwrap());
        let worst = c["worst"]["peak_reserved"].as_f64().unwrap();
        assert!(worst <= limit);
        // The same layout through `estimate`: every stage's whole program.
        let sharding = match &l["sharding"] {
            serde_json::Value::String(s) if s == "ddp" => vec![],
            serde_json::Value::String(s) if s == "fsdp" => vec!["--fsdp".to_string()],
            other => vec!["--zero".to_string(), other["zero"].to_string()],
        };
        let recompute = l["recompute"].as_str().unwrap().to_lowercase();
        let mut args: Vec<String> = [
            "estimate",
            "--model",
            "gpt",
            "--preset",
            "gpt2-xl",
            "--amp",
            "bf16",
            "--json",
            "--recompute",
            &recompute,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (flag, key) in [
            ("--batch", "micro_batch"),
            ("--dp", "dp"),
            ("--tp", "tp"),
            ("--pp", "pp"),
            ("--microbatches", "microbatches"),
        ] {
            args.push(flag.into());
            args.push(l[key].to_string());
        }
        if l["sp"].as_bool().unwrap() {
            args.push("--sp".into());
        }
        args.extend(sharding);
        let e = vramlab_json(&args);
        let most = e["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["peak_reserved"].as_f64().unwrap())
            .fold(0.0, f64::max);
        assert_eq!(most, worst, "{args:?}");
    }
}

#[test]
fn impossible_layouts_say_what_to_change() {
    let e = stderr_of(&["estimate", "--model", "simple-cnn", "--dp", "2"]);
    assert!(e.contains("--model gpt"), "{e}");
    let e = stderr_of(&[
        "estimate", "--model", "gpt", "--preset", "gpt2", "--zero", "2",
    ]);
    assert!(e.contains("--dp of 2 or more"), "{e}");
    let e = stderr_of(&[
        "estimate", "--model", "gpt", "--preset", "gpt2", "--tp", "5",
    ]);
    assert!(e.contains("divisor"), "{e}");
    let e = stderr_of(&[
        "estimate",
        "--model",
        "gpt",
        "--preset",
        "gpt2",
        "--dp",
        "2",
        "--optimizer",
        "sgd",
    ]);
    assert!(e.contains("adam"), "{e}");
    let e = stderr_of(&["plan", "--model", "gpt", "--gpus", "8", "--memory", "lots"]);
    assert!(e.contains("lots"), "{e}");
}

/// The `estimate` command `plan` prints for its first layout carries every
/// flag that changes the figures (here --flash-attention and --seq-len),
/// so it replays the same peak.
#[test]
fn plans_first_layout_command_replays_its_figures() {
    let args = [
        "plan",
        "--model",
        "gpt",
        "--preset",
        "gpt2",
        "--gpus",
        "8",
        "--memory",
        "80GiB",
        "--flash-attention",
        "--seq-len",
        "512",
        "--top",
        "1",
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v = vramlab_json(&json_args);
    let worst = v["layouts"][0]["worst"]["peak_reserved"].as_f64().unwrap();
    let out = vramlab(args);
    let text = stdout(&out);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("The first, rank by rank: vramlab "))
        .expect(&text);
    assert!(
        line.contains("--flash-attention") && line.contains("--seq-len 512"),
        "{line}"
    );
    let mut e: Vec<&str> = line.split_whitespace().collect();
    e.push("--json");
    let est = vramlab_json(&e);
    let most = est["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["peak_reserved"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(most, worst, "{line}");
}

/// An allocator limit under --memory (--memory-limit) bounds what fits: a
/// layout whose replay ran out of memory under it is not listed as fitting
/// (it was, with the peak at the point where it stopped).
#[test]
fn plans_under_a_memory_limit_fit_only_what_replays_whole() {
    let plan = |limit: &str| {
        vramlab([
            "plan",
            "--model",
            "gpt",
            "--preset",
            "gpt2",
            "--gpus",
            "8",
            "--memory",
            "80GiB",
            "--memory-limit",
            limit,
            "--top",
            "3",
            "--json",
        ])
    };
    // Under 256 MiB every layout's replay runs out of memory: the closest
    // are listed, and the command fails so that a script can tell.
    let out = plan("256MiB");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["layouts_fitting"], 0, "{v}");
    assert_eq!(v["exit_code"], 1, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("no layout of 8 GPUs fits"),
        "{v}"
    );
    for c in v["layouts"].as_array().unwrap() {
        assert_eq!(c["fits"], false, "{c}");
        assert!(c["worst"]["oom"].is_string(), "{c}");
    }
    // Under 1 GiB some do (micro-batch 1), and what is left is counted
    // from that limit, not from --memory.
    let v = crate::common::cli::json_of(plan("1GiB"));
    assert!(v["layouts_fitting"].as_u64().unwrap() > 0, "{v}");
    for c in v["layouts"].as_array().unwrap() {
        let (fits, left) = (
            c["fits"].as_bool().unwrap(),
            c["memory_left"].as_i64().unwrap(),
        );
        assert_eq!(fits, c["worst"]["oom"].is_null() && left >= 0, "{c}");
        assert!(left < 1 << 30, "{c}");
    }
}

/// Flags a layout's estimate would ignore, or that contradict each other,
/// are refused with what to do (they ran with the default figures).
#[test]
fn layout_flags_it_would_ignore_are_refused() {
    let bad = |extra: &[&str], want: &str| {
        let mut args = vec!["estimate", "--model", "gpt"];
        args.extend_from_slice(extra);
        let o = vramlab(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    bad(&["--dp", "2", "--loss", "chunked"], "--loss is for one GPU");
    // The optimizer step follows the precision: foreach in fp32, fused
    // with mixed precision (docs/parallel.md); the other is refused.
    bad(
        &["--dp", "2", "--optimizer-impl", "fused"],
        "in fp32 a parallel layout's ranks run PyTorch's foreach Adam",
    );
    bad(
        &["--dp", "2", "--amp", "bf16", "--optimizer-impl", "foreach"],
        "with mixed precision a parallel layout's ranks run a fused Adam",
    );
    bad(
        &["--dp", "2", "--optimizer-impl", "for-loop"],
        "or give foreach",
    );
    bad(
        &[
            "--dp",
            "2",
            "--mode",
            "checkpoint",
            "--recompute",
            "selective",
        ],
        "give one of them",
    );
    bad(
        &["--dp", "2", "--zero", "3", "--find-unused"],
        "which ZeRO-3 does not use",
    );
    bad(
        &["--tp", "2", "--bucket-view"],
        "a single data-parallel rank",
    );
    bad(
        &["--dp", "2", "--weight-decay", "0.1"],
        "without --weight-decay",
    );
    bad(&["--dp", "2", "--weight-decay", "-1"], "--weight-decay");
    // What agrees is accepted: checkpoint with full, DDP's options on DDP,
    // the optimizer each precision runs.
    for ok in [
        vec!["--dp", "2", "--mode", "checkpoint", "--recompute", "full"],
        vec!["--dp", "2", "--optimizer-impl", "foreach"],
        vec!["--dp", "2", "--amp", "bf16", "--optimizer-impl", "fused"],
        vec![
            "--dp",
            "2",
            "--find-unused",
            "--bucket-view",
            "--bucket-cap-mb",
            "10",
        ],
    ] {
        let mut args = vec!["estimate", "--model", "gpt", "--json"];
        args.extend(ok);
        vramlab_json(args);
    }
}

/// A layout one of whose stages runs out of memory does not fit, even when
/// another stage peaked higher before it (a stage that stopped early has
/// the lower peak): pp 2 × micro-batch 2 below, whose stage 1 is refused
/// its logits' gradient under 200 MiB, as `estimate` of it says.
#[test]
fn a_layout_with_any_stage_out_of_memory_does_not_fit() {
    let v = vramlab_json([
        "plan",
        "--vocab",
        "16000",
        "--layers",
        "24",
        "--seq-len",
        "256",
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--memory",
        "1GiB",
        "--memory-limit",
        "200MiB",
        "--fp32",
        "--recompute",
        "none",
        "--top",
        "100",
        "--json",
    ]);
    let layouts = v["layouts"].as_array().unwrap();
    let pp2 = layouts
        .iter()
        .find(|c| {
            let l = &c["layout"];
            l["pp"] == 2
                && l["micro_batch"] == 2
                && l["microbatches"] == 4
                && l["sharding"] == "ddp"
        })
        .expect("the layout is listed");
    assert_eq!(pp2["fits"], false, "{pp2}");
    assert!(pp2["worst"]["oom"].is_string(), "{pp2}");
    // Every layout that fits replayed every stage whole.
    for c in layouts.iter().filter(|c| c["fits"] == true) {
        assert!(c["worst"]["oom"].is_null() && c["whole"] == true, "{c}");
    }
    let e = command([
        "estimate", "--model", "gpt", "--vocab", "16000", "--layers", "24",
    ])
    .args([
        "--seq-len",
        "256",
        "--batch",
        "2",
        "--pp",
        "2",
        "--microbatches",
        "4",
    ])
    .args(["--recompute", "none", "--memory-limit", "200MiB"])
    .output()
    .unwrap();
    assert!(stdout(&e).contains("OUT OF MEMORY on stage 1"));
}

/// A stage out of memory fails `estimate` of a layout as it fails one
/// GPU's (exit 1, the error in the JSON beside the figures), and the JSON
/// carries the verdict the text prints.
#[test]
fn a_layout_out_of_memory_fails_its_estimate() {
    let args = [
        "estimate",
        "--model",
        "gpt",
        "--preset",
        "gpt2",
        "--batch",
        "8",
        "--dp",
        "2",
        "--memory-limit",
        "1GiB",
    ];
    let o = vramlab(args);
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("runs out of memory"), "{out}");
    assert!(
        err.contains("stage 0 of the layout runs out of memory"),
        "{err}"
    );
    let o = command(args).arg("--json").output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("out of memory"),
        "{v}"
    );
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["fits"], false);
    assert!(v["memory_left"].is_null() && v["stages"][0]["oom"].is_string());
}

/// `estimate`'s fit verdict says the headroom it takes (none unless
/// --headroom), and with plan's it agrees with plan: dp1/tp2/pp4 DDP
/// selective 1×64 fits 1 GiB whole, not 90% of it.
#[test]
fn estimates_verdict_takes_plans_headroom_when_asked() {
    let est = |extra: &[&'static str]| {
        let mut a = vec![
            "estimate",
            "--model",
            "gpt",
            "--preset",
            "gpt2",
            "--batch",
            "1",
            "--microbatches",
            "64",
            "--tp",
            "2",
            "--sp",
            "--pp",
            "4",
            "--recompute",
            "selective",
            "--amp",
            "bf16",
            "--capacity",
            "1GiB",
        ];
        a.extend_from_slice(extra);
        a
    };
    let text = vramlab(est(&[]));
    let text = stdout(&text);
    assert!(
        text.contains("On 1.00 GiB a GPU, no headroom") && text.contains(": fits, "),
        "{text}"
    );
    let whole = vramlab_json(est(&["--json"]));
    assert_eq!(whole["fits"], true, "{whole}");
    assert_eq!(whole["headroom"], 0.0);
    let worst = whole["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["peak_reserved"].as_i64().unwrap())
        .max()
        .unwrap();
    assert_eq!(whole["memory_left"].as_i64().unwrap(), (1 << 30) - worst);
    let tenth = vramlab_json(est(&["--headroom", "0.1", "--json"]));
    assert_eq!(tenth["fits"], false, "{tenth}");
    let left = tenth["memory_left"].as_i64().unwrap();
    assert!(left < 0, "{tenth}");
    // plan's figure for the same layout is the same.
    let plan = vramlab_json([
        "plan",
        "--preset",
        "gpt2",
        "--gpus",
        "8",
        "--memory",
        "1GiB",
        "--global-batch",
        "64",
        "--top",
        "400",
        "--json",
    ]);
    let c = plan["layouts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            let l = &c["layout"];
            l["dp"] == 1
                && l["tp"] == 2
                && l["pp"] == 4
                && l["recompute"] == "selective"
                && l["micro_batch"] == 1
        })
        .expect("listed");
    assert_eq!(c["fits"], false);
    assert_eq!(c["memory_left"].as_i64().unwrap(), left);
    // --headroom is a fraction of --capacity, and a layout's.
    let e = stderr_of(&[
        "estimate",
        "--model",
        "gpt",
        "--dp",
        "2",
        "--headroom",
        "0.1",
    ]);
    assert!(e.contains("add --capacity"), "{e}");
    let e = stderr_of(&["estimate", "--model", "gpt", "--headroom", "0.1"]);
    assert!(e.contains("--memory-limit"), "{e}");
}

/// plan names the cap on micro-batches (layer passes) when it leaves no
/// layout, instead of a divisibility rule the batch met, and counts the
/// layouts it skipped when it leaves some.
#[test]
fn plan_names_the_layer_pass_cap_and_counts_what_it_skipped() {
    // The tiny preset: 2 layers, so at most 100,000 micro-batches a rank.
    let e = stderr_of(&[
        "plan",
        "--gpus",
        "1",
        "--memory",
        "1GiB",
        "--global-batch",
        "1600000",
        "--recompute",
        "none",
    ]);
    assert!(
        e.contains("200,000") && e.contains("at most 800,000") && !e.contains("multiple"),
        "{e}"
    );
    let args = [
        "plan",
        "--gpus",
        "1",
        "--memory",
        "1GiB",
        "--global-batch",
        "800000",
        "--recompute",
        "none",
    ];
    let mut json = args.to_vec();
    json.push("--json");
    let v = vramlab_json(json);
    assert_eq!(v["layouts_skipped_past_layer_passes"], 3, "{v}");
    assert_eq!(v["layouts_evaluated"], 1, "{v}");
    let o = vramlab(args);
    let text = stdout(&o);
    assert!(text.contains("3 layouts skipped, not evaluated"), "{text}");
}

/// The layouts listed past those that fit are marked as not fitting, and
/// the memory limit that decided the fits is in the header and the JSON.
#[test]
fn plan_marks_what_does_not_fit_and_the_limit_it_fit_under() {
    let o = vramlab([
        "plan",
        "--preset",
        "gpt2",
        "--gpus",
        "1",
        "--memory",
        "8GiB",
        "--global-batch",
        "64",
        "--top",
        "20",
    ]);
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    let mark = lines
        .iter()
        .position(|l| *l == "(these do not fit; the closest:)")
        .expect(&text);
    // Every row after the mark is short of memory, none before it (one
    // GPU: no "(stage N)" after the peak).
    let left = |l: &str| -> f64 { l.split_whitespace().nth(7).unwrap().parse().unwrap() };
    let header = lines.iter().position(|l| l.contains("left GiB")).unwrap();
    assert!(
        lines[header + 1..mark].iter().all(|l| left(l) >= 0.0),
        "{text}"
    );
    assert!(left(lines[mark + 1]) < 0.0, "{text}");
    let plan = |limit: Option<&'static str>| {
        let mut a = vec![
            "plan",
            "--preset",
            "gpt2",
            "--gpus",
            "8",
            "--memory",
            "80GiB",
            "--global-batch",
            "64",
            "--top",
            "1",
        ];
        if let Some(l) = limit {
            a.extend(["--memory-limit", l]);
        }
        a
    };
    let mut json = plan(Some("1GiB"));
    json.push("--json");
    assert_eq!(vramlab_json(json)["memory_limit"], 1u64 << 30);
    let mut json = plan(None);
    json.push("--json");
    assert!(vramlab_json(json)["memory_limit"].is_null());
    let o = vramlab(plan(Some("1GiB")));
    let text = stdout(&o);
    assert!(
        text.lines()
            .next()
            .unwrap()
            .contains("(10% headroom, --memory-limit 1.00 GiB)"),
        "{text}"
    );
}

/// --capacity is the simulated device's size wherever a command runs on
/// one; plan, whose GPU size is --memory, refuses it instead of ignoring it.
#[test]
fn capacity_is_the_device_size_or_refused() {
    let e = stderr_of(&[
        "plan",
        "--preset",
        "gpt2",
        "--gpus",
        "8",
        "--memory",
        "16GiB",
        "--capacity",
        "1GiB",
    ]);
    assert!(e.contains("--memory"), "{e}");
    // simple-cnn at batch 64 reserves 118 MiB: not on a 10 MiB device.
    let e = stderr_of(&["estimate", "--batch", "64", "--capacity", "10MiB"]);
    assert!(
        e.contains("out of memory") && e.contains("10.00 MiB"),
        "{e}"
    );
    vramlab_json(["estimate", "--batch", "64", "--capacity", "1GiB", "--json"]);
}
