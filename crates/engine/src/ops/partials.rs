//! Adding up partial results: the second stage of every reduction that is
//! split across workgroups (split-K and batch-reduced matrix products, the
//! channel sums of bias gradients). Partials are f32 in a workspace; they
//! are added in a fixed order, so results are deterministic, and each
//! partial is itself a blocked sum, so the total is as accurate as one long
//! blocked reduction.

use crate::device::compose::{Defs, Elem};
use crate::device::{Kernel, Workgroups};
use crate::tensor::{Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/sum_partials.wgsl");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SumParams {
    len: u32,
    count: u32,
    off: u32,
    accumulate: u32,
    start: u32,
    cols: u32,
    _pad: [u32; 2],
}

/// Sums at least this long are spread over eight threads an output
/// ([`Spread::Blocks`]): SimpleConvNet's fc forward and conv1's weight
/// gradient (128 partials each), not conv2's summed batch (13 partials of
/// 73,728 outputs, which fill a GPU one thread an output).
const SPREAD_FROM: usize = 32;
/// Outputs a spread workgroup takes (`shaders/sum_partials.wgsl`).
const SPREAD_OUTPUTS: usize = 32;

/// How a sum of partials is spread over threads. The additions and their
/// order are the same either way, so are the bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// From the shape: [`Spread::Blocks`] for a sum of at least 32 partials.
    Auto,
    /// One thread an output, adding its partials in turn.
    Outputs,
    /// Eight threads an output, each adding blocks of 8 partials; one of
    /// them then adds the blocks in order.
    Blocks,
}

/// The kernel writing its output in `elem`, adding a bias per column (of
/// the output's type) with `col_bias`, spread by blocks with `blocks`.
fn kernel(elem: Elem, col_bias: bool, blocks: bool) -> Kernel {
    Kernel::variant(
        format!(
            "sum_partials[{}{}{}]",
            elem.name(),
            if col_bias { " +bias" } else { "" },
            if blocks { " spread" } else { "" }
        ),
        SOURCE,
        "main",
        Defs::elem(elem)
            .with("PAIRS", elem.is_16bit() as u8)
            .with("COL_BIAS", col_bias as u8)
            .with("SPREAD", blocks as u8),
    )
}

/// `out[off + i] (+)= Σ_z parts[start + z·len + i]` for i < len, z < count,
/// then `+ bias[i % bias.numel()]` where a bias is given (of the output's
/// type): each output its sum plus its column's bias, in f32. For f32 the
/// bits a pass adding the bias afterwards gives; a 16-bit output is rounded
/// once, after the bias, where a pass would round the sum first. `spread`
/// says how the sum is spread over threads ([`Spread::Auto`] but in tests,
/// which compare the ways: the bits do not depend on it).
#[allow(clippy::too_many_arguments)]
pub fn sum_partials(
    parts: &Tensor,
    out: &Tensor,
    start: usize,
    count: usize,
    len: usize,
    off: usize,
    accumulate: bool,
    bias: Option<&Tensor>,
    spread: Spread,
) -> Result<(), TensorError> {
    let blocks = match spread {
        Spread::Auto => count >= SPREAD_FROM,
        Spread::Outputs => false,
        Spread::Blocks => true,
    };
    let params = SumParams {
        len: len as u32,
        count: count as u32,
        off: off as u32,
        accumulate: accumulate as u32,
        start: start as u32,
        cols: bias.map_or(1, |b| b.numel().max(1)) as u32,
        _pad: [0; 2],
    };
    let elem = out.dtype().elem();
    if let Some(b) = bias {
        if b.dtype() != out.dtype() {
            return Err(TensorError::NotSupported {
                op: "sum_partials",
                what: "a bias added where partials are summed needs the output's dtype",
            });
        }
    }
    if elem.is_16bit() && !off.is_multiple_of(2) {
        return Err(TensorError::Misaligned {
            op: "sum_partials",
            offset: off,
        });
    }
    // A workgroup for every 32 outputs where spread; else an invocation an
    // output, or a word where the output is 16-bit.
    let workgroups = if blocks {
        len.div_ceil(SPREAD_OUTPUTS) as u64
    } else if elem.is_16bit() {
        (len.div_ceil(2) as u64).div_ceil(super::ELEMENTWISE_WORKGROUP)
    } else {
        (len as u64).div_ceil(super::ELEMENTWISE_WORKGROUP)
    };
    let slices: Vec<_> = [parts, out]
        .into_iter()
        .chain(bias)
        .map(Tensor::slice)
        .collect();
    let bindings: Vec<_> = slices.iter().collect();
    parts.engine().dispatch(
        &kernel(elem, bias.is_some(), blocks),
        &bindings,
        bytemuck::bytes_of(&params),
        Workgroups::Linear(workgroups),
    )?;
    Ok(())
}
