//! `resnet-mini`: `stem` (3×3 conv, padding 1) and ReLU, then `depth`
//! residual blocks `blocks.i` — conv1 (3×3, stride s), ReLU, conv2 (3×3),
//! plus a shortcut, then ReLU. Block 0 keeps `width` channels with an
//! identity shortcut; each later block doubles the channels with stride 2
//! and a 1×1 stride-2 `shortcut` conv. Then global average pooling and the
//! linear head `fc`. Input `[N, 3, R, R]`; activation memory grows with R².

use super::init::Rng;
use super::layers::{Conv2d, Linear};
use super::model::Model;
use super::spec::{check_sizes, set, ModelConfig, Sizes, StateDict, ZooEntry, MAX_MODEL_SIZE};
use crate::autograd::param::ParamStore;
use crate::autograd::{functions as f, Tape, Value};
use crate::io::SafeTensors;
use crate::ops::conv2d::Conv2dConfig;
use crate::tensor::{Engine, SpecError, TensorError};
use serde::Serialize;

#[derive(Clone)]
struct Block {
    conv1: Conv2d,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
}

pub struct ResnetMini {
    stem: Conv2d,
    blocks: Vec<Block>,
    fc: Linear,
    resolution: usize,
}

impl ResnetMini {
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        width: usize,
        depth: usize,
        resolution: usize,
        classes: usize,
    ) -> Result<ResnetMini, TensorError> {
        let same = Conv2dConfig {
            stride: 1,
            padding: 1,
        };
        let stem = Conv2d::new(engine, store, rng, "stem", 3, width, 3, same)?;
        let mut blocks = Vec::new();
        let mut ch = width;
        for i in 0..depth {
            let p = format!("blocks.{i}");
            let (out, stride) = if i == 0 { (ch, 1) } else { (ch * 2, 2) };
            let down = Conv2dConfig { stride, padding: 1 };
            let conv1 = Conv2d::new(engine, store, rng, &format!("{p}.conv1"), ch, out, 3, down)?;
            let conv2 = Conv2d::new(engine, store, rng, &format!("{p}.conv2"), out, out, 3, same)?;
            let shortcut = if i == 0 {
                None
            } else {
                let cfg = Conv2dConfig { stride, padding: 0 };
                let name = format!("{p}.shortcut");
                Some(Conv2d::new(engine, store, rng, &name, ch, out, 1, cfg)?)
            };
            blocks.push(Block {
                conv1,
                conv2,
                shortcut,
            });
            ch = out;
        }
        let fc = Linear::new(engine, store, rng, "fc", ch, classes)?;
        Ok(ResnetMini {
            stem,
            blocks,
            fc,
            resolution,
        })
    }
}

impl Model for ResnetMini {
    fn input_shape(&self) -> Vec<usize> {
        vec![3, self.resolution, self.resolution]
    }

    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        let mut h = self.stem.forward(tape, store, x)?;
        h = f::relu(tape, &h)?;
        for b in &self.blocks {
            h = b.forward(tape, store, &h)?;
        }
        h = f::global_avg_pool(tape, &h)?;
        self.fc.forward(tape, store, &h)
    }

    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        let mut h = self.stem.forward(tape, store, x)?;
        h = f::relu(tape, &h)?;
        for b in &self.blocks {
            let b = b.clone();
            h = f::checkpoint(tape, store, &h, move |t, s, v| b.forward(t, s, v))?;
        }
        h = f::global_avg_pool(tape, &h)?;
        self.fc.forward(tape, store, &h)
    }
}

impl Block {
    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        let mut r = self.conv1.forward(tape, store, x)?;
        r = f::relu(tape, &r)?;
        r = self.conv2.forward(tape, store, &r)?;
        let mut h = match &self.shortcut {
            Some(s) => s.forward(tape, store, x)?,
            None => x.clone(),
        };
        h = f::add(tape, &r, &h)?;
        drop(r);
        f::relu(tape, &h)
    }
}

/// `resnet-mini`'s sizes: block 0 keeps `width` channels, each later block
/// doubles them with stride 2.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResnetMiniSpec {
    pub width: usize,
    pub depth: usize,
    pub resolution: usize,
    pub classes: usize,
}

impl Default for ResnetMiniSpec {
    fn default() -> ResnetMiniSpec {
        ResnetMiniSpec {
            width: 16,
            depth: 3,
            resolution: 32,
            classes: 10,
        }
    }
}

pub const ENTRY: ZooEntry = ZooEntry {
    name: "resnet-mini",
    about: "3×3 stem, residual blocks (identity or 1×1 stride-2 shortcut), global average pool, linear head (--width, --depth, --resolution)",
    default: || ResnetMiniSpec::default().into(),
};

impl ModelConfig for ResnetMiniSpec {
    fn name(&self) -> &'static str {
        "resnet-mini"
    }

    fn describe(&self) -> String {
        let ResnetMiniSpec {
            width,
            depth,
            resolution,
            classes,
        } = self;
        format!(
            "resnet-mini width {width}, {depth} blocks, {resolution}×{resolution} input, {classes} classes"
        )
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![3, self.resolution, self.resolution]
    }

    fn flags(&self) -> &'static [&'static str] {
        &["width", "depth", "resolution", "classes"]
    }

    fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError> {
        set(&mut self.width, &sizes.width);
        set(&mut self.depth, &sizes.depth);
        set(&mut self.resolution, &sizes.resolution);
        set(&mut self.classes, &sizes.classes);
        Ok(())
    }

    fn validate(&self) -> Result<(), SpecError> {
        let ResnetMiniSpec {
            width,
            depth,
            resolution,
            classes,
        } = *self;
        check_sizes(&[width, resolution, classes])?;
        // Channels double per block after the first: width · 2^(depth−1).
        let widest = u32::try_from(depth.saturating_sub(1))
            .ok()
            .and_then(|d| 1usize.checked_shl(d))
            .and_then(|f| f.checked_mul(width));
        if widest.is_none_or(|c| c > MAX_MODEL_SIZE) {
            return Err(SpecError::Channels {
                width,
                depth,
                max: MAX_MODEL_SIZE,
            });
        }
        let too_small = u32::try_from(depth)
            .ok()
            .and_then(|d| 1usize.checked_shl(d))
            .is_none_or(|need| resolution < need);
        if width == 0 || depth == 0 || classes == 0 || too_small {
            return Err(SpecError::ResolutionForDepth {
                need: 1usize << depth.min(30),
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
        let m = ResnetMini::new(
            engine,
            store,
            rng,
            s.width,
            s.depth,
            s.resolution,
            s.classes,
        )?;
        Ok(Box::new(m))
    }

    fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError> {
        let sd = StateDict(st);
        self.width = sd.rows("stem.weight")?;
        self.depth = sd.count(|i| format!("blocks.{i}.conv1.weight"));
        self.classes = sd.rows("fc.weight")?;
        Ok(())
    }

    fn adapt_to_input(&mut self, x_shape: &[usize]) {
        if let [_, _, r, _] = x_shape {
            self.resolution = *r;
        }
    }
}
