//! The flags that describe a parallel layout (`estimate --dp/--zero/--tp/
//! --pp ...`, `plan`), and the transformer a GPT spec shards.

use crate::nn::{GptSpec, ModelSpec};
use crate::parallel::{Ddp, Layout, Precision, Recompute, Schedule, Sharding, Transformer};
use clap::{Args, ValueEnum};

/// Pipeline schedule flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScheduleArg {
    #[value(name = "1f1b")]
    OneFOneB,
    Gpipe,
}

/// Recomputation flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RecomputeArg {
    None,
    Selective,
    Full,
}

impl From<RecomputeArg> for Recompute {
    fn from(r: RecomputeArg) -> Recompute {
        match r {
            RecomputeArg::None => Recompute::None,
            RecomputeArg::Selective => Recompute::Selective,
            RecomputeArg::Full => Recompute::Full,
        }
    }
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Parallel layout (per-rank estimate)")]
pub struct LayoutArgs {
    /// Data-parallel ranks: the per-rank step of a layout (gpt only), with
    /// DDP's gradient buckets unless --zero or --fsdp shards the states.
    #[arg(long, value_name = "N")]
    pub dp: Option<u64>,
    /// ZeRO stage: 1 shards optimizer states over the --dp ranks, 2 also
    /// gradients, 3 also parameters (gathered one module at a time).
    #[arg(long, value_name = "1|2|3")]
    pub zero: Option<u8>,
    /// FSDP (fully_shard per block): ZeRO-3's sharding, gathering a whole
    /// block and prefetching the next.
    #[arg(long, conflicts_with = "zero")]
    pub fsdp: bool,
    /// Tensor-parallel ranks (Megatron's column/row split of every block).
    #[arg(long, value_name = "T")]
    pub tp: Option<u64>,
    /// Sequence parallelism: the activations tensor parallelism leaves
    /// whole (LayerNorms, dropouts) split along the sequence over --tp.
    #[arg(long)]
    pub sp: bool,
    /// Pipeline stages (the layers split evenly).
    #[arg(long, value_name = "P")]
    pub pp: Option<u64>,
    /// Micro-batches a step (each of --batch sequences a data-parallel
    /// rank): the pipeline's m, or gradient accumulation.
    #[arg(long, value_name = "M", default_value_t = 1)]
    pub microbatches: u64,
    /// Pipeline schedule: 1f1b holds at most p − i micro-batches on stage
    /// i, gpipe all of them.
    #[arg(long, value_enum, default_value = "1f1b")]
    pub schedule: ScheduleArg,
    /// Activation recomputation (Korthikanti et al. 2022): selective
    /// recomputes the attention core, full everything but each block's
    /// input (--mode checkpoint means full).
    #[arg(long, value_enum)]
    pub recompute: Option<RecomputeArg>,
    /// DDP's bucket_cap_mb.
    #[arg(long, value_name = "MB", default_value_t = 25.0)]
    pub bucket_cap_mb: f64,
    /// DDP's gradient_as_bucket_view=True: gradients are views into the
    /// buckets, not a second copy.
    #[arg(long)]
    pub bucket_view: bool,
    /// DDP's find_unused_parameters=True.
    #[arg(long)]
    pub find_unused: bool,
    /// Count DeepSpeed's fp32 gradient partition (4 bytes a parameter over
    /// the ranks), as its estimators do; the ZeRO paper does not.
    #[arg(long)]
    pub fp32_grad_partition: bool,
    /// Fused attention (FlashAttention; PyTorch's SDPA on a GPU): the
    /// attention scores are never stored; a log-sum-exp per row is.
    #[arg(long)]
    pub flash_attention: bool,
    /// Fraction of --capacity the fit verdict leaves free, as `plan`'s
    /// --headroom (default 0: the whole capacity; `plan` leaves 0.1).
    #[arg(long, value_name = "FRACTION")]
    pub headroom: Option<f64>,
}

impl LayoutArgs {
    /// Whether any flag asks for a parallel layout.
    pub fn given(&self) -> bool {
        self.dp.is_some()
            || self.zero.is_some()
            || self.fsdp
            || self.tp.is_some()
            || self.sp
            || self.pp.is_some()
            || self.microbatches != 1
            || self.recompute.is_some()
            || self.bucket_view
            || self.find_unused
            || self.fp32_grad_partition
            || self.flash_attention
            || self.schedule != ScheduleArg::OneFOneB
            || self.bucket_cap_mb != 25.0
    }

    /// The layout, for micro-batches of `micro_batch` sequences of `seq`
    /// tokens; `checkpoint` is `--mode checkpoint`.
    pub fn layout(
        &self,
        micro_batch: u64,
        seq: u64,
        precision: Precision,
        checkpoint: bool,
    ) -> anyhow::Result<Layout> {
        if !(self.bucket_cap_mb.is_finite() && self.bucket_cap_mb > 0.0) {
            anyhow::bail!(
                "--bucket-cap-mb {}: DDP's bucket size must be a number of MB above 0 (PyTorch's default is 25)",
                self.bucket_cap_mb
            );
        }
        let dp = self.dp.unwrap_or(1);
        let sharding = match (self.zero, self.fsdp) {
            (Some(0), _) | (None, false) => Sharding::Ddp,
            (Some(s), _) => Sharding::Zero(s),
            (None, true) => Sharding::Fsdp,
        };
        if sharding != Sharding::Ddp && dp == 1 {
            anyhow::bail!(
                "{} shards over the data-parallel ranks: give --dp of 2 or more",
                sharding.name()
            );
        }
        // DDP's own options mean nothing without DDP over 2 ranks or more.
        let ddp_flags = [
            ("--find-unused", self.find_unused),
            ("--bucket-view", self.bucket_view),
            ("--bucket-cap-mb", self.bucket_cap_mb != 25.0),
        ];
        if let Some((flag, _)) = ddp_flags.iter().find(|(_, on)| *on) {
            if sharding != Sharding::Ddp || dp == 1 {
                anyhow::bail!(
                    "{flag} is an option of DDP's gradient buckets, which {} does not use: leave it out, or give DDP (no --zero or --fsdp) with --dp of 2 or more",
                    if dp == 1 {
                        "a single data-parallel rank".to_string()
                    } else {
                        sharding.name().to_string()
                    }
                );
            }
        }
        let recompute = match (self.recompute, checkpoint) {
            (Some(RecomputeArg::Full) | None, true) => Recompute::Full,
            (Some(r), true) => anyhow::bail!(
                "--mode checkpoint is full recomputation, and --recompute {} asks for another: give one of them",
                Recompute::from(r).name()
            ),
            (Some(r), false) => r.into(),
            (None, false) => Recompute::None,
        };
        Ok(Layout {
            dp,
            tp: self.tp.unwrap_or(1),
            sp: self.sp,
            pp: self.pp.unwrap_or(1),
            sharding,
            ddp: Ddp {
                bucket_cap_mb: self.bucket_cap_mb,
                bucket_view: self.bucket_view,
                find_unused: self.find_unused,
            },
            micro_batch,
            microbatches: self.microbatches,
            seq,
            schedule: match self.schedule {
                ScheduleArg::OneFOneB => Schedule::OneFOneB,
                ScheduleArg::Gpipe => Schedule::Gpipe,
            },
            recompute,
            precision,
            fp32_grad_partition: self.fp32_grad_partition,
            flash_attention: self.flash_attention,
            // The caller sets it from the model ([`dropout`]).
            dropout: false,
        })
    }
}

/// Whether a gpt spec has dropout (`--dropout` above 0, the default 0 as
/// nanoGPT): a parallel layout saves dropout's masks only then.
pub fn dropout(spec: &ModelSpec) -> bool {
    spec.get::<GptSpec>().is_some_and(|g| g.dropout > 0.0)
}

/// The transformer a gpt spec describes, and the sequence length it runs.
pub fn transformer(spec: &ModelSpec) -> anyhow::Result<(Transformer, u64)> {
    let Some(g) = spec.get::<GptSpec>() else {
        anyhow::bail!(
            "parallel layouts are modelled for --model gpt (its presets gpt2 … 7b, 70b, 175b); {} is not a transformer",
            spec.name()
        );
    };
    let c = g.config;
    Ok((
        Transformer {
            layers: c.layers as u64,
            heads: c.heads as u64,
            hidden: c.dim as u64,
            positions: c.seq_len as u64,
            vocab: c.vocab as u64,
        },
        g.seq as u64,
    ))
}
