//! Tensors: a shape, a dtype, a label and a block of allocator memory, on one
//! [`Engine`] (a GPU with its caching allocator).

pub mod dtype;
pub mod engine;
pub mod error;
pub mod instruments;
#[allow(clippy::module_inception)]
pub mod tensor;

pub use dtype::DType;
pub use engine::{Engine, SavedTensor, ScopeGuard, Storage, ThreeLevels};
pub use error::{ConfigError, EngineError, LoadProblem, SpecError, TensorError};
pub use instruments::Instruments;
pub use tensor::{Tensor, GENERATE_CHUNK};
