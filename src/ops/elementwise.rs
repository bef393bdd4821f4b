//! Elementwise `add`, `sub`, `mul` and `sqdiff` of same-shaped tensors.
//! `add`'s backward is the identity for both inputs (the tape passes the
//! upstream gradient through), so it needs no kernel of its own.

use super::{check_u32, launch, same_shape, CountParams};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../shaders/binary.wgsl");
const ADD: Kernel = Kernel::fixed("add", SOURCE, "add");
const SUB: Kernel = Kernel::fixed("sub", SOURCE, "sub");
const SQDIFF: Kernel = Kernel::fixed("sqdiff", SOURCE, "sqdiff");
const MUL: Kernel = Kernel::fixed("mul", SOURCE, "mul");

fn binary(
    kernel: &Kernel,
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
) -> Result<Tensor, TensorError> {
    same_shape(op, a, b)?;
    a.require_f32(op)?;
    b.require_f32(op)?;
    check_u32(op, a)?;
    let out = Tensor::empty(a.engine(), a.shape(), DType::F32, &format!("{op}.out"))?;
    let n = a.numel();
    launch(
        a,
        kernel,
        &[&a.slice(), &b.slice(), &out.slice()],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
    )?;
    Ok(out)
}

/// `a + b`, elementwise.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(&ADD, "add", a, b)
}

/// `a - b`, elementwise.
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(&SUB, "sub", a, b)
}

/// `(a - b)²`, elementwise (MSE's per-element term).
pub fn sqdiff(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(&SQDIFF, "sqdiff", a, b)
}

/// `a * b`, elementwise.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(&MUL, "mul", a, b)
}

/// Gradient accumulation: `prev + g`, or `g` when there is nothing yet.
pub fn accumulate(prev: Option<Tensor>, g: Tensor) -> Result<Tensor, TensorError> {
    match prev {
        Some(prev) => add(&prev, &g),
        None => Ok(g),
    }
}
