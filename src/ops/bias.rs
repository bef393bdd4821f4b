//! Bias along a channel axis of a tensor viewed as `[outer, channels, inner]`
//! (conv: `[N, O, H·W]`, linear: `[N, O, 1]`): add it in place in forward, sum
//! over the other axes for its gradient.

use super::partials::sum_partials;
use super::{launch, plane_grid};
use crate::device::{Kernel, Workgroups};
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../shaders/bias.wgsl");
const ADD: Kernel = Kernel::fixed("bias_add", SOURCE, "add");
const ADD_PLANES: Kernel = Kernel::fixed("bias_add_planes", SOURCE, "add_planes");
const SCALE: Kernel = Kernel::fixed("bias_scale", SOURCE, "scale");
const CHANNEL_SUM: Kernel = Kernel::fixed(
    "channel_sum",
    include_str!("../../shaders/channel_sum.wgsl"),
    "main",
);

/// Positions one channel-sum workgroup takes: 256 threads × 64, the block
/// length of the blocked summation.
const PER_GROUP: usize = 256 * 64;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SumParams {
    outer: u32,
    channels: u32,
    inner: u32,
    total: u32,
    per_group: u32,
    groups: u32,
    _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    outer: u32,
    channels: u32,
    inner: u32,
    scale: f32,
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
    if inner >= 256 {
        let planes = p.outer as usize * channels;
        t.engine().dispatch(
            &ADD_PLANES,
            &[&t.slice(), &b.slice()],
            bytemuck::bytes_of(&p),
            plane_grid(t, inner, planes)?,
        )?;
        return Ok(());
    }
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
    let groups = total.div_ceil(PER_GROUP).max(1);
    // Stage one: a partial sum per (group of positions, channel), in a
    // workspace; stage two adds the groups up in order.
    let parts = Tensor::empty_as(
        t.engine(),
        &[groups, channels],
        DType::F32,
        "bias.partials",
        Some(Category::Workspace),
    )?;
    let sp = SumParams {
        outer: p.outer,
        channels: p.channels,
        inner: p.inner,
        total: total as u32,
        per_group: PER_GROUP as u32,
        groups: groups as u32,
        _pad: [0; 2],
    };
    t.engine().dispatch(
        &CHANNEL_SUM,
        &[&t.slice(), &parts.slice()],
        bytemuck::bytes_of(&sp),
        Workgroups::Linear((groups * channels) as u64),
    )?;
    sum_partials(&parts, &out, 0, groups, channels, 0, false)?;
    drop(parts);
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
