//! The docs cannot go stale: every ```console block in README.md and docs/
//! is run and its output compared. A block holds `$ vramlab ARGS` lines,
//! each followed by what the command prints on stdout. In the expected
//! text, `[..]` matches anything within a line (times, adapter names) and
//! a line `...` any number of lines; trailing spaces are ignored.

use crate::common::cli::{command, stderr, stdout};
use std::path::{Path, PathBuf};

struct Example {
    file: PathBuf,
    line: usize,
    args: Vec<String>,
    expected: Vec<String>,
}

fn examples() -> Vec<Example> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut in_block = false;
        for (n, line) in text.lines().enumerate() {
            if !in_block {
                in_block = line.trim_end() == "```console";
                continue;
            }
            if line.starts_with("```") {
                in_block = false;
            } else if let Some(cmd) = line.strip_prefix("$ ") {
                let mut words = cmd.split_whitespace().map(String::from);
                assert_eq!(
                    words.next().as_deref(),
                    Some("vramlab"),
                    "{}:{}: a console example runs vramlab",
                    file.display(),
                    n + 1
                );
                out.push(Example {
                    file: file.clone(),
                    line: n + 1,
                    args: words.collect(),
                    expected: Vec::new(),
                });
            } else if let Some(e) = out.last_mut() {
                e.expected.push(line.trim_end().to_string());
            }
        }
    }
    out
}

/// `line` matches `want`, where `[..]` in `want` matches any text.
fn matches(want: &str, line: &str) -> bool {
    let parts: Vec<&str> = want.split("[..]").collect();
    if parts.len() == 1 {
        return want == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// Where `printed` stops following `expected`, if it does.
fn compare(expected: &[String], printed: &[&str]) -> Result<(), String> {
    let mut at = 0;
    let mut skipping = false;
    for want in expected {
        if want == "..." {
            skipping = true;
            continue;
        }
        let found = printed[at..]
            .iter()
            .position(|l| matches(want, l.trim_end()));
        match found {
            Some(i) if i == 0 || skipping => at += i + 1,
            _ => {
                return Err(format!(
                    "expected next:\n  {want}\nprinted from there:\n{}",
                    printed[at..].join("\n")
                ))
            }
        }
        skipping = false;
    }
    if !skipping && at < printed.len() {
        return Err(format!(
            "printed more than the example shows (end it with `...` if that is meant):\n{}",
            printed[at..].join("\n")
        ));
    }
    Ok(())
}

#[test]
fn the_matcher_elides_what_it_should_and_nothing_else() {
    assert!(matches(
        "on [..] (vulkan)",
        "on llvmpipe (LLVM 15) (vulkan)"
    ));
    assert!(matches("step 1 ([..] s)", "step 1 (0.3 s)"));
    assert!(!matches("peak 8.52 MiB", "peak 8.53 MiB"));
    assert!(!matches("a [..] b [..] c", "a x c b"));
    let want = ["one".to_string(), "...".into(), "four".into()];
    assert!(compare(&want, &["one", "two", "three", "four"]).is_ok());
    assert!(compare(&want, &["one", "four", "five"]).is_err());
    assert!(compare(&want[..1], &["zero", "one"]).is_err());
}

#[test]
fn every_console_example_in_the_docs_prints_what_it_shows() {
    let all = examples();
    assert!(
        all.len() >= 5,
        "the docs keep their examples in ```console blocks"
    );
    let root = env!("CARGO_MANIFEST_DIR");
    let mut failures = Vec::new();
    for e in &all {
        let out = command(&e.args)
            .current_dir(root)
            .output()
            .expect("the vramlab binary runs");
        let printed = stdout(&out);
        let printed: Vec<&str> = printed.lines().collect();
        let result = if out.status.success() {
            compare(&e.expected, &printed)
        } else {
            Err(format!("exited with {}: {}", out.status, stderr(&out)))
        };
        if let Err(why) = result {
            failures.push(format!(
                "{}:{}: vramlab {}\n{why}",
                e.file.display(),
                e.line,
                e.args.join(" ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
