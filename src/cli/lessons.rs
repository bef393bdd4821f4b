//! `vramlab lessons` lists every claim of the documents with its lesson
//! (and with `--report DIR` runs them all into one HTML page);
//! `vramlab lesson ID` runs one: the claim, the experiment, the measured
//! figures, the verdict and why.

use super::args::DeviceArgs;
use crate::lessons::{self, catalog::LESSONS, Ctx, Lesson, Outcome};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct LessonsArgs {
    /// Run every lesson and write DIR/index.html (self-contained: plots as
    /// inline SVG, no external files) and DIR/lessons.json.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Run the experiments on the GPU instead of a simulated device (the
    /// figures are the same to the byte; slower; large models need a large GPU).
    #[arg(long)]
    pub measure: bool,
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

fn ctx(measure: bool, device: &DeviceArgs) -> Ctx {
    Ctx {
        device: measure.then(|| device.options()),
    }
}

fn json_of(l: &Lesson, r: &Result<Outcome, String>) -> serde_json::Value {
    let mut v = serde_json::json!({
        "id": l.id,
        "source": l.source,
        "claim": l.claim,
        "experiment": l.experiment,
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
    let Some(dir) = &args.report else {
        if args.json {
            let list: Vec<_> = LESSONS
                .iter()
                .map(|l| serde_json::json!({"id": l.id, "source": l.source, "claim": l.claim, "experiment": l.experiment}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
            return Ok(());
        }
        println!("{} lessons, one per claim of the documents (docs/claims.md in vramlab's repository); run one with `vramlab lesson ID`:\n", LESSONS.len());
        for l in LESSONS.iter() {
            println!("  {:<8} {}", l.id, l.claim);
        }
        println!("\n`vramlab lessons --report DIR` runs them all into DIR/index.html.");
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    let c = ctx(args.measure, &args.device);
    let t0 = std::time::Instant::now();
    let results: Vec<(&Lesson, Result<Outcome, String>)> = LESSONS
        .iter()
        .map(|l| (l, (l.run)(&c).map_err(|e| format!("{e:#}"))))
        .collect();
    let html = lessons::report::html(&results, c.source());
    let page = dir.join("index.html");
    crate::io::write_atomic(&page, html.as_bytes())?;
    let all: Vec<_> = results.iter().map(|(l, r)| json_of(l, r)).collect();
    crate::io::write_atomic(
        &dir.join("lessons.json"),
        serde_json::to_string_pretty(&all)?.as_bytes(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
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
    }
    if let Some((l, Err(e))) = results.iter().find(|(_, r)| r.is_err()) {
        anyhow::bail!("lesson {} failed: {e}", l.id);
    }
    Ok(())
}

pub fn run_one(args: &LessonArgs) -> anyhow::Result<()> {
    let l = lessons::find(&args.id).ok_or_else(|| {
        let ids: Vec<&str> = LESSONS.iter().map(|l| l.id).collect();
        anyhow::anyhow!(
            "no lesson {:?}; the lessons are: {} (`vramlab lessons` lists them)",
            args.id,
            ids.join(", ")
        )
    })?;
    let c = ctx(args.measure, &args.device);
    let r = (l.run)(&c).map_err(|e| format!("{e:#}"));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json_of(l, &r))?);
        return r.map(|_| ()).map_err(anyhow::Error::msg);
    }
    println!("{} (article {})", l.id, l.source);
    println!("  claim:      \"{}\"", l.claim);
    println!("  experiment: {} ({})", l.experiment, c.source());
    let o = r.map_err(anyhow::Error::msg)?;
    for f in &o.figures {
        println!("    {:<58} {:>12.2} {}", f.name, f.value, f.unit);
    }
    let detail = match &o.verdict {
        lessons::Verdict::Holds => String::new(),
        lessons::Verdict::Wrong(d)
        | lessons::Verdict::Partly(d)
        | lessons::Verdict::OutOfScope(d) => format!(": {d}"),
    };
    println!("  verdict:    {}{detail}", o.verdict.word());
    println!("  why:        {}", o.reason);
    Ok(())
}
