//! Runs the exact planner on MiniMalloc's 11 "challenging" instances (each
//! fits in 1,048,576 bytes, the capacity in its file name; C fits in less)
//! and prints a table of arenas as ratios to 1 MiB.
//!
//! `cargo run --release -p vramlab-lab --example minimalloc -- [SECONDS]`
//! (the budget per instance; default 60). With `MINIMALLOC_PLANS=DIR` set,
//! each plan is also written to `DIR/<instance>.plan.csv`.
//!
//! `cargo run --release -p vramlab-lab --example minimalloc -- fit SECONDS
//! [NAMES] [CAPACITY]` asks MiniMalloc's own question instead: does each
//! instance (default all, e.g. `ADJ`) fit in CAPACITY bytes (default 1 MiB)?
//! It prints found / exhausted / timeout and the search nodes.

use std::path::Path;
use std::time::Duration;
use vramlab_lab::exact_planner::{arena_of, fit, greedy, plan, verify};
use vramlab_lab::intervals::parse_csv;

/// The capacity in the file names, which every instance fits.
const CAPACITY: u64 = 1 << 20;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("fit") {
        return fit_mode();
    }
    let secs: f64 = match std::env::args().nth(1) {
        None => 60.0,
        Some(a) => match a.parse() {
            Ok(s) if s > 0.0 => s,
            _ => {
                eprintln!("usage: minimalloc [SECONDS per instance, default 60]; got `{a}`");
                std::process::exit(2);
            }
        },
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minimalloc");
    println!("budget {secs} s per instance; ratios to 1048576 bytes (the capacity each instance is known to fit)");
    println!(
        "| instance | buffers | greedy / 1 MiB | exact / 1 MiB | exact (bytes) | lower bound / 1 MiB | optimal? | nodes | seconds |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---:|---:|");
    for name in "ABCDEFGHIJK".chars() {
        let path = dir.join(format!("{name}.{CAPACITY}.csv"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let intervals = parse_csv(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let g = arena_of(&intervals, &greedy(&intervals));
        let r = plan(&intervals, Duration::from_secs_f64(secs));
        let checked =
            verify(&intervals, &r.offsets).unwrap_or_else(|e| panic!("{name}: invalid plan: {e}"));
        assert_eq!(checked, r.arena);
        if let Some(out) = std::env::var_os("MINIMALLOC_PLANS") {
            // id,lower,upper,size,offset: MiniMalloc's solution format.
            let mut csv = String::from("id,lower,upper,size,offset\n");
            for (i, o) in intervals.iter().zip(&r.offsets) {
                csv.push_str(&format!(
                    "{},{},{},{},{o}\n",
                    i.id, i.lower, i.upper, i.size
                ));
            }
            let path = Path::new(&out).join(format!("{name}.plan.csv"));
            std::fs::write(&path, csv).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        let ratio = |x: u64| x as f64 / CAPACITY as f64;
        println!(
            "| {name} | {} | {:.4} | {:.4} | {} | {:.4} | {} | {} | {:.2} |",
            intervals.len(),
            ratio(g),
            ratio(r.arena),
            r.arena,
            ratio(r.lower_bound),
            if r.optimal { "yes" } else { "no" },
            r.nodes,
            r.elapsed.as_secs_f64()
        );
    }
}

/// `minimalloc fit SECONDS [NAMES] [CAPACITY]`: MiniMalloc's own question,
/// does each instance fit in CAPACITY (default 1 MiB)?
fn fit_mode() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(60.0);
    let names = args.get(3).cloned().unwrap_or_else(|| "ABCDEFGHIJK".into());
    let cap: u64 = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(CAPACITY);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minimalloc");
    for name in names.chars() {
        let path = dir.join(format!("{name}.{CAPACITY}.csv"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let intervals = parse_csv(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let t = std::time::Instant::now();
        let r = fit(&intervals, cap, Duration::from_secs_f64(secs));
        let outcome = match &r.offsets {
            Some(o) => {
                let a =
                    verify(&intervals, o).unwrap_or_else(|e| panic!("{name}: invalid plan: {e}"));
                format!("found, arena {a}")
            }
            None if r.exhausted => "exhausted".into(),
            None => "timeout".into(),
        };
        println!(
            "{name}: fit({cap}) {outcome}, {} nodes, {:.2} s",
            r.nodes,
            t.elapsed().as_secs_f64()
        );
    }
}
