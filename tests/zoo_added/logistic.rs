//! A model added to the zoo from outside the engine, to show what adding one
//! takes: this file (sizes, defaults, checks, layers) and one `Zoo::add`
//! line. `logistic`: one linear layer `fc` from `features` to `classes`.

use serde::Serialize;
use vramlab::autograd::{Tape, Value};
use vramlab::io::SafeTensors;
use vramlab::nn::init::Rng;
use vramlab::nn::layers::Linear;
use vramlab::nn::spec::{check_sizes, set, StateDict};
use vramlab::nn::{Model, ModelConfig, ParamStore, Sizes, ZooEntry};
use vramlab::tensor::{Engine, SpecError, TensorError};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogisticSpec {
    pub features: usize,
    pub classes: usize,
}

pub const ENTRY: ZooEntry = ZooEntry {
    name: "logistic",
    about: "one linear layer onto the classes (--dim features, --classes)",
    default: || {
        LogisticSpec {
            features: 12,
            classes: 3,
        }
        .into()
    },
};

pub struct Logistic {
    fc: Linear,
    features: usize,
}

impl Model for Logistic {
    fn input_shape(&self) -> Vec<usize> {
        vec![self.features]
    }

    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        self.fc.forward(tape, store, x)
    }

    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        self.forward(tape, store, x)
    }
}

impl ModelConfig for LogisticSpec {
    fn name(&self) -> &'static str {
        "logistic"
    }

    fn describe(&self) -> String {
        format!("logistic {} → {}", self.features, self.classes)
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![self.features]
    }

    fn flags(&self) -> &'static [&'static str] {
        &["dim", "classes"]
    }

    fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError> {
        set(&mut self.features, &sizes.dim);
        set(&mut self.classes, &sizes.classes);
        Ok(())
    }

    fn validate(&self) -> Result<(), SpecError> {
        check_sizes(&[self.features, self.classes])?;
        if self.features == 0 || self.classes == 0 {
            return Err(SpecError::Zero {
                flags: "--dim and --classes",
            });
        }
        Ok(())
    }

    fn build(
        &self,
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
    ) -> Result<Box<dyn Model>, TensorError> {
        let fc = Linear::new(engine, store, rng, "fc", self.features, self.classes)?;
        Ok(Box::new(Logistic {
            fc,
            features: self.features,
        }))
    }

    fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError> {
        let sd = StateDict(st);
        self.classes = sd.rows("fc.weight")?;
        self.features = sd.shape("fc.weight")?.get(1).copied().unwrap_or(0);
        Ok(())
    }

    fn adapt_to_input(&mut self, x_shape: &[usize]) {
        if let [_, f] = x_shape {
            self.features = *f;
        }
    }
}
