//! The articles' SimpleConvNet (seed 002): conv1 3→64 k3 (no padding), ReLU,
//! conv2 64→128 k3, ReLU, flatten, fc 128·28·28 = 100,352 → 10 (the article
//! wrote 25,088), on 3×32×32
//! inputs. Parameter names are PyTorch's: conv1.weight, conv1.bias, ...

use super::init::Rng;
use super::layers::{Conv2d, Linear};
use super::model::Model;
use super::spec::{ModelConfig, Sizes, ZooEntry};
use crate::autograd::param::ParamStore;
use crate::autograd::{functions as f, Tape, Value};
use crate::io::SafeTensors;
use crate::ops::conv2d::Conv2dConfig;
use crate::tensor::{Engine, SpecError, TensorError};
use serde::Serialize;

/// The model's layers.
pub struct SimpleConvNet {
    conv1: Conv2d,
    conv2: Conv2d,
    fc: Linear,
}

/// Input shape per sample.
pub const INPUT: [usize; 3] = [3, 32, 32];
pub const CLASSES: usize = 10;

impl SimpleConvNet {
    /// Creates the parameters with PyTorch's default initialisation.
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
    ) -> Result<Self, TensorError> {
        let cfg = Conv2dConfig::default();
        Ok(SimpleConvNet {
            conv1: Conv2d::new(engine, store, rng, "conv1", 3, 64, 3, cfg)?,
            conv2: Conv2d::new(engine, store, rng, "conv2", 64, 128, 3, cfg)?,
            fc: Linear::new(engine, store, rng, "fc", 128 * 28 * 28, CLASSES)?,
        })
    }
}

impl Model for SimpleConvNet {
    fn input_shape(&self) -> Vec<usize> {
        INPUT.to_vec()
    }

    /// Logits `[N, 10]` for `x` `[N, 3, 32, 32]`.
    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        // Assignment (not `let` shadowing) drops each previous activation as
        // soon as the next exists, as Python's rebinding does; only what the
        // tape saved stays alive.
        let mut h = self.conv1.forward(tape, store, x)?;
        h = f::relu(tape, &h)?;
        h = self.conv2.forward(tape, store, &h)?;
        h = f::relu(tape, &h)?;
        h = f::flatten(tape, &h)?;
        self.fc.forward(tape, store, &h)
    }

    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        let (c1, c2) = (self.conv1.clone(), self.conv2.clone());
        let mut h = f::checkpoint(tape, store, x, move |t, s, v| {
            let mut h = c1.forward(t, s, v)?;
            h = f::relu(t, &h)?;
            h = c2.forward(t, s, &h)?;
            f::relu(t, &h)
        })?;
        h = f::flatten(tape, &h)?;
        self.fc.forward(tape, store, &h)
    }
}

/// `simple-cnn` has one size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SimpleCnnSpec;

pub const ENTRY: ZooEntry = ZooEntry {
    name: "simple-cnn",
    about: "the documents' SimpleConvNet: conv 3→64 k3, ReLU, conv 64→128 k3, ReLU, fc 100,352→10 (128·28·28; the article wrote 25,088) on 3×32×32",
    default: || SimpleCnnSpec.into(),
};

impl ModelConfig for SimpleCnnSpec {
    fn name(&self) -> &'static str {
        "simple-cnn"
    }

    fn describe(&self) -> String {
        "simple-cnn (3×32×32 → 10)".into()
    }

    fn classes(&self) -> usize {
        CLASSES
    }

    fn input_shape(&self) -> Vec<usize> {
        INPUT.to_vec()
    }

    fn flags(&self) -> &'static [&'static str] {
        &[]
    }

    fn apply(&mut self, _sizes: &Sizes) -> Result<(), SpecError> {
        Ok(())
    }

    fn validate(&self) -> Result<(), SpecError> {
        Ok(())
    }

    fn build(
        &self,
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
    ) -> Result<Box<dyn Model>, TensorError> {
        Ok(Box::new(SimpleConvNet::new(engine, store, rng)?))
    }

    fn adapt_to_weights(&mut self, _st: &SafeTensors) -> Result<(), SpecError> {
        Ok(())
    }

    fn adapt_to_input(&mut self, _x_shape: &[usize]) {}
}
