//! Adding up partial results: the second stage of every reduction that is
//! split across workgroups (split-K and batch-reduced matrix products, the
//! channel sums of bias gradients). Partials are f32 in a workspace; they
//! are added in a fixed order, so results are deterministic, and each
//! partial is itself a blocked sum, so the total is as accurate as one long
//! blocked reduction.

use crate::device::compose::{Defs, Elem};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

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

/// The kernel writing its output in `elem`, adding a bias per column with
/// `col_bias` (f32 only).
fn kernel(elem: Elem, col_bias: bool) -> Kernel {
    Kernel::variant(
        format!(
            "sum_partials[{}{}]",
            elem.name(),
            if col_bias { " +bias" } else { "" }
        ),
        SOURCE,
        "main",
        Defs::elem(elem)
            .with("PAIRS", elem.is_16bit() as u8)
            .with("COL_BIAS", col_bias as u8),
    )
}

/// `out[off + i] (+)= Σ_z parts[start + z·len + i]` for i < len, z < count,
/// then `+ bias[i % bias.numel()]` where a bias is given (f32 out and bias):
/// each output its sum plus its column's bias, the bits a pass adding the
/// bias afterwards gives.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sum_partials(
    parts: &Tensor,
    out: &Tensor,
    start: usize,
    count: usize,
    len: usize,
    off: usize,
    accumulate: bool,
    bias: Option<&Tensor>,
) -> Result<(), TensorError> {
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
        if out.dtype() != DType::F32 || b.dtype() != DType::F32 {
            return Err(TensorError::NotSupported {
                op: "sum_partials",
                what: "a bias added where partials are summed needs f32 output and bias",
            });
        }
        return super::launch(
            parts,
            &kernel(elem, true),
            &[&parts.slice(), &out.slice(), &b.slice()],
            bytemuck::bytes_of(&params),
            len,
        );
    }
    if elem.is_16bit() && !off.is_multiple_of(2) {
        return Err(TensorError::Misaligned {
            op: "sum_partials",
            offset: off,
        });
    }
    let invocations = if elem.is_16bit() {
        len.div_ceil(2)
    } else {
        len
    };
    super::launch(
        parts,
        &kernel(elem, false),
        &[&parts.slice(), &out.slice()],
        bytemuck::bytes_of(&params),
        invocations,
    )
}
