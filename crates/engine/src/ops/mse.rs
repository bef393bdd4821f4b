//! Mean squared error, `mean((pred − target)²)`, and its gradient with
//! respect to `pred`: (2/n) · dloss · (pred − target).

use super::elementwise::sqdiff;
use super::mean::mean;
use super::{launch, same_shape, CountParams};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const BACKWARD: Kernel = Kernel::fixed(
    "mse_backward",
    include_str!("../../../../shaders/mse_backward.wgsl"),
    "main",
);

/// The loss, a one-element tensor.
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor, TensorError> {
    same_shape("mse", pred, target)?;
    let sq = sqdiff(pred, target)?;
    sq.storage().retag(crate::memory::Category::Temporary);
    mean(&sq, "loss")
}

/// The gradient with respect to `pred`, given the loss gradient `dloss` `[1]`.
pub fn mse_backward(pred: &Tensor, target: &Tensor, dloss: &Tensor) -> Result<Tensor, TensorError> {
    same_shape("mse backward", pred, target)?;
    let dx = Tensor::empty(pred.engine(), pred.shape(), DType::F32, "mse.grad_input")?;
    let n = pred.numel();
    launch(
        pred,
        &BACKWARD,
        &[&pred.slice(), &target.slice(), &dloss.slice(), &dx.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
    )?;
    Ok(dx)
}
