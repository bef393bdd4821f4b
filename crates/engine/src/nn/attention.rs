//! `attention`: one single-head self-attention block over `[N, S, D]`
//! inputs, then a classifier:
//!   q, k, v = attn.{q,k,v}_proj(x);  a = softmax(q·kᵀ/√D);  o = attn.out_proj(a·v)
//!   h = x + o;  h = h + mlp.fc2(relu(mlp.fc1(h)));  logits = head(mean over S of h)
//! The score and probability tensors are `[N, S, S]`, so activation memory
//! grows with the square of the sequence length.
//!
//! `k_proj` has no bias (as in many modern blocks): softmax ignores a
//! constant added to a row of scores, and q·b_k is exactly that, so a key
//! bias gets a gradient that is zero in exact arithmetic and float noise in
//! practice — which Adam, dividing by √v ≈ |noise|, turns into updates of
//! ±lr driven by rounding alone. Without it every parameter learns.

use super::init::Rng;
use super::layers::Linear;
use super::model::Model;
use super::spec::{check_sizes, set, ModelConfig, Sizes, StateDict, ZooEntry};
use crate::autograd::param::ParamStore;
use crate::autograd::{functions as f, Tape, Value};
use crate::io::SafeTensors;
use crate::tensor::{Engine, SpecError, TensorError};
use serde::Serialize;

#[derive(Clone)]
pub struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    fc1: Linear,
    fc2: Linear,
    head: Linear,
    seq_len: usize,
    dim: usize,
}

impl Attention {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        seq_len: usize,
        dim: usize,
        hidden: usize,
        classes: usize,
    ) -> Result<Attention, TensorError> {
        let q = Linear::new(engine, store, rng, "attn.q_proj", dim, dim)?;
        let k = Linear::without_bias(engine, store, rng, "attn.k_proj", dim, dim)?;
        let mut lin = |name: &str, i, o| Linear::new(engine, store, rng, name, i, o);
        Ok(Attention {
            q,
            k,
            v: lin("attn.v_proj", dim, dim)?,
            out: lin("attn.out_proj", dim, dim)?,
            fc1: lin("mlp.fc1", dim, hidden)?,
            fc2: lin("mlp.fc2", hidden, dim)?,
            head: lin("head", dim, classes)?,
            seq_len,
            dim,
        })
    }
}

impl Attention {
    /// softmax(q·kᵀ/√d)·v through the output projection, on tokens `[N·S, D]`.
    fn attend(
        &self,
        tape: &Tape,
        store: &ParamStore,
        tokens: &Value,
        n: usize,
        len: usize,
    ) -> Result<Value, TensorError> {
        let d = self.dim;
        let proj = |l: &Linear| -> Result<Value, TensorError> {
            let y = l.forward(tape, store, tokens)?;
            f::reshape(tape, &y, &[n, len, d])
        };
        let (q, k, v) = (proj(&self.q)?, proj(&self.k)?, proj(&self.v)?);
        let mut a = f::matmul(tape, &q, &k, false, true)?;
        drop((q, k));
        a = f::softmax(tape, &a, 1.0 / (d as f32).sqrt())?;
        let mut o = f::matmul(tape, &a, &v, false, false)?;
        drop((a, v));
        o = f::reshape(tape, &o, &[n * len, d])?;
        self.out.forward(tape, store, &o)
    }

    /// fc2(relu(fc1(h))).
    fn mlp(&self, tape: &Tape, store: &ParamStore, h: &Value) -> Result<Value, TensorError> {
        let mut m = self.fc1.forward(tape, store, h)?;
        m = f::relu(tape, &m)?;
        self.fc2.forward(tape, store, &m)
    }

    fn run(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
        checkpointed: bool,
    ) -> Result<Value, TensorError> {
        let s = x.tensor().shape().to_vec();
        if s.len() != 3 || s[2] != self.dim {
            return Err(TensorError::WrongShape {
                op: "attention",
                want: "input [N, S, D]",
                sizes: vec![("D", self.dim)],
                got: s,
            });
        }
        let (n, len, d) = (s[0], s[1], s[2]);
        let tokens = f::reshape(tape, x, &[n * len, d])?;
        let o = if checkpointed {
            let me = self.clone();
            f::checkpoint(tape, store, &tokens, move |t, st, v| {
                me.attend(t, st, v, n, len)
            })?
        } else {
            self.attend(tape, store, &tokens, n, len)?
        };
        let mut h = f::add(tape, &tokens, &o)?;
        drop((tokens, o));
        let m = if checkpointed {
            let me = self.clone();
            f::checkpoint(tape, store, &h, move |t, st, v| me.mlp(t, st, v))?
        } else {
            self.mlp(tape, store, &h)?
        };
        h = f::add(tape, &h, &m)?;
        drop(m);
        h = f::reshape(tape, &h, &[n, len, d])?;
        h = f::mean_dim(tape, &h, 1)?;
        self.head.forward(tape, store, &h)
    }
}

impl Model for Attention {
    fn input_shape(&self) -> Vec<usize> {
        vec![self.seq_len, self.dim]
    }

    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        self.run(tape, store, x, false)
    }

    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        self.run(tape, store, x, true)
    }
}

/// `attention`'s sizes: one self-attention block over `seq_len` tokens of
/// `dim` features, an MLP of `hidden`, a head of `classes`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttentionSpec {
    pub seq_len: usize,
    pub dim: usize,
    pub hidden: usize,
    pub classes: usize,
}

impl Default for AttentionSpec {
    fn default() -> AttentionSpec {
        AttentionSpec {
            seq_len: 128,
            dim: 64,
            hidden: 256,
            classes: 10,
        }
    }
}

pub const ENTRY: ZooEntry = ZooEntry {
    name: "attention",
    about: "self-attention block: Q/K/V projections, softmax(QKᵀ/√d)V, output projection, residual, MLP, residual, mean over tokens, head (--seq-len, --dim, --hidden)",
    default: || AttentionSpec::default().into(),
};

impl ModelConfig for AttentionSpec {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn describe(&self) -> String {
        let AttentionSpec {
            seq_len,
            dim,
            hidden,
            classes,
        } = self;
        format!("attention seq_len {seq_len}, dim {dim}, MLP hidden {hidden}, {classes} classes")
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![self.seq_len, self.dim]
    }

    fn flags(&self) -> &'static [&'static str] {
        &["seq-len", "dim", "hidden", "classes"]
    }

    fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError> {
        set(&mut self.seq_len, &sizes.seq_len);
        set(&mut self.dim, &sizes.dim);
        set(&mut self.hidden, &sizes.hidden);
        set(&mut self.classes, &sizes.classes);
        Ok(())
    }

    fn validate(&self) -> Result<(), SpecError> {
        let AttentionSpec {
            seq_len,
            dim,
            hidden,
            classes,
        } = *self;
        check_sizes(&[seq_len, dim, hidden, classes])?;
        if seq_len == 0 || dim == 0 || hidden == 0 || classes == 0 {
            return Err(SpecError::Zero {
                flags: "--seq-len, --dim, --hidden and --classes",
            });
        }
        if seq_len > crate::ops::LONGEST_REDUCED_ROW {
            return Err(SpecError::RowTooLong {
                flag: "seq-len",
                value: seq_len,
                kernel: "the attention softmax",
                max: crate::ops::LONGEST_REDUCED_ROW,
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
        let s = self;
        let m = Attention::new(engine, store, rng, s.seq_len, s.dim, s.hidden, s.classes)?;
        Ok(Box::new(m))
    }

    fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError> {
        let sd = StateDict(st);
        self.dim = sd.rows("attn.q_proj.weight")?;
        self.hidden = sd.rows("mlp.fc1.weight")?;
        self.classes = sd.rows("head.weight")?;
        Ok(())
    }

    fn adapt_to_input(&mut self, x_shape: &[usize]) {
        if let [_, s, _] = x_shape {
            self.seq_len = *s;
        }
    }
}
