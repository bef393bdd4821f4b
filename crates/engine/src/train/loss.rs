//! Which cross-entropy a step runs. With the logits the loop holds, PyTorch's
//! `F.cross_entropy` keeps four vocabulary-sized buffers alive at once in
//! backward (the logits, the saved log-probabilities, two gradients),
//! vramlab's fused kernel two (the logits and their gradient), PyTorch's
//! chunked `linear_cross_entropy` none (a chunk's logits, and the head's
//! gradients made in the forward pass); for a large vocabulary that is the
//! difference between fitting and not.

use crate::autograd::{functions as f, Tape, Value};
use crate::nn::{Model, ParamStore};
use crate::ops::linear_cross_entropy::MAX_CHUNK_ROWS;
use crate::tensor::{ConfigError, Tensor, TensorError};
use serde::Serialize;

/// `--loss`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossMode {
    /// `F.cross_entropy` as PyTorch runs it: `log_softmax`, then
    /// `nll_loss` (the default: the step a PyTorch user runs).
    #[default]
    CrossEntropy,
    /// vramlab's fused kernel: the loss from the logits directly, and in
    /// backward one gradient computed from the saved logits.
    Fused,
    /// PyTorch 2.15's chunked `F.linear_cross_entropy(h, W, y,
    /// options=LinearCrossEntropyOptions(batch_chunk_size=ROWS))`: the head
    /// and the loss a chunk of rows at a time, so the logits never exist;
    /// `None` is PyTorch's own chunk size.
    Chunked(Option<usize>),
}

impl LossMode {
    /// Refuses a loss `model`'s head cannot take: `--loss chunked` runs the
    /// head inside the loss, which needs a bias-free linear head (gpt's,
    /// tied to the embedding).
    pub fn check_model(self, model: &crate::nn::ModelSpec) -> Result<(), TensorError> {
        if !self.fuses_head() || model.bias_free_head() {
            return Ok(());
        }
        Err(TensorError::NeedsLinearHead {
            loss: self.name(),
            model: model.name().to_string(),
        })
    }

    pub const NAMES: &'static str = "cross-entropy, fused, chunked[:ROWS]";

    /// The mode's name as `--loss` takes it (`chunked:64`).
    pub fn name(self) -> String {
        match self {
            LossMode::CrossEntropy => "cross-entropy".into(),
            LossMode::Fused => "fused".into(),
            LossMode::Chunked(None) => "chunked".into(),
            LossMode::Chunked(Some(r)) => format!("chunked:{r}"),
        }
    }

    /// Whether the loss runs the model's head itself (from the head's input
    /// and weight) rather than taking the logits.
    pub fn fuses_head(self) -> bool {
        matches!(self, LossMode::Chunked(_))
    }

    /// `--loss NAME`.
    pub fn parse(s: &str) -> Result<LossMode, ConfigError> {
        match s.trim() {
            "cross-entropy" | "cross_entropy" | "ce" => Ok(LossMode::CrossEntropy),
            "fused" => Ok(LossMode::Fused),
            "chunked" => Ok(LossMode::Chunked(None)),
            other => match other.strip_prefix("chunked:") {
                Some(rows) => match rows.trim().parse::<usize>() {
                    Ok(0) => Err(ConfigError::ChunkRowsZero),
                    Ok(r) if r > MAX_CHUNK_ROWS => Err(ConfigError::ChunkRowsTooMany {
                        rows: r,
                        max: MAX_CHUNK_ROWS,
                    }),
                    Ok(r) => Ok(LossMode::Chunked(Some(r))),
                    Err(_) => Err(ConfigError::ChunkRowsNotANumber {
                        given: rows.to_string(),
                    }),
                },
                None => Err(ConfigError::Unknown {
                    what: "loss",
                    given: other.to_string(),
                    known: Self::NAMES,
                }),
            },
        }
    }

    /// The model's forward pass and this loss over `labels`: what the loop
    /// holds until the next step rebinds it (the logits, or under
    /// `chunked`, which never makes them, the head's input) and the mean
    /// loss. `previous` is the last step's, released where a Python loop
    /// rebinds its names: its logits once the model's forward returns, its
    /// loss once this one exists.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        self,
        tape: &Tape,
        model: &dyn Model,
        store: &ParamStore,
        x: &Value,
        checkpointed: bool,
        labels: &Tensor,
        previous: Option<super::step::StepOutputs>,
    ) -> Result<(Value, Value), TensorError> {
        let (old_logits, old_loss) = match previous {
            Some(p) => (Some(p.logits), Some(p.loss)),
            None => (None, None),
        };
        if let LossMode::Chunked(rows) = self {
            let (h, w) = model
                .forward_head_input(tape, store, x, checkpointed)?
                .ok_or_else(|| TensorError::NeedsLinearHead {
                    loss: self.name(),
                    model: "this model".to_string(),
                })?;
            drop(old_logits);
            let loss = f::linear_cross_entropy(tape, &h, &w, labels, rows)?;
            drop(old_loss);
            return Ok((h, loss));
        }
        let logits = if checkpointed {
            model.forward_checkpointed(tape, store, x)?
        } else {
            model.forward(tape, store, x)?
        };
        drop(old_logits);
        let loss = match self {
            LossMode::Fused => f::cross_entropy(tape, &logits, labels)?,
            _ => f::cross_entropy_torch(tape, &logits, labels)?,
        };
        drop(old_loss);
        Ok((logits, loss))
    }
}

impl std::fmt::Display for LossMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}
