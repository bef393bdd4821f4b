//! `relu`: max(x, 0) into a new tensor.

use super::{check_u32, CountParams, ELEMENTWISE_WORKGROUP};
use crate::device::{Kernel, Workgroups};
use crate::tensor::{DType, Tensor, TensorError};

const RELU: Kernel = Kernel {
    name: "relu",
    source: include_str!("../../shaders/relu.wgsl"),
    entry: "main",
};

/// max(x, 0), elementwise, into a new tensor.
pub fn relu(x: &Tensor) -> Result<Tensor, TensorError> {
    x.require_f32("relu")?;
    check_u32("relu", x)?;
    let out = Tensor::empty(x.engine(), x.shape(), DType::F32, "relu.out")?;
    let n = x.numel();
    x.engine().gpu().dispatch(
        &RELU,
        &[&x.slice(), &out.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        Workgroups::Linear((n as u64).div_ceil(ELEMENTWISE_WORKGROUP)),
    )?;
    Ok(out)
}
