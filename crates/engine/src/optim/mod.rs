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
use crate::tensor::TensorError;

/// What the training loop needs of an optimizer.
pub trait Optimizer {
    /// The name used on the command line and in reports.
    fn name(&self) -> &'static str;
    /// Bytes of optimizer state held now.
    fn state_bytes(&self) -> usize;
    /// One update of every parameter that has a gradient.
    fn step(&mut self, store: &mut ParamStore) -> Result<(), TensorError>;
}
