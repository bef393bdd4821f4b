//! What every zoo model is to the training loop, and the zoo itself: names,
//! configurations (with defaults), building one, and recovering a
//! configuration from a PyTorch state_dict's shapes so that
//! `train --load W.safetensors` needs no size flags.

use super::attention::Attention;
use super::gpt::{Gpt, GptConfig};
use super::init::Rng;
use super::mlp::Mlp;
use super::resnet::Resnet;
use super::resnet_mini::ResnetMini;
use super::simple_cnn::SimpleConvNet;
use crate::autograd::param::ParamStore;
use crate::autograd::{Tape, Value};
use crate::io::SafeTensors;
use crate::tensor::{Engine, TensorError};
use serde::Serialize;

/// A model: parameters live in a [`ParamStore`], the model holds their ids.
pub trait Model {
    /// Shape of one sample (the batch axis is prepended).
    fn input_shape(&self) -> Vec<usize>;
    /// Logits `[N, classes]` for `x` `[N, ..input_shape]`.
    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError>;
    /// The same logits with the model's natural segments checkpointed
    /// (`torch.utils.checkpoint`): mlp runs of √L layers, simple-cnn's
    /// convolutional features, each residual block, each attention sublayer.
    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError>;
    /// The head's input `[N, D]` and its weight `[classes, D]` instead of
    /// the logits, for a loss that runs the head itself (`--loss chunked`);
    /// `None` for a model whose head is not a bias-free linear map.
    fn forward_head_input(
        &self,
        _tape: &Tape,
        _store: &ParamStore,
        _x: &Value,
        _checkpointed: bool,
    ) -> Result<Option<(Value, Value)>, TensorError> {
        Ok(None)
    }
}

/// Each zoo model with its size knobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "model", rename_all = "kebab-case")]
pub enum ModelSpec {
    /// Linear layers of the given widths (input first, classes last), ReLU
    /// between; `checkpoint_every` > 0 checkpoints runs of that many layers.
    Mlp {
        widths: Vec<usize>,
        checkpoint_every: usize,
    },
    /// The documents' SimpleConvNet; fixed size.
    SimpleCnn,
    /// Residual blocks after a 3×3 stem; block 0 keeps `width` channels, each
    /// later block doubles them with stride 2 and a 1×1 stride-2 shortcut.
    ResnetMini {
        width: usize,
        depth: usize,
        resolution: usize,
        classes: usize,
    },
    /// One self-attention block over `seq_len` tokens of `dim` features.
    Attention {
        seq_len: usize,
        dim: usize,
        hidden: usize,
        classes: usize,
    },
    /// GPT-2's architecture (see `nn::gpt`) trained on sequences of `seq`
    /// tokens (at most the `config.seq_len` positions of its table).
    /// `dropout` is the drop probability of every dropout (embedding,
    /// attention weights, both residual branches), 0 by default as in
    /// nanoGPT; GPT-2 trained with 0.1.
    Gpt {
        config: GptConfig,
        seq: usize,
        dropout: f32,
    },
    /// torchvision's ResNet-50 / 101 / 152 (see `nn::resnet`); `width` 64
    /// is torchvision's, smaller ones scale every stage down.
    Resnet50 {
        depth: usize,
        width: usize,
        resolution: usize,
        classes: usize,
    },
}

/// The zoo: command-line name and what it is.
pub const ZOO: [(&str, &str); 6] = [
    (
        "mlp",
        "linear layers with ReLU between (--widths 784,256,256,10; --checkpoint-every K)",
    ),
    (
        "simple-cnn",
        "the documents' SimpleConvNet: conv 3→64 k3, ReLU, conv 64→128 k3, ReLU, fc 100,352→10 (128·28·28; the article wrote 25,088) on 3×32×32",
    ),
    (
        "resnet-mini",
        "3×3 stem, residual blocks (identity or 1×1 stride-2 shortcut), global average pool, linear head (--width, --depth, --resolution)",
    ),
    (
        "attention",
        "self-attention block: Q/K/V projections, softmax(QKᵀ/√d)V, output projection, residual, MLP, residual, mean over tokens, head (--seq-len, --dim, --hidden)",
    ),
    (
        "gpt",
        "GPT-2: token + position embedding, pre-LN blocks (causal multi-head attention, GELU MLP), tied head, next-token loss (--preset tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl|7b|175b; --layers --heads --dim --seq-len --vocab)",
    ),
    (
        "resnet50",
        "torchvision's ResNet-50: 7×7/2 stem, BatchNorm, 3×3/2 max pool, bottleneck stages [3, 4, 6, 3], global average pool, fc (--depth 50|101|152, --width 64, --resolution 224, --classes 1000)",
    ),
];

/// The largest size of one model dimension (widths, channels, sequence
/// length, classes): 2^31.
pub const MAX_MODEL_SIZE: usize = 1 << 31;

impl ModelSpec {
    /// The zoo model called `name` with default sizes.
    pub fn default_for(name: &str) -> Result<ModelSpec, String> {
        Ok(match name {
            "mlp" => ModelSpec::Mlp {
                widths: vec![784, 256, 256, 10],
                checkpoint_every: 0,
            },
            "simple-cnn" => ModelSpec::SimpleCnn,
            "resnet-mini" => ModelSpec::ResnetMini {
                width: 16,
                depth: 3,
                resolution: 32,
                classes: 10,
            },
            "attention" => ModelSpec::Attention {
                seq_len: 128,
                dim: 64,
                hidden: 256,
                classes: 10,
            },
            "resnet50" => ModelSpec::Resnet50 {
                depth: 50,
                width: 64,
                resolution: 224,
                classes: 1000,
            },
            "gpt" => {
                let config = GptConfig::preset("tiny")?;
                ModelSpec::Gpt {
                    config,
                    seq: config.seq_len,
                    dropout: 0.0,
                }
            }
            other => {
                let names: Vec<&str> = ZOO.iter().map(|z| z.0).collect();
                return Err(format!(
                    "unknown model {other:?}; the zoo has: {} (see `vramlab models`)",
                    names.join(", ")
                ));
            }
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            ModelSpec::Mlp { .. } => "mlp",
            ModelSpec::SimpleCnn => "simple-cnn",
            ModelSpec::ResnetMini { .. } => "resnet-mini",
            ModelSpec::Attention { .. } => "attention",
            ModelSpec::Gpt { .. } => "gpt",
            ModelSpec::Resnet50 { .. } => "resnet50",
        }
    }

    /// Whether the model can be made 16-bit (`model.half()`): gpt's
    /// LayerNorm, GELU and embedding kernels and resnet50's BatchNorm and
    /// max-pool kernels are f32 only (they run under `--amp` instead).
    pub fn supports_16bit_model(&self) -> bool {
        !matches!(self, ModelSpec::Gpt { .. } | ModelSpec::Resnet50 { .. })
    }

    /// Refuses a 16-bit model dtype for a model whose kernels are f32 only,
    /// saying what to use instead.
    pub fn check_dtype(&self, dtype: crate::tensor::DType) -> Result<(), String> {
        if dtype == crate::tensor::DType::F32 || self.supports_16bit_model() {
            return Ok(());
        }
        Err(format!(
            "{} runs in f32 (its LayerNorm, GELU, embedding, BatchNorm and max-pool kernels are f32 only); for 16-bit compute use --amp f16 or --amp bf16 instead of --dtype {dtype}",
            self.name()
        ))
    }

    /// Number of parameters (elements), from the shapes alone.
    pub fn parameter_count(&self) -> usize {
        self.parameter_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// Number of output classes.
    pub fn classes(&self) -> usize {
        match self {
            ModelSpec::Mlp { widths, .. } => widths.last().copied().unwrap_or(0),
            ModelSpec::SimpleCnn => super::simple_cnn::CLASSES,
            ModelSpec::ResnetMini { classes, .. } | ModelSpec::Attention { classes, .. } => {
                *classes
            }
            ModelSpec::Gpt { config, .. } => config.vocab,
            ModelSpec::Resnet50 { classes, .. } => *classes,
        }
    }

    /// Shape of one sample.
    pub fn input_shape(&self) -> Vec<usize> {
        match self {
            ModelSpec::Mlp { widths, .. } => vec![widths[0]],
            ModelSpec::SimpleCnn => super::simple_cnn::INPUT.to_vec(),
            ModelSpec::ResnetMini { resolution, .. } => vec![3, *resolution, *resolution],
            ModelSpec::Attention { seq_len, dim, .. } => vec![*seq_len, *dim],
            ModelSpec::Gpt { seq, .. } => vec![*seq],
            ModelSpec::Resnet50 { resolution, .. } => vec![3, *resolution, *resolution],
        }
    }

    /// Every parameter's state_dict name and shape, in registration order,
    /// without building anything (what `models` lists and estimates count).
    /// A test checks it against the built models.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        let lin = |out: &mut Vec<(String, Vec<usize>)>, p: &str, i: usize, o: usize| {
            out.push((format!("{p}.weight"), vec![o, i]));
            out.push((format!("{p}.bias"), vec![o]));
        };
        let conv = |out: &mut Vec<(String, Vec<usize>)>, p: &str, i: usize, o: usize, k: usize| {
            out.push((format!("{p}.weight"), vec![o, i, k, k]));
            out.push((format!("{p}.bias"), vec![o]));
        };
        match self {
            ModelSpec::Mlp { widths, .. } => {
                for (i, w) in widths.windows(2).enumerate() {
                    lin(&mut out, &format!("layers.{i}"), w[0], w[1]);
                }
            }
            ModelSpec::SimpleCnn => {
                conv(&mut out, "conv1", 3, 64, 3);
                conv(&mut out, "conv2", 64, 128, 3);
                lin(&mut out, "fc", 128 * 28 * 28, super::simple_cnn::CLASSES);
            }
            ModelSpec::ResnetMini {
                width,
                depth,
                classes,
                ..
            } => {
                conv(&mut out, "stem", 3, *width, 3);
                let mut ch = *width;
                for i in 0..*depth {
                    let o = if i == 0 { ch } else { ch * 2 };
                    conv(&mut out, &format!("blocks.{i}.conv1"), ch, o, 3);
                    conv(&mut out, &format!("blocks.{i}.conv2"), o, o, 3);
                    if i > 0 {
                        conv(&mut out, &format!("blocks.{i}.shortcut"), ch, o, 1);
                    }
                    ch = o;
                }
                lin(&mut out, "fc", ch, *classes);
            }
            ModelSpec::Attention {
                dim,
                hidden,
                classes,
                ..
            } => {
                lin(&mut out, "attn.q_proj", *dim, *dim);
                out.push(("attn.k_proj.weight".into(), vec![*dim, *dim]));
                lin(&mut out, "attn.v_proj", *dim, *dim);
                lin(&mut out, "attn.out_proj", *dim, *dim);
                lin(&mut out, "mlp.fc1", *dim, *hidden);
                lin(&mut out, "mlp.fc2", *hidden, *dim);
                lin(&mut out, "head", *dim, *classes);
            }
            ModelSpec::Gpt { config, .. } => out = config.parameter_shapes(),
            ModelSpec::Resnet50 {
                depth,
                width,
                classes,
                ..
            } => out = super::resnet::parameter_shapes(*depth, *width, *classes),
        }
        out
    }

    /// A one-line description of the sizes.
    pub fn describe(&self) -> String {
        match self {
            ModelSpec::Mlp {
                widths,
                checkpoint_every,
            } => {
                let w: Vec<String> = widths.iter().map(|w| w.to_string()).collect();
                let ck = if *checkpoint_every > 0 {
                    format!(", checkpoint every {checkpoint_every} layers")
                } else {
                    String::new()
                };
                format!("mlp widths {}{ck}", w.join("→"))
            }
            ModelSpec::SimpleCnn => "simple-cnn (3×32×32 → 10)".into(),
            ModelSpec::ResnetMini {
                width,
                depth,
                resolution,
                classes,
            } => format!(
                "resnet-mini width {width}, {depth} blocks, {resolution}×{resolution} input, {classes} classes"
            ),
            ModelSpec::Attention {
                seq_len,
                dim,
                hidden,
                classes,
            } => format!(
                "attention seq_len {seq_len}, dim {dim}, MLP hidden {hidden}, {classes} classes"
            ),
            ModelSpec::Gpt {
                config: c,
                seq,
                dropout,
            } => format!(
                "gpt {} layers, {} heads, dim {}, vocab {}, {} positions, sequences of {seq}{}",
                c.layers,
                c.heads,
                c.dim,
                c.vocab,
                c.seq_len,
                if *dropout > 0.0 {
                    format!(", dropout {dropout}")
                } else {
                    String::new()
                }
            ),
            ModelSpec::Resnet50 {
                depth,
                width,
                resolution,
                classes,
            } => format!(
                "resnet{depth} width {width}, {resolution}×{resolution} input, {classes} classes"
            ),
        }
    }

    /// Checks the sizes make a model.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |m: &str| Err(format!("{}: {m}", self.name()));
        // Every size at most 2^31, so a product of two fits any count and
        // larger products are checked where shapes are made.
        let sizes: Vec<usize> = match self {
            ModelSpec::Mlp { widths, .. } => widths.clone(),
            ModelSpec::SimpleCnn => Vec::new(),
            ModelSpec::ResnetMini {
                width,
                resolution,
                classes,
                ..
            } => vec![*width, *resolution, *classes],
            ModelSpec::Attention {
                seq_len,
                dim,
                hidden,
                classes,
            } => vec![*seq_len, *dim, *hidden, *classes],
            ModelSpec::Gpt { config: c, seq, .. } => {
                vec![
                    c.layers,
                    c.heads,
                    c.dim,
                    c.seq_len,
                    c.vocab,
                    *seq,
                    4 * c.dim,
                ]
            }
            // The widest stage has 32·width channels (8·width planes × 4).
            ModelSpec::Resnet50 {
                width,
                resolution,
                classes,
                ..
            } => vec![width.saturating_mul(32), *resolution, *classes],
        };
        if let Some(s) = sizes.iter().find(|&&s| s > MAX_MODEL_SIZE) {
            return bad(&format!(
                "a size of {s} is more than the {MAX_MODEL_SIZE} vramlab accepts for one dimension"
            ));
        }
        if let ModelSpec::ResnetMini { width, depth, .. } = self {
            // Channels double per block after the first: width · 2^(depth−1).
            let widest = u32::try_from(depth.saturating_sub(1))
                .ok()
                .and_then(|d| 1usize.checked_shl(d))
                .and_then(|f| f.checked_mul(*width));
            if widest.is_none_or(|c| c > MAX_MODEL_SIZE) {
                return bad(&format!(
                    "--width {width} doubled over --depth {depth} blocks is more than {MAX_MODEL_SIZE} channels"
                ));
            }
        }
        match self {
            ModelSpec::Mlp { widths, .. } if widths.len() < 2 || widths.contains(&0) => {
                bad("--widths needs at least two positive widths (input, …, classes)")
            }
            ModelSpec::ResnetMini {
                width,
                depth,
                resolution,
                classes,
            } if *width == 0
                || *depth == 0
                || *classes == 0
                || u32::try_from(*depth)
                    .ok()
                    .and_then(|d| 1usize.checked_shl(d))
                    .is_none_or(|need| *resolution < need) =>
            {
                bad(&format!(
                    "needs width, depth and classes ≥ 1 and a resolution of at least 2^depth = {}",
                    1usize << depth.min(&30)
                ))
            }
            ModelSpec::Attention {
                seq_len,
                dim,
                hidden,
                classes,
            } if *seq_len == 0 || *dim == 0 || *hidden == 0 || *classes == 0 => {
                bad("--seq-len, --dim, --hidden and --classes must be at least 1")
            }
            ModelSpec::Attention { seq_len, .. } if *seq_len > crate::ops::MAX_LOOP_ITERATIONS => {
                bad(&format!(
                    "--seq-len {seq_len}: the attention softmax takes rows of at most {}",
                    crate::ops::MAX_LOOP_ITERATIONS
                ))
            }
            ModelSpec::Resnet50 {
                depth,
                width,
                resolution,
                classes,
            } if super::resnet::stage_blocks(*depth).is_none()
                || *width == 0
                || *classes == 0
                || *resolution < 32 =>
            {
                bad(&format!(
                    "needs --depth 50, 101 or 152 (got {depth}), --width and --classes ≥ 1, and --resolution ≥ 32 (five stride-2 steps; got {resolution})"
                ))
            }
            ModelSpec::Gpt {
                config: c,
                seq,
                dropout,
            } => {
                // The first rule broken, named by its flag and value.
                let rows = crate::ops::MAX_LOOP_ITERATIONS;
                let broken = [
                    (c.layers == 0, "--layers must be at least 1".to_string()),
                    (c.heads == 0, "--heads must be at least 1".into()),
                    (c.vocab == 0, "--vocab must be at least 1".into()),
                    (c.dim == 0, "--dim must be at least 1".into()),
                    (
                        c.heads > 0 && !c.dim.is_multiple_of(c.heads),
                        format!("--dim {} is not a multiple of --heads {}", c.dim, c.heads),
                    ),
                    (
                        !(0.0..1.0).contains(dropout),
                        format!("--dropout {dropout} is not in [0, 1)"),
                    ),
                    (*seq == 0, "--seq-len must be at least 1".into()),
                    (
                        *seq > c.seq_len,
                        format!("--seq-len {seq} is more than the {} positions", c.seq_len),
                    ),
                    // One thread walks each softmax and LayerNorm row.
                    (
                        *seq > rows,
                        format!("--seq-len {seq}: the causal softmax takes rows of at most {rows}"),
                    ),
                    (
                        c.dim > rows,
                        format!("--dim {}: LayerNorm takes rows of at most {rows}", c.dim),
                    ),
                ];
                match broken.into_iter().find(|(b, _)| *b) {
                    Some((_, m)) => bad(&m),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Creates the parameters (PyTorch's default init, seeded) and the model.
    pub fn build(
        &self,
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
    ) -> Result<Box<dyn Model>, TensorError> {
        self.validate()
            .map_err(|message| TensorError::InvalidShape {
                op: "model",
                message,
            })?;
        Ok(match self {
            ModelSpec::Mlp {
                widths,
                checkpoint_every,
            } => Box::new(Mlp::new(engine, store, rng, widths, *checkpoint_every)?),
            ModelSpec::SimpleCnn => Box::new(SimpleConvNet::new(engine, store, rng)?),
            ModelSpec::ResnetMini {
                width,
                depth,
                resolution,
                classes,
            } => Box::new(ResnetMini::new(
                engine,
                store,
                rng,
                *width,
                *depth,
                *resolution,
                *classes,
            )?),
            ModelSpec::Attention {
                seq_len,
                dim,
                hidden,
                classes,
            } => Box::new(Attention::new(
                engine, store, rng, *seq_len, *dim, *hidden, *classes,
            )?),
            ModelSpec::Gpt {
                config,
                seq,
                dropout,
            } => Box::new(Gpt::new(engine, store, rng, *config, *seq, *dropout)?),
            ModelSpec::Resnet50 {
                depth,
                width,
                resolution,
                classes,
            } => Box::new(Resnet::new(
                engine,
                store,
                rng,
                *depth,
                *width,
                *resolution,
                *classes,
            )?),
        })
    }

    /// Takes the sizes a state_dict's shapes imply (layer count and widths),
    /// so a PyTorch-written weights file defines the model it belongs to.
    pub fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), String> {
        let shape = |name: &str| -> Result<Vec<usize>, String> {
            Ok(st.get(name).map_err(|e| e.to_string())?.shape.clone())
        };
        // The first axis of a weight (its output size); a 0-dimensional
        // weight is an error that names it, not an index out of bounds.
        let rows = |name: &str| -> Result<usize, String> {
            let s = shape(name)?;
            s.first().copied().filter(|&d| d > 0).ok_or_else(|| {
                format!(
                    "{}: {name} has shape {s:?}; a weight needs at least one axis of nonzero size",
                    st.origin
                )
            })
        };
        let count = |pattern: &dyn Fn(usize) -> String| {
            (0..)
                .take_while(|i| st.tensors.contains_key(&pattern(*i)))
                .count()
        };
        match self {
            ModelSpec::Mlp { widths, .. } => {
                let n = count(&|i| format!("layers.{i}.weight"));
                if n == 0 {
                    return Err(format!(
                        "{} has no layers.0.weight, so it is not an mlp state_dict",
                        st.origin
                    ));
                }
                let first = shape("layers.0.weight")?;
                let mut w = vec![first.get(1).copied().unwrap_or(0)];
                for i in 0..n {
                    w.push(rows(&format!("layers.{i}.weight"))?);
                }
                *widths = w;
            }
            ModelSpec::SimpleCnn => {}
            ModelSpec::ResnetMini {
                width,
                depth,
                classes,
                ..
            } => {
                *width = rows("stem.weight")?;
                *depth = count(&|i| format!("blocks.{i}.conv1.weight"));
                *classes = rows("fc.weight")?;
            }
            ModelSpec::Attention {
                dim,
                hidden,
                classes,
                ..
            } => {
                *dim = rows("attn.q_proj.weight")?;
                *hidden = rows("mlp.fc1.weight")?;
                *classes = rows("head.weight")?;
            }
            ModelSpec::Resnet50 {
                depth,
                width,
                classes,
                ..
            } => {
                *width = rows("conv1.weight")?;
                *classes = rows("fc.weight")?;
                let count = |s: usize| {
                    (0..)
                        .take_while(|i| {
                            st.tensors
                                .contains_key(&format!("layer{s}.{i}.conv1.weight"))
                        })
                        .count()
                };
                let blocks = [count(1), count(2), count(3), count(4)];
                *depth = [50, 101, 152]
                    .into_iter()
                    .find(|d| super::resnet::stage_blocks(*d) == Some(blocks))
                    .ok_or_else(|| {
                        format!(
                            "{}: stages of {blocks:?} blocks are not ResNet-50, 101 or 152",
                            st.origin
                        )
                    })?;
            }
            ModelSpec::Gpt { config, seq, .. } => {
                let wte = shape("wte.weight")?;
                let wpe = shape("wpe.weight")?;
                if wte.len() != 2 || wpe.len() != 2 {
                    return Err(format!(
                        "{}: wte.weight and wpe.weight must be [rows, dim]",
                        st.origin
                    ));
                }
                config.vocab = wte[0];
                config.dim = wte[1];
                config.seq_len = wpe[0];
                config.layers = count(&|i| format!("h.{i}.ln_1.weight"));
                // Heads are in no shape: PyTorch-written weights carry them
                // as metadata (scripts/gpt_reference.py), else --heads.
                if let Some(h) = st.metadata.get("heads") {
                    config.heads = h.parse().map_err(|_| {
                        format!("{}: metadata heads = {h:?} is not a number", st.origin)
                    })?;
                }
                *seq = (*seq).min(config.seq_len);
            }
        }
        self.validate()
    }

    /// Takes the sizes a batch's input shape implies (resolution, sequence
    /// length, input width).
    pub fn adapt_to_input(&mut self, x_shape: &[usize]) -> Result<(), String> {
        match self {
            ModelSpec::Mlp { widths, .. } if x_shape.len() == 2 => widths[0] = x_shape[1],
            ModelSpec::ResnetMini { resolution, .. } if x_shape.len() == 4 => {
                *resolution = x_shape[2]
            }
            ModelSpec::Attention { seq_len, .. } if x_shape.len() == 3 => *seq_len = x_shape[1],
            ModelSpec::Gpt { seq, .. } if x_shape.len() == 2 => *seq = x_shape[1],
            ModelSpec::Resnet50 { resolution, .. } if x_shape.len() == 4 => {
                *resolution = x_shape[2]
            }
            _ => {}
        }
        self.validate()
    }
}
