//! The training loop the CLI, the demo and the tests share: a batch (random
//! or from safetensors), an optimizer chosen by name, and one step measured
//! by the allocator's own statistics.

pub mod batch;
pub mod loss;
pub mod optimizer;
pub mod step;
pub mod text;

pub use batch::Batch;
pub use loss::LossMode;
pub use optimizer::{OptimizerConfig, OptimizerKind};
pub use step::{Mode, StepRecord, Trainer};
