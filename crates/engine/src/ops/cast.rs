//! `cast`: a tensor converted to another dtype (PyTorch's `.to(dtype)`), the
//! op autocast inserts before low-precision kernels and after them where a
//! float32 op follows.

use super::{check_u32, CountParams};
use crate::device::compose::Defs;
use crate::device::{Kernel, Part};
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/cast.wgsl");

fn kernel(from: DType, to: DType) -> Kernel {
    Kernel::variant(
        format!("cast[{from}→{to}]"),
        SOURCE,
        "main",
        Defs::elem(from.elem())
            .with("ELEM_OUT", to.elem().name())
            .with("T_OUT", to.elem().storage()),
    )
}

/// `x` in `dtype`, as a new tensor labelled `label` (a tensor already in
/// `dtype` is copied all the same: callers that can reuse it check first).
pub fn cast(x: &Tensor, dtype: DType, label: &str) -> Result<Tensor, TensorError> {
    check_u32("cast", x)?;
    let out = Tensor::empty(x.engine(), x.shape(), dtype, label)?;
    cast_into(x, &out)?;
    Ok(out)
}

/// Converts `x` into the existing tensor `out` (same number of elements).
pub fn cast_into(x: &Tensor, out: &Tensor) -> Result<(), TensorError> {
    let n = x.numel();
    if out.numel() != n {
        return Err(TensorError::ShapeMismatch {
            op: "cast",
            lhs: x.shape().to_vec(),
            rhs: out.shape().to_vec(),
        });
    }
    let bytes = |t: &Tensor| Part::Elements(t.dtype().size_in_bytes() as u64);
    super::launch_flat(
        x,
        &kernel(x.dtype(), out.dtype()),
        &[(&x.slice(), bytes(x)), (&out.slice(), bytes(out))],
        bytemuck::bytes_of(&CountParams::new(n)),
        n,
        2,
    )
}
