//! `vramlab estimate --dp/--zero/--fsdp/--tp/--sp/--pp ...`: each pipeline
//! stage's rank of a parallel layout, its two steps replayed through the
//! caching allocator, beside the ZeRO paper's model states and Korthikanti
//! et al.'s activations.

use crate::memory::AllocatorConfig;
use crate::parallel::formulas::{dropout_layer, flash_layer, korthikanti_layer, zero_model_states};
use crate::parallel::rank::{program, Kind};
use crate::parallel::replay::{run, RankReport};
use crate::parallel::{Layout, Precision, Recompute, Schedule, Transformer};
use serde::Serialize;

/// One stage's figures.
#[derive(Debug, Serialize)]
pub struct StageRow {
    #[serde(flatten)]
    pub report: RankReport,
    /// The ZeRO paper's model states for this stage's parameters.
    pub zero_paper_model_states: f64,
    /// Korthikanti et al.'s table 2 per layer, times the stage's layers and
    /// micro-batches in flight (16-bit activations only).
    pub korthikanti_activations: Option<f64>,
}

/// Every stage's rank of `layout` (all of them up to 16 stages, else the
/// first, second and last).
pub fn stages(
    model: &Transformer,
    l: &Layout,
    capacity: Option<u64>,
    config: &AllocatorConfig,
) -> Vec<StageRow> {
    let stages = crate::parallel::plan::whole_stages(l.pp);
    crate::parallel::pool::map(&stages, |&s| run(&program(model, l, s), capacity, config))
        .into_iter()
        .map(|report| {
            let form = if l.flash_attention {
                flash_layer
            } else {
                korthikanti_layer
            };
            let per_layer = form(
                l.seq,
                l.micro_batch,
                model.hidden,
                model.heads,
                l.tp,
                l.sp,
                l.recompute,
            ) - if l.dropout {
                0.0
            } else {
                dropout_layer(l, model.hidden, model.heads)
            };
            StageRow {
                zero_paper_model_states: zero_model_states(
                    report.stage_params,
                    l.dp,
                    l.sharding.stage(),
                    l.precision,
                ),
                korthikanti_activations: (l.precision == Precision::Mixed)
                    .then(|| per_layer * (model.layers / l.pp) as f64 * report.in_flight as f64),
                report,
            }
        })
        .collect()
}

pub fn describe(model: &Transformer, l: &Layout) -> String {
    let prec = match l.precision {
        Precision::Mixed => "mixed precision (16-bit parameters, gradients and activations; fp32 master weights and Adam: K = 12)",
        Precision::Fp32 => "fp32 (parameters, gradients, activations; Adam: K = 8)",
    };
    let rec = match l.recompute {
        Recompute::None => "no recomputation",
        Recompute::Selective => "selective recomputation",
        Recompute::Full => "full recomputation",
    };
    let rec = if l.flash_attention {
        format!("{rec}, fused attention (no scores stored)")
    } else {
        rec.to_string()
    };
    let rec = if l.dropout {
        format!("{rec}; dropout (its masks saved)")
    } else {
        format!("{rec}; no dropout (--dropout 0)")
    };
    let sched = match l.schedule {
        Schedule::OneFOneB => "1F1B",
        Schedule::Gpipe => "GPipe",
    };
    let mut s = format!(
        "{} parameters, {} layers, hidden {}, {} heads; {} = dp {} × tp {}{} × pp {} ({sched}); {}",
        super::parameters(model.params()),
        model.layers,
        model.hidden,
        model.heads,
        super::count(l.gpus(), "GPU"),
        l.dp,
        l.tp,
        if l.sp { " (+sp)" } else { "" },
        l.pp,
        l.sharding.name(),
    );
    if l.sharding == crate::parallel::Sharding::Ddp && l.dp > 1 {
        s += &format!(
            " (bucket_cap_mb {}, gradient_as_bucket_view {}, find_unused_parameters {})",
            l.ddp.bucket_cap_mb, l.ddp.bucket_view, l.ddp.find_unused
        );
    }
    s += &format!(
        ";\nmicro-batch {} × {} tokens, {} a step (global batch {}); {prec}; {rec}",
        l.micro_batch,
        l.seq,
        super::count(l.microbatches, "micro-batch"),
        l.global_batch()
    );
    s
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / (1u64 << 30) as f64)
}

pub fn print(model: &Transformer, l: &Layout, rows: &[StageRow]) {
    let korthikanti = if l.dropout {
        "sbh(34 + 5as/h) a layer with dropout (this model's)"
    } else {
        "sbh(34 + 5as/h) a layer with dropout, sbh(32 + 2as/h) without (this model has none)"
    };
    println!("{}\n", describe(model, l));
    println!("Per rank, two steps through the caching allocator (the second is the steady state):");
    println!(
        "{:>5}  {:>10}  {:>13}  {:>13}  {:>13}  {:>13}  {:>14}  {:>13}",
        "stage",
        "params",
        "model states",
        "ZeRO paper",
        "activations",
        "Korthikanti",
        "peak allocated",
        "peak reserved"
    );
    for r in rows {
        let acts = r
            .report
            .kind_peaks
            .iter()
            .find(|(k, _)| *k == Kind::Activations)
            .map_or(0, |x| x.1);
        println!(
            "{:>5}  {:>10}  {:>13}  {:>13}  {:>13}  {:>13}  {:>14}  {:>13}",
            r.report.stage,
            super::parameters(r.report.stage_params),
            if r.report.oom.is_some() {
                "— (out of memory)".to_string()
            } else {
                gib(r.report.model_states as f64)
            },
            gib(r.zero_paper_model_states),
            gib(acts as f64),
            r.korthikanti_activations.map_or("—".into(), gib),
            gib(r.report.peak_allocated as f64),
            gib(r.report.peak_reserved as f64),
        );
    }
    for r in rows {
        let mut parts: Vec<String> = r
            .report
            .at_peak
            .iter()
            .filter(|(_, b)| *b > 0)
            .map(|(k, b)| format!("{} {}", k.name(), gib(*b as f64)))
            .collect();
        // So the parts add up to the peak allocated.
        if r.report.block_rounding_at_peak > 0 {
            parts.push(format!(
                "block rounding {}",
                gib(r.report.block_rounding_at_peak as f64)
            ));
        }
        println!("At stage {}'s peak: {}", r.report.stage, parts.join(", "));
        if let Some(o) = &r.report.oom {
            println!(
                "  OUT OF MEMORY on stage {}: {o}\n  (this stage's figures stop at that allocation)",
                r.report.stage
            );
        }
    }
    println!(
        "\nmodel states: parameters, gradients and optimizer states (master weights, Adam's moments) of one rank,\n\
         all live before zero_grad; ZeRO paper: (2+2+K)Ψ, (2+2)Ψ+KΨ/N, 2Ψ+(2+K)Ψ/N, (2+2+K)Ψ/N for stages 0-3.\n\
         activations: what the stage's layers save for its micro-batches in flight; Korthikanti et al. 2022,\n\
         table 2: {korthikanti}, over t as tensor and sequence parallelism split it.\n\
         The peaks also hold DDP's buckets, gathered parameters, activation gradients and communication buffers;\n\
         CUDA's context, NCCL's buffers and cuBLAS workspaces are not in them."
    );
}

/// Whether the fullest stage fits, and under what.
#[derive(Debug)]
pub struct Fit {
    /// What the fullest stage's peak reserved must stay under: --capacity
    /// less --headroom, or --memory-limit, whichever is less.
    pub limit: u64,
    /// No stage ran out of memory and the fullest peaked under `limit`.
    pub fits: bool,
    /// `limit` less the fullest stage's peak reserved (negative: short by
    /// that much); `None` when a stage ran out of memory (its peak is where
    /// it stopped, not what it needs).
    pub memory_left: Option<i64>,
}

/// The verdict on `rows` under `capacity` less `headroom` and the allocator's
/// `memory_limit`, as `plan` decides it; `None` without either size.
pub fn fit(
    rows: &[StageRow],
    capacity: Option<u64>,
    headroom: f64,
    memory_limit: Option<u64>,
) -> Option<Fit> {
    let usable = capacity.map(|c| (c as f64 * (1.0 - headroom)) as u64);
    let limit = match (usable, memory_limit) {
        (Some(u), Some(m)) => u.min(m),
        (u, m) => u.or(m)?,
    };
    let oom = rows.iter().any(|r| r.report.oom.is_some());
    let worst = rows
        .iter()
        .map(|r| r.report.peak_reserved)
        .max()
        .unwrap_or(0);
    let left = limit as i64 - worst as i64;
    Some(Fit {
        limit,
        fits: !oom && left >= 0,
        memory_left: (!oom).then_some(left),
    })
}

/// The verdict's line: the size, the headroom taken from it (plan's 10%
/// is not applied unless --headroom asks), the limit, and the answer.
pub fn verdict(f: &Fit, capacity: Option<u64>, headroom: f64, memory_limit: Option<u64>) -> String {
    let mut under = match capacity {
        Some(c) if headroom > 0.0 => format!(
            "On {} a GPU less {:.0}% headroom ({})",
            gib(c as f64),
            headroom * 100.0,
            gib((c as f64 * (1.0 - headroom)).floor())
        ),
        Some(c) => format!(
            "On {} a GPU, no headroom (plan leaves 10%: --headroom 0.1)",
            gib(c as f64)
        ),
        None => String::new(),
    };
    if let Some(m) = memory_limit {
        under += &format!(
            "{} --memory-limit {}",
            if under.is_empty() { "Under" } else { ", under" },
            gib(m as f64)
        );
    }
    let answer = match f.memory_left {
        None => "runs out of memory".to_string(),
        Some(left) if left >= 0 => {
            format!("fits, {} left on the fullest stage", gib(left as f64))
        }
        Some(left) => format!(
            "does not fit, {} short on the fullest stage",
            gib(-left as f64)
        ),
    };
    format!("{under}: {answer}")
}
