//! `vramlab lessons` / `lesson`: every claim of the documents has a lesson
//! whose verdict comes with measured figures; the report page loads in
//! headless Chromium with every section and plot drawn; `--measure` on the
//! GPU gives the simulated figures; bad ids are errors that list the ids.

mod common;
use common::*;
use std::process::Command;

/// The claims of CLAIMS.md (C25 is not used there; some are merged pairs).
const CLAIMS: [&str; 36] = [
    "C01", "C02", "C03", "C04", "C05", "C06", "C07", "C08", "C09", "C10", "C11", "C12", "C13",
    "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21", "C22", "C23", "C24", "C26", "C27",
    "C28", "C29", "C30", "C31", "C32", "C33", "C34", "C35", "C36", "C37",
];

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
    for c in CLAIMS {
        assert!(ids.iter().any(|i| i == c), "no lesson for {c}");
    }
    let dir = std::env::temp_dir().join(format!("vramlab-lessons-{}", std::process::id()));
    let all = vramlab_json(["lessons", "--report", dir.to_str().unwrap(), "--json"]);
    for l in all.as_array().unwrap() {
        let id = l["id"].as_str().unwrap();
        assert!(l.get("error").is_none(), "{id}: {l}");
        let verdict = l["verdict"].as_str().unwrap();
        assert!(
            ["holds", "wrong", "partly", "out_of_scope"].contains(&verdict),
            "{id}"
        );
        if verdict != "out_of_scope" && id != "C21" {
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
    assert_eq!(get("C18")["verdict"], "wrong", "bf16 is 2 bytes");
    assert_eq!(get("C15")["verdict"], "holds");

    // The page in headless Chromium: every section, every plot drawn.
    let dom = rendered_dom(&dir.join("index.html"));
    assert!(dom.contains(r#"data-plots="10""#), "ten plots");
    assert!(dir.join("lessons.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_lesson_on_the_gpu_gives_the_simulated_figures() {
    let sim = vramlab_json(["lesson", "C34", "--json"]);
    let gpu = vramlab_json(["lesson", "c34", "--measure", "--json"]);
    assert_eq!(sim["figures"], gpu["figures"]);
    assert_eq!(gpu["verdict"], "holds");
}

#[test]
fn an_unknown_lesson_lists_the_ids() {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(["lesson", "C99"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("C07") && e.contains("vramlab lessons"), "{e}");
}
