//! Memory per GPU when one GPU is not enough. A [`Layout`] (data parallel
//! with DDP's buckets or ZeRO stages 1–3 / FSDP, tensor parallel with or
//! without sequence parallelism, pipeline stages under 1F1B or GPipe) and a
//! [`Transformer`] give, for each pipeline stage, the allocations and frees
//! of one rank's training steps ([`rank::program`]); [`replay::run`] puts
//! them through vramlab-alloc's PyTorch caching allocator for peak
//! allocated and reserved by kind. [`formulas`] holds the closed forms the
//! programs are checked against (the ZeRO paper's model states, Korthikanti
//! et al. 2022's activations), and [`plan`] searches the layouts of a GPU
//! count for the ones that fit. Nothing here touches wgpu.

pub mod formulas;
pub mod layout;
pub mod model;
mod periods;
pub mod plan;
pub mod pool;
pub mod rank;
pub mod replay;

pub use layout::{Ddp, Layout, LayoutError, Precision, Recompute, Schedule, Sharding};
pub use model::Transformer;
