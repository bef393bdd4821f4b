//! Choosing an optimizer by name, with torch.optim's defaults where a flag
//! is not given (SGD lr 0.01 momentum 0; Adam lr 1e-3; AdamW lr 1e-3 and
//! weight decay 0.01).

use crate::optim::{Adam, Optimizer, OptimizerImpl, Sgd};
use crate::tensor::ConfigError;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Adam,
    Adamw,
}

/// torch.optim's class names: SGD, Adam, AdamW.
impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OptimizerKind::Sgd => "SGD",
            OptimizerKind::Adam => "Adam",
            OptimizerKind::Adamw => "AdamW",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OptimizerConfig {
    pub kind: OptimizerKind,
    #[serde(serialize_with = "as_typed")]
    pub lr: f32,
    #[serde(serialize_with = "as_typed")]
    pub momentum: f32,
    #[serde(serialize_with = "as_typed")]
    pub weight_decay: f32,
    /// foreach (PyTorch's default on CUDA), for-loop or fused: the same
    /// update, different temporaries.
    pub implementation: OptimizerImpl,
}

/// An f32 in JSON as it was typed (0.001, not 0.0010000000474974513): its
/// shortest decimal, which reads back to the same f32.
fn as_typed<S: serde::Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(x.to_string().parse::<f64>().unwrap_or(*x as f64))
}

impl OptimizerConfig {
    /// Fills unset values with torch.optim's defaults for `kind`.
    pub fn new(
        kind: OptimizerKind,
        lr: Option<f32>,
        momentum: Option<f32>,
        weight_decay: Option<f32>,
    ) -> OptimizerConfig {
        let (lr0, wd0) = match kind {
            OptimizerKind::Sgd => (0.01, 0.0),
            OptimizerKind::Adam => (1e-3, 0.0),
            OptimizerKind::Adamw => (1e-3, 0.01),
        };
        OptimizerConfig {
            kind,
            lr: lr.unwrap_or(lr0),
            momentum: momentum.unwrap_or(0.0),
            weight_decay: weight_decay.unwrap_or(wd0),
            implementation: OptimizerImpl::default(),
        }
    }

    /// Whether its step takes GradScaler's flag on the device (the fused
    /// implementations, as PyTorch's `_step_supports_amp_scaling`): a step
    /// skipped there makes the state an update makes.
    pub fn takes_found_inf(&self) -> bool {
        self.implementation.takes_found_inf()
    }

    /// The same optimizer, implemented as `implementation`.
    pub fn with_impl(self, implementation: OptimizerImpl) -> OptimizerConfig {
        OptimizerConfig {
            implementation,
            ..self
        }
    }

    /// Whether the optimizer keeps state between steps: Adam's moments,
    /// SGD's momentum buffers (plain SGD keeps none).
    pub fn has_state(&self) -> bool {
        self.kind != OptimizerKind::Sgd || self.momentum != 0.0
    }

    /// Errors for values torch.optim rejects too.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let negative = |what: &'static str, value: f32| {
            if value.is_nan() || value < 0.0 {
                Err(ConfigError::Negative { what, value })
            } else {
                Ok(())
            }
        };
        negative("learning rate", self.lr)?;
        negative("momentum", self.momentum)?;
        if self.momentum != 0.0 && self.kind != OptimizerKind::Sgd {
            return Err(ConfigError::MomentumNotSgd);
        }
        negative("weight decay", self.weight_decay)
    }

    pub fn build(&self) -> Box<dyn Optimizer> {
        match self.kind {
            OptimizerKind::Sgd => {
                let mut s = Sgd::new(self.lr, self.momentum);
                s.weight_decay = self.weight_decay;
                s.implementation = self.implementation;
                Box::new(s)
            }
            OptimizerKind::Adam | OptimizerKind::Adamw => {
                let mut a = if self.kind == OptimizerKind::Adam {
                    Adam::new(self.lr)
                } else {
                    Adam::adamw(self.lr)
                };
                a.weight_decay = self.weight_decay;
                a.implementation = self.implementation;
                Box::new(a)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_in_json_as_typed() {
        let o = OptimizerConfig::new(OptimizerKind::Adamw, None, None, None);
        let v = serde_json::to_value(o).unwrap();
        assert_eq!(v["lr"].to_string(), "0.001");
        assert_eq!(v["weight_decay"].to_string(), "0.01");
        assert_eq!(v["lr"].as_f64().unwrap() as f32, o.lr);
    }
}
