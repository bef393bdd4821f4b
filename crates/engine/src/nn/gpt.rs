//! `gpt`: the GPT-2 architecture (nanoGPT's layout) over token ids:
//!   h = wte[idx] + wpe[0..S]
//!   per block i:  h = h + attn.c_proj(causal_attention(ln_1(h)))
//!                 h = h + mlp.c_proj(gelu(mlp.c_fc(ln_2(h))))
//!   logits = ln_f(h) · wteᵀ          (the head is tied to the embedding)
//! with `heads` heads of `dim / heads` features, GELU's tanh form, LayerNorm
//! eps 1e-5, and GPT-2's initialisation (normal, std 0.02; LayerNorm 1 and 0).
//! Logits are `[N·S, vocab]`, one row per position, against next-token labels.
//!
//! Dropout (probability `dropout`, 0 by default as in nanoGPT) follows the
//! embedding, the attention probabilities and both residual branches, as in
//! GPT-2, each keeping a one-byte mask (CUDA's native_dropout).
//!
//! One difference from GPT-2's modules changes no byte of memory: the query,
//! key and value projections are three `D → D` linears instead of one fused
//! `D → 3D` (the same parameters, split three ways; each saves the same input
//! tensor).

use super::init::Rng;
use super::layers::{in_layer, Linear};
use super::model::Model;
use super::spec::{check_sizes, set, ModelConfig, Sizes, StateDict, ZooEntry};
use crate::autograd::param::{ParamId, ParamStore};
use crate::autograd::{functions as f, transformer as t, Tape, Value};
use crate::io::SafeTensors;
use crate::memory::Category;
use crate::tensor::{DType, Engine, SpecError, Tensor, TensorError};
use serde::Serialize;

/// The most transformer blocks a GPT is built with: a thousand times
/// GPT-3's 96, far past any model that trains, and each block costs host
/// memory before a tensor exists.
pub const MAX_LAYERS: usize = 100_000;
use std::sync::Arc;

/// LayerNorm's epsilon (PyTorch's default, GPT-2's).
pub const LN_EPS: f32 = 1e-5;

/// GPT-2's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GptConfig {
    pub layers: usize,
    pub heads: usize,
    pub dim: usize,
    /// Positions in the table (the longest sequence the model takes).
    pub seq_len: usize,
    pub vocab: usize,
}

/// The GPT-2 family, and a small character-level default.
pub const PRESETS: [(&str, GptConfig); 8] = [
    (
        "tiny",
        GptConfig {
            layers: 2,
            heads: 4,
            dim: 64,
            seq_len: 64,
            vocab: 96,
        },
    ),
    (
        "gpt2",
        GptConfig {
            layers: 12,
            heads: 12,
            dim: 768,
            seq_len: 1024,
            vocab: 50257,
        },
    ),
    (
        "gpt2-medium",
        GptConfig {
            layers: 24,
            heads: 16,
            dim: 1024,
            seq_len: 1024,
            vocab: 50257,
        },
    ),
    (
        "gpt2-large",
        GptConfig {
            layers: 36,
            heads: 20,
            dim: 1280,
            seq_len: 1024,
            vocab: 50257,
        },
    ),
    (
        "gpt2-xl",
        GptConfig {
            layers: 48,
            heads: 25,
            dim: 1600,
            seq_len: 1024,
            vocab: 50257,
        },
    ),
    // LLaMA-7B's depth and width on GPT-2's block (about 6.7B parameters).
    (
        "7b",
        GptConfig {
            layers: 32,
            heads: 32,
            dim: 4096,
            seq_len: 2048,
            vocab: 50257,
        },
    ),
    // LLaMA-2-70B's depth, width and context on GPT-2's block (about 64.9B
    // parameters: GPT-2's MLP is 4h wide where LLaMA's gated one is 3.5h).
    (
        "70b",
        GptConfig {
            layers: 80,
            heads: 64,
            dim: 8192,
            seq_len: 4096,
            vocab: 50257,
        },
    ),
    // GPT-3 175B (Brown et al. 2020, table 2.1).
    (
        "175b",
        GptConfig {
            layers: 96,
            heads: 96,
            dim: 12288,
            seq_len: 2048,
            vocab: 50257,
        },
    ),
];

impl GptConfig {
    pub fn preset(name: &str) -> Result<GptConfig, SpecError> {
        PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| *c)
            .ok_or_else(|| SpecError::UnknownPreset {
                name: name.to_string(),
                known: PRESETS.iter().map(|p| p.0).collect(),
            })
    }
}

/// `nn.LayerNorm(d)`.
#[derive(Debug, Clone)]
struct LayerNorm {
    name: Arc<str>,
    weight: ParamId,
    bias: ParamId,
}

#[derive(Debug, Clone)]
struct Block {
    ln_1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    c_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
}

#[derive(Debug, Clone)]
pub struct Gpt {
    cfg: GptConfig,
    dropout: f32,
    /// Seeds this forward's dropout masks; advanced once per forward, and
    /// copied into a checkpointed block's closure, so recomputation draws
    /// the same masks.
    seed: std::cell::Cell<u64>,
    /// Positions per sample this instance trains on (≤ cfg.seq_len).
    seq: usize,
    wte: ParamId,
    wpe: ParamId,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

fn init(
    engine: &Engine,
    store: &mut ParamStore,
    name: String,
    shape: &[usize],
    values: impl FnMut(usize) -> Vec<f32>,
) -> Result<ParamId, TensorError> {
    let _scope = engine.scope(Category::Parameter, "init");
    let t = Tensor::generated(engine, shape, DType::F32, &name, values)?;
    Ok(store.add(&name, t))
}

fn normal(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.normal(n).into_iter().map(|v| 0.02 * v).collect()
}

impl Gpt {
    /// A GPT of `cfg` that runs on sequences of `seq` tokens.
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        cfg: GptConfig,
        seq: usize,
        dropout: f32,
    ) -> Result<Gpt, TensorError> {
        if cfg.heads == 0 || !cfg.dim.is_multiple_of(cfg.heads) {
            return Err(crate::tensor::ConfigError::NotDivisible {
                what: "dim",
                value: cfg.dim,
                by_what: "heads",
                by: cfg.heads,
            }
            .into());
        }
        if seq == 0 || seq > cfg.seq_len {
            return Err(TensorError::OutOfRange {
                op: "gpt",
                what: "the sequence length",
                value: seq,
                min: 1,
                max: cfg.seq_len,
                hint: "",
            });
        }
        let d = cfg.dim;
        let wte = init(engine, store, "wte.weight".into(), &[cfg.vocab, d], |n| {
            normal(rng, n)
        })?;
        let wpe = init(engine, store, "wpe.weight".into(), &[cfg.seq_len, d], |n| {
            normal(rng, n)
        })?;
        let ln = |store: &mut ParamStore, name: String| -> Result<LayerNorm, TensorError> {
            Ok(LayerNorm {
                weight: init(engine, store, format!("{name}.weight"), &[d], |n| {
                    vec![1.0; n]
                })?,
                bias: init(engine, store, format!("{name}.bias"), &[d], |n| {
                    vec![0.0; n]
                })?,
                name: Arc::from(name.as_str()),
            })
        };
        let mut blocks = Vec::with_capacity(cfg.layers);
        for b in 0..cfg.layers {
            let ln_1 = ln(store, format!("h.{b}.ln_1"))?;
            // GPT-2's initialisation: normal(0, 0.02) weights, zero biases.
            let mut lin = |store: &mut ParamStore, n: &str, i: usize, o: usize| {
                let name = format!("h.{b}.{n}");
                let weight = init(engine, store, format!("{name}.weight"), &[o, i], |c| {
                    normal(rng, c)
                })?;
                let bias = init(engine, store, format!("{name}.bias"), &[o], |c| {
                    vec![0.0; c]
                })?;
                Ok::<Linear, TensorError>(Linear {
                    name: Arc::from(name.as_str()),
                    weight,
                    bias: Some(bias),
                })
            };
            let q = lin(store, "attn.q_proj", d, d)?;
            let k = lin(store, "attn.k_proj", d, d)?;
            let v = lin(store, "attn.v_proj", d, d)?;
            let c_proj = lin(store, "attn.c_proj", d, d)?;
            let ln_2 = ln(store, format!("h.{b}.ln_2"))?;
            let c_fc = lin(store, "mlp.c_fc", d, 4 * d)?;
            let mlp_proj = lin(store, "mlp.c_proj", 4 * d, d)?;
            blocks.push(Block {
                ln_1,
                q,
                k,
                v,
                c_proj,
                ln_2,
                c_fc,
                mlp_proj,
            });
        }
        let ln_f = ln(store, "ln_f".into())?;
        let seed = std::cell::Cell::new(rng.below(u64::MAX));
        Ok(Gpt {
            cfg,
            dropout,
            seed,
            seq,
            wte,
            wpe,
            blocks,
            ln_f,
        })
    }

    fn norm(
        &self,
        tape: &Tape,
        store: &ParamStore,
        l: &LayerNorm,
        x: &Value,
    ) -> Result<Value, TensorError> {
        in_layer(x, &l.name, || {
            let (w, b) = (tape.param(store, l.weight), tape.param(store, l.bias));
            t::layernorm(tape, x, &w, &b, LN_EPS)
        })
    }

    /// Causal multi-head self-attention over tokens `[N·S, D]`.
    fn attention(
        &self,
        tape: &Tape,
        store: &ParamStore,
        blk: &Block,
        blk_index: usize,
        x: &Value,
        n: usize,
    ) -> Result<Value, TensorError> {
        let (s, d, h) = (self.seq, self.cfg.dim, self.cfg.heads);
        let hd = d / h;
        // [N·S, D] → [N, S, H, hd] → [N, H, S, hd] → [N·H, S, hd]
        let heads = |l: &Linear, label| -> Result<Value, TensorError> {
            let y = l.forward(tape, store, x)?;
            let y = f::reshape(tape, &y, &[n, s, h, hd])?;
            let y = t::swap_axes(tape, &y, label)?;
            f::reshape(tape, &y, &[n * h, s, hd])
        };
        let q = heads(&blk.q, "attn.q_heads")?;
        let k = heads(&blk.k, "attn.k_heads")?;
        let mut a = f::matmul(tape, &q, &k, false, true)?;
        drop((q, k));
        a = t::softmax_causal(tape, &a, 1.0 / (hd as f32).sqrt())?;
        a = t::dropout(tape, &a, self.dropout, self.site(blk_index, 0))?;
        let v = heads(&blk.v, "attn.v_heads")?;
        let mut y = f::matmul(tape, &a, &v, false, false)?;
        drop((a, v));
        y = f::reshape(tape, &y, &[n, h, s, hd])?;
        y = t::swap_axes(tape, &y, "attn.merged")?;
        y = f::reshape(tape, &y, &[n * s, d])?;
        y = blk.c_proj.forward(tape, store, &y)?;
        t::dropout(tape, &y, self.dropout, self.site(blk_index, 1))
    }

    /// The seed of dropout site `k` of block `b` in this forward.
    fn site(&self, b: usize, k: u64) -> u64 {
        let x = self.seed.get() ^ ((b as u64 + 1) << 8 | k);
        x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
    }

    fn block(
        &self,
        tape: &Tape,
        store: &ParamStore,
        blk: &Block,
        blk_index: usize,
        x: &Value,
        n: usize,
    ) -> Result<Value, TensorError> {
        let a = self.norm(tape, store, &blk.ln_1, x)?;
        let a = self.attention(tape, store, blk, blk_index, &a, n)?;
        let h = f::add(tape, x, &a)?;
        drop(a);
        let mut m = self.norm(tape, store, &blk.ln_2, &h)?;
        m = blk.c_fc.forward(tape, store, &m)?;
        m = t::gelu(tape, &m)?;
        m = blk.mlp_proj.forward(tape, store, &m)?;
        m = t::dropout(tape, &m, self.dropout, self.site(blk_index, 2))?;
        f::add(tape, &h, &m)
    }

    fn run(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
        checkpointed: bool,
    ) -> Result<Value, TensorError> {
        let h = self.run_to_head(tape, store, x, checkpointed)?;
        // The tied head: logits = h · wteᵀ.
        let head: Arc<str> = Arc::from("lm_head");
        in_layer(&h, &head, || {
            f::linear(tape, &h, &tape.param(store, self.wte), None)
        })
    }

    /// Everything up to the head: ln_f's output `[N·S, D]`.
    fn run_to_head(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
        checkpointed: bool,
    ) -> Result<Value, TensorError> {
        let shape = x.tensor().shape().to_vec();
        if shape.len() != 2 || shape[1] != self.seq {
            return Err(TensorError::WrongShape {
                op: "gpt",
                want: "token ids [N, S]",
                sizes: vec![("S", self.seq)],
                got: shape,
            });
        }
        let (n, s, d) = (shape[0], self.seq, self.cfg.dim);
        // New dropout masks for each forward (a recomputation inside
        // backward runs blocks, not `run`, and keeps these).
        if tape.grad_enabled() && self.dropout > 0.0 {
            self.seed
                .set(self.seed.get().wrapping_add(0x9E37_79B9_7F4A_7C15));
        }
        let idx = x.tensor().reshape(&[n * s])?;
        // Rows named as nanoGPT's modules (`wte`, `wpe`), which own the two
        // tables, so per-layer tables and tags say whose memory it is.
        let wte = tape.param(store, self.wte);
        let mut h = in_layer(x, &Arc::from("wte"), || t::embedding(tape, &wte, &idx))?;
        h = f::reshape(tape, &h, &[n, s, d])?;
        let wpe = tape.param(store, self.wpe);
        h = in_layer(&h, &Arc::from("wpe"), || t::add_positions(tape, &h, &wpe))?;
        h = f::reshape(tape, &h, &[n * s, d])?;
        h = t::dropout(tape, &h, self.dropout, self.site(self.blocks.len(), 0))?;
        for (i, blk) in self.blocks.iter().enumerate() {
            // Everything a block allocates is tagged `h.<i>.forward` (its
            // layers nest inside as `h.<i>.ln_1.forward`, …), so per-layer
            // reports and the saved-bytes count attribute it to the block.
            let engine = h.tensor().engine().clone();
            let _block = engine.op_scope(&format!("h.{i}.forward"));
            h = if checkpointed {
                let (me, blk) = (self.clone(), blk.clone());
                f::checkpoint(tape, store, &h, move |t, st, v| {
                    me.block(t, st, &blk, i, v, n)
                })?
            } else {
                self.block(tape, store, blk, i, &h, n)?
            };
            // A row for the block's own ops (head copies, scores, softmax,
            // GELU, residual adds) beside its layers' rows.
            engine.note_layer_output(&Arc::from(format!("h.{i}")), h.tensor().shape());
        }
        self.norm(tape, store, &self.ln_f, &h)
    }
}

impl Model for Gpt {
    fn input_shape(&self) -> Vec<usize> {
        vec![self.seq]
    }

    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        self.run(tape, store, x, false)
    }

    /// Each block checkpointed.
    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        self.run(tape, store, x, true)
    }

    /// ln_f's output and the tied head's weight (the embedding table).
    fn forward_head_input(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
        checkpointed: bool,
    ) -> Result<Option<(Value, Value)>, TensorError> {
        let h = self.run_to_head(tape, store, x, checkpointed)?;
        Ok(Some((h, tape.param(store, self.wte))))
    }
}

/// `gpt`'s sizes: GPT-2's architecture of `config`, trained on sequences of
/// `seq` tokens (at most the `config.seq_len` positions of its table).
/// `dropout` is the drop probability of every dropout (embedding, attention
/// weights, both residual branches), 0 by default as in nanoGPT; GPT-2
/// trained with 0.1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GptSpec {
    pub config: GptConfig,
    pub seq: usize,
    pub dropout: f32,
}

impl GptSpec {
    /// A preset's sizes on sequences of all its positions, no dropout.
    pub fn preset(name: &str) -> Result<GptSpec, SpecError> {
        let config = GptConfig::preset(name)?;
        Ok(GptSpec {
            config,
            seq: config.seq_len,
            dropout: 0.0,
        })
    }
}

pub const ENTRY: ZooEntry = ZooEntry {
    name: "gpt",
    about: "GPT-2: token + position embedding, pre-LN blocks (causal multi-head attention, GELU MLP), tied head, next-token loss (--preset tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl|7b|70b|175b; --layers --heads --dim --seq-len --vocab)",
    default: || PRESETS[0].1.into(),
};

impl From<GptConfig> for crate::nn::ModelSpec {
    fn from(config: GptConfig) -> Self {
        GptSpec {
            config,
            seq: config.seq_len,
            dropout: 0.0,
        }
        .into()
    }
}

impl ModelConfig for GptSpec {
    fn name(&self) -> &'static str {
        "gpt"
    }

    fn describe(&self) -> String {
        let c = &self.config;
        format!(
            "gpt {} layers, {} heads, dim {}, vocab {}, {} positions, sequences of {}{}",
            c.layers,
            c.heads,
            c.dim,
            c.vocab,
            c.seq_len,
            self.seq,
            if self.dropout > 0.0 {
                format!(", dropout {}", self.dropout)
            } else {
                String::new()
            }
        )
    }

    fn classes(&self) -> usize {
        self.config.vocab
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![self.seq]
    }

    fn flags(&self) -> &'static [&'static str] {
        &[
            "preset", "layers", "heads", "dim", "vocab", "seq-len", "dropout",
        ]
    }

    fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError> {
        set(&mut self.dropout, &sizes.dropout);
        if let Some(p) = &sizes.preset {
            self.config = GptConfig::preset(p)?;
            self.seq = self.config.seq_len;
        }
        let c = &mut self.config;
        set(&mut c.layers, &sizes.layers);
        set(&mut c.heads, &sizes.heads);
        set(&mut c.dim, &sizes.dim);
        set(&mut c.vocab, &sizes.vocab);
        if let Some(s) = sizes.seq_len {
            self.seq = s;
            c.seq_len = c.seq_len.max(s);
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), SpecError> {
        let (c, seq, dropout) = (&self.config, self.seq, self.dropout);
        // Checked before anything is built: the model holds a few hundred
        // host bytes a layer, so 10^8 layers would abort on the host.
        if c.layers > MAX_LAYERS {
            return Err(SpecError::TooManyLayers {
                layers: c.layers,
                max: MAX_LAYERS,
            });
        }
        check_sizes(&[c.layers, c.heads, c.dim, c.seq_len, c.vocab, seq, 4 * c.dim])?;
        // The first rule broken, named by its flag and value.
        let max = crate::ops::LONGEST_REDUCED_ROW;
        let zero = |flags| Err(SpecError::Zero { flags });
        if c.layers == 0 {
            return zero("--layers");
        }
        if c.heads == 0 {
            return zero("--heads");
        }
        if c.vocab == 0 {
            return zero("--vocab");
        }
        if c.dim == 0 {
            return zero("--dim");
        }
        if !c.dim.is_multiple_of(c.heads) {
            return Err(SpecError::HeadsDoNotDivide {
                dim: c.dim,
                heads: c.heads,
            });
        }
        if !(0.0..1.0).contains(&dropout) {
            return Err(SpecError::Dropout(dropout));
        }
        if seq == 0 {
            return zero("--seq-len");
        }
        if seq > c.seq_len {
            return Err(SpecError::PastPositions {
                seq,
                positions: c.seq_len,
            });
        }
        // The softmax and LayerNorm rows' longest (ops::LONGEST_REDUCED_ROW).
        let rows = |flag, value, kernel| SpecError::RowTooLong {
            flag,
            value,
            kernel,
            max,
        };
        if seq > max {
            return Err(rows("seq-len", seq, "the causal softmax"));
        }
        if c.dim > max {
            return Err(rows("dim", c.dim, "LayerNorm"));
        }
        Ok(())
    }

    fn build(
        &self,
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
    ) -> Result<Box<dyn Model>, TensorError> {
        let m = Gpt::new(engine, store, rng, self.config, self.seq, self.dropout)?;
        Ok(Box::new(m))
    }

    fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError> {
        let sd = StateDict(st);
        let wte = sd.shape("wte.weight")?;
        let wpe = sd.shape("wpe.weight")?;
        if wte.len() != 2 || wpe.len() != 2 {
            return Err(SpecError::WeightRank {
                origin: sd.origin().to_string(),
                names: "wte.weight and wpe.weight",
                want: "[rows, dim]",
            });
        }
        let c = &mut self.config;
        c.vocab = wte[0];
        c.dim = wte[1];
        c.seq_len = wpe[0];
        c.layers = sd.count(|i| format!("h.{i}.ln_1.weight"));
        // Heads are in no shape: PyTorch-written weights carry them as
        // metadata (scripts/gpt_reference.py), else --heads.
        if let Some(h) = st.metadata.get("heads") {
            c.heads = h.parse().map_err(|_| SpecError::MetadataNotANumber {
                origin: sd.origin().to_string(),
                key: "heads",
                value: h.clone(),
            })?;
        }
        self.seq = self.seq.min(c.seq_len);
        Ok(())
    }

    /// Sequences of the batch's length, with as many positions as they
    /// need (a loaded table of fewer is then refused by its shape).
    fn adapt_to_input(&mut self, x_shape: &[usize]) {
        if let [_, s] = x_shape {
            self.seq = *s;
            self.config.seq_len = self.config.seq_len.max(*s);
        }
    }

    fn f32_only_kernels(&self) -> Option<&'static str> {
        Some("LayerNorm, GELU and embedding")
    }

    fn vocab(&self) -> Option<usize> {
        Some(self.config.vocab)
    }

    /// The head is the embedding's transpose, tied.
    fn bias_free_head(&self) -> bool {
        true
    }

    fn tied_parameters(&self) -> &'static [(&'static str, &'static str)] {
        &[("lm_head", "wte.weight")]
    }
}
