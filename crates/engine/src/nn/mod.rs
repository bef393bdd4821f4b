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
pub mod spec;
pub mod zoo;

/// Parameters live with autograd (checkpointing reruns a forward over
/// them); models reach them here too.
pub use crate::autograd::param::{self, ParamId, ParamStore, Parameter};
pub use attention::AttentionSpec;
pub use gpt::GptSpec;
pub use mlp::MlpSpec;
pub use model::Model;
pub use resnet::Resnet50Spec;
pub use resnet_mini::ResnetMiniSpec;
pub use simple_cnn::{SimpleCnnSpec, SimpleConvNet};
pub use spec::{ModelConfig, ModelSpec, Sizes, MAX_MODEL_SIZE};
pub use zoo::{Zoo, ZooEntry, ZOO};
