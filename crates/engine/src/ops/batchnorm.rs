//! BatchNorm2d (ResNet's), f32, as PyTorch's `native_batch_norm`: in
//! training, each channel normalised by its batch mean and biased variance
//! (two passes, so no E[x²] − E[x]² cancellation), and the running mean and
//! unbiased variance updated with `momentum`; in eval, the running
//! statistics. Forward returns the per-channel mean and 1/σ beside the
//! output, because backward needs them: PyTorch saves the input, these two
//! `[C]` vectors, the weight and the running buffers, and so does the tape
//! (the two vectors as one `[2, C]` tensor: the same bytes).

use super::bias::{channel_sums, sum_channels_into, Centre};
use super::partials::{sum_partials, Spread};
use super::{check_u32, launch};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/batchnorm.wgsl");
const MEAN_OF: Kernel = Kernel::fixed("batchnorm_mean", SOURCE, "mean_of");
const FINISH: Kernel = Kernel::fixed("batchnorm_stats", SOURCE, "finish");
const EVAL_STATS: Kernel = Kernel::fixed("batchnorm_eval_stats", SOURCE, "eval_stats");
const NORMALIZE: Kernel = Kernel::fixed("batchnorm_normalize", SOURCE, "normalize");
const DX: Kernel = Kernel::fixed("batchnorm_backward_input", SOURCE, "dx");
const DWEIGHT: Kernel = Kernel::fixed("batchnorm_backward_weight", SOURCE, "dweight");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    outer: u32,
    channels: u32,
    inner: u32,
    total: u32,
    train: u32,
    eps: f32,
    momentum: f32,
    _p: u32,
}

/// PyTorch's BatchNorm2d defaults.
pub const EPS: f32 = 1e-5;
pub const MOMENTUM: f32 = 0.1;

/// What the forward hands to backward.
pub struct BatchNormOut {
    pub y: Tensor,
    /// `[2, C]`: the mean used, then 1/√(var + eps) (batch statistics in
    /// training, running ones in eval).
    pub stats: Tensor,
}

fn dims(x: &Tensor, w: &Tensor) -> Result<(usize, usize, usize), TensorError> {
    x.require_f32("batchnorm")?;
    w.require_f32("batchnorm")?;
    check_u32("batchnorm", x)?;
    let s = x.shape();
    if s.len() < 2 || w.shape() != [s[1]] {
        return Err(TensorError::ShapeMismatch {
            op: "batchnorm (x [N, C, ..], weight [C])",
            lhs: s.to_vec(),
            rhs: w.shape().to_vec(),
        });
    }
    let inner: usize = s[2..].iter().product();
    Ok((s[0], s[1], inner))
}

fn params(n: usize, c: usize, inner: usize, train: bool) -> Params {
    let total = n * inner;
    Params {
        outer: n as u32,
        channels: c as u32,
        inner: inner as u32,
        total: total as u32,
        train: train as u32,
        eps: EPS,
        momentum: MOMENTUM,
        _p: 0,
    }
}

/// `batch_norm(x, running_mean, running_var, w, b, training)`; in training
/// the running statistics are updated in place.
pub fn batchnorm(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    train: bool,
) -> Result<BatchNormOut, TensorError> {
    let (n, c, inner) = dims(x, w)?;
    for t in [b, running_mean, running_var] {
        if t.shape() != [c] {
            return Err(TensorError::ShapeMismatch {
                op: "batchnorm (bias and running statistics are [C])",
                lhs: x.shape().to_vec(),
                rhs: t.shape().to_vec(),
            });
        }
    }
    if train && n * inner < 2 {
        return Err(TensorError::OneValuePerChannel {
            op: "batchnorm",
            shape: x.shape().to_vec(),
        });
    }
    let e = x.engine();
    let p = params(n, c, inner, train);
    let stats = Tensor::empty(e, &[2, c], DType::F32, "batchnorm.stats")?;
    let per_channel = |k: &Kernel, bind: [&Tensor; 6]| -> Result<(), TensorError> {
        let slices: Vec<_> = bind.iter().map(|t| t.slice()).collect();
        let refs: Vec<_> = slices.iter().collect();
        launch(x, k, &refs, bytemuck::bytes_of(&p), c)
    };
    if train {
        let sums = Tensor::empty(e, &[c], DType::F32, "batchnorm.sums")?;
        sum_channels_into(x, c, inner, &sums, 0)?;
        per_channel(&MEAN_OF, [&stats, x, &sums, x, x, x])?;
        channel_sums(x, c, inner, &sums, 0, Centre::Squared { mean: &stats })?;
        per_channel(&FINISH, [&stats, x, x, &sums, running_mean, running_var])?;
    } else {
        per_channel(&EVAL_STATS, [&stats, x, x, x, running_mean, running_var])?;
    }
    let y = Tensor::empty(e, x.shape(), DType::F32, "batchnorm.out")?;
    launch(
        x,
        &NORMALIZE,
        &[
            &x.slice(),
            &b.slice(),
            &stats.slice(),
            &x.slice(),
            &w.slice(),
            &y.slice(),
        ],
        bytemuck::bytes_of(&p),
        x.numel(),
    )?;
    Ok(BatchNormOut { y, stats })
}

/// `(dx, dweight, dbias)` from the saved input, weight and `[2, C]` stats;
/// `train` says which statistics the forward used.
pub fn batchnorm_backward(
    x: &Tensor,
    w: &Tensor,
    stats: &Tensor,
    g: &Tensor,
    train: bool,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor, Tensor), TensorError> {
    let (n, c, inner) = dims(x, w)?;
    super::same_shape("batchnorm backward", x, g)?;
    let e = x.engine();
    let p = params(n, c, inner, train);
    // [Σg | Σg(x − mean)]
    let sums = Tensor::empty(e, &[2, c], DType::F32, "batchnorm.grad_sums")?;
    sum_channels_into(g, c, inner, &sums, 0)?;
    channel_sums(x, c, inner, &sums, c, Centre::TimesG { mean: stats, g })?;
    let dw = Tensor::empty(e, &[c], DType::F32, "batchnorm.grad_weight")?;
    launch(
        x,
        &DWEIGHT,
        &[
            &x.slice(),
            &x.slice(),
            &stats.slice(),
            &sums.slice(),
            &x.slice(),
            &dw.slice(),
        ],
        bytemuck::bytes_of(&p),
        c,
    )?;
    let db = Tensor::empty(e, &[c], DType::F32, "batchnorm.grad_bias")?;
    sum_partials(&sums, &db, 0, 1, c, 0, false, None, Spread::Auto)?;
    let dx = if need_dx {
        let dx = Tensor::empty(e, x.shape(), DType::F32, "batchnorm.grad_input")?;
        launch(
            x,
            &DX,
            &[
                &x.slice(),
                &g.slice(),
                &stats.slice(),
                &sums.slice(),
                &w.slice(),
                &dx.slice(),
            ],
            bytemuck::bytes_of(&p),
            x.numel(),
        )?;
        Some(dx)
    } else {
        None
    };
    Ok((dx, dw, db))
}
