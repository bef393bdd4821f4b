//! `vramlab estimate`: a step's memory predicted without a GPU — per layer,
//! per category, per phase, the peak allocated and the reserved memory the
//! caching allocator will hold — with `--measure` the same step on the
//! device beside it, and the documents' hand method beside both.

use super::args::{AllocArgs, DeviceArgs, ModelArgs, StepArgs};
use crate::estimate::hand::{hand_method, HandMethod};
use crate::estimate::run::estimate;
use crate::estimate::{analyze, run_step, Analysis, Plan};
use crate::memory::{Category, CATEGORIES};
use crate::tensor::Engine;
use clap::Args;
use serde::Serialize;

/// Element types the estimate can be scaled to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    Int8,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Int8 => 1,
        }
    }
}

#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    #[command(flatten)]
    pub step: StepArgs,
    /// Element type. vramlab's kernels run f32; other types scale every
    /// tensor's bytes (what a framework storing them would hold) and cannot
    /// be measured.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Dtype,
    /// Also run the step on the GPU and compare.
    #[arg(long)]
    pub measure: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn mib(b: f64) -> f64 {
    b / 1048576.0
}

#[derive(Serialize)]
struct Side<'a> {
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    by_category: &'a std::collections::BTreeMap<&'static str, u64>,
    allocated_after_bytes: u64,
    device_allocs: u64,
    phases: &'a [crate::estimate::PhaseRow],
    seconds: f64,
}

fn side(a: &Analysis, seconds: f64) -> Side<'_> {
    Side {
        peak_allocated_bytes: a.peak_allocated_bytes,
        peak_reserved_bytes: a.peak_reserved_bytes,
        by_category: &a.by_category,
        allocated_after_bytes: a.allocated_after_bytes,
        device_allocs: a.device_allocs,
        phases: &a.phases,
        seconds,
    }
}

pub fn run(args: &EstimateArgs) -> anyhow::Result<()> {
    if args.batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    if args.measure && args.dtype != Dtype::F32 {
        anyhow::bail!(
            "--measure needs --dtype f32: vramlab's kernels compute in f32, so only f32 can be measured"
        );
    }
    let spec = args.model.spec()?;
    let plan = args
        .step
        .plan(spec.clone(), args.batch, args.alloc.config(None)?)?;
    let est = estimate(&plan)?;
    let a = analyze(&est.events, &est.layer_outputs);
    let scale = args.dtype.bytes() as f64 / 4.0;
    let input_elements = args.batch * spec.input_shape().iter().product::<usize>();
    let layers: Vec<String> = spec
        .parameter_shapes()
        .iter()
        .filter_map(|(n, _)| n.rsplit_once('.').map(|x| x.0.to_string()))
        .collect();
    let hand = hand_method(
        &layers,
        est.parameters,
        input_elements,
        &a,
        &plan.optimizer,
        args.step.mode,
        args.dtype.bytes(),
    );
    let measured = if args.measure {
        let engine = Engine::new(&args.device.options(), plan.config.clone())?;
        let m = run_step(engine, &plan, 0)?;
        Some((analyze(&m.events, &m.layer_outputs), m))
    } else {
        None
    };
    let per_dtype: Vec<serde_json::Value> = [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::Int8]
        .iter()
        .map(|d| {
            let s = d.bytes() as f64 / 4.0;
            serde_json::json!({
                "dtype": d,
                "parameters_bytes": est.parameters as u64 * d.bytes(),
                "peak_allocated_bytes": (a.peak_allocated_bytes as f64 * s) as u64,
            })
        })
        .collect();
    if args.json {
        let scaled: std::collections::BTreeMap<&str, u64> = a
            .by_category
            .iter()
            .map(|(k, v)| (*k, (*v as f64 * scale) as u64))
            .collect();
        let mut est_side = serde_json::to_value(side(&a, est.seconds))?;
        est_side["peak_allocated_bytes"] = ((a.peak_allocated_bytes as f64 * scale) as u64).into();
        est_side["peak_reserved_bytes"] = ((a.peak_reserved_bytes as f64 * scale) as u64).into();
        est_side["by_category"] = serde_json::to_value(&scaled)?;
        est_side["layers"] = serde_json::to_value(&a.layers)?;
        let mut out = serde_json::json!({
            "plan": plan,
            "dtype": args.dtype,
            "parameters": est.parameters,
            "estimate": est_side,
            "hand_method": hand,
            "per_dtype": per_dtype,
        });
        if let Some((m, p)) = &measured {
            out["measured"] = serde_json::to_value(side(m, p.seconds))?;
            out["device"] = p.device.clone().into();
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_text(
        args,
        &plan,
        &a,
        est.parameters,
        scale,
        &hand,
        measured.as_ref().map(|(m, p)| (m, p.device.as_str())),
    );
    Ok(())
}

fn print_text(
    args: &EstimateArgs,
    plan: &Plan,
    a: &Analysis,
    parameters: usize,
    scale: f64,
    hand: &HandMethod,
    measured: Option<(&Analysis, &str)>,
) {
    let s = |b: u64| mib(b as f64 * scale);
    println!(
        "vramlab estimate: {}, batch {}, {:?}, mode {:?}, {:?} — predicted on a simulated device (no GPU touched)",
        plan.model.describe(),
        plan.batch,
        plan.optimizer.kind,
        plan.mode,
        args.dtype
    );
    println!();
    let shapes = plan.model.parameter_shapes();
    println!(
        "{:<22} {:<22} {:>10} {:>14} {:>14} {:>14}",
        "Layer", "Output shape", "Params", "Saved (MiB)", "Fwd + (MiB)", "Bwd − (MiB)"
    );
    for l in &a.layers {
        let params: usize = shapes
            .iter()
            .filter(|(n, _)| n.rsplit_once('.').map(|x| x.0) == Some(l.layer.as_str()))
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        println!(
            "{:<22} {:<22} {:>10} {:>14.2} {:>14.2} {:>14.2}",
            l.layer,
            format!("{:?}", l.output_shape),
            params,
            s(l.activation_bytes),
            mib(l.forward_added as f64 * scale),
            s(l.backward_released)
        );
    }
    println!("{:<22} {:<22} {:>10}", "total", "", parameters);
    println!();
    println!("Phases (allocated MiB):");
    for p in &a.phases {
        let cats: Vec<String> = p
            .by_category_at_start
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", s(*v)))
            .collect();
        println!(
            "  {:<10} at start {:>9.2}  peak inside {:>9.2}   live: {}",
            p.phase,
            s(p.allocated_at_start),
            s(p.peak_allocated),
            cats.join(", ")
        );
    }
    println!();
    match measured {
        None => {
            println!("At the peak (MiB):");
            for c in CATEGORIES {
                if let Some(v) = a.by_category.get(c.name()) {
                    println!("  {:<16} {:>10.2}", c.name(), s(*v));
                }
            }
            println!(
                "  {:<16} {:>10.2}",
                "peak allocated",
                s(a.peak_allocated_bytes)
            );
            println!(
                "  {:<16} {:>10.2}",
                "peak reserved",
                s(a.peak_reserved_bytes)
            );
        }
        Some((m, device)) => {
            println!("Estimate vs measured on {device} (bytes at the peak):");
            println!(
                "  {:<16} {:>14} {:>14} {:>12} {:>8}",
                "", "estimate", "measured", "diff", "diff %"
            );
            let row = |name: &str, e: u64, m: u64| {
                let d = m as i64 - e as i64;
                let pct = if m > 0 {
                    100.0 * d as f64 / m as f64
                } else {
                    0.0
                };
                println!("  {name:<16} {e:>14} {m:>14} {d:>12} {pct:>7.2}%");
            };
            for c in CATEGORIES {
                let (e, mv) = (
                    a.by_category.get(c.name()).copied().unwrap_or(0),
                    m.by_category.get(c.name()).copied().unwrap_or(0),
                );
                if e > 0 || mv > 0 {
                    row(c.name(), e, mv);
                }
            }
            row(
                "peak allocated",
                a.peak_allocated_bytes,
                m.peak_allocated_bytes,
            );
            row(
                "peak reserved",
                a.peak_reserved_bytes,
                m.peak_reserved_bytes,
            );
        }
    }
    println!();
    println!(
        "Per dtype (accelerate-style; vramlab computes in f32, other rows scale every tensor):"
    );
    println!(
        "  {:<6} {:>14} {:>18}",
        "dtype", "params (MiB)", "peak step (MiB)"
    );
    for d in [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::Int8] {
        let f = d.bytes() as f64 / 4.0;
        println!(
            "  {:<6} {:>14.2} {:>18.2}",
            format!("{d:?}").to_lowercase(),
            mib(parameters as f64 * d.bytes() as f64),
            mib(a.peak_allocated_bytes as f64 * f)
        );
    }
    println!();
    let truth = a.peak_allocated_bytes as f64 * scale;
    println!(
        "The documents' hand method (parameters + gradients + optimizer + layer outputs + input):"
    );
    println!(
        "  {:.2} + {:.2} + {:.2} + {:.2} + {:.2} = {:.2} MiB, vs the true peak {:.2} MiB ({:+.1}%)",
        mib(hand.parameters as f64),
        mib(hand.gradients as f64),
        mib(hand.optimizer_state as f64),
        mib(hand.layer_outputs as f64),
        mib(hand.input as f64),
        mib(hand.total as f64),
        mib(truth),
        100.0 * (hand.total as f64 - truth) / truth
    );
    let cat = |c: Category| s(a.by_category.get(c.name()).copied().unwrap_or(0));
    println!(
        "  It leaves out, at the peak: outputs of ops between layers saved for backward (ReLU),"
    );
    println!(
        "  backward's temporaries ({:.2} MiB), op workspace ({:.2} MiB), block rounding, and that",
        cat(Category::Temporary),
        cat(Category::Workspace)
    );
    println!(
        "  gradients and optimizer state are not all alive at once; reserved ({:.2} MiB) is what the GPU holds.",
        s(a.peak_reserved_bytes)
    );
}
