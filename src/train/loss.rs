//! Which cross-entropy a step runs. With the logits the loop holds, PyTorch's
//! `F.cross_entropy` keeps four vocabulary-sized buffers alive at once in
//! backward (the logits, the saved log-probabilities, two gradients),
//! vramlab's fused kernel two (the logits and their gradient); for a large
//! vocabulary that is the difference between fitting and not.

use crate::autograd::{functions as f, Tape, Value};
use crate::tensor::{Tensor, TensorError};
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
}

impl LossMode {
    pub const NAMES: &'static str = "cross-entropy, fused";

    pub fn name(self) -> &'static str {
        match self {
            LossMode::CrossEntropy => "cross-entropy",
            LossMode::Fused => "fused",
        }
    }

    /// `--loss NAME`.
    pub fn parse(s: &str) -> Result<LossMode, String> {
        match s.trim() {
            "cross-entropy" | "cross_entropy" | "ce" => Ok(LossMode::CrossEntropy),
            "fused" => Ok(LossMode::Fused),
            other => Err(format!(
                "unknown loss {other:?}; the losses are: {} (chunked, PyTorch's linear_cross_entropy, is not built yet)",
                Self::NAMES
            )),
        }
    }

    /// The mean loss of `logits` `[N, classes]` against `labels` `[N]`.
    pub fn apply(self, tape: &Tape, logits: &Value, labels: &Tensor) -> Result<Value, TensorError> {
        match self {
            LossMode::CrossEntropy => f::cross_entropy_torch(tape, logits, labels),
            LossMode::Fused => f::cross_entropy(tape, logits, labels),
        }
    }
}

impl std::fmt::Display for LossMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
