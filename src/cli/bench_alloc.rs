//! `vramlab bench-alloc`: the built-in workload suite — traces recorded from
//! vramlab's own training steps (on a simulated device, so no GPU is needed)
//! and synthetic fragmentation patterns — through every allocator strategy,
//! with a summary of geometric-mean fragmentation per strategy.

use super::args::parse_capacity;
use crate::estimate::run::run_steps;
use crate::estimate::Plan;
use crate::lab::strategies::NAMES;
use crate::lab::synthetic;
use crate::lab::workload::{compare_with, RunResult, Workload};
use crate::memory::AllocatorConfig;
use crate::nn::ModelSpec;
use crate::tensor::Engine;
use crate::train::{Mode, OptimizerConfig, OptimizerKind};
use clap::Args;
use serde::Serialize;

#[derive(Debug, Args)]
pub struct BenchAllocArgs {
    /// Strategies to compare (default: all; --help says what each is).
    #[arg(long, value_delimiter = ',', value_name = "NAMES", long_help = super::replay::STRATEGIES_HELP)]
    pub allocators: Option<Vec<String>>,
    /// Simulated device size; a strategy that needs more is marked OOM.
    #[arg(long, value_name = "SIZE", value_parser = super::args::capacity_text)]
    pub capacity: Option<String>,
    /// Allocator options in PYTORCH_CUDA_ALLOC_CONF syntax for pytorch,
    /// expandable and vramlab (each adds its own), e.g.
    /// "max_split_size_mb:128". Default: the VRAMLAB_ALLOC_CONF environment
    /// variable, else PyTorch's defaults.
    #[arg(long, value_name = "OPTIONS")]
    pub alloc_conf: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Instead of the suite: pytorch vs vramlab as the engine runs it
    /// (vramlab's placement options lookahead and small_from_large) on every
    /// zoo model × Adam and SGD (momentum 0.9) × batches 1..128, three
    /// steps each (wins, ties, losses)
    #[arg(long, conflicts_with_all = ["allocators", "capacity", "alloc_conf"])]
    pub grid: bool,
}

#[derive(Serialize)]
struct WorkloadReport {
    name: String,
    operations: usize,
    lower_bound_bytes: u64,
    results: Vec<RunResult>,
}

/// Traces of vramlab's own training: two steps of each zoo model.
pub fn recorded_suite() -> anyhow::Result<Vec<Workload>> {
    let cases = [
        (
            ModelSpec::from(crate::nn::SimpleCnnSpec),
            64,
            OptimizerKind::Adam,
        ),
        (
            ModelSpec::default_for("resnet-mini").map_err(anyhow::Error::msg)?,
            32,
            OptimizerKind::Sgd,
        ),
        (
            ModelSpec::from(crate::nn::AttentionSpec {
                seq_len: 256,
                dim: 64,
                hidden: 256,
                classes: 10,
            }),
            8,
            OptimizerKind::Adamw,
        ),
        (
            ModelSpec::from(crate::nn::MlpSpec {
                widths: vec![784, 1024, 1024, 1024, 10],
                checkpoint_every: 0,
            }),
            256,
            OptimizerKind::Adam,
        ),
    ];
    let mut out = Vec::new();
    for (model, batch, opt) in cases {
        let opt_name = opt.to_string();
        // vramlab's own step (fused loss, fused optimizer), the traces the
        // lab's tables were measured on; PyTorch's default step (foreach
        // lists) is a different workload, and on mlp vramlab's strategy
        // does not beat PyTorch's there yet (issue "allocator lab").
        let plan = Plan {
            model,
            batch,
            optimizer: OptimizerConfig::new(opt, None, None, None)
                .with_impl(crate::optim::OptimizerImpl::Fused),
            mode: Mode::Train,
            amp: None,
            dtype: crate::tensor::DType::F32,
            loss: crate::train::LossMode::Fused,
            config: AllocatorConfig::default(),
        };
        let p = run_steps(
            Engine::simulated(AllocatorConfig::default(), None),
            &plan,
            0,
            2,
        )?;
        // The name says what `estimate` needs to give the same trace:
        // the model as built, the optimizer, and the fused step.
        out.push(Workload::from_events(
            &format!(
                "train {} (batch {batch}, {opt_name}, fused loss and optimizer, 2 steps)",
                plan.model.describe()
            ),
            &p.events,
        ));
    }
    Ok(out)
}

pub fn run(args: &BenchAllocArgs) -> anyhow::Result<()> {
    let conf = super::args::AllocArgs {
        alloc_conf: args.alloc_conf.clone(),
        memory_limit: None,
        memory_fraction: None,
        capacity: None,
    };
    if args.grid {
        // The grid compares PyTorch's defaults with vramlab's options
        // (--alloc-conf conflicts with it: only the variable can be set).
        if let Some(from) = conf.conf_source() {
            eprintln!(
                "note: --grid compares PyTorch's defaults with vramlab's placement options; {from} is not applied"
            );
        }
        return super::alloc_grid::run(args.json);
    }
    let capacity = parse_capacity(&args.capacity)?;
    let config = conf.config(None)?;
    let names = match &args.allocators {
        Some(names) => super::replay::strategy_names(names)?,
        None => NAMES.to_vec(),
    };
    let mut workloads = recorded_suite()?;
    workloads.extend(synthetic::suite());
    let mut reports = Vec::new();
    for w in &workloads {
        let results = compare_with(w, &names, capacity, &config).map_err(anyhow::Error::msg)?;
        reports.push(WorkloadReport {
            name: w.name.clone(),
            operations: w.ops.len(),
            lower_bound_bytes: w.lower_bound(),
            results,
        });
    }
    // Geometric mean of fragmentation per strategy, over the workloads it
    // ran without running out of memory (those it did are counted apart).
    let geo: Vec<(String, Option<f64>, usize)> = names
        .iter()
        .map(|n| {
            let runs: Vec<_> = reports
                .iter()
                .filter_map(|r| r.results.iter().find(|x| x.allocator == *n))
                .collect();
            let logs: Vec<f64> = runs
                .iter()
                .filter_map(|x| x.fragmentation)
                .map(f64::ln)
                .collect();
            // None where no workload ran to its end: no mean of nothing.
            let mean =
                (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp());
            (n.to_string(), mean, runs.len() - logs.len())
        })
        .collect();
    let from = conf.conf_source();
    if args.json {
        let out = serde_json::json!({
            "alloc_conf": from.map(|from| serde_json::json!({"from": from, "options": config.options_text()})),
            "workloads": reports,
            "geomean_fragmentation": geo.iter().map(|(n, g, _)| (n.clone(), *g)).collect::<std::collections::BTreeMap<_, _>>(),
            "out_of_memory_workloads": geo.iter().map(|(n, _, k)| (n.clone(), *k)).collect::<std::collections::BTreeMap<_, _>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if let Some(from) = from {
        println!(
            "allocator options from {from}: {} (pytorch, expandable and vramlab run under them)\n",
            config.options_text()
        );
    }
    for r in &reports {
        println!(
            "{} — {} operations, lower bound {}",
            r.name,
            r.operations,
            crate::memory::Mib(r.lower_bound_bytes)
        );
        super::replay::print_results(&r.results);
        println!();
    }
    println!("{}\n", super::replay::COLUMNS);
    println!("Geometric-mean fragmentation (peak reserved / peak live requested):");
    for (n, g, oom) in &geo {
        let left_out = if *oom > 0 && g.is_none() {
            " (out of memory on every workload)".to_string()
        } else if *oom > 0 {
            format!(
                " (over the rest: out of memory on {})",
                super::count(*oom as u64, "workload")
            )
        } else {
            String::new()
        };
        let g = g.map_or("-".to_string(), |g| format!("{g:.3}"));
        println!("  {n:<10} {g}{left_out}");
    }
    Ok(())
}
