//! vramlab: a GPU compute engine on wgpu that makes GPU memory visible.
//!
//! Layers, each importing only those below it:
//! - [`memory`]: the caching allocator (no wgpu), its statistics and traces;
//! - [`device`]: wgpu adapter/device/queue, pipelines, dispatch, readback, and
//!   the segment source that backs the allocator with wgpu buffers;
//! - [`tensor`] and [`ops`]: tensors living in allocator blocks, and kernels.

pub mod autograd;
pub mod cli;
pub mod device;
pub mod estimate;
pub mod io;
pub mod lab;
pub mod lessons;
pub mod memory;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod profile;
pub mod tensor;
pub mod train;
