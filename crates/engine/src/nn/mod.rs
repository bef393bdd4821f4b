//! Models: parameters by PyTorch name, initialisation, layers, and the zoo.

pub mod attention;
pub mod gpt;
pub mod init;
pub mod layers;
pub mod mlp;
pub mod model;
pub mod resnet;
pub mod resnet_mini;
pub mod simple_cnn;

/// Parameters live with autograd (checkpointing reruns a forward over
/// them); models reach them here too.
pub use crate::autograd::param::{self, ParamId, ParamStore, Parameter};
pub use model::{Model, ModelSpec, ZOO};
pub use simple_cnn::SimpleConvNet;
