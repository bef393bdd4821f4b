//! Which of torch.optim's three implementations a step follows: they
//! compute the same update but allocate different temporaries, and a large
//! model on a small batch peaks in `optimizer.step()`, so the choice moves
//! the peak (gpt2-xl AdamW: foreach's `_foreach_sqrt` list is 6.2 GB).

use serde::Serialize;

/// torch.optim's `foreach` / `fused` flags. PyTorch picks `foreach` when
/// every parameter is on CUDA and neither flag is given, so it is the
/// default here too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerImpl {
    /// `foreach=True` (`_multi_tensor_*`): one op over every parameter of a
    /// device and dtype at a time, so a temporary is a parameter-sized list.
    #[default]
    Foreach,
    /// `foreach=False` (`_single_tensor_*`): a parameter at a time, so a
    /// temporary is one parameter's size.
    ForLoop,
    /// `fused=True` (`_fused_*`): one kernel per parameter, no temporaries;
    /// Adam keeps its step count on the device (a 4-byte tensor each).
    Fused,
}

impl OptimizerImpl {
    /// Whether the step takes GradScaler's inf/NaN flag on the device and
    /// skips there (PyTorch's `_step_supports_amp_scaling`): the fused
    /// kernels only.
    pub fn takes_found_inf(self) -> bool {
        self == OptimizerImpl::Fused
    }

    pub fn name(self) -> &'static str {
        match self {
            OptimizerImpl::Foreach => "foreach",
            OptimizerImpl::ForLoop => "for-loop",
            OptimizerImpl::Fused => "fused",
        }
    }
}

impl std::fmt::Display for OptimizerImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
