//! Elementwise `add`, `sub`, `mul` and `sqdiff` of same-shaped tensors.
//! `add`'s backward is the identity for both inputs (the tape passes the
//! upstream gradient through), so it needs no kernel of its own.

use super::{
    check_u32, launch_flat, same_dtype, same_parts, same_shape, typed_kernel, CountParams,
};
use crate::tensor::{Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/binary.wgsl");

/// `op` of same-shaped, same-dtype tensors, into a new tensor of that dtype.
fn binary(op: &'static str, a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    same_shape(op, a, b)?;
    same_dtype(op, a, b)?;
    check_u32(op, a)?;
    let out = Tensor::empty(a.engine(), a.shape(), a.dtype(), &format!("{op}.out"))?;
    let n = a.numel();
    launch_flat(
        a,
        &typed_kernel(op, SOURCE, op, a.dtype()),
        &same_parts(a, &[&a.slice(), &b.slice(), &out.slice()]),
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
        2,
    )?;
    Ok(out)
}

/// `a + b`, elementwise.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary("add", a, b)
}

/// `a - b`, elementwise.
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary("sub", a, b)
}

/// `(a - b)²`, elementwise (MSE's per-element term).
pub fn sqdiff(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary("sqdiff", a, b)
}

/// `a * b`, elementwise.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary("mul", a, b)
}

/// Gradient accumulation: `prev += g` in place when `prev` is the only
/// handle to its storage (what PyTorch's AccumulateGrad does: no new
/// tensor, so a second contribution costs no memory), else `prev + g`;
/// `g` when there is nothing yet.
pub fn accumulate(prev: Option<Tensor>, g: Tensor) -> Result<Tensor, TensorError> {
    match prev {
        Some(prev) if prev.is_unique() && prev.dtype() == g.dtype() => {
            same_shape("add", &prev, &g)?;
            check_u32("add", &prev)?;
            let n = prev.numel();
            // Each invocation reads and writes the same pair of elements,
            // so reading and writing one buffer is race-free.
            launch_flat(
                &prev,
                &typed_kernel("add", SOURCE, "add", prev.dtype()),
                &same_parts(&prev, &[&prev.slice(), &g.slice(), &prev.slice()]),
                bytemuck::bytes_of(&CountParams::new(n)),
                n,
                2,
            )?;
            Ok(prev)
        }
        Some(prev) => add(&prev, &g),
        None => Ok(g),
    }
}
