//! 2-D convolution, NCHW input, OIHW weight, bias, stride and padding, as
//! im2col + one batched matmul (`W · col`), in chunks of samples so the
//! im2col workspace stays under the device's binding limit. Backward:
//! `dW += dY[n] · col[n]ᵀ`, `dcol = Wᵀ · dY`, `dX = col2im(dcol)`, `db = Σ dY`.
//! Like PyTorch (cuDNN), only the input is kept for backward; the im2col
//! buffer is workspace, recomputed in backward.

use super::bias::{add_bias, sum_channels};
use super::fill;
use super::matmul::{gemm, Gemm, MatView, MatmulKernel};
use crate::device::{Kernel, Workgroups};
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const IM2COL: Kernel = Kernel::fixed("im2col", include_str!("../../shaders/im2col.wgsl"), "main");
const COL2IM: Kernel = Kernel::fixed("col2im", include_str!("../../shaders/col2im.wgsl"), "main");

/// Workspace cap for one im2col chunk: small enough that the workspace stays
/// below the activations it serves (SimpleConvNet's conv2 needs 1.8 MB per
/// sample against 0.4 MB of output), large enough to keep dispatches big.
const MAX_WORKSPACE_BYTES: u64 = 8 << 20;

/// Stride and padding (same for both axes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dConfig {
    pub stride: usize,
    pub padding: usize,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig {
            stride: 1,
            padding: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ColParams {
    c: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    stride: u32,
    pad: u32,
    ho: u32,
    wo: u32,
    n0: u32,
    nb: u32,
    total: u32,
}

/// Checked dimensions of one convolution.
#[derive(Debug, Clone, Copy)]
struct Dims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    cfg: Conv2dConfig,
}

impl Dims {
    fn new(x: &Tensor, weight: &Tensor, cfg: Conv2dConfig) -> Result<Dims, TensorError> {
        let (xs, ws) = (x.shape(), weight.shape());
        let mismatch = || TensorError::ShapeMismatch {
            op: "conv2d",
            lhs: xs.to_vec(),
            rhs: ws.to_vec(),
        };
        if xs.len() != 4 || ws.len() != 4 || xs[1] != ws[1] || cfg.stride == 0 {
            return Err(mismatch());
        }
        let (h, w, kh, kw) = (xs[2], xs[3], ws[2], ws[3]);
        if h + 2 * cfg.padding < kh || w + 2 * cfg.padding < kw {
            return Err(TensorError::InvalidShape {
                op: "conv2d",
                message: format!(
                    "kernel {kh}x{kw} is larger than the padded input {}x{}",
                    h + 2 * cfg.padding,
                    w + 2 * cfg.padding
                ),
            });
        }
        Ok(Dims {
            n: xs[0],
            c: xs[1],
            h,
            w,
            o: ws[0],
            kh,
            kw,
            ho: (h + 2 * cfg.padding - kh) / cfg.stride + 1,
            wo: (w + 2 * cfg.padding - kw) / cfg.stride + 1,
            cfg,
        })
    }

    fn ckk(&self) -> usize {
        self.c * self.kh * self.kw
    }

    fn hw(&self) -> usize {
        self.ho * self.wo
    }

    /// Samples per im2col chunk.
    fn chunk(&self, x: &Tensor) -> usize {
        let per_sample = (self.ckk() * self.hw() * 4) as u64;
        let cap = MAX_WORKSPACE_BYTES.min(x.engine().max_binding());
        ((cap / per_sample.max(1)) as usize).clamp(1, self.n)
    }

    fn col_params(&self, n0: usize, nb: usize, total: usize) -> ColParams {
        let u = |v: usize| v as u32;
        ColParams {
            c: u(self.c),
            h: u(self.h),
            w: u(self.w),
            kh: u(self.kh),
            kw: u(self.kw),
            stride: u(self.cfg.stride),
            pad: u(self.cfg.padding),
            ho: u(self.ho),
            wo: u(self.wo),
            n0: u(n0),
            nb: u(nb),
            total: u(total),
        }
    }
}

fn im2col(x: &Tensor, d: &Dims, n0: usize, nb: usize) -> Result<Tensor, TensorError> {
    let col = Tensor::empty_as(
        x.engine(),
        &[nb, d.ckk(), d.hw()],
        DType::F32,
        "conv2d.im2col",
        Some(Category::Workspace),
    )?;
    let total = col.numel();
    x.engine().dispatch(
        &IM2COL,
        &[&x.slice(), &col.slice()],
        bytemuck::bytes_of(&d.col_params(n0, nb, total)),
        plane_grid(x, d.hw(), d.ckk() * nb)?,
    )?;
    Ok(col)
}

/// The grid of im2col and col2im: x covers `inner` positions 256 at a time,
/// (y, z) the `plane` (sample, row) or (sample, channel) pairs.
fn plane_grid(x: &Tensor, inner: usize, plane: usize) -> Result<Workgroups, TensorError> {
    let max = x
        .engine()
        .gpu()
        .map(|g| g.limits.max_compute_workgroups_per_dimension as usize)
        .unwrap_or(65_535);
    let gx = inner.div_ceil(256);
    let gy = plane.min(max);
    let gz = plane.div_ceil(gy.max(1));
    if gx > max || gz > max {
        return Err(TensorError::InvalidShape {
            op: "conv2d",
            message: format!(
                "{inner} positions × {plane} rows need more workgroups than the device's {max} per dimension"
            ),
        });
    }
    Ok(Workgroups::Grid([gx as u32, gy as u32, gz as u32]))
}

/// `conv2d(x, weight, bias)`: x `[N, C, H, W]`, weight `[O, C, KH, KW]`,
/// bias `[O]` → `[N, O, HO, WO]`.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    cfg: Conv2dConfig,
) -> Result<Tensor, TensorError> {
    let d = Dims::new(x, weight, cfg)?;
    let out = Tensor::empty(
        x.engine(),
        &[d.n, d.o, d.ho, d.wo],
        DType::F32,
        "conv2d.out",
    )?;
    let chunk = d.chunk(x);
    for n0 in (0..d.n).step_by(chunk) {
        let nb = chunk.min(d.n - n0);
        let col = im2col(x, &d, n0, nb)?;
        let g = Gemm {
            m: d.o,
            n: d.hw(),
            k: d.ckk(),
            batch: nb,
            a: MatView::dense(0, d.o, d.ckk(), false).shared(),
            b: MatView::dense(0, d.ckk(), d.hw(), false),
            c_offset: n0 * d.o * d.hw(),
            c_batch_stride: d.o * d.hw(),
            accumulate: false,
            reduce_batch: false,
        };
        gemm(&g, weight, &col, &out, MatmulKernel::Tiled)?;
    }
    if let Some(b) = bias {
        add_bias(&out, b, d.o, d.hw())?;
    }
    Ok(out)
}

/// Gradients of `conv2d` given the upstream gradient `dy`: `(dx, dweight, dbias)`.
pub fn conv2d_backward(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    cfg: Conv2dConfig,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor, Tensor), TensorError> {
    let d = Dims::new(x, weight, cfg)?;
    if dy.shape() != [d.n, d.o, d.ho, d.wo] {
        return Err(TensorError::ShapeMismatch {
            op: "conv2d backward",
            lhs: dy.shape().to_vec(),
            rhs: vec![d.n, d.o, d.ho, d.wo],
        });
    }
    let db = sum_channels(dy, d.o, d.hw(), 1.0, "conv2d.grad_bias")?;
    let dw = fill::zeros(x.engine(), weight.shape(), "conv2d.grad_weight")?;
    let dx = if need_dx {
        Some(Tensor::empty(
            x.engine(),
            x.shape(),
            DType::F32,
            "conv2d.grad_input",
        )?)
    } else {
        None
    };
    let chunk = d.chunk(x);
    for n0 in (0..d.n).step_by(chunk) {
        let nb = chunk.min(d.n - n0);
        let col = im2col(x, &d, n0, nb)?;
        // dW (O×CKK) += Σ_b dY[n0+b] (O×HW) · col[b]ᵀ (HW×CKK), the chunk's
        // samples in one batch-reduced product.
        let g = Gemm {
            m: d.o,
            n: d.ckk(),
            k: d.hw(),
            batch: nb,
            a: MatView::dense(n0 * d.o * d.hw(), d.o, d.hw(), false),
            b: MatView::dense(0, d.ckk(), d.hw(), true),
            c_offset: 0,
            c_batch_stride: 0,
            accumulate: true,
            reduce_batch: true,
        };
        gemm(&g, dy, &col, &dw, MatmulKernel::Tiled)?;
        drop(col);
        if let Some(dx) = &dx {
            // dcol[b] (CKK×HW) = Wᵀ (CKK×O) · dY[n] (O×HW)
            let dcol = Tensor::empty_as(
                x.engine(),
                &[nb, d.ckk(), d.hw()],
                DType::F32,
                "conv2d.grad_im2col",
                Some(Category::Workspace),
            )?;
            let g = Gemm {
                m: d.ckk(),
                n: d.hw(),
                k: d.o,
                batch: nb,
                a: MatView::dense(0, d.o, d.ckk(), true).shared(),
                b: MatView::dense(n0 * d.o * d.hw(), d.o, d.hw(), false),
                c_offset: 0,
                c_batch_stride: d.ckk() * d.hw(),
                accumulate: false,
                reduce_batch: false,
            };
            gemm(&g, weight, dy, &dcol, MatmulKernel::Tiled)?;
            let total = nb * d.c * d.h * d.w;
            x.engine().dispatch(
                &COL2IM,
                &[&dcol.slice(), &dx.slice()],
                bytemuck::bytes_of(&d.col_params(n0, nb, total)),
                plane_grid(x, d.h * d.w, d.c * nb)?,
            )?;
        }
    }
    Ok((dx, dw, db))
}
