//! `relu`: max(x, 0) into a new tensor.

use super::{check_u32, launch_pairs, typed_kernel, CountParams};
use crate::tensor::{Tensor, TensorError};

const RELU: &str = include_str!("../../shaders/relu.wgsl");
const RELU_BACKWARD: &str = include_str!("../../shaders/relu_backward.wgsl");

/// max(x, 0), elementwise, into a new tensor of x's dtype.
pub fn relu(x: &Tensor) -> Result<Tensor, TensorError> {
    check_u32("relu", x)?;
    let out = Tensor::empty(x.engine(), x.shape(), x.dtype(), "relu.out")?;
    let n = x.numel();
    launch_pairs(
        x,
        &typed_kernel("relu", RELU, "main", x.dtype()),
        &[&x.slice(), &out.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
    )?;
    Ok(out)
}

/// The gradient of ReLU from its saved output `y`: `dy` where `y > 0`.
pub fn relu_backward(y: &Tensor, dy: &Tensor) -> Result<Tensor, TensorError> {
    super::same_shape("relu backward", y, dy)?;
    super::same_dtype("relu backward", y, dy)?;
    let dx = Tensor::empty(y.engine(), y.shape(), y.dtype(), "relu.grad_input")?;
    let n = y.numel();
    launch_pairs(
        y,
        &typed_kernel("relu_backward", RELU_BACKWARD, "main", y.dtype()),
        &[&y.slice(), &dy.slice(), &dx.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
    )?;
    Ok(dx)
}
