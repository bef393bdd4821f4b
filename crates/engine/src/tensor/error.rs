//! Tensor-level errors: shapes, dtypes, memory and device, each with the
//! values involved so the message says what to fix.

use super::dtype::DType;
use crate::device::DeviceError;
use crate::memory::AllocError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not match")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    #[error("{op}: {message}")]
    InvalidShape { op: &'static str, message: String },
    /// A shape past what any device holds: sizes from a flag or a file.
    #[error("{op}: a tensor of shape {shape:?} has more elements than any device can hold (over 2^62 bytes); check the sizes given")]
    TooLarge { op: &'static str, shape: Vec<usize> },
    #[error("{got} values given for shape {shape:?}, which holds {want}")]
    DataLength {
        got: usize,
        want: usize,
        shape: Vec<usize>,
    },
    #[error("{op} is not implemented for {dtype} yet; use f32")]
    UnsupportedDType { op: &'static str, dtype: DType },
    #[error("{op}: a tensor of shape {shape:?} has no elements; every tensor needs at least one")]
    Empty { op: &'static str, shape: Vec<usize> },
    #[error("{op}: tensors live on different engines")]
    DifferentEngines { op: &'static str },
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl TensorError {
    pub fn is_oom(&self) -> bool {
        matches!(self, TensorError::Alloc(e) if e.is_oom())
    }
}
