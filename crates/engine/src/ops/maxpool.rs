//! 2-D max pooling with indices (ResNet's stem pool), f32. Backward needs
//! which input each output took: PyTorch saves the input and an int64 index
//! per output; vramlab saves the input and an f32 index per output (4 bytes,
//! not 8 — exact for planes up to 2^24 positions, checked).

use super::{check_u32, launch};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/maxpool.wgsl");
const FORWARD: Kernel = Kernel::fixed("maxpool_forward", SOURCE, "forward");
const BACKWARD: Kernel = Kernel::fixed("maxpool_backward", SOURCE, "backward");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    planes: u32,
    h: u32,
    w: u32,
    ho: u32,
    wo: u32,
    k: u32,
    stride: u32,
    pad: u32,
}

/// Kernel size, stride and padding (square).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

fn params(x: &Tensor, cfg: PoolConfig) -> Result<(Params, Vec<usize>), TensorError> {
    x.require_f32("max_pool2d")?;
    check_u32("max_pool2d", x)?;
    let [n, c, h, w] = match x.shape() {
        [n, c, h, w] => [*n, *c, *h, *w],
        s => {
            return Err(TensorError::WrongShape {
                op: "max_pool2d",
                want: "x [N, C, H, W]",
                sizes: Vec::new(),
                got: s.to_vec(),
            })
        }
    };
    let PoolConfig {
        kernel: k,
        stride: s,
        padding: pd,
    } = cfg;
    if k == 0 || s == 0 || 2 * pd > k || h + 2 * pd < k || w + 2 * pd < k {
        return Err(TensorError::PoolWindow {
            op: "max_pool2d",
            kernel: k,
            stride: s,
            padding: pd,
            input: (h, w),
        });
    }
    // A forward invocation walks the window's k² taps, a backward one the
    // at most ⌈k/s⌉² windows that hold its position.
    if k * k > super::MAX_LOOP_ITERATIONS {
        return Err(TensorError::PoolWindowTooLarge {
            op: "max_pool2d",
            kernel: k,
            max: super::MAX_LOOP_ITERATIONS,
        });
    }
    if h * w > 1 << 24 {
        return Err(TensorError::PlaneTooLarge {
            op: "max_pool2d",
            plane: (h, w),
        });
    }
    let (ho, wo) = ((h + 2 * pd - k) / s + 1, (w + 2 * pd - k) / s + 1);
    let p = Params {
        planes: (n * c) as u32,
        h: h as u32,
        w: w as u32,
        ho: ho as u32,
        wo: wo as u32,
        k: k as u32,
        stride: s as u32,
        pad: pd as u32,
    };
    Ok((p, vec![n, c, ho, wo]))
}

/// `max_pool2d(x, k, stride, padding, return_indices=True)`: `(y, indices)`.
pub fn max_pool2d(x: &Tensor, cfg: PoolConfig) -> Result<(Tensor, Tensor), TensorError> {
    let (p, shape) = params(x, cfg)?;
    let e = x.engine();
    let y = Tensor::empty(e, &shape, DType::F32, "max_pool2d.out")?;
    let idx = Tensor::empty(e, &shape, DType::F32, "max_pool2d.indices")?;
    launch(
        x,
        &FORWARD,
        &[&x.slice(), &idx.slice(), &y.slice()],
        bytemuck::bytes_of(&p),
        y.numel(),
    )?;
    Ok((y, idx))
}

/// The input gradient from the upstream gradient `g` and the saved
/// indices; `x` gives the input's shape.
pub fn max_pool2d_backward(
    x: &Tensor,
    idx: &Tensor,
    g: &Tensor,
    cfg: PoolConfig,
) -> Result<Tensor, TensorError> {
    let (p, shape) = params(x, cfg)?;
    if g.shape() != shape.as_slice() || idx.shape() != shape.as_slice() {
        return Err(TensorError::ShapeMismatch {
            op: "max_pool2d backward",
            lhs: g.shape().to_vec(),
            rhs: shape,
        });
    }
    let dx = Tensor::empty(x.engine(), x.shape(), DType::F32, "max_pool2d.grad_input")?;
    launch(
        x,
        &BACKWARD,
        &[&g.slice(), &idx.slice(), &dx.slice()],
        bytemuck::bytes_of(&p),
        x.numel(),
    )?;
    Ok(dx)
}
