//! Dropout (GPT's), f32, as CUDA's `native_dropout`: elements kept with
//! probability 1 − p and scaled by 1/(1 − p), and the decision kept for
//! backward as one byte per element (PyTorch's bool mask on a GPU; its CPU
//! path keeps a float noise tensor, 4 bytes an element, instead). vramlab has
//! no byte dtype, so the mask is an opaque tensor of ⌈n/4⌉ words: the same
//! bytes, to the 4-byte word. Random numbers are a hash of (seed, index), so
//! a seed gives the same mask again (checkpoint recomputation).

use super::{check_u32, launch};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/dropout.wgsl");
const FORWARD: Kernel = Kernel::fixed("dropout_forward", SOURCE, "forward");
const BACKWARD: Kernel = Kernel::fixed("dropout_backward", SOURCE, "backward");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    seed_lo: u32,
    seed_hi: u32,
    threshold: u32,
    scale: f32,
    _p: [u32; 3],
}

fn params(op: &'static str, n: usize, p: f32, seed: u64) -> Result<Params, TensorError> {
    if !(0.0..1.0).contains(&p) {
        return Err(TensorError::Probability {
            op,
            what: "drop probability",
            value: p,
        });
    }
    Ok(Params {
        n: n as u32,
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        threshold: (p as f64 * 4294967296.0).min(u32::MAX as f64) as u32,
        scale: 1.0 / (1.0 - p),
        _p: [0; 3],
    })
}

/// `(y, mask)` of dropout with probability `p`; the mask is `[⌈n/4⌉]`
/// words of four one-byte decisions.
pub fn dropout(x: &Tensor, p: f32, seed: u64) -> Result<(Tensor, Tensor), TensorError> {
    x.require_f32("dropout")?;
    check_u32("dropout", x)?;
    let n = x.numel();
    let prm = params("dropout", n, p, seed)?;
    let e = x.engine();
    let y = Tensor::empty(e, x.shape(), DType::F32, "dropout.out")?;
    let mask = Tensor::empty(e, &[n.div_ceil(4)], DType::F32, "dropout.mask")?;
    launch(
        x,
        &FORWARD,
        &[&x.slice(), &mask.slice(), &y.slice()],
        bytemuck::bytes_of(&prm),
        n.div_ceil(4),
    )?;
    Ok((y, mask))
}

/// `g · mask / (1 − p)`.
pub fn dropout_backward(g: &Tensor, mask: &Tensor, p: f32) -> Result<Tensor, TensorError> {
    g.require_f32("dropout backward")?;
    let n = g.numel();
    if mask.numel() != n.div_ceil(4) {
        return Err(TensorError::ShapeMismatch {
            op: "dropout backward (mask of ⌈n/4⌉ words)",
            lhs: g.shape().to_vec(),
            rhs: mask.shape().to_vec(),
        });
    }
    let prm = params("dropout backward", n, p, 0)?;
    let dx = Tensor::empty(g.engine(), g.shape(), DType::F32, "dropout.grad_input")?;
    launch(
        g,
        &BACKWARD,
        &[&g.slice(), &mask.slice(), &dx.slice()],
        bytemuck::bytes_of(&prm),
        n,
    )?;
    Ok(dx)
}
