//! GELU with the tanh approximation (GPT-2's activation; PyTorch's
//! `gelu(approximate='tanh')`), f32. Backward needs the input, which is
//! what PyTorch saves: unlike ReLU, the output alone does not give the slope.

use super::{check_u32, launch_flat, same_parts, CountParams};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/gelu.wgsl");
const FORWARD: Kernel = Kernel::fixed("gelu_forward", SOURCE, "forward");
const BACKWARD: Kernel = Kernel::fixed("gelu_backward", SOURCE, "backward");

/// `gelu(x)` (tanh approximation) into a new tensor.
pub fn gelu(x: &Tensor) -> Result<Tensor, TensorError> {
    x.require_f32("gelu")?;
    check_u32("gelu", x)?;
    let y = Tensor::empty(x.engine(), x.shape(), DType::F32, "gelu.out")?;
    launch_flat(
        x,
        &FORWARD,
        &same_parts(x, &[&x.slice(), &x.slice(), &y.slice()]),
        bytemuck::bytes_of(&CountParams::new(x.numel())),
        x.numel(),
        1,
    )?;
    Ok(y)
}

/// The input gradient from the saved input `x` and the upstream gradient `g`.
pub fn gelu_backward(x: &Tensor, g: &Tensor) -> Result<Tensor, TensorError> {
    super::same_shape("gelu backward", x, g)?;
    g.require_f32("gelu backward")?;
    let dx = Tensor::empty(x.engine(), x.shape(), DType::F32, "gelu.grad_input")?;
    launch_flat(
        x,
        &BACKWARD,
        &same_parts(x, &[&x.slice(), &g.slice(), &dx.slice()]),
        bytemuck::bytes_of(&CountParams::new(x.numel())),
        x.numel(),
        1,
    )?;
    Ok(dx)
}
