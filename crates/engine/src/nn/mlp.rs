//! `mlp`: linear layers `layers.0 … layers.{L-1}` with ReLU between (none
//! after the last), on inputs `[N, widths[0]]`. With `checkpoint_every = k`
//! each run of k layers is one checkpointed segment: only segment inputs are
//! kept through forward, and each segment's activations exist only while its
//! backward runs — the √L trade when k ≈ √L.

use super::init::Rng;
use super::layers::Linear;
use super::model::Model;
use crate::autograd::param::ParamStore;
use crate::autograd::{functions as f, Tape, Value};
use crate::tensor::{Engine, TensorError};

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
