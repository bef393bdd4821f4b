//! A zoo model before it is built: its sizes, as a [`ModelConfig`] that the
//! model's own file implements, behind the one [`ModelSpec`] every command
//! passes around. Nothing here names a model: adding one is a file and a
//! line in `zoo.rs`.

use super::init::Rng;
use super::model::Model;
use crate::autograd::param::ParamStore;
use crate::io::SafeTensors;
use crate::memory::AllocatorConfig;
use crate::tensor::{DType, Engine, SpecError, TensorError};
use serde::Serialize;
use std::any::Any;
use std::fmt::Debug;

/// The largest size of one model dimension (widths, channels, sequence
/// length, classes): 2^31, so a product of two fits any count.
pub const MAX_MODEL_SIZE: usize = 1 << 31;

/// The size knobs a command line can give; each model takes the ones it
/// lists in [`ModelConfig::flags`] and refuses the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sizes {
    pub widths: Option<Vec<usize>>,
    pub checkpoint_every: Option<usize>,
    pub width: Option<usize>,
    pub depth: Option<usize>,
    pub resolution: Option<usize>,
    pub seq_len: Option<usize>,
    pub dim: Option<usize>,
    pub hidden: Option<usize>,
    pub classes: Option<usize>,
    pub preset: Option<String>,
    pub layers: Option<usize>,
    pub heads: Option<usize>,
    pub vocab: Option<usize>,
    pub dropout: Option<f32>,
}

impl Sizes {
    /// Each knob by its flag name and whether it is set.
    pub fn given(&self) -> [(&'static str, bool); 14] {
        [
            ("widths", self.widths.is_some()),
            ("checkpoint-every", self.checkpoint_every.is_some()),
            ("width", self.width.is_some()),
            ("depth", self.depth.is_some()),
            ("resolution", self.resolution.is_some()),
            ("seq-len", self.seq_len.is_some()),
            ("dim", self.dim.is_some()),
            ("hidden", self.hidden.is_some()),
            ("classes", self.classes.is_some()),
            ("preset", self.preset.is_some()),
            ("layers", self.layers.is_some()),
            ("heads", self.heads.is_some()),
            ("vocab", self.vocab.is_some()),
            ("dropout", self.dropout.is_some()),
        ]
    }
}

/// Sets `slot` when `value` is given.
pub fn set<T: Clone>(slot: &mut T, value: &Option<T>) {
    if let Some(v) = value {
        *slot = v.clone();
    }
}

/// A model's sizes and what follows from them. Each zoo model's file
/// implements it for its own config struct.
pub trait ModelConfig: ConfigValue + Debug + Send + Sync + 'static {
    /// The command-line name (`--model NAME`).
    fn name(&self) -> &'static str;
    /// A one-line description of the sizes.
    fn describe(&self) -> String;
    /// Number of output classes (the logits' width).
    fn classes(&self) -> usize;
    /// Shape of one sample (the batch axis is prepended).
    fn input_shape(&self) -> Vec<usize>;
    /// The [`Sizes`] flags this model takes, by flag name.
    fn flags(&self) -> &'static [&'static str];
    /// Takes the given sizes (only those in [`flags`](Self::flags) are set).
    fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError>;
    /// Every size in range; the first rule broken, named by its flag.
    fn validate(&self) -> Result<(), SpecError>;
    /// Creates the parameters (PyTorch's default init, seeded) and the model.
    fn build(
        &self,
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
    ) -> Result<Box<dyn Model>, TensorError>;
    /// Takes the sizes a PyTorch state_dict's shapes imply.
    fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError>;
    /// Takes the sizes a batch's input shape `x_shape` implies.
    fn adapt_to_input(&mut self, x_shape: &[usize]);
    /// The kernels that have no 16-bit forms, which make `model.half()`
    /// impossible (the model runs under `--amp` instead); `None` where every
    /// kernel has them.
    fn f32_only_kernels(&self) -> Option<&'static str> {
        None
    }
    /// `Some(vocab)` for a language model, whose input is token ids in
    /// `0..vocab` and whose labels are the next tokens.
    fn vocab(&self) -> Option<usize> {
        None
    }
    /// Whether the head is a bias-free linear map onto the classes, which a
    /// loss that runs the head itself (`--loss chunked`) needs.
    fn bias_free_head(&self) -> bool {
        false
    }
    /// Layers that use another layer's parameter, as (layer, parameter
    /// name): a tied head owns no parameter of its own, and per-layer
    /// tables say whose it reads instead of showing 0.
    fn tied_parameters(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
}

/// What a [`ModelSpec`] needs of any config to clone, compare and print it;
/// implemented for every `Serialize + Clone + PartialEq` config.
pub trait ConfigValue {
    fn boxed(&self) -> Box<dyn ModelConfig>;
    fn json(&self) -> serde_json::Value;
    fn same(&self, other: &dyn Any) -> bool;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: ModelConfig + Serialize + Clone + PartialEq> ConfigValue for T {
    fn boxed(&self) -> Box<dyn ModelConfig> {
        Box::new(self.clone())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
    fn same(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// One zoo model with its sizes.
#[derive(Debug)]
pub struct ModelSpec(Box<dyn ModelConfig>);

impl<T: ModelConfig> From<T> for ModelSpec {
    fn from(config: T) -> ModelSpec {
        ModelSpec(Box::new(config))
    }
}

impl Clone for ModelSpec {
    fn clone(&self) -> ModelSpec {
        ModelSpec(self.0.boxed())
    }
}

impl PartialEq for ModelSpec {
    fn eq(&self, other: &ModelSpec) -> bool {
        self.0.same(other.0.as_any())
    }
}

/// `{"model": NAME, ...sizes}`, as the `--json` outputs have always shown.
impl Serialize for ModelSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let fields = match self.0.json() {
            serde_json::Value::Object(m) => m,
            _ => Default::default(),
        };
        let mut map = s.serialize_map(Some(fields.len() + 1))?;
        map.serialize_entry("model", self.name())?;
        for (k, v) in &fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// One model of the zoo (zoo.rs lists them): its name, what it is, and its
/// default sizes. Each model's file exports one.
#[derive(Clone, Copy)]
pub struct ZooEntry {
    pub name: &'static str,
    /// One line: the architecture and the flags that size it.
    pub about: &'static str,
    pub default: fn() -> ModelSpec,
}

impl ModelSpec {
    /// The sizes as `T`, when this is that model (`spec.get::<GptSpec>()`).
    pub fn get<T: ModelConfig>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }

    pub fn get_mut<T: ModelConfig>(&mut self) -> Option<&mut T> {
        self.0.as_any_mut().downcast_mut()
    }

    pub fn is<T: ModelConfig>(&self) -> bool {
        self.get::<T>().is_some()
    }

    pub fn config(&self) -> &dyn ModelConfig {
        &*self.0
    }

    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    pub fn describe(&self) -> String {
        self.0.describe()
    }

    pub fn classes(&self) -> usize {
        self.0.classes()
    }

    pub fn input_shape(&self) -> Vec<usize> {
        self.0.input_shape()
    }

    pub fn flags(&self) -> &'static [&'static str] {
        self.0.flags()
    }

    /// Whether `model.half()` is possible (every kernel has 16-bit forms).
    pub fn supports_16bit_model(&self) -> bool {
        self.0.f32_only_kernels().is_none()
    }

    pub fn tied_parameters(&self) -> &'static [(&'static str, &'static str)] {
        self.0.tied_parameters()
    }

    pub fn vocab(&self) -> Option<usize> {
        self.0.vocab()
    }

    pub fn bias_free_head(&self) -> bool {
        self.0.bias_free_head()
    }

    /// Takes `sizes`, refusing a flag this model does not take (rather than
    /// ignoring it), then checks the result.
    pub fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError> {
        let flags = self.flags();
        if let Some((flag, _)) = sizes
            .given()
            .into_iter()
            .find(|(f, g)| *g && !flags.contains(f))
        {
            return Err(SpecError::FlagDoesNotApply {
                flag,
                model: self.name(),
            });
        }
        self.0.apply(sizes)?;
        self.validate()
    }

    /// Checks the sizes make a model, the message prefixed by its name.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.0.validate().map_err(|e| SpecError::InModel {
            model: self.name(),
            source: Box::new(e),
        })
    }

    /// Refuses a 16-bit model dtype for a model whose kernels are f32 only,
    /// saying what to use instead.
    pub fn check_dtype(&self, dtype: DType) -> Result<(), SpecError> {
        match self.0.f32_only_kernels() {
            Some(kernels) if dtype != DType::F32 => Err(SpecError::F32Only {
                model: self.name(),
                kernels,
                dtype,
            }),
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
        self.validate()?;
        self.0.build(engine, store, rng)
    }

    /// Every parameter's state_dict name and shape, in registration order,
    /// read off the model built on a simulated device (no memory, no init).
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let engine = Engine::simulated(AllocatorConfig::default(), None);
        let mut store = ParamStore::new();
        if self.build(&engine, &mut store, &mut Rng::new(0)).is_err() {
            return Vec::new();
        }
        store
            .iter()
            .map(|p| (p.name.clone(), p.value.shape().to_vec()))
            .collect()
    }

    /// Number of parameters (elements).
    pub fn parameter_count(&self) -> usize {
        count_of(&self.parameter_shapes())
    }

    /// Takes the sizes a state_dict's shapes imply (layer count and widths),
    /// so a PyTorch-written weights file defines the model it belongs to.
    pub fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError> {
        self.0.adapt_to_weights(st)?;
        self.validate()
    }

    /// Takes the sizes a batch's input shape implies (resolution, sequence
    /// length, input width).
    pub fn adapt_to_input(&mut self, x_shape: &[usize]) -> Result<(), SpecError> {
        self.0.adapt_to_input(x_shape);
        self.validate()
    }
}

/// Elements in all of `shapes` (as [`ModelSpec::parameter_shapes`] lists them).
pub fn count_of(shapes: &[(String, Vec<usize>)]) -> usize {
    shapes
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum()
}

/// Every size at most [`MAX_MODEL_SIZE`].
pub fn check_sizes(sizes: &[usize]) -> Result<(), SpecError> {
    match sizes.iter().find(|&&s| s > MAX_MODEL_SIZE) {
        Some(&size) => Err(SpecError::SizeTooLarge {
            size,
            max: MAX_MODEL_SIZE,
        }),
        None => Ok(()),
    }
}

/// A state_dict reader for [`ModelConfig::adapt_to_weights`]: shapes by
/// name, first axes, and counts of numbered layers, with errors naming the
/// file.
pub struct StateDict<'a>(pub &'a SafeTensors);

impl StateDict<'_> {
    pub fn shape(&self, name: &str) -> Result<Vec<usize>, SpecError> {
        Ok(self.0.get(name)?.shape.clone())
    }

    /// The first axis of a weight (its output size); a 0-dimensional weight
    /// is an error that names it, not an index out of bounds.
    pub fn rows(&self, name: &str) -> Result<usize, SpecError> {
        let s = self.shape(name)?;
        s.first()
            .copied()
            .filter(|&d| d > 0)
            .ok_or_else(|| SpecError::EmptyWeight {
                origin: self.0.origin.clone(),
                name: name.to_string(),
                shape: s.clone(),
            })
    }

    /// How many of `pattern(0)`, `pattern(1)`, … exist, counting from 0.
    pub fn count(&self, pattern: impl Fn(usize) -> String) -> usize {
        (0..)
            .take_while(|i| self.0.tensors.contains_key(&pattern(*i)))
            .count()
    }

    pub fn origin(&self) -> &str {
        &self.0.origin
    }
}
