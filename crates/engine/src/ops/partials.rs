//! Adding up partial results: the second stage of every reduction that is
//! split across workgroups (split-K and batch-reduced matrix products, the
//! channel sums of bias gradients). Partials are f32 in a workspace; they
//! are added in a fixed order, so results are deterministic, and each
//! partial is itself a blocked sum, so the total is as accurate as one long
//! blocked reduction.

use crate::device::compose::{Defs, Elem};
use crate::device::Kernel;
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
    _pad: [u32; 3],
}

/// The kernel writing its output in `elem`.
fn kernel(elem: Elem) -> Kernel {
    Kernel::variant(
        format!("sum_partials[{}]", elem.name()),
        SOURCE,
        "main",
        Defs::elem(elem).with("PAIRS", elem.is_16bit() as u8),
    )
}

/// `out[off + i] (+)= Σ_z parts[start + z·len + i]` for i < len, z < count.
pub(crate) fn sum_partials(
    parts: &Tensor,
    out: &Tensor,
    start: usize,
    count: usize,
    len: usize,
    off: usize,
    accumulate: bool,
) -> Result<(), TensorError> {
    let params = SumParams {
        len: len as u32,
        count: count as u32,
        off: off as u32,
        accumulate: accumulate as u32,
        start: start as u32,
        _pad: [0; 3],
    };
    let elem = out.dtype().elem();
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
        &kernel(elem),
        &[&parts.slice(), &out.slice()],
        bytemuck::bytes_of(&params),
        invocations,
    )
}
