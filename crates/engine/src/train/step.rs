//! One training step the way a PyTorch loop writes it —
//! `zero_grad(); logits = model(x); loss = F.cross_entropy(logits, y);
//! loss.backward(); opt.step()` — with the allocator's numbers read after it.
//! The loop's `logits` and `loss` stay bound after a step, as Python's
//! names do: the trainer holds them, and the next step releases each where
//! it is rebound (the old logits once the model's forward returns, the old
//! loss once the new one exists), so memory between and across steps is a
//! Python loop's (but with `retain_graph`, which models a graph kept alive
//! across steps).
//! The peak is reset before each step so `peak_allocated_bytes` is that
//! step's own. With `retain_graph` one tape is kept across steps and backward
//! keeps every record, so each step's saved activations stay allocated.

use super::batch::Batch;
use crate::autograd::{Tape, Value};
use crate::memory::Category;
use crate::nn::{Model, ParamStore};
use crate::optim::{GradScaler, Optimizer};
use crate::tensor::{DType, Engine, Tensor, TensorError};
use serde::Serialize;
use std::time::Instant;

/// What a step does: train (forward, backward, optimizer), train with the
/// model's segments checkpointed, or inference (a `no_grad` forward only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Train,
    Checkpoint,
    Inference,
}

/// The flag's own word (train, checkpoint, inference), as `--mode` takes it.
impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match clap::ValueEnum::to_possible_value(self) {
            Some(v) => f.write_str(v.get_name()),
            None => write!(f, "{self:?}"),
        }
    }
}

/// What one step measured.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    pub step: usize,
    pub loss: f32,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub seconds: f64,
    /// GradScaler's scale used for this step's backward (amp f16 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_scale: Option<f32>,
    /// The optimizer step was skipped: a gradient was inf or NaN.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
}

pub struct Trainer {
    pub engine: Engine,
    pub model: Box<dyn Model>,
    pub store: ParamStore,
    pub optimizer: Box<dyn Optimizer>,
    retained: Option<Tape>,
    steps: usize,
    pub mode: Mode,
    /// Autocast dtype for the forward (`torch.autocast`), if any.
    pub amp: Option<DType>,
    /// Loss scaling (used with f16 autocast, as PyTorch recommends).
    pub scaler: Option<GradScaler>,
    /// Which cross-entropy the step runs.
    pub loss: super::LossMode,
    /// The last step's `logits` and `loss`, bound until the next step
    /// rebinds them.
    held: Option<StepOutputs>,
}

/// A step's outputs: what the loop's `logits` and `loss` hold.
pub struct StepOutputs {
    /// The logits; under `--loss chunked`, which never makes them, the
    /// head's input.
    pub logits: Tensor,
    pub loss: Tensor,
}

impl Trainer {
    pub fn new(
        engine: Engine,
        model: Box<dyn Model>,
        store: ParamStore,
        optimizer: Box<dyn Optimizer>,
        retain_graph: bool,
    ) -> Trainer {
        Trainer {
            engine,
            model,
            store,
            optimizer,
            retained: retain_graph.then(Tape::new),
            steps: 0,
            mode: Mode::Train,
            amp: None,
            scaler: None,
            loss: super::LossMode::default(),
            held: None,
        }
    }

    /// The last step's `logits` and `loss` (for `--dump`), still bound as
    /// the loop's names are.
    pub fn outputs(&self) -> Option<&StepOutputs> {
        self.held.as_ref()
    }

    /// Pure low precision (`model.half()` / `.to(torch.bfloat16)`): the
    /// parameters become `dtype`, and so do their gradients and the
    /// optimizer's state; the batch must be converted too
    /// ([`Batch::to_dtype`]). The loss is still computed in f32.
    pub fn with_dtype(mut self, dtype: DType) -> Result<Trainer, TensorError> {
        self.store.to_dtype(dtype)?;
        Ok(self)
    }

    /// Mixed precision: autocast the forward to `dtype`; with f16, a
    /// GradScaler with PyTorch's defaults scales the loss (bf16 has f32's
    /// exponent range and needs none).
    pub fn with_amp(mut self, dtype: Option<DType>) -> Trainer {
        self.amp = dtype.filter(|d| *d != DType::F32);
        self.scaler = (self.amp == Some(DType::F16)).then(GradScaler::default);
        self
    }

    /// Runs one step on `batch` and returns its record; its logits and loss
    /// are then [`Trainer::outputs`]. A step that fails after its forward
    /// began (out of memory) has released the last step's outputs and holds
    /// none, where Python would keep its names bound: run no further step
    /// on the trainer.
    pub fn step(&mut self, batch: &Batch) -> Result<StepRecord, TensorError> {
        let mut expected = vec![batch.size()];
        expected.extend(self.model.input_shape());
        if batch.x.shape() != expected {
            return Err(TensorError::ShapeMismatch {
                op: "train (batch x vs the model's input)",
                lhs: batch.x.shape().to_vec(),
                rhs: expected,
            });
        }
        let t0 = Instant::now();
        self.steps += 1;
        let engine = self.engine.clone();
        engine.allocator().reset_peak_memory_stats();
        self.store.zero_grad();
        let previous = self.held.take();
        let fresh = Tape::new();
        let tape = self.retained.as_ref().unwrap_or(&fresh);
        engine.mark_phase("forward");
        engine.reset_op_numbers();
        let forward = engine.scope(Category::Output, "forward");
        let x = Value::constant(batch.x.clone());
        let labels = &batch.labels;
        let (logits, loss) = match self.mode {
            Mode::Train | Mode::Checkpoint => self.forward_and_loss(tape, &x, labels, previous)?,
            // model.eval() under torch.no_grad(): the usual inference.
            Mode::Inference => {
                tape.eval(|| tape.no_grad(|| self.forward_and_loss(tape, &x, labels, previous)))?
            }
        };
        drop((forward, x));
        if self.mode == Mode::Inference {
            return self.finish(t0, logits, loss);
        }
        engine.mark_phase("backward");
        let backward = engine.scope(Category::Temporary, "backward");
        let grad_scale = self.scaler.as_ref().map(|s| s.scale);
        match (&self.retained, grad_scale) {
            (Some(_), _) => tape.backward_retain(&loss, &mut self.store)?,
            (None, Some(scale)) => tape.backward_scaled(&loss, &mut self.store, scale)?,
            (None, None) => tape.backward(&loss, &mut self.store)?,
        }
        drop(backward);
        engine.mark_phase("optimizer");
        let step_op = format!("{}.step", self.optimizer.name());
        let optimizer = engine.scope(Category::OptimizerState, &step_op);
        // scaler.step(opt): unscale, and step only if every gradient is
        // finite: decided by the host, which waits for the flag, or with a
        // fused optimizer by its kernels (the flag read with the loss).
        let mut skipped = false;
        let mut found_inf = None;
        match self.scaler.as_mut() {
            Some(scaler) if self.optimizer.takes_found_inf() => {
                found_inf = scaler.unscale_on_device(&mut self.store)?;
                match &found_inf {
                    Some(found) => self.optimizer.step_unless_found(&mut self.store, found)?,
                    // No parameters: nothing to flag.
                    None => {
                        self.optimizer.step(&mut self.store)?;
                        scaler.update(false);
                    }
                }
            }
            Some(scaler) => {
                skipped = scaler.unscale(&mut self.store)?;
                scaler.update(skipped);
                if !skipped {
                    self.optimizer.step(&mut self.store)?;
                }
            }
            None => self.optimizer.step(&mut self.store)?,
        }
        drop(optimizer);
        let outputs = StepOutputs {
            logits: logits.tensor().clone(),
            loss: loss.tensor().clone(),
        };
        drop((logits, loss));
        let deferred = found_inf.is_some();
        let mut record = self.finish_with(t0, outputs, found_inf)?;
        if deferred {
            // scaler.update(), after the step's one read.
            skipped = record.skipped;
            if let Some(scaler) = self.scaler.as_mut() {
                scaler.update(skipped);
            }
            if skipped {
                self.optimizer.was_skipped()?;
            }
        }
        record.grad_scale = grad_scale;
        record.skipped = skipped;
        Ok(record)
    }

    /// One optimizer step over `micro` micro-batches (gradient
    /// accumulation): each runs forward and backward with its loss scaled by
    /// 1/K, so `.grad` sums to the mean over all of them, as one batch of
    /// their total size gives (each micro-batch's loss is its own mean);
    /// then one optimizer step. Only one micro-batch's activations are ever
    /// alive. The record's loss is the mean of the micro-batches' losses.
    pub fn step_accumulated(&mut self, micro: &[Batch]) -> Result<StepRecord, TensorError> {
        if micro.len() < 2 {
            return match micro.first() {
                Some(b) => self.step(b),
                None => Err(TensorError::NotSupported {
                    op: "accumulate",
                    what: "no micro-batches: give at least one",
                }),
            };
        }
        if self.mode == Mode::Inference || self.retained.is_some() || self.scaler.is_some() {
            return Err(TensorError::NotSupported {
                op: "accumulate",
                what: "gradient accumulation trains without retain_graph and without f16 loss scaling (use --amp bf16)",
            });
        }
        let t0 = Instant::now();
        self.steps += 1;
        let engine = self.engine.clone();
        engine.allocator().reset_peak_memory_stats();
        self.store.zero_grad();
        let k = micro.len() as f32;
        let mut losses = 0.0;
        // Each micro-batch's forward rebinds the loop's names.
        let mut last: Option<StepOutputs> = self.held.take();
        for batch in micro {
            let tape = Tape::new();
            engine.mark_phase("forward");
            engine.reset_op_numbers();
            let forward = engine.scope(Category::Output, "forward");
            let x = Value::constant(batch.x.clone());
            let (logits, loss) = self.forward_and_loss(&tape, &x, &batch.labels, last.take())?;
            drop((forward, x));
            engine.mark_phase("backward");
            let backward = engine.scope(Category::Temporary, "backward");
            tape.backward_scaled(&loss, &mut self.store, 1.0 / k)?;
            drop(backward);
            losses += loss.tensor().to_vec()?[0];
            last = Some(StepOutputs {
                logits: logits.tensor().clone(),
                loss: loss.tensor().clone(),
            });
        }
        engine.mark_phase("optimizer");
        let step_op = format!("{}.step", self.optimizer.name());
        let optimizer = engine.scope(Category::OptimizerState, &step_op);
        self.optimizer.step(&mut self.store)?;
        drop(optimizer);
        let outputs = last.ok_or(TensorError::NotSupported {
            op: "accumulate",
            what: "no micro-batches: give at least one",
        })?;
        let mut record = self.finish_with(t0, outputs, None)?;
        record.loss = losses / k;
        Ok(record)
    }

    /// The model's forward and the loss, under autocast where it is on;
    /// `previous` (the last forward's outputs) is released where a Python
    /// loop rebinds its names.
    fn forward_and_loss(
        &self,
        tape: &Tape,
        x: &Value,
        labels: &Tensor,
        previous: Option<StepOutputs>,
    ) -> Result<(Value, Value), TensorError> {
        let checkpointed = self.mode == Mode::Checkpoint;
        let run = || {
            self.loss.forward(
                tape,
                self.model.as_ref(),
                &self.store,
                x,
                checkpointed,
                labels,
                previous,
            )
        };
        match self.amp {
            Some(d) => tape.autocast(d, run),
            None => run(),
        }
    }

    fn finish(
        &mut self,
        t0: Instant,
        logits: Value,
        loss: Value,
    ) -> Result<StepRecord, TensorError> {
        let outputs = StepOutputs {
            logits: logits.tensor().clone(),
            loss: loss.tensor().clone(),
        };
        drop((logits, loss));
        self.finish_with(t0, outputs, None)
    }

    /// Reads the step's figures with its outputs still bound, then keeps
    /// them as the loop's names. GradScaler's flag, where a fused optimizer
    /// took it on the device, is read with the loss (one wait) and freed
    /// before the memory is read, as `scaler.update()` drops PyTorch's.
    fn finish_with(
        &mut self,
        t0: Instant,
        outputs: StepOutputs,
        found_inf: Option<Tensor>,
    ) -> Result<StepRecord, TensorError> {
        let (loss_value, skipped) = match found_inf {
            Some(found) => {
                let read = Tensor::read_together(&[&outputs.loss, &found])?;
                drop(found);
                (read[0][0], GradScaler::found(&read[1]))
            }
            None => (outputs.loss.to_vec()?[0], false),
        };
        self.engine.synchronize()?;
        let a = self.engine.allocator();
        let record = StepRecord {
            step: self.steps,
            loss: loss_value,
            allocated_bytes: a.memory_allocated(),
            reserved_bytes: a.memory_reserved(),
            peak_allocated_bytes: a.max_memory_allocated(),
            seconds: t0.elapsed().as_secs_f64(),
            grad_scale: None,
            skipped,
        };
        drop(a);
        self.held = Some(outputs);
        Ok(record)
    }
}
