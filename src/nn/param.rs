//! Parameters by name (PyTorch's state_dict names) with their gradients.
//! A gradient stays allocated until `zero_grad`, as in PyTorch, which is why
//! "gradients live only through backward" (the articles' claim C03) is false.

use crate::ops::elementwise;
use crate::tensor::{Tensor, TensorError};

/// Index of a parameter in its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamId(pub usize);

/// One trainable tensor.
pub struct Parameter {
    pub name: String,
    pub value: Tensor,
    pub grad: Option<Tensor>,
}

/// All parameters of a model, in registration order.
#[derive(Default)]
pub struct ParamStore {
    params: Vec<Parameter>,
}

impl ParamStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, name: &str, value: Tensor) -> ParamId {
        self.params.push(Parameter {
            name: name.to_string(),
            value,
            grad: None,
        });
        ParamId(self.params.len() - 1)
    }

    pub fn get(&self, id: ParamId) -> &Parameter {
        &self.params[id.0]
    }

    pub fn get_mut(&mut self, id: ParamId) -> &mut Parameter {
        &mut self.params[id.0]
    }

    pub fn iter(&self) -> impl Iterator<Item = &Parameter> {
        self.params.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Parameter> {
        self.params.iter_mut()
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Total number of elements (what the articles call the parameter count).
    pub fn numel(&self) -> usize {
        self.params.iter().map(|p| p.value.numel()).sum()
    }

    /// Adds `g` into the parameter's `.grad` (sets it if there is none).
    pub fn accumulate_grad(&mut self, id: ParamId, g: Tensor) -> Result<(), TensorError> {
        let p = &mut self.params[id.0];
        p.grad = Some(elementwise::accumulate(p.grad.take(), g)?);
        Ok(())
    }

    /// `zero_grad(set_to_none=True)`, PyTorch's default: frees every gradient.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.grad = None;
        }
    }
}
