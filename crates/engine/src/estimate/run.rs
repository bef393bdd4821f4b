//! One recorded step: build the model and batch, run one step in the chosen
//! mode, and keep the allocator's event log and the layers' output shapes.

use crate::memory::{AllocatorConfig, MemEvent};
use crate::nn::init::Rng;
use crate::nn::{ModelSpec, ParamStore};
use crate::tensor::{DType, Engine, TensorError};
use crate::train::{Batch, Mode, OptimizerConfig, Trainer};
use serde::Serialize;
use std::sync::Arc;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub model: ModelSpec,
    pub batch: usize,
    pub optimizer: OptimizerConfig,
    pub mode: Mode,
    /// Autocast dtype (`train --amp`), if any.
    pub amp: Option<DType>,
    /// The model's dtype (`model.half()`: f16; f32 normally).
    pub dtype: DType,
    /// Which cross-entropy the step runs.
    pub loss: crate::train::LossMode,
    #[serde(skip)]
    pub config: AllocatorConfig,
}

impl Plan {
    /// The model (weights from `seed`), one random batch, and a trainer in
    /// the plan's mode with its optimizer.
    pub fn trainer(&self, engine: &Engine, seed: u64) -> Result<(Trainer, Batch), TensorError> {
        self.model.check_dtype(self.dtype)?;
        self.loss.check_model(&self.model)?;
        let mut rng = Rng::new(seed);
        let mut store = ParamStore::new();
        let model = self.model.build(engine, &mut store, &mut rng)?;
        let batch = Batch::random_for(engine, &mut rng, &self.model, self.batch, self.dtype)?;
        let mut trainer = Trainer::new(engine.clone(), model, store, self.optimizer.build(), false)
            .with_dtype(self.dtype)?
            .with_amp(self.amp);
        trainer.mode = self.mode;
        trainer.loss = self.loss;
        Ok((trainer, batch))
    }

    /// Each of `steps` steps' peak allocated bytes, on a simulated device
    /// (memory depends on shapes only, so these are a real run's to the
    /// byte): what `train --amp` and `demo --amp` print beside their own.
    pub fn step_peaks(&self, steps: usize) -> Result<Vec<u64>, TensorError> {
        let sim = Engine::simulated(self.config.clone(), None);
        let (mut t, b) = self.trainer(&sim, 0)?;
        (0..steps)
            .map(|_| Ok(t.step(&b)?.peak_allocated_bytes))
            .collect()
    }
}

/// A recorded step.
pub struct StepProfile {
    pub events: Vec<MemEvent>,
    pub layer_outputs: Vec<(Arc<str>, Vec<usize>)>,
    pub parameters: usize,
    pub device: String,
    pub seconds: f64,
    /// Memory at three levels right after the last step, model still alive.
    pub levels: crate::tensor::ThreeLevels,
    /// Steps the f16 GradScaler skipped (a gradient overflowed): a skipped
    /// step allocates no optimizer state. Only a real device can skip; a
    /// simulated one has no values, so an estimate assumes every step updates.
    pub skipped_steps: usize,
}

/// Runs `plan` on `engine` (simulated or real) with recording on from the
/// first allocation, so parameters and the batch are in the log too.
pub fn run_step(engine: Engine, plan: &Plan, seed: u64) -> Result<StepProfile, TensorError> {
    run_steps(engine, plan, seed, 1)
}

/// `steps` steps of `plan` on one batch, recorded.
pub fn run_steps(
    engine: Engine,
    plan: &Plan,
    seed: u64,
    steps: usize,
) -> Result<StepProfile, TensorError> {
    let t0 = std::time::Instant::now();
    engine.allocator().start_recording();
    let (mut trainer, batch) = plan.trainer(&engine, seed)?;
    let parameters = trainer.store.numel();
    let mut skipped_steps = 0;
    for _ in 0..steps {
        let record = trainer.step(&batch)?;
        skipped_steps += record.skipped as usize;
    }
    engine.synchronize()?;
    let levels = engine.three_levels();
    let events = engine.allocator().take_events();
    Ok(StepProfile {
        events,
        layer_outputs: engine.take_layer_outputs(),
        parameters,
        device: engine.device_name(),
        seconds: t0.elapsed().as_secs_f64(),
        levels,
        skipped_steps,
    })
}

/// The step on a simulated device (no GPU).
pub fn estimate(plan: &Plan) -> Result<StepProfile, TensorError> {
    run_step(Engine::simulated(plan.config.clone(), None), plan, 0)
}
