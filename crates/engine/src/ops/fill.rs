//! `fill`: set every element to a value, on the GPU (ordered with other work).

use super::{check_u32, launch_flat};
use crate::device::{Kernel, Part};
use crate::tensor::{DType, Engine, Tensor, TensorError};

const FILL: Kernel = Kernel::fixed(
    "fill",
    include_str!("../../../../shaders/fill.wgsl"),
    "main",
);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct FillParams {
    n: u32,
    value: f32,
    _pad: [u32; 2],
}

/// Writes `value` into every element of `t`.
pub fn fill(t: &Tensor, value: f32) -> Result<(), TensorError> {
    t.require_f32("fill")?;
    check_u32("fill", t)?;
    let n = t.numel();
    let params = FillParams {
        n: n as u32,
        value,
        _pad: [0; 2],
    };
    launch_flat(
        t,
        &FILL,
        &[(&t.slice(), Part::Elements(4))],
        bytemuck::bytes_of(&params),
        n,
        1,
    )
}

/// A new f32 tensor full of `value`.
pub fn full(
    engine: &Engine,
    shape: &[usize],
    value: f32,
    label: &str,
) -> Result<Tensor, TensorError> {
    let t = Tensor::empty(engine, shape, DType::F32, label)?;
    fill(&t, value)?;
    Ok(t)
}

/// A new f32 tensor of zeros.
pub fn zeros(engine: &Engine, shape: &[usize], label: &str) -> Result<Tensor, TensorError> {
    full(engine, shape, 0.0, label)
}

/// A new tensor of zeros in `dtype` (zero is all-zero bits in every
/// dtype, so a 16-bit tensor is filled word by word).
pub fn zeros_as(
    engine: &Engine,
    shape: &[usize],
    dtype: DType,
    label: &str,
) -> Result<Tensor, TensorError> {
    let t = Tensor::empty(engine, shape, dtype, label)?;
    check_u32("fill", &t)?;
    let words = (t.nbytes()).div_ceil(4);
    let params = FillParams {
        n: words as u32,
        value: 0.0,
        _pad: [0; 2],
    };
    launch_flat(
        &t,
        &FILL,
        &[(&t.slice(), Part::Elements(4))],
        bytemuck::bytes_of(&params),
        words,
        1,
    )?;
    Ok(t)
}
