//! Optimizers. State is allocated lazily at the first step, as in PyTorch,
//! so memory steps up there (Adam/AdamW: two buffers per parameter; SGD with
//! momentum: one; plain SGD: none).

pub mod adam;
pub mod grad_scaler;
pub mod implementation;
mod phases;
pub mod sgd;

pub use adam::Adam;
pub use grad_scaler::GradScaler;
pub use implementation::OptimizerImpl;
pub use sgd::Sgd;

use crate::autograd::param::ParamStore;
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

/// What the training loop needs of an optimizer.
pub trait Optimizer {
    /// The name used on the command line and in reports.
    fn name(&self) -> &'static str;
    /// Bytes of optimizer state held now.
    fn state_bytes(&self) -> usize;
    /// One update of every parameter that has a gradient.
    fn step(&mut self, store: &mut ParamStore) -> Result<(), TensorError>;

    /// Whether [`Optimizer::step_unless_found`] runs: the step takes
    /// GradScaler's inf/NaN flag on the device, so the host does not wait
    /// for it mid-step (PyTorch's `_step_supports_amp_scaling`: the fused
    /// implementations).
    fn takes_found_inf(&self) -> bool {
        false
    }

    /// [`Optimizer::step`], changing nothing on the device where
    /// `found_inf` (one element, written by [`GradScaler::unscale_on_device`])
    /// is set. State is made either way, as PyTorch's fused optimizers make
    /// it before their kernels read the flag.
    fn step_unless_found(
        &mut self,
        store: &mut ParamStore,
        found_inf: &Tensor,
    ) -> Result<(), TensorError> {
        let _ = (store, found_inf);
        fused_only(
            OptimizerImpl::default(),
            "optimizer step with GradScaler's flag on the device",
        )
    }

    /// The host's side of a step the device skipped, once the step's final
    /// read has said so: counts that assumed an update go back by one.
    fn was_skipped(&mut self) -> Result<(), TensorError> {
        Ok(())
    }
}

/// Refuses a step with GradScaler's flag on the device where
/// `implementation` does not take it.
fn fused_only(implementation: OptimizerImpl, op: &'static str) -> Result<(), TensorError> {
    if implementation.takes_found_inf() {
        return Ok(());
    }
    Err(TensorError::NotSupported {
        op,
        what: "only the fused implementation takes it (--optimizer-impl fused)",
    })
}

/// A fused optimizer kernel's variant that reads GradScaler's flag (the
/// `SKIP` binding after the tensors) and returns where it is set.
fn skipping_kernel(name: &str, source: &'static str, dtype: DType) -> Kernel {
    Kernel::variant(
        format!("{name}[{dtype} found_inf]"),
        source,
        "main",
        crate::device::compose::Defs::elem(dtype.elem()).with("SKIP", 1u8),
    )
}
