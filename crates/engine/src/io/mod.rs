//! Files in and out: safetensors (weights from a PyTorch state_dict, batches,
//! dumps of results). No wgpu here; tensors cross as host vectors.

pub mod atomic;
pub mod bounded;
pub mod interrupt;
pub mod safetensors;

pub use atomic::{check_writable, write_atomic};

pub use self::safetensors::{FormatProblem, SafeTensors, SafetensorsError, StDtype};
