//! Models: parameters by PyTorch name, initialisation, and the model zoo.

pub mod init;
pub mod param;
pub mod simple_cnn;

pub use param::{ParamId, ParamStore, Parameter};
pub use simple_cnn::SimpleConvNet;
