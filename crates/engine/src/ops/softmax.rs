//! Softmax over the last axis, of `scale · x` (attention folds its 1/√d into
//! the scale, so the scaled scores are never a tensor of their own), and its
//! backward from the saved output: dx = scale · y ⊙ (g − Σ g ⊙ y); and the
//! causal variant of GPT's attention.

use super::{check_row_length, check_u32, LONGEST_REDUCED_ROW};
use crate::device::{Kernel, Part};
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/softmax.wgsl");
const FORWARD: Kernel = Kernel::fixed("softmax_forward", SOURCE, "forward");
const BACKWARD: Kernel = Kernel::fixed("softmax_backward", SOURCE, "backward");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    scale: f32,
    causal: u32,
}

fn params(op: &'static str, x: &Tensor, scale: f32) -> Result<Params, TensorError> {
    x.require_f32(op)?;
    check_u32(op, x)?;
    check_row_length(op, x, LONGEST_REDUCED_ROW)?;
    let cols = *x.shape().last().unwrap_or(&0);
    Ok(Params {
        rows: (x.numel() / cols) as u32,
        cols: cols as u32,
        scale,
        causal: 0,
    })
}

fn run(
    kernel: &Kernel,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    p: Params,
) -> Result<(), TensorError> {
    // A row at a time past the binding budget; a causal row's place in
    // its matrix is its index modulo the columns, so ranges start on a
    // matrix.
    let row = Part::Elements(p.cols as u64 * 4);
    super::launch_rows(
        a,
        kernel,
        &[(&a.slice(), row), (&b.slice(), row), (&out.slice(), row)],
        bytemuck::bytes_of(&p),
        p.rows as usize,
        1,
        if p.causal != 0 { p.cols as usize } else { 1 },
    )
}

/// `softmax(scale · x)` along the last axis.
pub fn softmax(x: &Tensor, scale: f32) -> Result<Tensor, TensorError> {
    let p = params("softmax", x, scale)?;
    let y = Tensor::empty(x.engine(), x.shape(), DType::F32, "softmax.out")?;
    run(&FORWARD, x, x, &y, p)?;
    Ok(y)
}

/// `softmax(scale · x)` with a causal mask: x is `[.., S, S]` scores of
/// queries (rows) against keys (columns), and query i sees keys 0..=i; the
/// masked probabilities are exactly 0 (GPT's masked attention, fused: no
/// mask tensor and no -inf-filled copy of the scores exist).
pub fn softmax_causal(x: &Tensor, scale: f32) -> Result<Tensor, TensorError> {
    let mut p = params("causal softmax", x, scale)?;
    let s = x.shape();
    if s.len() < 2 || s[s.len() - 1] != s[s.len() - 2] {
        return Err(TensorError::WrongShape {
            op: "causal softmax",
            want: "square score matrices [.., S, S]",
            sizes: Vec::new(),
            got: s.to_vec(),
        });
    }
    p.causal = 1;
    let y = Tensor::empty(x.engine(), x.shape(), DType::F32, "softmax.out")?;
    run(&FORWARD, x, x, &y, p)?;
    Ok(y)
}

/// The input gradient from the saved output `y` and the upstream gradient `g`.
pub fn softmax_backward(y: &Tensor, g: &Tensor, scale: f32) -> Result<Tensor, TensorError> {
    super::same_shape("softmax backward", y, g)?;
    let p = params("softmax backward", y, scale)?;
    let dx = Tensor::empty(y.engine(), y.shape(), DType::F32, "softmax.grad_input")?;
    run(&BACKWARD, y, g, &dx, p)?;
    Ok(dx)
}
