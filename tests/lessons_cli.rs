//! `vramlab lessons` / `lesson`: every claim of the documents has a lesson
//! whose verdict comes with measured figures; the report page loads in
//! headless Chromium with every section and plot drawn; `--measure` on the
//! GPU gives the simulated figures; bad ids are errors that list the ids.

use crate::common;
use crate::common::cli::{fails_cleanly, stderr, vramlab};
use common::*;

/// The claim ids of the repository's docs/claims.md (the list the product
/// points its users to): each line `- C06/C28 (000, 002) claim...`.
fn claims_in_docs() -> Vec<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/claims.md"))
        .expect("docs/claims.md");
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("- C")
                .map(|l| ("C", l))
                .or_else(|| l.strip_prefix("- X").map(|l| ("X", l)))
        })
        .filter_map(|(p, l)| l.split_once(" (").map(|(ids, _)| format!("{p}{ids}")))
        .flat_map(|ids| ids.split('/').map(String::from).collect::<Vec<_>>())
        .collect()
}

#[test]
fn every_claim_has_a_lesson_with_a_measured_verdict() {
    let list = vramlab_json(["lessons", "--json"]);
    let ids: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| {
            l["id"]
                .as_str()
                .unwrap()
                .split('/')
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    let claims = claims_in_docs();
    // C01–C37 but C25, which the documents never used, and X01 beyond them.
    assert_eq!(
        claims.iter().filter(|c| c.starts_with('C')).count(),
        36,
        "{claims:?}"
    );
    assert!(claims.iter().any(|c| c == "X01"), "{claims:?}");
    for c in &claims {
        assert!(ids.iter().any(|i| i == c), "no lesson for {c}");
    }
    for i in &ids {
        assert!(
            claims.contains(i),
            "lesson {i} has no claim in docs/claims.md"
        );
    }
    let dir = std::env::temp_dir().join(format!("vramlab-lessons-{}", std::process::id()));
    let doc = vramlab_json(["lessons", "--report", dir.to_str().unwrap(), "--json"]);
    // One object whether or not every lesson ran: the page and the outcomes.
    assert!(
        doc["report"].as_str().unwrap().ends_with("index.html"),
        "{doc}"
    );
    assert!(doc.get("error").is_none(), "{doc}");
    let all = doc["lessons"].clone();
    for l in all.as_array().unwrap() {
        let id = l["id"].as_str().unwrap();
        assert!(l.get("error").is_none(), "{id}: {l}");
        let verdict = l["verdict"].as_str().unwrap();
        assert!(
            ["holds", "wrong", "partly", "out_of_scope"].contains(&verdict),
            "{id}"
        );
        if verdict != "out_of_scope" {
            assert!(
                !l["figures"].as_array().unwrap().is_empty(),
                "{id}: a verdict needs figures"
            );
        }
        if verdict == "wrong" || verdict == "partly" || verdict == "out_of_scope" {
            assert!(
                !l["detail"].as_str().unwrap().is_empty(),
                "{id}: say what is right"
            );
        }
    }
    // A few verdicts the figures must give.
    let get = |id: &str| {
        all.as_array()
            .unwrap()
            .iter()
            .find(|l| l["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(get("C04")["verdict"], "wrong");
    assert!((get("C04")["figures"][0]["value"].as_f64().unwrap() - 12.25).abs() < 1e-9);
    assert_eq!(get("C07")["verdict"], "wrong", "checkpointing is O(√n)");
    // bf16 is 2 bytes (wrong), autocast saves about half (right).
    let c18 = get("C18");
    assert_eq!(c18["verdict"], "partly", "{c18}");
    assert_eq!(c18["figures"][1]["value"].as_f64(), Some(2000.0), "{c18}");
    assert_eq!(get("C15")["verdict"], "holds");
    // A ReLU between two linears adds nothing held for backward; a GELU
    // adds its input (64 × 1024 f32).
    let c09 = get("C09");
    assert_eq!(c09["verdict"], "holds", "{c09}");
    assert_eq!(c09["figures"][1]["value"].as_f64(), Some(0.0), "{c09}");
    assert_eq!(c09["figures"][2]["value"].as_f64(), Some(256.0), "{c09}");
    // The fallback after an out-of-memory error, on the same device: the
    // refused batch's cache sends the smaller batch out of memory too,
    // until empty_cache() returns it.
    let c24 = get("C24/C36");
    let value = |l: &serde_json::Value, name: &str| {
        l["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"].as_str().unwrap().starts_with(name))
            .map(|f| f["value"].as_f64().unwrap())
    };
    assert_eq!(c24["verdict"], "partly", "{c24}");
    assert_eq!(value(&c24, "that batch again"), Some(0.0), "{c24}");
    assert_eq!(value(&c24, "after empty_cache()"), Some(1.0), "{c24}");
    assert!(value(&c24, "first batch refused").unwrap() > value(&c24, "largest batch").unwrap());
    // reset_peak_memory_stats brings the peak down to what is allocated.
    let c37 = get("C37");
    assert_eq!(c37["verdict"], "holds", "{c37}");
    assert_eq!(
        value(&c37, "max_memory_allocated after"),
        value(&c37, "memory_allocated")
    );
    // BatchNorm's eval is a value claim: simulated, it waits for a device.
    assert_eq!(get("C33")["verdict"], "out_of_scope");
    assert_eq!(get("C33")["needs_device"], true);
    // find_unused_parameters' map is bytes; DDP's buckets are what cost.
    let c21 = get("C21");
    assert_eq!(c21["verdict"], "wrong", "{c21}");
    assert!(
        c21["figures"][0]["value"].as_f64().unwrap() < 4096.0,
        "{c21}"
    );

    // The page in headless Chromium: every section, every plot drawn.
    let dom = rendered_dom(&dir.join("index.html"));
    assert!(dom.contains(r#"data-plots="12""#), "twelve plots");
    assert!(dir.join("lessons.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_lesson_on_the_gpu_gives_the_simulated_figures() {
    let sim = vramlab_json(["lesson", "C34", "--json"]);
    let gpu = vramlab_json(["lesson", "c34", "--measure", "--json"]);
    assert_eq!(sim["figures"], gpu["figures"]);
    assert_eq!(gpu["verdict"], "holds");
    // Each says where it ran.
    assert_eq!(gpu["ran_on"], "measured on the GPU");
    assert!(
        sim["ran_on"].as_str().unwrap().starts_with("simulated"),
        "{sim}"
    );
}

/// BatchNorm's eval output on the GPU is the running statistics'
/// normalisation, not the batch's: C33's verdict, which a simulated device
/// leaves to a measured run.
#[test]
fn batchnorm_in_eval_is_checked_on_the_gpu() {
    let gpu = vramlab_json(["lesson", "C33", "--measure", "--json"]);
    assert_eq!(gpu["verdict"], "holds", "{gpu}");
    assert!(gpu.get("needs_device").is_none(), "{gpu}");
    let figures = gpu["figures"].as_array().unwrap();
    assert!(figures[2]["value"].as_f64().unwrap() < 1e-5, "{gpu}");
    assert!(figures[3]["value"].as_f64().unwrap() > 1e-2, "{gpu}");
}

/// Device flags choose the GPU of --measure: without it they are refused,
/// and a bad --only id leaves no report directory behind.
#[test]
fn device_flags_without_measure_and_bad_ids_are_refused_before_anything_runs() {
    let e = fails_cleanly(["lesson", "C04", "--adapter", "nvidia"]);
    assert!(e.contains("--adapter") && e.contains("--measure"), "{e}");
    let dir = std::env::temp_dir().join(format!("vramlab-lessons-bad-{}", std::process::id()));
    let out = vramlab([
        "lessons",
        "--report",
        dir.to_str().unwrap(),
        "--only",
        "C99",
    ]);
    assert!(!out.status.success());
    assert!(!dir.exists(), "a refused run made {}", dir.display());
}

#[test]
fn an_unknown_lesson_lists_the_ids() {
    let e = fails_cleanly(["lesson", "C99"]);
    assert!(e.contains("C07") && e.contains("vramlab lessons"), "{e}");
}

/// `lessons --measure` runs every chosen lesson on the GPU and on the
/// simulated device: a lesson the adapter cannot run (C12 trains GPT-2-XL
/// at 1,024 tokens, more memory than a CI host has free, so lavapipe
/// refuses it up front) is reported with its reason and the simulated
/// verdict while the others still run, and the exit status says whether
/// every verdict agreed.
#[test]
fn measured_lessons_report_what_could_not_run_and_agree_otherwise() {
    let dir = std::env::temp_dir().join(format!("vramlab-lessons-gpu-{}", std::process::id()));
    let out = vramlab([
        "lessons",
        "--report",
        dir.to_str().unwrap(),
        "--measure",
        "--only",
        "C12,C34",
        "--json",
    ]);
    let stderr = stderr(&out);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("lessons.json")).unwrap()).unwrap();
    let lessons = json.as_array().unwrap();
    assert_eq!(lessons.len(), 2);
    let mut all_agree = true;
    for l in lessons {
        let id = l["id"].as_str().unwrap();
        let agrees = l["agrees_with_simulation"].as_bool().unwrap();
        assert!(l["simulated_verdict"].is_string(), "{id}: {l}");
        if !agrees {
            all_agree = false;
            let e = l["error"].as_str().unwrap_or("");
            assert!(e.contains("could not run on this adapter"), "{id}: {l}");
            assert!(stderr.contains(id), "{id}: {stderr}");
        }
    }
    // C34 (two models, small) runs anywhere, with the simulation's verdict.
    assert_eq!(lessons[1]["agrees_with_simulation"], true, "{}", lessons[1]);
    assert_eq!(out.status.success(), all_agree, "{stderr}");
    // stdout's JSON has the same shape whether or not every verdict agreed:
    // the outcomes, and on a failure what failed beside them.
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(&doc["lessons"], &json, "{doc}");
    if !all_agree {
        assert!(stderr.contains("1 of 2 lessons ran on the GPU"), "{stderr}");
        let error = doc["error"].as_str().unwrap_or("");
        assert!(error.contains("1 of 2 lessons ran on the GPU"), "{doc}");
    } else {
        assert!(doc.get("error").is_none(), "{doc}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lesson` takes every id `lessons` lists, whole (`C06/C28`) or by one of
/// its parts, in any case, with or without the C and the leading zero.
#[test]
fn lessons_are_found_by_the_ids_lessons_lists() {
    use vramlab::lessons::{catalog::LESSONS, find};
    for l in LESSONS.iter() {
        assert_eq!(find(l.id).map(|f| f.id), Some(l.id), "{}", l.id);
        assert_eq!(find(&l.id.to_lowercase()).map(|f| f.id), Some(l.id));
        for part in l.id.split('/') {
            assert_eq!(find(part).map(|f| f.id), Some(l.id), "{part}");
        }
    }
    assert_eq!(find("7").map(|l| l.id), find("C07").map(|l| l.id));
    assert_eq!(find("c6").map(|l| l.id), Some("C06/C28"));
    assert!(find("C06/C99").is_none() && find("nope").is_none());
}
