//! Mean cross-entropy of logits `[N, C]` against integer labels (an f32
//! tensor `[N]` of class indices, exact below 2²⁴), numerically stable
//! (log-sum-exp with the row maximum subtracted), and its gradient.

use super::mean::mean;
use crate::device::{Kernel, Part, Workgroups};
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const FORWARD: Kernel = Kernel::fixed(
    "cross_entropy_forward",
    include_str!("../../../../shaders/cross_entropy_forward.wgsl"),
    "main",
);
const BACKWARD: Kernel = Kernel::fixed(
    "cross_entropy_backward",
    include_str!("../../../../shaders/cross_entropy_backward.wgsl"),
    "main",
);

/// The row kernels' uniform (`ops::nll`'s too): rows and classes.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Params {
    pub rows: u32,
    pub classes: u32,
    _pad: [u32; 2],
}

impl Params {
    /// Of a `[rows, classes]` shape the caller has checked.
    pub(super) fn of(shape: &[usize]) -> Params {
        Params {
            rows: shape[0] as u32,
            classes: shape[1] as u32,
            _pad: [0; 2],
        }
    }
}

fn check(logits: &Tensor, labels: &Tensor) -> Result<Params, TensorError> {
    let s = logits.shape();
    if s.len() != 2 || labels.shape() != [s[0]] {
        return Err(TensorError::ShapeMismatch {
            op: "cross_entropy",
            lhs: s.to_vec(),
            rhs: labels.shape().to_vec(),
        });
    }
    // The kernel indexes in u32; a simulated device (estimates) runs none.
    super::check_u32("cross_entropy", logits)?;
    super::check_row_length("cross_entropy", logits, super::LONGEST_REDUCED_ROW)?;
    Ok(Params::of(s))
}

/// Mean cross-entropy, a one-element tensor.
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor, TensorError> {
    let p = check(logits, labels)?;
    let losses = Tensor::empty_as(
        logits.engine(),
        &[logits.shape()[0]],
        DType::F32,
        "cross_entropy.rows",
        Some(Category::Temporary),
    )?;
    super::launch_rows(
        logits,
        &FORWARD,
        &[
            (&logits.slice(), Part::Elements(p.classes as u64 * 4)),
            (&labels.slice(), Part::Elements(4)),
            (&losses.slice(), Part::Elements(4)),
        ],
        bytemuck::bytes_of(&p),
        p.rows as usize,
        1,
        1,
    )?;
    mean(&losses, "loss")
}

/// Gradient with respect to the logits, given the loss gradient `dloss` `[1]`.
pub fn cross_entropy_backward(
    logits: &Tensor,
    labels: &Tensor,
    dloss: &Tensor,
) -> Result<Tensor, TensorError> {
    let p = check(logits, labels)?;
    let dx = Tensor::empty(
        logits.engine(),
        logits.shape(),
        DType::F32,
        "cross_entropy.grad_input",
    )?;
    logits.engine().dispatch(
        &BACKWARD,
        &[
            &logits.slice(),
            &labels.slice(),
            &dloss.slice(),
            &dx.slice(),
        ],
        bytemuck::bytes_of(&p),
        Workgroups::Linear(p.rows as u64),
    )?;
    Ok(dx)
}
