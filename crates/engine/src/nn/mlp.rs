//! `mlp`: linear layers `layers.0 … layers.{L-1}` with ReLU between (none
//! after the last), on inputs `[N, widths[0]]`. With `checkpoint_every = k`
//! each run of k layers is one checkpointed segment: only segment inputs are
//! kept through forward, and each segment's activations exist only while its
//! backward runs — the √L trade when k ≈ √L.

use super::init::Rng;
use super::layers::Linear;
use super::model::Model;
use super::spec::{check_sizes, set, ModelConfig, Sizes, StateDict, ZooEntry};
use crate::autograd::param::ParamStore;
use crate::autograd::{functions as f, Tape, Value};
use crate::io::SafeTensors;
use crate::tensor::{Engine, SpecError, TensorError};
use serde::Serialize;

pub struct Mlp {
    layers: Vec<Linear>,
    inputs: usize,
    checkpoint_every: usize,
}

/// Layers `range` of `layers`, ReLU after each except the network's last.
fn run(
    layers: &[Linear],
    last: usize,
    first_index: usize,
    tape: &Tape,
    store: &ParamStore,
    x: &Value,
) -> Result<Value, TensorError> {
    let mut h = x.clone();
    for (j, layer) in layers.iter().enumerate() {
        h = layer.forward(tape, store, &h)?;
        if first_index + j != last {
            h = f::relu(tape, &h)?;
        }
    }
    Ok(h)
}

impl Mlp {
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        widths: &[usize],
        checkpoint_every: usize,
    ) -> Result<Mlp, TensorError> {
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| Linear::new(engine, store, rng, &format!("layers.{i}"), w[0], w[1]))
            .collect::<Result<_, _>>()?;
        Ok(Mlp {
            layers,
            inputs: widths[0],
            checkpoint_every,
        })
    }
}

impl Model for Mlp {
    fn input_shape(&self) -> Vec<usize> {
        vec![self.inputs]
    }

    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        if self.checkpoint_every == 0 {
            let last = self.layers.len() - 1;
            return run(&self.layers, last, 0, tape, store, x);
        }
        self.segments(self.checkpoint_every, tape, store, x)
    }

    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        let k = match self.checkpoint_every {
            0 => (self.layers.len() as f64).sqrt().ceil() as usize,
            k => k,
        };
        self.segments(k, tape, store, x)
    }
}

impl Mlp {
    /// Runs of `k` layers, each one checkpointed segment.
    fn segments(
        &self,
        k: usize,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        let last = self.layers.len() - 1;
        let mut h = x.clone();
        for (s, chunk) in self.layers.chunks(k).enumerate() {
            let chunk = chunk.to_vec();
            let first = s * k;
            h = f::checkpoint(tape, store, &h, move |t, st, v| {
                run(&chunk, last, first, t, st, v)
            })?;
        }
        Ok(h)
    }
}

/// `mlp`'s sizes: linear layers of the given widths (input first, classes
/// last); `checkpoint_every` > 0 checkpoints runs of that many layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MlpSpec {
    pub widths: Vec<usize>,
    pub checkpoint_every: usize,
}

impl Default for MlpSpec {
    fn default() -> MlpSpec {
        MlpSpec {
            widths: vec![784, 256, 256, 10],
            checkpoint_every: 0,
        }
    }
}

pub const ENTRY: ZooEntry = ZooEntry {
    name: "mlp",
    about: "linear layers with ReLU between (--widths 784,256,256,10; --checkpoint-every K)",
    default: || MlpSpec::default().into(),
};

impl ModelConfig for MlpSpec {
    fn name(&self) -> &'static str {
        "mlp"
    }

    fn describe(&self) -> String {
        let w: Vec<String> = self.widths.iter().map(|w| w.to_string()).collect();
        let ck = if self.checkpoint_every > 0 {
            format!(", checkpoint every {} layers", self.checkpoint_every)
        } else {
            String::new()
        };
        format!("mlp widths {}{ck}", w.join("→"))
    }

    fn classes(&self) -> usize {
        self.widths.last().copied().unwrap_or(0)
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![self.widths.first().copied().unwrap_or(0)]
    }

    fn flags(&self) -> &'static [&'static str] {
        &["widths", "checkpoint-every"]
    }

    fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError> {
        set(&mut self.widths, &sizes.widths);
        set(&mut self.checkpoint_every, &sizes.checkpoint_every);
        Ok(())
    }

    fn validate(&self) -> Result<(), SpecError> {
        check_sizes(&self.widths)?;
        if self.widths.len() < 2 || self.widths.contains(&0) {
            return Err(SpecError::Widths);
        }
        Ok(())
    }

    fn build(
        &self,
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
    ) -> Result<Box<dyn Model>, TensorError> {
        let m = Mlp::new(engine, store, rng, &self.widths, self.checkpoint_every)?;
        Ok(Box::new(m))
    }

    fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError> {
        let sd = StateDict(st);
        let n = sd.count(|i| format!("layers.{i}.weight"));
        if n == 0 {
            return Err(SpecError::NotAStateDict {
                origin: sd.origin().to_string(),
                name: "layers.0.weight",
                model: "mlp",
            });
        }
        // A layer missing from the middle would read as a shorter model.
        let later = st
            .tensors
            .keys()
            .filter_map(|k| {
                k.strip_prefix("layers.")?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .filter(|&i| i > n)
            .min();
        if let Some(j) = later {
            return Err(SpecError::LayerGap {
                origin: sd.origin().to_string(),
                missing: format!("layers.{n}.weight"),
                later: format!("layers.{j}"),
            });
        }
        let first = sd.shape("layers.0.weight")?;
        let mut w = vec![first.get(1).copied().unwrap_or(0)];
        for i in 0..n {
            w.push(sd.rows(&format!("layers.{i}.weight"))?);
        }
        self.widths = w;
        Ok(())
    }

    fn adapt_to_input(&mut self, x_shape: &[usize]) {
        if let ([_, w], Some(first)) = (x_shape, self.widths.first_mut()) {
            *first = *w;
        }
    }
}
