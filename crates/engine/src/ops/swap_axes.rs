//! Exchanging the middle axes of a 4-D tensor, `[A, B, C, E] → [A, C, B, E]`,
//! into a new contiguous tensor: multi-head attention's split into heads
//! (`[N, S, H, hd] → [N, H, S, hd]`) and merge back. PyTorch does the same
//! copy implicitly when `matmul` reshapes a transposed view, and saves the
//! copy, so the tape saves what PyTorch saves.

use super::{check_u32, launch};
use crate::memory::Category;
use crate::tensor::{Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/swap_axes.wgsl");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    a: u32,
    b: u32,
    c: u32,
    e: u32,
}

/// `x.transpose(1, 2).contiguous()` for a 4-D `x`.
pub fn swap_axes_12(x: &Tensor, label: &str) -> Result<Tensor, TensorError> {
    swap_axes_12_as(x, label, None)
}

/// [`swap_axes_12`] into a tensor of the given memory category (a
/// convolution's transposed weight is a workspace).
pub(crate) fn swap_axes_12_as(
    x: &Tensor,
    label: &str,
    category: Option<Category>,
) -> Result<Tensor, TensorError> {
    check_u32("swap axes", x)?;
    let [a, b, c, e] = match x.shape() {
        [a, b, c, e] => [*a, *b, *c, *e],
        s => {
            return Err(TensorError::WrongShape {
                op: "swap axes",
                want: "a 4-D tensor",
                sizes: Vec::new(),
                got: s.to_vec(),
            })
        }
    };
    let out = Tensor::empty_as(x.engine(), &[a, c, b, e], x.dtype(), label, category)?;
    let p = Params {
        a: a as u32,
        b: b as u32,
        c: c as u32,
        e: e as u32,
    };
    launch(
        x,
        &super::typed_kernel("swap_axes", SOURCE, "main", x.dtype()),
        &[&x.slice(), &out.slice()],
        bytemuck::bytes_of(&p),
        x.numel().div_ceil(2),
    )?;
    Ok(out)
}
