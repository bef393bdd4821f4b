//! The wgpu side: adapter choice, the device and its one ordered command
//! stream, kernel dispatch, transfers, and the segment source that backs the
//! allocator with wgpu buffers. Ops never call wgpu directly; they go through
//! [`Gpu::dispatch`], [`Gpu::upload`] and [`Gpu::download`].

pub mod adapter;
pub mod bind_groups;
pub mod buffer_source;
pub mod compose;
pub mod engine_source;
pub mod error;
pub mod flat;
pub mod gpu;
pub mod grid;
pub mod host_memory;
pub mod info;
pub mod segment_buffers;
pub mod settings;
pub mod timing;
pub mod windows;

pub use adapter::{AdapterOptions, AdapterSummary, BackendChoice};
pub use buffer_source::WgpuSource;
pub use engine_source::EngineSource;
pub use error::DeviceError;
pub use flat::{Flat, Part};
pub use gpu::{BufferSlice, Gpu, Kernel};
pub use grid::{grid_for, Workgroups};
pub use info::InfoReport;
pub use segment_buffers::SegmentBuffers;
pub use timing::{DispatchTime, TimingSource};
