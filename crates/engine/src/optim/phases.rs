//! What the foreach and for-loop implementations share: a temporary the
//! size of a parameter, and one pass of a phase kernel over a parameter.

use crate::autograd::param::Parameter;
use crate::memory::Category;
use crate::tensor::{Tensor, TensorError};

/// A parameter-sized temporary in the parameter's dtype (PyTorch's foreach
/// and for-loop temporaries are the parameter's dtype, f16 after half()).
pub(super) fn temporary(like: &Tensor, label: &str) -> Result<Tensor, TensorError> {
    Tensor::empty_as(
        like.engine(),
        like.shape(),
        like.dtype(),
        label,
        Some(Category::Temporary),
    )
}

/// One pass of a phase kernel (two elements per invocation) over `like`'s
/// elements; every binding holds as many elements of its dtype.
pub(super) fn run(
    kernel: &crate::device::Kernel,
    like: &Tensor,
    bindings: &[&Tensor],
    params: &[u8],
) -> Result<(), TensorError> {
    let slices: Vec<_> = bindings.iter().map(|t| t.slice()).collect();
    let refs: Vec<_> = slices.iter().collect();
    crate::ops::launch_flat(
        like,
        kernel,
        &crate::ops::same_parts(like, &refs),
        params,
        like.numel(),
        2,
    )
}

/// Drops a list of temporaries last to first, as CPython frees a list's
/// items (the event log then reads as PyTorch's).
pub(super) fn free_in_reverse(mut list: Vec<Tensor>) {
    while list.pop().is_some() {}
}

/// The gradient of `p`, refused unless it has the parameter's dtype (the
/// update kernels read both as one element type).
pub(super) fn grad_of<'a>(
    op: &'static str,
    p: &'a Parameter,
) -> Result<Option<&'a Tensor>, TensorError> {
    match &p.grad {
        Some(g) if g.dtype() != p.value.dtype() => Err(TensorError::GradientDType {
            op,
            param: p.name.clone(),
            grad: g.dtype(),
            value: p.value.dtype(),
        }),
        g => Ok(g.as_ref()),
    }
}
