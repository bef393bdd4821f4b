//! A parallel layout: how many GPUs of each kind of parallelism, how data
//! parallel ranks share model states, and how a step runs (micro-batches,
//! pipeline schedule, recomputation, precision).

use crate::model::Transformer;
use serde::Serialize;

/// How data-parallel ranks hold the model states.
// JSON names as the flags say them: "ddp", {"zero": 2}, "fsdp".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// PyTorch DDP: every rank holds everything, gradients go through
    /// flat buckets.
    Ddp,
    /// DeepSpeed ZeRO stage 1, 2 or 3: optimizer states, then gradients,
    /// then parameters split across the data-parallel ranks. Stage 3
    /// gathers one leaf module at a time.
    Zero(u8),
    /// FSDP (`fully_shard` per block): as ZeRO-3, gathering a whole block
    /// at a time and the next one ahead (prefetch).
    Fsdp,
}

impl Sharding {
    /// 0 for DDP, else the ZeRO stage (FSDP is stage 3).
    pub fn stage(self) -> u8 {
        match self {
            Sharding::Ddp => 0,
            Sharding::Zero(s) => s,
            Sharding::Fsdp => 3,
        }
    }

    pub fn name(self) -> String {
        match self {
            Sharding::Ddp => "DDP".into(),
            Sharding::Zero(s) => format!("ZeRO-{s}"),
            Sharding::Fsdp => "FSDP".into(),
        }
    }
}

/// DDP's options (`DistributedDataParallel(...)`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ddp {
    /// `bucket_cap_mb` (25); the first bucket holds 1 MiB (DDP's
    /// `_DEFAULT_FIRST_BUCKET_BYTES`).
    pub bucket_cap_mb: f64,
    /// `gradient_as_bucket_view`: gradients are views into the buckets
    /// instead of tensors of their own.
    pub bucket_view: bool,
    /// `find_unused_parameters`: a device map of one int32 per parameter
    /// tensor, marked each iteration.
    pub find_unused: bool,
}

impl Default for Ddp {
    fn default() -> Self {
        Ddp {
            bucket_cap_mb: 25.0,
            bucket_view: false,
            find_unused: false,
        }
    }
}

/// Pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Schedule {
    /// All forwards, then all backwards: a stage holds every micro-batch.
    #[serde(rename = "gpipe")]
    Gpipe,
    /// One forward, one backward (PipeDream-flush): stage i holds at most
    /// p − i micro-batches.
    #[serde(rename = "1f1b")]
    OneFOneB,
}

/// What the forward saves for backward (Korthikanti et al. 2022, §4–5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    None,
    /// The attention core (softmax, its dropout, attention over V) is
    /// recomputed in backward: the 5as²b/t term is not saved.
    Selective,
    /// Only each block's input is saved; backward recomputes the block.
    Full,
}

impl Recompute {
    /// The `--recompute` value that names it.
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// Bytes per parameter of each model state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Mixed precision as the ZeRO paper and DeepSpeed/Megatron run it:
    /// 16-bit parameters and gradients, fp32 master weights and Adam's two
    /// moments (K = 12); activations 16-bit.
    Mixed,
    /// fp32 everything: parameters 4, gradients 4, Adam 8 (K = 8).
    Fp32,
}

impl Precision {
    /// Bytes of a parameter and of a gradient as the model holds them.
    pub fn param_bytes(self) -> u64 {
        match self {
            Precision::Mixed => 2,
            Precision::Fp32 => 4,
        }
    }

    /// The optimizer's bytes per parameter (the ZeRO paper's K).
    pub fn k(self) -> u64 {
        match self {
            Precision::Mixed => 12,
            Precision::Fp32 => 8,
        }
    }

    /// Bytes of an activation element.
    pub fn activation_bytes(self) -> u64 {
        self.param_bytes()
    }
}

/// One layout of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Layout {
    pub dp: u64,
    pub tp: u64,
    /// Sequence parallelism (only with tp > 1).
    pub sp: bool,
    pub pp: u64,
    pub sharding: Sharding,
    pub ddp: Ddp,
    /// Sequences a micro-batch (per data-parallel rank).
    pub micro_batch: u64,
    /// Micro-batches a step (gradient accumulation; the pipeline's m).
    pub microbatches: u64,
    pub seq: u64,
    pub schedule: Schedule,
    pub recompute: Recompute,
    pub precision: Precision,
    /// DeepSpeed keeps an fp32 copy of its gradient partition for the
    /// optimizer (4 bytes a parameter over the data-parallel ranks), which
    /// its estimators count and the ZeRO paper's formula does not.
    pub fp32_grad_partition: bool,
    /// Fused attention (FlashAttention, PyTorch's SDPA kernels): the
    /// a·s² scores are never stored, in forward or backward; the kernel
    /// saves its output and a log-sum-exp per row (fp32).
    pub flash_attention: bool,
    /// Dropout in the model (p > 0): its masks, the attention's dropout
    /// output and the embedding's mask are saved. With p = 0 PyTorch's
    /// dropout returns its input and saves nothing (nanoGPT's default, and
    /// `--dropout`'s).
    pub dropout: bool,
}

impl Layout {
    /// A single-GPU step of `micro_batch` sequences of `seq` tokens, with
    /// dropout (Korthikanti et al.'s, Megatron's default).
    pub fn single(micro_batch: u64, seq: u64) -> Layout {
        Layout {
            dp: 1,
            tp: 1,
            sp: false,
            pp: 1,
            sharding: Sharding::Ddp,
            ddp: Ddp::default(),
            micro_batch,
            microbatches: 1,
            seq,
            schedule: Schedule::OneFOneB,
            recompute: Recompute::None,
            precision: Precision::Mixed,
            fp32_grad_partition: false,
            flash_attention: false,
            dropout: true,
        }
    }

    pub fn gpus(&self) -> u64 {
        self.dp * self.tp * self.pp
    }

    /// Sequences a step over all data-parallel ranks.
    pub fn global_batch(&self) -> u64 {
        self.dp * self.micro_batch * self.microbatches
    }

    /// Whether a stage's program would be past [`MAX_LAYER_PASSES`]
    /// (micro-batches × the stage's layers), too many to hold and replay.
    pub fn past_layer_passes(&self, model: &Transformer) -> bool {
        self.microbatches
            .saturating_mul(model.layers / self.pp.max(1))
            > MAX_LAYER_PASSES
    }

    /// Whether `model` can run this layout, or what is wrong and what would
    /// fix it.
    pub fn check(&self, model: &Transformer) -> Result<(), LayoutError> {
        let bad = |what: String| Err(LayoutError(what));
        if self.dp == 0 || self.tp == 0 || self.pp == 0 {
            return bad("--dp, --tp and --pp must be at least 1".into());
        }
        if self.micro_batch == 0 || self.microbatches == 0 || self.seq == 0 {
            return bad(
                "the micro-batch, the micro-batch count and the sequence length must be at least 1"
                    .into(),
            );
        }
        if let Sharding::Zero(s) = self.sharding {
            if !(1..=3).contains(&s) {
                return bad(format!(
                    "--zero {s}: ZeRO has stages 1, 2 and 3 (0 is plain DDP: leave --zero out)"
                ));
            }
        }
        if !model.heads.is_multiple_of(self.tp) || !model.hidden.is_multiple_of(self.tp) {
            return bad(format!(
                "--tp {}: tensor parallelism splits the {} heads and the hidden size {}; pick a divisor of both",
                self.tp, model.heads, model.hidden
            ));
        }
        if !model.layers.is_multiple_of(self.pp) {
            return bad(format!(
                "--pp {}: the {} layers must split evenly over the pipeline stages; pick a divisor of {}",
                self.pp, model.layers, model.layers
            ));
        }
        if self.sp && self.tp == 1 {
            return bad("--sp splits along the sequence the activations that tensor parallelism leaves whole; it needs --tp of 2 or more".into());
        }
        if self.sp && !self.seq.is_multiple_of(self.tp) {
            return bad(format!(
                "--sp: the sequence length {} must be a multiple of --tp {}",
                self.seq, self.tp
            ));
        }
        // Every size the programs compute must fit u64, and a program is
        // held in memory: about 25 allocations a layer and micro-batch.
        let big = |what: &str| {
            Err(LayoutError(format!(
                "{what} is too large to model; use smaller sizes (a real run of it could not be held either)"
            )))
        };
        let gpus = self
            .dp
            .checked_mul(self.tp)
            .and_then(|x| x.checked_mul(self.pp));
        let batch = self
            .dp
            .checked_mul(self.micro_batch)
            .and_then(|x| x.checked_mul(self.microbatches));
        let (s, b) = (self.seq, self.micro_batch);
        let scores = model
            .heads
            .checked_mul(s)
            .and_then(|x| x.checked_mul(s))
            .and_then(|x| x.checked_mul(b))
            .and_then(|x| x.checked_mul(8));
        let logits = s
            .checked_mul(b)
            .and_then(|x| x.checked_mul(model.vocab.max(model.hidden * 4)))
            .and_then(|x| x.checked_mul(8));
        let params = model.params().checked_mul(16);
        if gpus.is_none() || batch.is_none() {
            return big("--dp × --tp × --pp or the global batch");
        }
        if scores.is_none() || logits.is_none() || params.is_none() {
            return big("a tensor of this model and micro-batch");
        }
        if self.past_layer_passes(model) {
            return Err(LayoutError(format!(
                "--microbatches {} over {} layers a stage is past the {MAX_LAYER_PASSES} layer passes a program holds; use fewer micro-batches (a larger --batch) or more --pp",
                self.microbatches,
                model.layers / self.pp
            )));
        }
        if self.seq > model.positions {
            return bad(format!(
                "sequence length {} is longer than the model's {} positions",
                self.seq, model.positions
            ));
        }
        Ok(())
    }
}

/// Micro-batches × layers a stage the per-rank program is built for (about
/// 25 allocations each, two steps: some 10 million operations).
pub const MAX_LAYER_PASSES: u64 = 200_000;

/// A layout the model cannot run, with what would fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LayoutError(pub String);
