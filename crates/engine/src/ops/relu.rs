//! `relu`: max(x, 0) into a new tensor.

use super::{check_u32, launch_vec4_or_pairs, CountParams};
use crate::tensor::{Tensor, TensorError};

const RELU: &str = include_str!("../../../../shaders/relu.wgsl");
const RELU_BACKWARD: &str = include_str!("../../../../shaders/relu_backward.wgsl");

/// max(x, 0), elementwise, into a new tensor of x's dtype.
pub fn relu(x: &Tensor) -> Result<Tensor, TensorError> {
    check_u32("relu", x)?;
    let out = Tensor::empty(x.engine(), x.shape(), x.dtype(), "relu.out")?;
    let n = x.numel();
    launch_vec4_or_pairs(
        x,
        "relu",
        RELU,
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
    launch_vec4_or_pairs(
        y,
        "relu_backward",
        RELU_BACKWARD,
        &[&y.slice(), &dy.slice(), &dx.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
    )?;
    Ok(dx)
}
