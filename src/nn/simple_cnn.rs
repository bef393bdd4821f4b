//! The articles' SimpleConvNet (seed 002): conv1 3→64 k3 (no padding), ReLU,
//! conv2 64→128 k3, ReLU, flatten, fc 128·28·28 = 25,088 → 10, on 3×32×32
//! inputs. Parameter names are PyTorch's: conv1.weight, conv1.bias, ...

use super::init::{default_bound, Rng};
use super::param::{ParamId, ParamStore};
use crate::autograd::{functions as f, Tape, Value};
use crate::ops::conv2d::Conv2dConfig;
use crate::tensor::{Engine, Tensor, TensorError};

/// The model's parameter handles.
pub struct SimpleConvNet {
    conv1_w: ParamId,
    conv1_b: ParamId,
    conv2_w: ParamId,
    conv2_b: ParamId,
    fc_w: ParamId,
    fc_b: ParamId,
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
        let mut param = |name: &str,
                         shape: &[usize],
                         fan_in: usize|
         -> Result<ParamId, TensorError> {
            let n: usize = shape.iter().product();
            let t =
                Tensor::from_slice(engine, &rng.uniform(n, default_bound(fan_in)), shape, name)?;
            Ok(store.add(name, t))
        };
        Ok(SimpleConvNet {
            conv1_w: param("conv1.weight", &[64, 3, 3, 3], 3 * 9)?,
            conv1_b: param("conv1.bias", &[64], 3 * 9)?,
            conv2_w: param("conv2.weight", &[128, 64, 3, 3], 64 * 9)?,
            conv2_b: param("conv2.bias", &[128], 64 * 9)?,
            fc_w: param("fc.weight", &[10, 128 * 28 * 28], 128 * 28 * 28)?,
            fc_b: param("fc.bias", &[10], 128 * 28 * 28)?,
        })
    }

    /// Logits `[N, 10]` for `x` `[N, 3, 32, 32]`.
    pub fn forward(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        let p = |id| tape.param(store, id);
        let cfg = Conv2dConfig::default();
        // Assignment (not `let` shadowing) drops each previous activation as
        // soon as the next exists, as Python's rebinding does; only what the
        // tape saved stays alive.
        let mut h = f::conv2d(tape, x, &p(self.conv1_w), &p(self.conv1_b), cfg)?;
        h = f::relu(tape, &h)?;
        h = f::conv2d(tape, &h, &p(self.conv2_w), &p(self.conv2_b), cfg)?;
        h = f::relu(tape, &h)?;
        h = f::flatten(tape, &h)?;
        f::linear(tape, &h, &p(self.fc_w), &p(self.fc_b))
    }
}
