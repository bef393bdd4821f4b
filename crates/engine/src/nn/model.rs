//! What every built model is to the training loop. Its sizes before it is
//! built are a `ModelSpec` (spec.rs); the models are listed in zoo.rs.

use crate::autograd::param::ParamStore;
use crate::autograd::{Tape, Value};
use crate::tensor::{Tensor, TensorError};

/// A model: parameters live in a [`ParamStore`], the model holds their ids.
pub trait Model {
    /// Shape of one sample (the batch axis is prepended).
    fn input_shape(&self) -> Vec<usize>;
    /// The model's buffers by state_dict name (BatchNorm's running
    /// statistics): state a state_dict holds beside the parameters, which
    /// the optimizer never sees.
    fn buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// Logits `[N, classes]` for `x` `[N, ..input_shape]`.
    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError>;
    /// The same logits with the model's natural segments checkpointed
    /// (`torch.utils.checkpoint`): mlp runs of √L layers, simple-cnn's
    /// convolutional features, each residual block, each attention sublayer.
    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError>;
    /// The head's input `[N, D]` and its weight `[classes, D]` instead of
    /// the logits, for a loss that runs the head itself (`--loss chunked`);
    /// `None` for a model whose head is not a bias-free linear map.
    fn forward_head_input(
        &self,
        _tape: &Tape,
        _store: &ParamStore,
        _x: &Value,
        _checkpointed: bool,
    ) -> Result<Option<(Value, Value)>, TensorError> {
        Ok(None)
    }
}
