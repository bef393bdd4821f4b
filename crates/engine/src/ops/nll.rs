//! `F.cross_entropy` as PyTorch decomposes it — `log_softmax` over the
//! classes, then `nll_loss` with mean reduction — so that it allocates what
//! PyTorch's does: the log-probabilities (saved for backward), the loss and
//! `total_weight` (two scalars); in backward a zero-filled gradient from
//! `nll_loss_backward` and a second from `_log_softmax_backward_data`
//! while the log-probabilities are still saved. Labels are class indices
//! stored as f32 (exact below 2²⁴), as in `cross_entropy`.

use super::cross_entropy::Params;
use crate::device::{Kernel, Part, Workgroups};
use crate::ops::fill;
use crate::tensor::{DType, Tensor, TensorError};

const LOG_SOFTMAX: Kernel = Kernel::fixed(
    "log_softmax",
    include_str!("../../../../shaders/log_softmax.wgsl"),
    "main",
);
const LOG_SOFTMAX_BACKWARD: Kernel = Kernel::fixed(
    "log_softmax_backward",
    include_str!("../../../../shaders/log_softmax_backward.wgsl"),
    "main",
);
const NLL: Kernel = Kernel::fixed(
    "nll_loss",
    include_str!("../../../../shaders/nll_loss.wgsl"),
    "main",
);
const NLL_BACKWARD: Kernel = Kernel::fixed(
    "nll_loss_backward",
    include_str!("../../../../shaders/nll_loss_backward.wgsl"),
    "main",
);

/// `nll_loss`'s uniform: the shape and the rows this dispatch sums.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct NllRange {
    rows: u32,
    classes: u32,
    begin: u32,
    end: u32,
}

/// `[rows, classes]`, f32, indexable in u32.
fn rows_of(op: &'static str, x: &Tensor) -> Result<Params, TensorError> {
    let s = x.shape();
    if s.len() != 2 || s[1] == 0 {
        return Err(TensorError::WrongShape {
            op,
            want: "[rows, classes] with at least one class",
            sizes: Vec::new(),
            got: s.to_vec(),
        });
    }
    if x.dtype() != DType::F32 {
        return Err(TensorError::WrongDType {
            op,
            want: DType::F32,
            got: x.dtype(),
            why: "autocast's rule for it",
        });
    }
    super::check_u32(op, x)?;
    super::check_row_length(op, x, super::LONGEST_REDUCED_ROW)?;
    Ok(Params::of(s))
}

fn check_labels(op: &'static str, x: &Tensor, labels: &Tensor) -> Result<Params, TensorError> {
    let p = rows_of(op, x)?;
    if labels.shape() != [x.shape()[0]] {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: labels.shape().to_vec(),
        });
    }
    Ok(p)
}

/// `torch.log_softmax(x, dim=1)`: a new `[rows, classes]` tensor.
pub fn log_softmax(x: &Tensor) -> Result<Tensor, TensorError> {
    let p = rows_of("log_softmax", x)?;
    let y = Tensor::empty(x.engine(), x.shape(), DType::F32, "log_softmax.out")?;
    let row = Part::Elements(p.classes as u64 * 4);
    super::launch_rows(
        x,
        &LOG_SOFTMAX,
        &[(&x.slice(), row), (&y.slice(), row)],
        bytemuck::bytes_of(&p),
        p.rows as usize,
        1,
        1,
    )?;
    Ok(y)
}

/// `_log_softmax_backward_data(g, y)`: the input gradient from the saved
/// output `y` and the upstream gradient `g`.
pub fn log_softmax_backward(g: &Tensor, y: &Tensor) -> Result<Tensor, TensorError> {
    super::same_shape("log_softmax backward", y, g)?;
    let p = rows_of("log_softmax backward", y)?;
    let dx = Tensor::empty(y.engine(), y.shape(), DType::F32, "log_softmax.grad_input")?;
    let row = Part::Elements(p.classes as u64 * 4);
    super::launch_rows(
        y,
        &LOG_SOFTMAX_BACKWARD,
        &[(&g.slice(), row), (&y.slice(), row), (&dx.slice(), row)],
        bytemuck::bytes_of(&p),
        p.rows as usize,
        1,
        1,
    )?;
    Ok(dx)
}

/// `nll_loss_forward(logp, labels)`, mean reduction: the loss and
/// `total_weight` (the row count, which backward divides by), each a
/// one-element tensor made in that order.
pub fn nll_loss(logp: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor), TensorError> {
    let p = check_labels("nll_loss", logp, labels)?;
    let e = logp.engine();
    let out = Tensor::empty(e, &[1], DType::F32, "loss")?;
    let total_weight = Tensor::empty(e, &[1], DType::F32, "nll_loss.total_weight")?;
    // Rows [begin, end) a dispatch: one workgroup's 256 invocations walk
    // at most MAX_LOOP_ITERATIONS rows each; later ones add to `out`.
    let rows = p.rows as usize;
    let step = 256 * super::MAX_LOOP_ITERATIONS;
    for begin in (0..rows.max(1)).step_by(step) {
        let range = NllRange {
            rows: p.rows,
            classes: p.classes,
            begin: begin as u32,
            end: (begin + step).min(rows) as u32,
        };
        e.dispatch(
            &NLL,
            &[
                &logp.slice(),
                &labels.slice(),
                &out.slice(),
                &total_weight.slice(),
            ],
            bytemuck::bytes_of(&range),
            Workgroups::Linear(1),
        )?;
    }
    Ok((out, total_weight))
}

/// `nll_loss_backward`: a zero-filled `[rows, classes]` gradient with
/// `-dloss / total_weight` at each row's label.
pub fn nll_loss_backward(
    logp: &Tensor,
    labels: &Tensor,
    dloss: &Tensor,
    total_weight: &Tensor,
) -> Result<Tensor, TensorError> {
    let p = check_labels("nll_loss backward", logp, labels)?;
    let e = logp.engine();
    let dx = fill::zeros_as(e, logp.shape(), DType::F32, "nll_loss.grad_input")?;
    e.dispatch(
        &NLL_BACKWARD,
        &[
            &labels.slice(),
            &dloss.slice(),
            &total_weight.slice(),
            &dx.slice(),
        ],
        bytemuck::bytes_of(&p),
        Workgroups::Linear((p.rows as u64).div_ceil(256)),
    )?;
    Ok(dx)
}
