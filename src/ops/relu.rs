//! `relu`: max(x, 0) into a new tensor.

use super::{check_u32, CountParams};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const RELU: Kernel = Kernel::fixed("relu", include_str!("../../shaders/relu.wgsl"), "main");

/// max(x, 0), elementwise, into a new tensor.
pub fn relu(x: &Tensor) -> Result<Tensor, TensorError> {
    x.require_f32("relu")?;
    check_u32("relu", x)?;
    let out = Tensor::empty(x.engine(), x.shape(), DType::F32, "relu.out")?;
    let n = x.numel();
    super::launch(
        x,
        &RELU,
        &[&x.slice(), &out.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
    )?;
    Ok(out)
}

const RELU_BACKWARD: Kernel = Kernel::fixed(
    "relu_backward",
    include_str!("../../shaders/relu_backward.wgsl"),
    "main",
);

/// The gradient of ReLU from its saved output `y`: `dy` where `y > 0`.
pub fn relu_backward(y: &Tensor, dy: &Tensor) -> Result<Tensor, TensorError> {
    super::same_shape("relu backward", y, dy)?;
    let dx = Tensor::empty(y.engine(), y.shape(), DType::F32, "relu.grad_input")?;
    let n = y.numel();
    super::launch(
        y,
        &RELU_BACKWARD,
        &[&y.slice(), &dy.slice(), &dx.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
    )?;
    Ok(dx)
}
