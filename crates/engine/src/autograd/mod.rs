//! Reverse-mode autodiff: a tape of recorded ops ([`Tape`]), values that know
//! their place in it ([`Value`]), and the differentiable functions.

pub mod functions;
pub mod param;
pub mod tape;
pub mod transformer;
pub mod vision;

pub use tape::{Tape, Value};
