//! `resnet50` (and 101, 152): torchvision's ResNet v1.5 — a 7×7 stride-2
//! stem convolution, BatchNorm, ReLU, a 3×3 stride-2 max pool, four stages
//! of bottleneck blocks (1×1 reduce, 3×3 with the stage's stride, 1×1
//! expand ×4, each followed by BatchNorm; a 1×1 strided projection with
//! BatchNorm where the shape changes; residual add, ReLU), global average
//! pooling and a linear head. Convolutions have no bias. Parameter names
//! are torchvision's state_dict names; BatchNorm's running statistics are
//! buffers (model state the optimizer never sees). `width` scales every
//! stage (64 is torchvision's), so the committed PyTorch fixtures can use a
//! narrow copy of the same architecture.

use super::init::Rng;
use super::layers::{in_layer, Linear};
use super::model::Model;
use super::spec::{check_sizes, set, ModelConfig, Sizes, StateDict, ZooEntry};
use crate::autograd::param::{ParamId, ParamStore};
use crate::autograd::{functions as f, vision as v, Tape, Value};
use crate::io::SafeTensors;
use crate::memory::Category;
use crate::ops::conv2d::Conv2dConfig;
use crate::ops::maxpool::PoolConfig;
use crate::tensor::{DType, Engine, SpecError, Tensor, TensorError};
use serde::Serialize;
use std::sync::Arc;

/// Bottleneck blocks per stage for each depth.
pub fn stage_blocks(depth: usize) -> Option<[usize; 4]> {
    match depth {
        50 => Some([3, 4, 6, 3]),
        101 => Some([3, 4, 23, 3]),
        152 => Some([3, 8, 36, 3]),
        _ => None,
    }
}

/// The stem's max pool.
pub const STEM_POOL: PoolConfig = PoolConfig {
    kernel: 3,
    stride: 2,
    padding: 1,
};

#[derive(Debug, Clone)]
struct Conv {
    name: Arc<str>,
    weight: ParamId,
    cfg: Conv2dConfig,
}

#[derive(Debug, Clone)]
struct BatchNorm {
    name: Arc<str>,
    weight: ParamId,
    bias: ParamId,
    running_mean: Tensor,
    running_var: Tensor,
}

#[derive(Debug, Clone)]
struct Bottleneck {
    name: Arc<str>,
    convs: [(Conv, BatchNorm); 3],
    downsample: Option<(Conv, BatchNorm)>,
}

#[derive(Debug, Clone)]
pub struct Resnet {
    stem: (Conv, BatchNorm),
    stages: Vec<Vec<Bottleneck>>,
    fc: Linear,
    resolution: usize,
}

fn tensor(
    engine: &Engine,
    name: &str,
    shape: &[usize],
    values: impl FnMut(usize) -> Vec<f32>,
) -> Result<Tensor, TensorError> {
    let _scope = engine.scope(Category::Parameter, "init");
    Tensor::generated(engine, shape, DType::F32, name, values)
}

/// torchvision's init: kaiming normal (fan_out, ReLU) for convolutions.
fn conv(
    engine: &Engine,
    store: &mut ParamStore,
    rng: &mut Rng,
    name: String,
    (i, o, k): (usize, usize, usize),
    stride: usize,
) -> Result<Conv, TensorError> {
    let std = (2.0 / (o * k * k) as f32).sqrt();
    let w = tensor(engine, &format!("{name}.weight"), &[o, i, k, k], |n| {
        rng.normal(n).into_iter().map(|v| v * std).collect()
    })?;
    Ok(Conv {
        weight: store.add(&format!("{name}.weight"), w),
        name: Arc::from(name.as_str()),
        cfg: Conv2dConfig {
            stride,
            padding: k / 2,
        },
    })
}

fn bn(
    engine: &Engine,
    store: &mut ParamStore,
    name: String,
    c: usize,
) -> Result<BatchNorm, TensorError> {
    let w = tensor(engine, &format!("{name}.weight"), &[c], |n| vec![1.0; n])?;
    let b = tensor(engine, &format!("{name}.bias"), &[c], |n| vec![0.0; n])?;
    Ok(BatchNorm {
        weight: store.add(&format!("{name}.weight"), w),
        bias: store.add(&format!("{name}.bias"), b),
        running_mean: tensor(engine, &format!("{name}.running_mean"), &[c], |n| {
            vec![0.0; n]
        })?,
        running_var: tensor(engine, &format!("{name}.running_var"), &[c], |n| {
            vec![1.0; n]
        })?,
        name: Arc::from(name.as_str()),
    })
}

impl Resnet {
    pub fn new(
        engine: &Engine,
        store: &mut ParamStore,
        rng: &mut Rng,
        depth: usize,
        width: usize,
        resolution: usize,
        classes: usize,
    ) -> Result<Resnet, TensorError> {
        let blocks = stage_blocks(depth).ok_or_else(|| crate::tensor::ConfigError::Choice {
            what: "--depth",
            value: depth.to_string(),
            expected: "resnet50 has depths 50, 101 and 152",
        })?;
        let stem = (
            conv(engine, store, rng, "conv1".into(), (3, width, 7), 2)?,
            bn(engine, store, "bn1".into(), width)?,
        );
        let mut inplanes = width;
        let mut stages = Vec::new();
        for (s, &count) in blocks.iter().enumerate() {
            let planes = width << s;
            let mut stage = Vec::new();
            for i in 0..count {
                let stride = if s > 0 && i == 0 { 2 } else { 1 };
                let p = format!("layer{}.{i}", s + 1);
                let mut cb = |n: usize, (ci, co, k): (usize, usize, usize), st| {
                    Ok::<_, TensorError>((
                        conv(engine, store, rng, format!("{p}.conv{n}"), (ci, co, k), st)?,
                        bn(engine, store, format!("{p}.bn{n}"), co)?,
                    ))
                };
                let c1 = cb(1, (inplanes, planes, 1), 1)?;
                let c2 = cb(2, (planes, planes, 3), stride)?;
                let c3 = cb(3, (planes, 4 * planes, 1), 1)?;
                let downsample = if stride != 1 || inplanes != 4 * planes {
                    Some((
                        conv(
                            engine,
                            store,
                            rng,
                            format!("{p}.downsample.0"),
                            (inplanes, 4 * planes, 1),
                            stride,
                        )?,
                        bn(engine, store, format!("{p}.downsample.1"), 4 * planes)?,
                    ))
                } else {
                    None
                };
                stage.push(Bottleneck {
                    name: Arc::from(p.as_str()),
                    convs: [c1, c2, c3],
                    downsample,
                });
                inplanes = 4 * planes;
            }
            stages.push(stage);
        }
        // nn.Linear's default init (uniform ±1/√fan_in), as torchvision keeps.
        let fc = Linear::new(engine, store, rng, "fc", inplanes, classes)?;
        Ok(Resnet {
            stem,
            stages,
            fc,
            resolution,
        })
    }
}

/// conv (no bias) then BatchNorm, each as its own layer.
fn conv_bn(
    tape: &Tape,
    store: &ParamStore,
    (c, b): &(Conv, BatchNorm),
    x: &Value,
) -> Result<Value, TensorError> {
    let y = in_layer(x, &c.name, || {
        f::conv2d_nobias(tape, x, &tape.param(store, c.weight), c.cfg)
    })?;
    in_layer(&y, &b.name, || {
        let (w, bias) = (tape.param(store, b.weight), tape.param(store, b.bias));
        v::batchnorm(tape, &y, &w, &bias, &b.running_mean, &b.running_var)
    })
}

impl Bottleneck {
    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        let mut r = conv_bn(tape, store, &self.convs[0], x)?;
        r = f::relu(tape, &r)?;
        r = conv_bn(tape, store, &self.convs[1], &r)?;
        r = f::relu(tape, &r)?;
        r = conv_bn(tape, store, &self.convs[2], &r)?;
        let identity = match &self.downsample {
            Some(d) => conv_bn(tape, store, d, x)?,
            None => x.clone(),
        };
        let h = f::add(tape, &r, &identity)?;
        drop((r, identity));
        f::relu(tape, &h)
    }
}

impl Resnet {
    fn run(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
        checkpointed: bool,
    ) -> Result<Value, TensorError> {
        let engine = x.tensor().engine().clone();
        let mut h = {
            // Everything of a stage is tagged with it (`stem.forward`,
            // `layer1.0.forward`, …), for per-layer rows and the per-stage
            // saved-bytes count.
            let _s = engine.op_scope("stem.forward");
            let mut h = conv_bn(tape, store, &self.stem, x)?;
            h = f::relu(tape, &h)?;
            v::max_pool2d(tape, &h, STEM_POOL)?
        };
        engine.note_layer_output(&Arc::from("stem"), h.tensor().shape());
        for stage in &self.stages {
            for blk in stage {
                let _s = engine.op_scope(&format!("{}.forward", blk.name));
                h = if checkpointed {
                    let b = blk.clone();
                    f::checkpoint(tape, store, &h, move |t, s, v| b.forward(t, s, v))?
                } else {
                    blk.forward(tape, store, &h)?
                };
                drop(_s);
                engine.note_layer_output(&blk.name, h.tensor().shape());
            }
        }
        let _s = engine.op_scope("head.forward");
        h = f::global_avg_pool(tape, &h)?;
        self.fc.forward(tape, store, &h)
    }
}

impl Model for Resnet {
    fn input_shape(&self) -> Vec<usize> {
        vec![3, self.resolution, self.resolution]
    }

    fn buffers(&self) -> Vec<(String, Tensor)> {
        let blocks = self.stages.iter().flatten();
        std::iter::once(&self.stem.1)
            .chain(blocks.flat_map(|b| {
                b.convs
                    .iter()
                    .map(|(_, n)| n)
                    .chain(b.downsample.as_ref().map(|(_, n)| n))
            }))
            .flat_map(|n| {
                [
                    (format!("{}.running_mean", n.name), n.running_mean.clone()),
                    (format!("{}.running_var", n.name), n.running_var.clone()),
                ]
            })
            .collect()
    }

    fn forward(&self, tape: &Tape, store: &ParamStore, x: &Value) -> Result<Value, TensorError> {
        self.run(tape, store, x, false)
    }

    /// Each bottleneck block checkpointed.
    fn forward_checkpointed(
        &self,
        tape: &Tape,
        store: &ParamStore,
        x: &Value,
    ) -> Result<Value, TensorError> {
        self.run(tape, store, x, true)
    }
}

/// `resnet50`'s sizes: torchvision's ResNet-50 / 101 / 152; `width` 64 is
/// torchvision's, smaller ones scale every stage down.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resnet50Spec {
    pub depth: usize,
    pub width: usize,
    pub resolution: usize,
    pub classes: usize,
}

impl Default for Resnet50Spec {
    fn default() -> Resnet50Spec {
        Resnet50Spec {
            depth: 50,
            width: 64,
            resolution: 224,
            classes: 1000,
        }
    }
}

pub const ENTRY: ZooEntry = ZooEntry {
    name: "resnet50",
    about: "torchvision's ResNet-50: 7×7/2 stem, BatchNorm, 3×3/2 max pool, bottleneck stages [3, 4, 6, 3], global average pool, fc (--depth 50|101|152, --width 64, --resolution 224, --classes 1000)",
    default: || Resnet50Spec::default().into(),
};

impl ModelConfig for Resnet50Spec {
    fn name(&self) -> &'static str {
        "resnet50"
    }

    fn describe(&self) -> String {
        let Resnet50Spec {
            depth,
            width,
            resolution,
            classes,
        } = self;
        format!("resnet{depth} width {width}, {resolution}×{resolution} input, {classes} classes")
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![3, self.resolution, self.resolution]
    }

    fn flags(&self) -> &'static [&'static str] {
        &["depth", "width", "resolution", "classes"]
    }

    fn apply(&mut self, sizes: &Sizes) -> Result<(), SpecError> {
        set(&mut self.depth, &sizes.depth);
        set(&mut self.width, &sizes.width);
        set(&mut self.resolution, &sizes.resolution);
        set(&mut self.classes, &sizes.classes);
        Ok(())
    }

    fn validate(&self) -> Result<(), SpecError> {
        let Resnet50Spec {
            depth,
            width,
            resolution,
            classes,
        } = *self;
        // The widest stage has 32·width channels (8·width planes × 4).
        check_sizes(&[width.saturating_mul(32), resolution, classes])?;
        // Name only what is wrong.
        let mut wrong = Vec::new();
        if stage_blocks(depth).is_none() {
            wrong.push(format!("--depth must be 50, 101 or 152 (got {depth})"));
        }
        if width == 0 {
            wrong.push("--width must be at least 1".to_string());
        }
        if classes == 0 {
            wrong.push("--classes must be at least 1".to_string());
        }
        if resolution < 32 {
            wrong.push(format!(
                "--resolution must be at least 32, for five stride-2 steps (got {resolution})"
            ));
        }
        if !wrong.is_empty() {
            return Err(SpecError::ResnetSizes {
                what: wrong.join("; "),
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
        let m = Resnet::new(
            engine,
            store,
            rng,
            s.depth,
            s.width,
            s.resolution,
            s.classes,
        )?;
        Ok(Box::new(m))
    }

    fn adapt_to_weights(&mut self, st: &SafeTensors) -> Result<(), SpecError> {
        let sd = StateDict(st);
        self.width = sd.rows("conv1.weight")?;
        self.classes = sd.rows("fc.weight")?;
        let count = |s: usize| sd.count(|i| format!("layer{s}.{i}.conv1.weight"));
        let blocks = [count(1), count(2), count(3), count(4)];
        self.depth = [50, 101, 152]
            .into_iter()
            .find(|d| stage_blocks(*d) == Some(blocks))
            .ok_or_else(|| SpecError::ResnetStages {
                origin: sd.origin().to_string(),
                blocks,
            })?;
        Ok(())
    }

    fn adapt_to_input(&mut self, x_shape: &[usize]) {
        if let [_, _, r, _] = x_shape {
            self.resolution = *r;
        }
    }

    fn f32_only_kernels(&self) -> Option<&'static str> {
        Some("BatchNorm and max-pool")
    }
}
