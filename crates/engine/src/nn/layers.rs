//! The two layers with parameters, as PyTorch modules: `Linear` and `Conv2d`,
//! registered under `<prefix>.weight` / `<prefix>.bias` with PyTorch's
//! default initialisation (uniform in ±1/√fan_in, weight then bias, which is
//! the order the random draws are made in).

use super::init::{default_bound, Rng};
use crate::autograd::param::{ParamId, ParamStore};
use crate::autograd::{functions as f, Tape, Value};
use crate::memory::Category;
use crate::ops::conv2d::Conv2dConfig;
use crate::tensor::{DType, Engine, Tensor, TensorError};
use std::sync::Arc;

/// Runs a layer's forward: what it allocates is tagged `<name>.forward`,
/// and its output is noted for the per-layer reports.
pub(super) fn in_layer(
    x: &Value,
    name: &Arc<str>,
    forward: impl FnOnce() -> Result<Value, TensorError>,
) -> Result<Value, TensorError> {
    let engine = x.tensor().engine();
    let _scope = engine.op_scope(&format!("{name}.forward"));
    let y = forward()?;
    engine.note_layer_output(name, y.tensor().shape());
    Ok(y)
}

fn param(
    engine: &Engine,
    store: &mut ParamStore,
    rng: &mut Rng,
    name: String,
    shape: &[usize],
    fan_in: usize,
) -> Result<ParamId, TensorError> {
    let _scope = engine.scope(Category::Parameter, "init");
    let bound = default_bound(fan_in);
    let t = Tensor::generated(engine, shape, DType::F32, &name, |n| rng.uniform(n, bound))?;
    Ok(store.add(&name, t))
}

/// `nn.Linear(inputs, outputs, bias)`: weight `[out, in]`, bias `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The module's name (`fc`, `layers.0`): allocations are tagged `fc.forward`.
    pub name: Arc<str>,
    pub weight: ParamId,
    pub bias: Option<ParamId>,
}

impl Linear {
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        prefix: &str,
        inputs: usize,
        outputs: usize,
    ) -> Result<Linear, TensorError> {
        let mut l = Self::without_bias(engine, store, rng, prefix, inputs, outputs)?;
        let name = format!("{prefix}.bias");
        l.bias = Some(param(engine, store, rng, name, &[outputs], inputs)?);
        Ok(l)
    }

    /// `nn.Linear(inputs, outputs, bias=False)`.
    pub fn without_bias(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        prefix: &str,
        inputs: usize,
        outputs: usize,
    ) -> Result<Linear, TensorError> {
        let name = format!("{prefix}.weight");
        let weight = param(engine, store, rng, name, &[outputs, inputs], inputs)?;
        Ok(Linear {
            name: Arc::from(prefix),
            weight,
            bias: None,
        })
    }

    pub fn forward(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        in_layer(x, &self.name, || {
            let w = tape.param(store, self.weight);
            let b = self.bias.map(|b| tape.param(store, b));
            f::linear(tape, x, &w, b.as_ref())
        })
    }
}

/// `nn.Conv2d(in, out, k, stride, padding)`: weight `[out, in, k, k]`, bias `[out]`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    pub name: Arc<str>,
    pub weight: ParamId,
    pub bias: ParamId,
    pub config: Conv2dConfig,
}

impl Conv2d {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        prefix: &str,
        inputs: usize,
        outputs: usize,
        kernel: usize,
        config: Conv2dConfig,
    ) -> Result<Conv2d, TensorError> {
        let fan_in = inputs * kernel * kernel;
        Ok(Conv2d {
            name: Arc::from(prefix),
            weight: param(
                engine,
                store,
                rng,
                format!("{prefix}.weight"),
                &[outputs, inputs, kernel, kernel],
                fan_in,
            )?,
            bias: param(
                engine,
                store,
                rng,
                format!("{prefix}.bias"),
                &[outputs],
                fan_in,
            )?,
            config,
        })
    }

    pub fn forward(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        in_layer(x, &self.name, || {
            let (w, b) = (tape.param(store, self.weight), tape.param(store, self.bias));
            f::conv2d(tape, x, &w, &b, self.config)
        })
    }
}
