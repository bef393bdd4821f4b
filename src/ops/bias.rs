//! Bias along a channel axis of a tensor viewed as `[outer, channels, inner]`
//! (conv: `[N, O, H·W]`, linear: `[N, O, 1]`): add it in place in forward, sum
//! over the other axes for its gradient.

use super::launch;
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../shaders/bias.wgsl");
const ADD: Kernel = Kernel::fixed("bias_add", SOURCE, "add");
const SCALE: Kernel = Kernel::fixed("bias_scale", SOURCE, "scale");
const REDUCE: Kernel = Kernel::fixed("bias_reduce", SOURCE, "reduce");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    outer: u32,
    channels: u32,
    inner: u32,
    scale: f32,
    begin: u32,
    end: u32,
    accumulate: u32,
    _pad: u32,
}

fn params(t: &Tensor, channels: usize, inner: usize, scale: f32) -> Result<Params, TensorError> {
    let n = t.numel();
    if channels == 0 || inner == 0 || !n.is_multiple_of(channels * inner) {
        return Err(TensorError::InvalidShape {
            op: "bias",
            message: format!(
                "shape {:?} has no axis of {channels} channels with {inner} elements inside",
                t.shape()
            ),
        });
    }
    Ok(Params {
        outer: (n / (channels * inner)) as u32,
        channels: channels as u32,
        inner: inner as u32,
        scale,
        begin: 0,
        end: 0,
        accumulate: 0,
        _pad: 0,
    })
}

/// `t[o, c, i] += b[c]`, in place.
pub fn add_bias(t: &Tensor, b: &Tensor, channels: usize, inner: usize) -> Result<(), TensorError> {
    if b.numel() != channels {
        return Err(TensorError::ShapeMismatch {
            op: "bias",
            lhs: t.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    let p = params(t, channels, inner, 1.0)?;
    launch(
        t,
        &ADD,
        &[&t.slice(), &b.slice()],
        bytemuck::bytes_of(&p),
        t.numel(),
    )
}

/// `out[c] = scale · Σ_{o,i} t[o, c, i]`: the bias gradient, or (channels = 1)
/// a scaled total.
pub fn sum_channels(
    t: &Tensor,
    channels: usize,
    inner: usize,
    scale: f32,
    label: &str,
) -> Result<Tensor, TensorError> {
    let p = params(t, channels, inner, scale)?;
    let out = Tensor::empty(t.engine(), &[channels], DType::F32, label)?;
    let total = p.outer as usize * inner;
    for begin in (0..total).step_by(super::MAX_LOOP_ITERATIONS) {
        let part = Params {
            begin: begin as u32,
            end: (begin + super::MAX_LOOP_ITERATIONS).min(total) as u32,
            accumulate: (begin > 0) as u32,
            ..p
        };
        launch(
            t,
            &REDUCE,
            &[&t.slice(), &out.slice()],
            bytemuck::bytes_of(&part),
            channels,
        )?;
    }
    if scale != 1.0 {
        launch(
            t,
            &SCALE,
            &[&t.slice(), &out.slice()],
            bytemuck::bytes_of(&p),
            channels,
        )?;
    }
    Ok(out)
}
