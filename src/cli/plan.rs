//! `vramlab plan`: the layouts of a GPU count (data × tensor × pipeline
//! parallel, DDP or ZeRO 1–3 or FSDP, recomputation, micro-batch) whose
//! every rank fits a GPU's memory with the headroom asked, each rank's two
//! steps replayed through the caching allocator, ranked by a stated cost.

use super::args::{AllocArgs, ModelArgs};
use super::layout_args::{transformer, RecomputeArg};
use crate::parallel::layout::MAX_LAYER_PASSES;
use crate::parallel::plan::{search, Candidate, Costs, Request};
use crate::parallel::{Precision, Recompute, Sharding};
use clap::Args;

// Only transformers have parallel layouts here: gpt by default.
#[derive(Debug, Args)]
#[command(mut_arg("model", |a| a
    .default_value("gpt")
    .help("Zoo model: gpt (the one with parallel layouts; its --preset or sizes)")))]
#[command(mut_arg("memory_fraction", |a| a
    .help("Most memory the allocator may reserve, as a fraction (0..1] of --memory")))]
// The other models' sizes and --capacity (plan's GPU size is --memory) are
// refused with a message; --help leaves them out.
#[command(
    mut_arg("widths", |a| a.hide(true)),
    mut_arg("checkpoint_every", |a| a.hide(true)),
    mut_arg("width", |a| a.hide(true)),
    mut_arg("depth", |a| a.hide(true)),
    mut_arg("resolution", |a| a.hide(true)),
    mut_arg("hidden", |a| a.hide(true)),
    mut_arg("classes", |a| a.hide(true)),
    mut_arg("capacity", |a| a.hide(true))
)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// GPUs in all.
    #[arg(long)]
    pub gpus: u64,
    /// Memory a GPU gives the process (e.g. 80GiB).
    #[arg(long, value_name = "SIZE", value_parser = super::args::memory_text)]
    pub memory: String,
    /// Fraction of --memory to leave free (for the CUDA context, NCCL,
    /// cuBLAS workspaces and fragmentation the replay does not see).
    #[arg(long, default_value_t = 0.1)]
    pub headroom: f64,
    /// Sequences a step over all data-parallel ranks.
    #[arg(long, default_value_t = 1024)]
    pub global_batch: u64,
    /// fp32 everything (parameters, gradients, activations, Adam); the
    /// default is 16-bit mixed precision with fp32 master weights and Adam.
    #[arg(long)]
    pub fp32: bool,
    /// Only this recomputation (default: none, selective and full).
    #[arg(long, value_enum)]
    pub recompute: Option<RecomputeArg>,
    /// Fused attention (FlashAttention) in every layout: no attention
    /// scores stored.
    #[arg(long)]
    pub flash_attention: bool,
    /// Largest tensor-parallel size (GPUs joined by NVLink in a node). Its
    /// size divides the heads and the hidden size; where it also divides
    /// the sequence, sequence parallelism comes with it.
    #[arg(long, default_value_t = 8)]
    pub max_tp: u64,
    /// Achieved matrix TFLOP/s a GPU, for the step-time cost (the 16-bit
    /// rate; with --fp32 give the fp32 rate).
    #[arg(long, default_value_t = 400.0)]
    pub tflops: f64,
    /// GB/s a GPU inside a node (tensor parallelism).
    #[arg(long, default_value_t = 450.0)]
    pub nvlink_gbs: f64,
    /// GB/s a GPU between nodes (data and pipeline parallelism).
    #[arg(long, default_value_t = 50.0)]
    pub network_gbs: f64,
    /// Layouts to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub alloc: AllocArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The `estimate` arguments that replay `l` for the model `args` name:
/// every model, precision, attention and allocator flag carried over.
pub fn estimate_command(args: &PlanArgs, l: &crate::parallel::Layout, seq: u64) -> Vec<String> {
    let m = &args.model;
    let rec = (l.recompute != Recompute::None).then(|| l.recompute.name().to_string());
    let (zero, fsdp) = match l.sharding {
        Sharding::Ddp => (None, false),
        Sharding::Zero(s) => (Some(s.to_string()), false),
        Sharding::Fsdp => (None, true),
    };
    let s = |x: u64| Some(x.to_string());
    let valued: [(&str, Option<String>); 19] = [
        ("model", Some(m.model.clone())),
        ("preset", m.preset.clone()),
        ("layers", m.layers.map(|x| x.to_string())),
        ("heads", m.heads.map(|x| x.to_string())),
        ("dim", m.dim.map(|x| x.to_string())),
        ("vocab", m.vocab.map(|x| x.to_string())),
        ("dropout", m.dropout.map(|x| x.to_string())),
        ("seq-len", s(seq)),
        ("batch", s(l.micro_batch)),
        ("dp", s(l.dp)),
        ("zero", zero),
        ("tp", s(l.tp)),
        ("pp", s(l.pp)),
        ("microbatches", s(l.microbatches)),
        ("recompute", rec),
        ("amp", (!args.fp32).then(|| "bf16".to_string())),
        ("alloc-conf", args.alloc.alloc_conf.clone()),
        // plan's GPU size and headroom, so estimate's verdict is plan's.
        ("capacity", Some(args.memory.clone())),
        ("headroom", Some(args.headroom.to_string())),
    ];
    let mut v = vec![];
    for (name, value) in valued {
        if let Some(x) = value {
            v.push(format!("--{name}"));
            v.push(x);
        }
    }
    for (name, on) in [
        ("fsdp", fsdp),
        ("sp", l.sp),
        ("flash-attention", l.flash_attention),
    ] {
        if on {
            v.push(format!("--{name}"));
        }
    }
    for (name, value) in [
        ("memory-limit", args.alloc.memory_limit.clone()),
        (
            "memory-fraction",
            args.alloc.memory_fraction.map(|x| x.to_string()),
        ),
    ] {
        if let Some(x) = value {
            v.push(format!("--{name}"));
            v.push(x);
        }
    }
    v
}

fn gib(b: f64) -> String {
    let g = b / (1u64 << 30) as f64;
    // A shortfall under 0.05 GiB is not "-0.0".
    if g.abs() < 0.05 {
        return "0.0".into();
    }
    format!("{g:.1}")
}

fn row(c: &Candidate) -> String {
    let l = &c.layout;
    let rec = l.recompute.name();
    let stage = if l.pp > 1 {
        format!(" (stage {})", c.worst.stage)
    } else {
        String::new()
    };
    // A replay stopped by out-of-memory has no peak to speak of, nor room left.
    let (peak, left) = if c.worst.oom.is_some() {
        ("OOM".to_string(), "-".to_string())
    } else {
        (gib(c.worst.peak_reserved as f64), gib(c.memory_left as f64))
    };
    format!(
        "{:>4} {:>3}{:<3} {:>3} {:<7} {:>9} {:>3}×{:<4} {:>10}{:<11} {:>9} {:>7.1}% {:>9.1} {:>8.2}",
        l.dp,
        l.tp,
        if l.sp { "+sp" } else { "" },
        l.pp,
        l.sharding.name(),
        rec,
        l.micro_batch,
        l.microbatches,
        peak,
        stage,
        left,
        c.bubble * 100.0,
        c.comm_bytes.iter().sum::<f64>() / 1e9,
        c.step_seconds,
    )
}

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let spec = args.model.spec()?;
    let (model, seq) = transformer(&spec)?;
    let memory = super::args::parse_memory("--memory", &args.memory)?;
    // The GPU's size is --memory here; a second size would be ignored.
    if args.alloc.capacity.is_some() {
        anyhow::bail!(
            "plan takes the GPU's size as --memory; leave --capacity out (--memory-fraction is a fraction of --memory, --memory-limit caps the allocator under it)"
        );
    }
    super::args::at_least_one(&[
        ("--gpus", args.gpus),
        ("--global-batch", args.global_batch),
        ("--max-tp", args.max_tp),
        ("--top", args.top as u64),
    ])?;
    for (flag, x) in [
        ("--tflops", args.tflops),
        ("--nvlink-gbs", args.nvlink_gbs),
        ("--network-gbs", args.network_gbs),
    ] {
        // Bounded so that every step time stays a finite, printable
        // number (1e-320 made them infinite, 1e-300 300 digits long).
        if !(1e-6..=1e9).contains(&x) {
            anyhow::bail!(
                "{flag} {} is a rate: give a number from 1e-6 to 1e9",
                super::args::number_as_typed(x)
            );
        }
    }
    if !(0.0..1.0).contains(&args.headroom) {
        anyhow::bail!("--headroom is a fraction of --memory, from 0 up to (not including) 1");
    }
    let recompute = match args.recompute {
        Some(r) => vec![r.into()],
        None => vec![Recompute::None, Recompute::Selective, Recompute::Full],
    };
    let req = Request {
        model,
        gpus: args.gpus,
        memory,
        headroom: args.headroom,
        seq,
        global_batch: args.global_batch,
        precision: if args.fp32 {
            Precision::Fp32
        } else {
            Precision::Mixed
        },
        recompute,
        max_tp: args.max_tp,
        flash_attention: args.flash_attention,
        dropout: super::layout_args::dropout(&spec),
        costs: Costs {
            flops: args.tflops * 1e12,
            intra_bw: args.nvlink_gbs * 1e9,
            inter_bw: args.network_gbs * 1e9,
        },
        config: args.alloc.config(Some(memory))?,
    };
    let t0 = std::time::Instant::now();
    let searched = search(&req, args.top);
    let seconds = t0.elapsed().as_secs_f64();
    let found = &searched.candidates;
    // Layouts with more micro-batches than a program holds are not
    // replayed: say how many, and name that cap when nothing is left.
    let capped: Vec<&crate::parallel::Layout> = searched.past_layer_passes(&model).collect();
    if found.is_empty() && !capped.is_empty() {
        let most = capped
            .iter()
            .map(|l| l.dp * l.micro_batch * (MAX_LAYER_PASSES / (model.layers / l.pp)))
            .max()
            .unwrap_or(0);
        if most == 0 {
            anyhow::bail!(
                "no layout of {} can be replayed: even one micro-batch over a stage's layers takes more layer passes than the {} a rank's program holds; give more --gpus (more pipeline stages) or fewer --layers",
                super::count(args.gpus, "GPU"),
                super::grouped(MAX_LAYER_PASSES),
            );
        }
        anyhow::bail!(
            "no layout of {} with global batch {} can be replayed: each of its {} takes more layer passes (micro-batches × layers a stage, with micro-batches of at most 8 sequences a data-parallel rank) than the {} a rank's program holds; give a --global-batch of at most {}, or more --gpus",
            super::count(args.gpus, "GPU"),
            args.global_batch,
            super::count(capped.len() as u64, "layout"),
            super::grouped(MAX_LAYER_PASSES),
            super::grouped(most),
        );
    }
    if found.is_empty() {
        if let Some((_, e)) = searched.skipped.first() {
            anyhow::bail!(
                "no layout of {} with global batch {} can be modelled: {e}",
                super::count(args.gpus, "GPU"),
                args.global_batch
            );
        }
        anyhow::bail!(
            "no layout of {} runs this model with global batch {}: the data-parallel ranks times the micro-batch must divide it, the tensor-parallel size the {} heads, the pipeline stages the {} layers; try a --global-batch that is a multiple of --gpus",
            super::count(args.gpus, "GPU"),
            args.global_batch,
            model.heads,
            model.layers
        );
    }
    let fitting = found.iter().filter(|c| c.fits).count();
    // No layout fits: the closest are still listed, and the command fails
    // so that a script can tell.
    let none_fits = (fitting == 0).then(|| {
        let closest = &found[0];
        let (limit, allocators) = req.limit();
        let (under, raise) = if allocators {
            (
                format!(
                    "the allocator's limit of {} a GPU ({})",
                    crate::memory::format_size(limit),
                    if args.alloc.memory_fraction.is_some() {
                        "--memory-fraction"
                    } else {
                        "--memory-limit"
                    }
                ),
                "raise it",
            )
        } else if args.headroom > 0.0 {
            (
                format!(
                    "{} a GPU (--memory less the {:.0}% headroom)",
                    crate::memory::format_size(limit),
                    args.headroom * 100.0
                ),
                "give a larger --memory or less --headroom",
            )
        } else {
            (
                format!("{} a GPU", crate::memory::format_size(limit)),
                "give a larger --memory",
            )
        };
        anyhow::anyhow!(
            "no layout of {} fits under {under}: the closest ({}) {}; {raise}, more --gpus, or a smaller model",
            super::count(args.gpus, "GPU"),
            describe(&closest.layout),
            if closest.worst.oom.is_some() {
                "ran out of memory in its replay".to_string()
            } else {
                format!(
                    "needs {} reserved",
                    crate::memory::format_size(closest.worst.peak_reserved)
                )
            },
        )
    });
    if args.json {
        let mut out = serde_json::json!({
            "model": model,
            "parameters": model.params(),
            "gpus": args.gpus,
            "memory": memory,
            "headroom": args.headroom,
            "sequence": seq,
            "global_batch": args.global_batch,
            "costs": req.costs,
            "memory_limit": req.config.memory_limit,
            "layouts_evaluated": found.len(),
            "layouts_fitting": fitting,
            "layouts_skipped_past_layer_passes": capped.len(),
            "max_layer_passes": MAX_LAYER_PASSES,
            "seconds": seconds,
            "layouts": found.iter().take(args.top).collect::<Vec<_>>(),
        });
        let failed = none_fits.map(|e| super::fail_in_json(&mut out, e));
        println!("{}", serde_json::to_string_pretty(&out)?);
        return failed.map_or(Ok(()), Err);
    }
    println!(
        "{} parameters ({}, hidden {}, {}), {} a sequence, global batch {}, {} of {} ({:.0}% headroom{}), {}",
        super::parameters(model.params()),
        super::count(model.layers, "layer"),
        model.hidden,
        super::count(model.heads, "head"),
        super::count(seq, "token"),
        args.global_batch,
        super::count(args.gpus, "GPU"),
        crate::memory::format_size(memory),
        args.headroom * 100.0,
        match (req.config.memory_limit, args.alloc.memory_fraction) {
            (Some(m), Some(f)) => format!(
                ", --memory-fraction {} = {:.2} GiB",
                super::args::number_as_typed(f),
                m as f64 / (1u64 << 30) as f64
            ),
            (Some(m), None) => format!(", --memory-limit {:.2} GiB", m as f64 / (1u64 << 30) as f64),
            (None, _) => String::new(),
        },
        if args.fp32 { "fp32" } else { "mixed precision" },
    );
    if req.dropout {
        println!(
            "dropout {} (its masks saved)",
            args.model.dropout.map_or(String::new(), |p| p.to_string())
        );
    }
    println!(
        "{} layouts evaluated in {seconds:.1} s (each rank's two steps through the caching allocator: the first and\n\
         last stages, 1F1B's steady state shortened); {fitting} fit. Those listed were replayed whole, as `estimate`\n\
         does (every stage; the first, second and last past 16); the fullest stage is shown. left: under --memory\n\
         less the headroom{}.{}\n",
        found.len(),
        if req.config.memory_limit.is_some() {
            " or --memory-limit, whichever is less"
        } else {
            ""
        },
        if capped.is_empty() {
            String::new()
        } else {
            format!(
                "\n{} skipped, not evaluated: more layer passes (micro-batches × layers a stage) than the {}\n\
                 a rank's program holds (a smaller --global-batch or more --gpus brings them in).",
                super::count(capped.len() as u64, "layout"),
                super::grouped(MAX_LAYER_PASSES)
            )
        }
    );
    println!(
        "{:>4} {:>3}{:3} {:>3} {:<7} {:>9} {:>8} {:>21} {:>9} {:>8} {:>9} {:>8}",
        "dp",
        "tp",
        "",
        "pp",
        "states",
        "recompute",
        "mb×m",
        "peak reserved GiB",
        "left GiB",
        "bubble",
        "comm GB",
        "step s"
    );
    let shown: Vec<&Candidate> = found.iter().take(args.top).collect();
    if fitting == 0 {
        println!("(none fits; the closest:)");
    }
    for (i, c) in shown.iter().enumerate() {
        // Those that fit come first; a line marks where the rest begin.
        if i > 0 && i == fitting {
            println!("(these do not fit; the closest:)");
        }
        println!("{}", row(c));
    }
    println!(
        "\nstep s: 6·params·tokens/GPUs at {} TFLOP/s a GPU (×4/3 with full recomputation), over 1 − bubble, plus\n\
         data- and pipeline-parallel bytes at {} GB/s and tensor-parallel bytes at {} GB/s, none overlapped.\n\
         comm GB: bytes a GPU sends a step: DDP and ZeRO-1 move the stage's parameters twice a step, ZeRO-2 m + 1\n\
         times (a reduce-scatter after each micro-batch), ZeRO-3 and FSDP 3m times. Tensor parallelism comes\n\
         with sequence parallelism where the sequence divides by it; pipelines run 1F1B. DeepSpeed's pipeline\n\
         engine takes ZeRO-1 only.",
        args.tflops, args.network_gbs, args.nvlink_gbs
    );
    if let Some(best) = shown.first().filter(|c| c.fits) {
        println!(
            "\nThe first, rank by rank: vramlab estimate {}",
            estimate_command(args, &best.layout, seq).join(" ")
        );
    }
    none_fits.map_or(Ok(()), Err)
}

/// A layout in a few words: "dp 8, tp 8 with sp, pp 16, ZeRO-2,
/// recomputation selective, 192 micro-batches of 1".
fn describe(l: &crate::parallel::Layout) -> String {
    format!(
        "dp {}, tp {}{}, pp {}, {}, recomputation {}, {} of {}",
        l.dp,
        l.tp,
        if l.sp { " with sp" } else { "" },
        l.pp,
        l.sharding.name(),
        l.recompute.name(),
        super::count(l.microbatches, "micro-batch"),
        l.micro_batch
    )
}
