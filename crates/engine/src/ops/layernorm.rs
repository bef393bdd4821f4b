//! LayerNorm over the last axis (GPT's pre-LN blocks), f32, as PyTorch's
//! `native_layer_norm`: biased variance, `eps` inside the square root, and
//! per-row `mean` and `rstd` returned beside the output because backward
//! needs them — PyTorch saves the input, these two `[rows]` tensors and the
//! affine parameters, and so does the tape.

use super::{
    check_row_length, check_u32, launch, launch_rows, LONGEST_REDUCED_ROW, MAX_LOOP_ITERATIONS,
};
use crate::device::{Kernel, Part};
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/layernorm.wgsl");
const FORWARD: Kernel = Kernel::fixed("layernorm_forward", SOURCE, "forward");
const BACKWARD_INPUT: Kernel = Kernel::fixed("layernorm_backward_input", SOURCE, "backward_input");
const BACKWARD_PARAMS: Kernel =
    Kernel::fixed("layernorm_backward_params", SOURCE, "backward_params");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    r0: u32,
    nr: u32,
    accumulate: u32,
    _p: [u32; 2],
}

/// What the forward hands to backward.
pub struct LayerNormOut {
    pub y: Tensor,
    /// Per-row mean and 1/√(var + eps), `[rows]` f32 each.
    pub mean: Tensor,
    pub rstd: Tensor,
}

fn check(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(usize, usize), TensorError> {
    for t in [x, w, b] {
        t.require_f32("layernorm")?;
    }
    check_u32("layernorm", x)?;
    check_row_length("layernorm", x, LONGEST_REDUCED_ROW)?;
    let cols = *x.shape().last().unwrap_or(&0);
    if w.shape() != [cols] || b.shape() != [cols] {
        return Err(TensorError::ShapeMismatch {
            op: "layernorm (weight and bias are [last axis])",
            lhs: x.shape().to_vec(),
            rhs: w.shape().to_vec(),
        });
    }
    Ok((x.numel() / cols, cols))
}

fn params(rows: usize, cols: usize, eps: f32) -> Params {
    Params {
        rows: rows as u32,
        cols: cols as u32,
        eps,
        r0: 0,
        nr: 0,
        accumulate: 0,
        _p: [0; 2],
    }
}

/// `layer_norm(x, [cols], w, b, eps)`.
pub fn layernorm(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f32,
) -> Result<LayerNormOut, TensorError> {
    let (rows, cols) = check(x, w, b)?;
    let e = x.engine();
    let y = Tensor::empty(e, x.shape(), DType::F32, "layernorm.out")?;
    let mean = Tensor::empty(e, &[rows], DType::F32, "layernorm.mean")?;
    let rstd = Tensor::empty(e, &[rows], DType::F32, "layernorm.rstd")?;
    let p = params(rows, cols, eps);
    let (row, one) = (Part::Elements(cols as u64 * 4), Part::Elements(4));
    launch_rows(
        x,
        &FORWARD,
        &[
            (&x.slice(), row),
            (&w.slice(), Part::Whole),
            (&b.slice(), Part::Whole),
            (&y.slice(), row),
            (&mean.slice(), one),
            (&rstd.slice(), one),
        ],
        bytemuck::bytes_of(&p),
        rows,
        1,
        1,
    )?;
    Ok(LayerNormOut { y, mean, rstd })
}

/// `(dx, dw, db)` from the saved input, weight, mean and rstd.
pub fn layernorm_backward(
    x: &Tensor,
    w: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor, Tensor), TensorError> {
    let (rows, cols) = check(x, w, w)?;
    super::same_shape("layernorm backward", x, g)?;
    g.require_f32("layernorm backward")?;
    let e = x.engine();
    let dx = Tensor::empty(e, x.shape(), DType::F32, "layernorm.grad_input")?;
    let dw = Tensor::empty(e, &[cols], DType::F32, "layernorm.grad_weight")?;
    let db = Tensor::empty(e, &[cols], DType::F32, "layernorm.grad_bias")?;
    let mut p = params(rows, cols, 0.0);
    let (row, one) = (Part::Elements(cols as u64 * 4), Part::Elements(4));
    launch_rows(
        x,
        &BACKWARD_INPUT,
        &[
            (&x.slice(), row),
            (&w.slice(), Part::Whole),
            (&g.slice(), row),
            (&dx.slice(), row),
            (&mean.slice(), one),
            (&rstd.slice(), one),
        ],
        bytemuck::bytes_of(&p),
        rows,
        1,
        1,
    )?;
    // Rows in chunks under llvmpipe's loop limit; later chunks accumulate.
    let mut r0 = 0;
    while r0 < rows || r0 == 0 {
        let nr = MAX_LOOP_ITERATIONS.min(rows - r0);
        p.r0 = r0 as u32;
        p.nr = nr as u32;
        p.accumulate = (r0 > 0) as u32;
        launch(
            x,
            &BACKWARD_PARAMS,
            &[
                &x.slice(),
                &dw.slice(),
                &db.slice(),
                &g.slice(),
                &mean.slice(),
                &rstd.slice(),
            ],
            bytemuck::bytes_of(&p),
            cols,
        )?;
        r0 += nr.max(1);
    }
    Ok((dx, dw, db))
}
