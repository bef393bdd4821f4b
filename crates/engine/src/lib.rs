//! vramlab's engine: a GPU compute engine on wgpu whose tensors live in
//! vramlab's caching allocator (`vramlab-alloc`).
//!
//! Layers, each importing only those below it (tests/layering.rs checks it):
//! - [`memory`]: the caching allocator (its own crate, no wgpu);
//! - [`device`]: wgpu adapter/device/queue, pipelines, dispatch, readback, and
//!   the segment source that backs the allocator with wgpu buffers;
//! - [`tensor`] and [`ops`]: tensors living in allocator blocks, and kernels;
//! - [`autograd`], [`nn`], [`optim`], [`train`]: training;
//! - [`estimate`], [`profile`]: what a step holds, predicted and recorded;
//! - [`io`]: files (safetensors, pickles' bytes, atomic writes).

pub use vramlab_alloc as memory;

/// The engine's one error type (every fallible function returns it).
pub use tensor::{ConfigError, EngineError, LoadProblem, TensorError};

pub mod autograd;
pub mod device;
pub mod estimate;
pub mod io;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod profile;
pub mod tensor;
pub mod train;
