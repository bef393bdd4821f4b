//! `vramlab lessons` lists every claim of the documents with its lesson
//! (and with `--report DIR` runs them all into one HTML page);
//! `vramlab lesson ID` runs one: the claim, the experiment, the measured
//! figures, the verdict and why.

use super::args::DeviceArgs;
use crate::lessons::{self, catalog::LESSONS, Ctx, Lesson, Outcome};
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct LessonsArgs {
    /// Run every lesson and write DIR/index.html (self-contained: plots as
    /// inline SVG, no external files) and DIR/lessons.json.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// With --report: run the experiments on the GPU instead of a simulated
    /// device (the memory figures are the same to the byte, timings aside; slower; large models
    /// need a large GPU).
    #[arg(long, requires = "report")]
    pub measure: bool,
    /// With --report: run only these lessons (e.g. C05,C34), for a slow
    /// adapter or a second look.
    #[arg(long, value_delimiter = ',', value_name = "ID,..", requires = "report")]
    pub only: Option<Vec<String>>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Print JSON (the list, or with --report every outcome).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LessonArgs {
    /// The claim's id from `vramlab lessons` (C07, c7, C28 …).
    pub id: String,
    /// Run on the GPU instead of a simulated device.
    #[arg(long)]
    pub measure: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A lesson's outcome where it ran, and with --measure its simulated one.
type Run<'a> = (
    &'a Lesson,
    Result<Outcome, String>,
    Option<Result<Outcome, String>>,
);

fn ctx(measure: bool, device: &DeviceArgs) -> Ctx {
    Ctx {
        device: measure.then(|| device.options()),
    }
}

fn json_of(l: &Lesson, r: &Result<Outcome, String>, ran_on: &str) -> serde_json::Value {
    let mut v = serde_json::json!({
        "id": l.id,
        "source": l.source,
        "claim": l.claim,
        "experiment": l.experiment,
        "ran_on": ran_on,
    });
    match r {
        Ok(o) => {
            if let (Some(m), Ok(serde_json::Value::Object(o))) =
                (v.as_object_mut(), serde_json::to_value(o))
            {
                m.extend(o);
            }
        }
        Err(e) => v["error"] = serde_json::Value::String(e.clone()),
    }
    v
}

pub fn run_list(args: &LessonsArgs) -> anyhow::Result<()> {
    args.device
        .only_with("--report DIR --measure", args.measure)?;
    let Some(dir) = &args.report else {
        if args.json {
            let list: Vec<_> = LESSONS
                .iter()
                .map(|l| serde_json::json!({"id": l.id, "source": l.source, "claim": l.claim, "experiment": l.experiment}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
            return Ok(());
        }
        let beyond = LESSONS.iter().filter(|l| l.id.starts_with('X')).count();
        println!(
            "{} lessons: one per claim of the documents (C25 is a number they never used), and {beyond} beyond them (X); docs/claims.md in vramlab's repository lists the claims. Run one with `vramlab lesson ID`:\n",
            LESSONS.len()
        );
        for l in LESSONS.iter() {
            println!("  {:<8} {}", l.id, l.claim);
        }
        println!("\n`vramlab lessons --report DIR` runs them all into DIR/index.html.");
        return Ok(());
    };
    // The ids first: a bad one leaves no directory behind.
    let chosen: Vec<&Lesson> = match &args.only {
        None => LESSONS.iter().collect(),
        Some(ids) => {
            let mut chosen: Vec<&Lesson> = Vec::new();
            for id in ids {
                let l = lessons::find(id).ok_or_else(|| unknown_lesson(id))?;
                // C02,c2 names one lesson: it runs once.
                if !chosen.iter().any(|c| c.id == l.id) {
                    chosen.push(l);
                }
            }
            chosen
        }
    };
    super::args::out_dir_for("--report", dir, &["index.html", "lessons.json"])?;
    let c = ctx(args.measure, &args.device);
    let t0 = std::time::Instant::now();
    // With --measure each lesson also runs on the simulated device, whose
    // verdict the GPU's must repeat; a lesson the adapter cannot run (too
    // little memory, a tensor past its binding limit) is reported with its
    // reason and the simulated verdict, and the others still run.
    let sim = Ctx::simulated();
    // A line per lesson on stderr as it ends: a measured run takes minutes
    // per large model on a software adapter.
    let total = chosen.len();
    let bar = super::progress::bar(total as u64, "lessons", args.json);
    let runs: Vec<Run> = chosen
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let start = std::time::Instant::now();
            bar.set_message(l.id);
            let r = (l.run)(&c).map_err(|e| format!("{e:#}"));
            let simulated = args
                .measure
                .then(|| (l.run)(&sim).map_err(|e| format!("{e:#}")));
            let verdict = r.as_ref().map_or("not run", |o| o.verdict.word());
            let line = format!(
                "[{}/{total}] {:<8} {verdict:<10} {:.1} s",
                i + 1,
                l.id,
                start.elapsed().as_secs_f64()
            );
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
                bar.inc(1);
            }
            (l, r, simulated)
        })
        .collect();
    bar.finish_and_clear();
    let results: Vec<(&Lesson, Result<Outcome, String>)> = runs
        .iter()
        .map(|(l, r, simulated)| {
            let r = match (r, simulated) {
                (Err(e), Some(Ok(s))) => Err(format!(
                    "could not run on this adapter: {e} (simulated verdict: {})",
                    s.verdict.word()
                )),
                _ => r.clone(),
            };
            (*l, r)
        })
        .collect();
    let html = lessons::report::html(&results, c.source());
    let page = dir.join("index.html");
    crate::io::write_atomic(&page, html.as_bytes())
        .with_context(|| format!("writing {}", page.display()))?;
    let all: Vec<_> = runs
        .iter()
        .zip(&results)
        .map(|((_, _, simulated), (l, r))| {
            let mut v = json_of(l, r, c.source());
            if let Some(s) = simulated {
                v["simulated_verdict"] = s.as_ref().map_or("error", |o| o.verdict.word()).into();
                v["agrees_with_simulation"] = agrees(r, s).into();
            }
            v
        })
        .collect();
    let json = dir.join("lessons.json");
    crate::io::write_atomic(&json, serde_json::to_string_pretty(&all)?.as_bytes())
        .with_context(|| format!("writing {}", json.display()))?;
    let failure = list_failure(args, &runs, &results, &page);
    if args.json {
        // One shape either way: the page and every outcome; a failure adds
        // what failed to the same object.
        let mut doc = serde_json::json!({
            "report": page.display().to_string(),
            "lessons": all,
        });
        let failure = failure.map(|e| super::fail_in_json(&mut doc, e));
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return failure.map_or(Ok(()), Err);
    }
    for (l, r) in &results {
        match r {
            Ok(o) => println!("  {:<8} {:<13} {}", l.id, o.verdict.word(), o.reason),
            Err(e) => println!("  {:<8} {:<13} {e}", l.id, "error"),
        }
    }
    println!(
        "\nwrote {} and lessons.json ({} lessons, {:.1} s, {})",
        page.display(),
        results.len(),
        t0.elapsed().as_secs_f64(),
        c.source()
    );
    failure.map_or(Ok(()), Err)
}

/// Why `lessons --report` fails, if it does: with --measure, lessons whose
/// GPU verdict is not the simulation's (or that could not run); else the
/// first lesson that failed.
fn list_failure(
    args: &LessonsArgs,
    runs: &[Run],
    results: &[(&Lesson, Result<Outcome, String>)],
    page: &std::path::Path,
) -> Option<anyhow::Error> {
    if args.measure {
        let differ: Vec<String> = runs
            .iter()
            .zip(results)
            .filter(|((_, r, s), _)| !s.as_ref().is_some_and(|s| agrees(r, s)))
            .map(|(_, (l, r))| match r {
                Err(e) => format!("{}: {e}", l.id),
                Ok(o) => format!(
                    "{}: the GPU's verdict is {}, the simulation's differs",
                    l.id,
                    o.verdict.word()
                ),
            })
            .collect();
        if differ.is_empty() {
            return None;
        }
        let (total, agreed) = (runs.len(), runs.len() - differ.len());
        return Some(anyhow::anyhow!(
            "{agreed} of {total} lessons ran on the GPU with the simulation's verdict; the others (also in {}):\n  {}",
            page.display(),
            differ.join("\n  ")
        ));
    }
    results.iter().find_map(|(l, r)| {
        r.as_ref()
            .err()
            .map(|e| anyhow::anyhow!("lesson {} failed: {e}", l.id))
    })
}

fn unknown_lesson(id: &str) -> anyhow::Error {
    let ids: Vec<&str> = LESSONS.iter().map(|l| l.id).collect();
    anyhow::anyhow!(
        "no lesson {id:?}; the lessons are: {} (`vramlab lessons` lists them)",
        ids.join(", ")
    )
}

/// Whether a measured lesson ran and reached the simulated verdict (or the
/// simulation left the verdict to values only a device computes).
fn agrees(measured: &Result<Outcome, String>, simulated: &Result<Outcome, String>) -> bool {
    matches!((measured, simulated), (Ok(m), Ok(s)) if s.needs_device || m.verdict.word() == s.verdict.word())
}

pub fn run_one(args: &LessonArgs) -> anyhow::Result<()> {
    args.device.only_with_measure(args.measure)?;
    let l = lessons::find(&args.id).ok_or_else(|| unknown_lesson(&args.id))?;
    let c = ctx(args.measure, &args.device);
    let r = (l.run)(&c).map_err(|e| format!("{e:#}"));
    if args.json {
        let mut doc = json_of(l, &r, c.source());
        let failed = r
            .err()
            .map(|e| super::fail_in_json(&mut doc, anyhow::Error::msg(e)));
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return failed.map_or(Ok(()), Err);
    }
    println!("{} ({})", l.id, l.origin());
    println!("  claim:      \"{}\"", l.claim);
    println!("  experiment: {} ({})", l.experiment, c.source());
    let o = r.map_err(anyhow::Error::msg)?;
    for f in &o.figures {
        // Counts are whole numbers: grouped, without decimals.
        let value = if f.unit.is_empty() && f.value.fract() == 0.0 && f.value.abs() < 1e15 {
            let g = super::grouped(f.value.abs() as u64);
            if f.value < 0.0 {
                format!("-{g}")
            } else {
                g
            }
        } else {
            format!("{:.2}", f.value)
        };
        println!("    {:<58} {:>12} {}", f.name, value, f.unit);
    }
    let detail = o
        .verdict
        .detail()
        .map_or(String::new(), |d| format!(": {d}"));
    println!("  verdict:    {}{detail}", o.verdict.word());
    println!("  why:        {}", o.reason);
    Ok(())
}
