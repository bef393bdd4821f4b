//! Predicting a training step's memory without touching a GPU, exactly.
//!
//! The estimator does not re-derive the engine's allocations from formulas
//! (which drift from the code the moment an op changes); it runs the model's
//! own step on a simulated device — the same allocator, the same op code,
//! every kernel and transfer skipped — and reads the allocation sequence it
//! produced. Reserved memory comes from replaying that sequence through the
//! caching allocator on the simulated source, which happens as it runs. The
//! result is exact to the byte by construction, which `--measure` (the same
//! step on the real device) and the tests confirm.
//!
//! Beside it, [`hand`] computes the documents' hand method (claim C26) so its
//! omissions can be shown with numbers.

pub mod analysis;
pub mod fit;
pub mod hand;
pub mod run;

pub use analysis::{analyze, Analysis, LayerRow, PhaseRow};
pub use run::{run_step, Plan, StepProfile};
