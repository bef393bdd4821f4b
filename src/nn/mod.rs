//! Models: parameters by PyTorch name, initialisation, layers, and the zoo.

pub mod attention;
pub mod gpt;
pub mod init;
pub mod layers;
pub mod mlp;
pub mod model;
pub mod param;
pub mod resnet;
pub mod resnet_mini;
pub mod simple_cnn;

pub use model::{Model, ModelSpec, ZOO};
pub use param::{ParamId, ParamStore, Parameter};
pub use simple_cnn::SimpleConvNet;
