//! 2-D convolution, NCHW input, OIHW weight, bias, stride and padding, as
//! implicit GEMM: one batched matmul `out[n] = W · im2col(x[n]) + b` whose B
//! operand is read from x in place (no im2col buffer) and whose epilogue
//! adds the bias (no second pass over the output). Backward: `dW = Σ_n
//! dY[n] · im2col(x[n])ᵀ`, implicit too, in one batch-reduced product;
//! for stride 1, `dX` is itself a convolution (of dY with the transposed,
//! flipped kernel), implicit as well; otherwise `dcol = Wᵀ · dY` into a
//! workspace, in chunks of samples so it stays under the device's binding
//! limit, then `dX = col2im(dcol)`; `db = Σ dY`. Like PyTorch (cuDNN), only
//! the input is kept for backward.

use super::bias::sum_channels;
use super::matmul::{gemm, gemm_bias, ConvGeometry, Gemm, MatView, MatmulKernel};
use super::plane_grid;
use super::swap_axes::swap_axes_12_as;
use crate::device::compose::Defs;
use crate::device::{Kernel, Workgroups};
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const COL2IM: &str = include_str!("../../../../shaders/col2im.wgsl");

/// Workspace cap for one chunk of dcol (the input gradient's im2col-shaped
/// product): small enough that the workspace stays below the activations it
/// serves (SimpleConvNet's conv2 needs 1.8 MB per sample against 0.4 MB of
/// output), large enough to keep dispatches big.
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
    n0: u32,
    nb: u32,
    _pad: [u32; 2],
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
        super::same_dtype("conv2d", x, weight)?;
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
            return Err(TensorError::KernelTooLarge {
                op: "conv2d",
                kernel: (kh, kw),
                input: (h + 2 * cfg.padding, w + 2 * cfg.padding),
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

    /// x as the B operand of an implicit product: one sample per batch
    /// entry (the geometry gives the rest).
    fn input_view(&self) -> MatView {
        MatView {
            offset: 0,
            row_stride: 0,
            col_stride: 0,
            batch_stride: self.c * self.h * self.w,
        }
    }

    /// The im2col a product reads in place (implicit GEMM).
    fn geometry(&self) -> ConvGeometry {
        ConvGeometry {
            c: self.c,
            h: self.h,
            w: self.w,
            kh: self.kh,
            kw: self.kw,
            stride: self.cfg.stride,
            pad: self.cfg.padding,
            wo: self.wo,
            transposed: false,
            flipped: false,
        }
    }

    /// Whether dX can be computed as a convolution of dY (implicit GEMM,
    /// no workspace of im2col's shape and no col2im): stride 1, a square
    /// kernel and padding below its size (so the transposed convolution's
    /// padding KH−1−P is one number and not negative). 16-bit too, where
    /// each sample's H·W is even: the product then writes whole 16-bit
    /// words (an odd one would take an f32 copy of all of dX, where the
    /// chunked col2im route is bounded), summing in f32 and rounding once.
    fn dx_as_convolution(&self, dtype: DType) -> bool {
        self.cfg.stride == 1
            && self.kh == self.kw
            && self.cfg.padding < self.kh
            && (dtype == DType::F32 || (self.h * self.w).is_multiple_of(2))
    }

    fn ckk(&self) -> usize {
        self.c * self.kh * self.kw
    }

    fn hw(&self) -> usize {
        self.ho * self.wo
    }

    /// Samples per dcol chunk.
    fn chunk(&self, x: &Tensor) -> usize {
        let per_sample = (self.ckk() * self.hw() * 4) as u64;
        let cap = MAX_WORKSPACE_BYTES.min(x.engine().max_binding());
        ((cap / per_sample.max(1)) as usize).clamp(1, self.n)
    }

    /// col2im for this geometry (a variant per convolution shape: see
    /// the shader for why the sizes are constants).
    fn col2im(&self, dtype: DType) -> Kernel {
        let mut defs = Defs::elem(dtype.elem()).with("PAIRS", dtype.is_16bit() as u8);
        for (name, v) in [
            ("C", self.c),
            ("H", self.h),
            ("W", self.w),
            ("KH", self.kh),
            ("KW", self.kw),
            ("STRIDE", self.cfg.stride),
            ("PAD", self.cfg.padding),
            ("HO", self.ho),
            ("WO", self.wo),
        ] {
            defs = defs.with(name, v);
        }
        Kernel::variant(
            format!(
                "col2im[{}x{}x{} k{}x{} s{} p{}{}]",
                self.c,
                self.h,
                self.w,
                self.kh,
                self.kw,
                self.cfg.stride,
                self.cfg.padding,
                if dtype == DType::F32 {
                    String::new()
                } else {
                    format!(" {dtype}")
                }
            ),
            COL2IM,
            "main",
            defs,
        )
    }
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
    let out = Tensor::empty(x.engine(), &[d.n, d.o, d.ho, d.wo], x.dtype(), "conv2d.out")?;
    // Implicit GEMM: out[n] = W · im2col(x[n]) with the im2col read from x
    // in place, every sample in one product (no workspace).
    let g = Gemm {
        m: d.o,
        n: d.hw(),
        k: d.ckk(),
        batch: d.n,
        a: MatView::dense(0, d.o, d.ckk(), false).shared(),
        b: d.input_view(),
        c_offset: 0,
        c_batch_stride: d.o * d.hw(),
        accumulate: false,
        reduce_batch: false,
        implicit_b: Some(d.geometry()),
    };
    // The bias is added in the product's epilogue.
    gemm_bias(&g, weight, x, &out, bias, MatmulKernel::Tiled)?;
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
    let (dx, dw, db) = conv2d_backward_ex(x, weight, dy, cfg, need_dx, true)?;
    let db = db.ok_or(TensorError::NotSupported {
        op: "conv2d backward",
        what: "no bias gradient was computed (a bug: it was asked for)",
    })?;
    Ok((dx, dw, db))
}

/// [`conv2d_backward`] for a convolution with or without a bias (ResNet's
/// convolutions have none: no bias gradient is computed or allocated).
pub fn conv2d_backward_ex(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    cfg: Conv2dConfig,
    need_dx: bool,
    need_db: bool,
) -> Result<(Option<Tensor>, Tensor, Option<Tensor>), TensorError> {
    let d = Dims::new(x, weight, cfg)?;
    if dy.shape() != [d.n, d.o, d.ho, d.wo] {
        return Err(TensorError::ShapeMismatch {
            op: "conv2d backward",
            lhs: dy.shape().to_vec(),
            rhs: vec![d.n, d.o, d.ho, d.wo],
        });
    }
    let db = if need_db {
        Some(sum_channels(dy, d.o, d.hw(), "conv2d.grad_bias")?)
    } else {
        None
    };
    super::same_dtype("conv2d backward", x, dy)?;
    let dw = Tensor::empty(
        x.engine(),
        weight.shape(),
        weight.dtype(),
        "conv2d.grad_weight",
    )?;
    let dx = if need_dx {
        Some(Tensor::empty(
            x.engine(),
            x.shape(),
            x.dtype(),
            "conv2d.grad_input",
        )?)
    } else {
        None
    };
    // dW (O×CKK) = Σ_n dY[n] (O×HW) · im2col(x[n])ᵀ (HW×CKK): every sample in
    // one batch-reduced product, the im2col read from x in place.
    let g = Gemm {
        m: d.o,
        n: d.ckk(),
        k: d.hw(),
        batch: d.n,
        a: MatView::dense(0, d.o, d.hw(), false),
        b: d.input_view(),
        c_offset: 0,
        c_batch_stride: 0,
        accumulate: false,
        reduce_batch: true,
        implicit_b: Some(ConvGeometry {
            transposed: true,
            ..d.geometry()
        }),
    };
    gemm(&g, dy, x, &dw, MatmulKernel::Tiled)?;
    if let Some(out) = dx.as_ref().filter(|_| d.dx_as_convolution(x.dtype())) {
        // dX[n] (C×HW) = W' (C × O·KH·KW) · im2col(dY[n]) with padding
        // KH−1−P and the window flipped, where W'[c, o, ·] = W[o, c, ·]:
        // a stride-1 convolution's input gradient is the convolution of dY
        // with the transposed, flipped kernel. Implicit like the forward:
        // only the transposed weight (O·C·KH·KW values) as workspace, where
        // the im2col route wrote C·KH·KW values per output position and
        // col2im read them back (on llvmpipe, 9× the output's stores).
        let kk = d.kh * d.kw;
        let wt = swap_axes_12_as(
            &weight.reshape(&[1, d.o, d.c, kk])?,
            "conv2d.weight_t",
            Some(Category::Workspace),
        )?;
        let g = Gemm {
            m: d.c,
            n: d.h * d.w,
            k: d.o * kk,
            batch: d.n,
            a: MatView::dense(0, d.c, d.o * kk, false).shared(),
            b: MatView {
                offset: 0,
                row_stride: 0,
                col_stride: 0,
                batch_stride: d.o * d.hw(),
            },
            c_offset: 0,
            c_batch_stride: d.c * d.h * d.w,
            accumulate: false,
            reduce_batch: false,
            implicit_b: Some(ConvGeometry {
                c: d.o,
                h: d.ho,
                w: d.wo,
                kh: d.kh,
                kw: d.kw,
                stride: 1,
                pad: d.kh - 1 - d.cfg.padding,
                wo: d.w,
                transposed: false,
                flipped: true,
            }),
        };
        gemm(&g, &wt, dy, out, MatmulKernel::Tiled)?;
        return Ok((dx, dw, db));
    }
    let chunk = d.chunk(x);
    for n0 in (0..d.n).step_by(chunk) {
        let nb = chunk.min(d.n - n0);
        if let Some(dx) = &dx {
            // dcol[b] (CKK×HW) = Wᵀ (CKK×O) · dY[n] (O×HW)
            let dcol = Tensor::empty_as(
                x.engine(),
                &[nb, d.ckk(), d.hw()],
                x.dtype(),
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
                implicit_b: None,
            };
            gemm(&g, weight, dy, &dcol, MatmulKernel::Tiled)?;
            let params = ColParams {
                n0: n0 as u32,
                nb: nb as u32,
                _pad: [0; 2],
            };
            let grid = if x.dtype().is_16bit() {
                // One invocation per word overlapping the chunk.
                let chw = d.c * d.h * d.w;
                let (lo, hi) = (n0 * chw, (n0 + nb) * chw);
                let words = (hi - 1) / 2 - lo / 2 + 1;
                Workgroups::Linear(words.div_ceil(256) as u64)
            } else {
                plane_grid(x, d.h * d.w, d.c * nb)?
            };
            x.engine().dispatch(
                &d.col2im(x.dtype()),
                &[&dcol.slice(), &dx.slice()],
                bytemuck::bytes_of(&params),
                grid,
            )?;
        }
    }
    Ok((dx, dw, db))
}
