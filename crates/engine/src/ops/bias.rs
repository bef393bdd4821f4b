//! Bias along a channel axis of a tensor viewed as `[outer, channels, inner]`
//! (conv: `[N, O, H·W]`, linear: `[N, O, 1]`): add it in place in forward, sum
//! over the other axes for its gradient.

use super::partials::{sum_partials, Spread};
use super::{launch_pairs, plane_grid, same_dtype, typed_kernel};
use crate::device::compose::Defs;
use crate::device::Kernel;
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/bias.wgsl");
const CHANNEL_SUM: &str = include_str!("../../../../shaders/channel_sum.wgsl");

/// The most positions one channel-sum workgroup takes: 256 threads × 64,
/// the block length of the blocked summation.
const PER_GROUP: usize = 256 * 64;
/// The fewest it takes: 256 threads × 8.
const MIN_PER_GROUP: usize = 256 * 8;
/// Workgroups a channel sum aims at, between those bounds. Few channels
/// over many positions (SimpleConvNet's conv2 bias: 128 channels, 4
/// groups) left each thread 49 loads in a row and a GPU mostly waiting.
const TARGET_WORKGROUPS: usize = 1024;

/// Positions a workgroup of a channel sum takes: shapes only, so the
/// workspace is the same on every adapter.
fn per_group(total: usize, channels: usize) -> usize {
    total
        .div_ceil(TARGET_WORKGROUPS.div_ceil(channels.max(1)))
        .next_multiple_of(256)
        .clamp(MIN_PER_GROUP, PER_GROUP)
}

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
    _pad: u32,
}

fn params(t: &Tensor, channels: usize, inner: usize) -> Result<Params, TensorError> {
    let n = t.numel();
    if channels == 0 || inner == 0 || !n.is_multiple_of(channels * inner) {
        return Err(TensorError::NoChannelAxis {
            op: "bias",
            shape: t.shape().to_vec(),
            channels,
            inner,
        });
    }
    Ok(Params {
        outer: (n / (channels * inner)) as u32,
        channels: channels as u32,
        inner: inner as u32,
        _pad: 0,
    })
}

/// Whether `b` can be added to `t` along `channels`: one value a channel,
/// of t's dtype.
pub(crate) fn check_bias(t: &Tensor, b: &Tensor, channels: usize) -> Result<(), TensorError> {
    if b.numel() != channels {
        return Err(TensorError::ShapeMismatch {
            op: "bias",
            lhs: t.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    same_dtype("bias", t, b)
}

/// `t[o, c, i] += b[c]`, in place (t and b of one dtype).
pub fn add_bias(t: &Tensor, b: &Tensor, channels: usize, inner: usize) -> Result<(), TensorError> {
    check_bias(t, b, channels)?;
    let p = params(t, channels, inner)?;
    if inner >= 256 && !t.dtype().is_16bit() {
        let planes = p.outer as usize * channels;
        t.engine().dispatch(
            &typed_kernel("bias_add_planes", SOURCE, "add_planes", t.dtype()),
            &[&t.slice(), &b.slice()],
            bytemuck::bytes_of(&p),
            plane_grid(t, inner, planes)?,
        )?;
        return Ok(());
    }
    launch_pairs(
        t,
        &typed_kernel("bias_add", SOURCE, "add", t.dtype()),
        &[&t.slice(), &b.slice()],
        bytemuck::bytes_of(&p),
        t.numel(),
    )
}

/// `out[c] = Σ_{o,i} t[o, c, i]`: the bias gradient, in t's dtype (summed
/// in f32, rounded once).
pub fn sum_channels(
    t: &Tensor,
    channels: usize,
    inner: usize,
    label: &str,
) -> Result<Tensor, TensorError> {
    params(t, channels, inner)?;
    let out = Tensor::empty(t.engine(), &[channels], t.dtype(), label)?;
    sum_channels_into(t, channels, inner, &out, 0)?;
    Ok(out)
}

/// [`sum_channels`] into `out[off..off + channels]` (BatchNorm keeps its
/// per-channel sums side by side in one tensor).
pub(crate) fn sum_channels_into(
    t: &Tensor,
    channels: usize,
    inner: usize,
    out: &Tensor,
    off: usize,
) -> Result<(), TensorError> {
    channel_sums(t, channels, inner, out, off, Centre::None)
}

/// What the channel sum adds up about a per-channel centre.
#[derive(Clone, Copy)]
pub(crate) enum Centre<'a> {
    /// Σ t.
    None,
    /// Σ (t − mean[c])² (`mean` holds at least `channels` f32 values).
    Squared { mean: &'a Tensor },
    /// Σ g·(t − mean[c]).
    TimesG { mean: &'a Tensor, g: &'a Tensor },
}

/// `out[off + c] = Σ term` over every position of channel c, two-stage:
/// the bias gradient's plain sums and BatchNorm's centred ones (the same
/// kernel, `CENTRED`).
pub(crate) fn channel_sums(
    t: &Tensor,
    channels: usize,
    inner: usize,
    out: &Tensor,
    off: usize,
    centre: Centre,
) -> Result<(), TensorError> {
    let p = params(t, channels, inner)?;
    // From the shape, not the kernel's u32 parameters: a simulated device
    // sizes the workspace of tensors past 2^32 elements too.
    let total = t.numel() / channels;
    let per_group = per_group(total, channels);
    let groups = total.div_ceil(per_group).max(1);
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
        per_group: per_group as u32,
        groups: groups as u32,
        _pad: [0; 2],
    };
    let (mode, what, extra): (u8, &str, Vec<&Tensor>) = match centre {
        Centre::None => (0, "", vec![]),
        Centre::Squared { mean } => (1, " (t−mean)²", vec![mean]),
        Centre::TimesG { mean, g } => (2, " g·(t−mean)", vec![mean, g]),
    };
    let mut slices = vec![t.slice(), parts.slice()];
    slices.extend(extra.iter().map(|x| x.slice()));
    let bindings: Vec<_> = slices.iter().collect();
    t.engine().dispatch(
        &Kernel::variant(
            format!("channel_sum[{}{what}]", t.dtype()),
            CHANNEL_SUM,
            "main",
            Defs::elem(t.dtype().elem()).with("CENTRED", mode),
        ),
        &bindings,
        bytemuck::bytes_of(&sp),
        crate::device::Workgroups::Linear((groups * channels) as u64),
    )?;
    sum_partials(
        &parts,
        out,
        0,
        groups,
        channels,
        off,
        false,
        None,
        Spread::Auto,
    )
}
