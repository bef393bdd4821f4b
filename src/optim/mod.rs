//! Optimizers. State is allocated lazily at the first step, as in PyTorch.

pub mod adam;

pub use adam::Adam;
