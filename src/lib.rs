//! vramlab: a GPU compute engine on wgpu that makes GPU memory visible.
//!
//! Three crates below this one, each importing only those below it:
//! - [`memory`] (`vramlab-alloc`): PyTorch's caching allocator and its
//!   statistics, snapshots and events; no wgpu;
//! - [`lab`] (`vramlab-lab`): allocator strategies, traces, snapshot formats
//!   and replay;
//! - [`parallel`] (`vramlab-parallel`): what one rank of a DDP / ZeRO /
//!   FSDP / tensor / pipeline parallel layout allocates, replayed through
//!   the allocator, and the search for layouts that fit; no wgpu;
//! - the engine (`vramlab-engine`): [`device`], [`tensor`], [`ops`],
//!   [`autograd`], [`nn`], [`optim`], [`train`], [`estimate`], [`profile`],
//!   [`io`].
//!
//! This crate holds the command line ([`cli`]) and the lessons.

pub use vramlab_alloc as memory;
pub use vramlab_engine::{autograd, device, estimate, io, nn, ops, optim, profile, tensor, train};
pub use vramlab_lab as lab;
pub use vramlab_parallel as parallel;

pub mod cli;
pub mod lessons;
