//! Lessons: each claim of the documents (`docs/claims.md`) as an
//! experiment that measures it and a verdict drawn from the measured
//! figures — holds, wrong (with the right number), partly (with which part),
//! or out of reach on one wgpu device (with the nearest thing measured).
//! Experiments run on a simulated device by default (exact to the byte, as
//! the estimator tests show) or on the GPU with `--measure`.
//! `catalog.rs` holds the lessons, `report.rs` the HTML page.

pub mod catalog;
pub mod report;

use crate::estimate::{analyze, run::run_steps, Analysis, Plan};
use crate::memory::{format_size, AllocatorConfig};
use crate::nn::{GptSpec, ModelSpec, Resnet50Spec};
use crate::tensor::{DType, Engine};
use crate::train::{Mode, OptimizerConfig, OptimizerKind};
use serde::Serialize;

/// What a lesson concluded.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", content = "detail", rename_all = "snake_case")]
pub enum Verdict {
    Holds,
    /// The claim is wrong; the right figure.
    Wrong(String),
    /// Part of it holds; which part.
    Partly(String),
    /// Needs hardware or software vramlab cannot have; the nearest figure.
    OutOfScope(String),
}

impl Verdict {
    /// What the verdict says beyond its word (none for holds).
    pub fn detail(&self) -> Option<&str> {
        match self {
            Verdict::Holds => None,
            Verdict::Wrong(d) | Verdict::Partly(d) | Verdict::OutOfScope(d) => Some(d),
        }
    }

    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Wrong(_) => "wrong",
            Verdict::Partly(_) => "partly",
            Verdict::OutOfScope(_) => "out of scope",
        }
    }
}

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
}

/// A curve for the report (x, y).
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub lines: Vec<(String, Vec<(f64, f64)>)>,
}

/// What running a lesson gives.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub figures: Vec<Figure>,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// One line: why.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<Series>,
    /// More plots, after the first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_series: Vec<Series>,
    /// The verdict waits for values a simulated device does not compute:
    /// a measured run's verdict stands in for it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub needs_device: bool,
}

/// A lesson: the claim quoted in English, the experiment, and its run.
pub struct Lesson {
    pub id: &'static str,
    /// The article(s) it comes from (`000` … `004`).
    pub source: &'static str,
    pub claim: &'static str,
    pub experiment: &'static str,
    pub run: fn(&Ctx) -> anyhow::Result<Outcome>,
}

impl Lesson {
    /// Where the claim comes from, as a heading says it.
    pub fn origin(&self) -> String {
        if self.source == "beyond" {
            "beyond the articles".to_string()
        } else {
            format!("article {}", self.source)
        }
    }
}

/// Where experiments run.
pub struct Ctx {
    /// A real device (`--measure`); else every engine is simulated.
    pub device: Option<crate::device::AdapterOptions>,
}

impl Ctx {
    pub fn simulated() -> Ctx {
        Ctx { device: None }
    }

    /// A fresh engine: the GPU with `--measure`, else a simulated device.
    pub fn engine(&self, config: AllocatorConfig) -> anyhow::Result<Engine> {
        Ok(match &self.device {
            Some(o) => Engine::new(o, config)?,
            None => Engine::simulated(config, None),
        })
    }

    /// Where the figures came from.
    pub fn source(&self) -> &'static str {
        if self.device.is_some() {
            "measured on the GPU"
        } else {
            "simulated device (exact to the byte)"
        }
    }

    /// `steps` steps of `plan`, analysed, after [`Ctx::check`]'s refusal.
    pub fn run(&self, plan: &Plan, steps: usize) -> anyhow::Result<Analysis> {
        let p = self.profile(plan, steps)?;
        Ok(analyze(&p.events, &p.layer_outputs))
    }

    /// `steps` steps of `plan` with their event log, after [`Ctx::check`]'s
    /// refusal.
    pub fn profile(
        &self,
        plan: &Plan,
        steps: usize,
    ) -> anyhow::Result<crate::estimate::StepProfile> {
        let engine = self.engine(plan.config.clone())?;
        Self::check_on(&engine, plan, steps)?;
        Ok(run_steps(engine, plan, 0, steps)?)
    }

    /// Whether `plan` can run here. On a CPU adapter, whose memory is the
    /// host's, a plan the simulation (exact to the byte) shows needing more
    /// than the host has free is refused with both figures: running it would
    /// swap or be killed, not fail cleanly. A lesson with several plans
    /// checks them all before running any, so a refusal costs no run.
    pub fn check(&self, plan: &Plan, steps: usize) -> anyhow::Result<()> {
        match self.device {
            None => Ok(()),
            Some(_) => Self::check_on(&self.engine(plan.config.clone())?, plan, steps),
        }
    }

    fn check_on(engine: &Engine, plan: &Plan, steps: usize) -> anyhow::Result<()> {
        let Some(free) = engine
            .is_cpu_adapter()
            .then(crate::device::host_memory::available)
            .flatten()
        else {
            return Ok(());
        };
        let sim = run_steps(Engine::simulated(plan.config.clone(), None), plan, 0, steps)?;
        let need = analyze(&sim.events, &sim.layer_outputs).peak_reserved_bytes;
        // Host copies of inputs and the process itself need room too.
        if need > free / 10 * 8 {
            anyhow::bail!(
                "{} batch {} needs {} of device memory (simulated, exact), more than 80% of the {} this CPU adapter's host has free; without --measure the lesson runs on the simulated device, whose figures are the same to the byte",
                label(&plan.model),
                plan.batch,
                format_size(need),
                format_size(free)
            );
        }
        Ok(())
    }
}

/// A model as a refusal names it: the zoo name, and the size knob that
/// tells one lesson's plans apart.
fn label(model: &ModelSpec) -> String {
    if let Some(r) = model.get::<Resnet50Spec>() {
        return format!("ResNet-{}", r.depth);
    }
    if let Some(g) = model.get::<GptSpec>() {
        return format!(
            "gpt of {:.2}B parameters ({} tokens)",
            model.parameter_count() as f64 / 1e9,
            g.seq
        );
    }
    model.name().to_string()
}

/// A training plan with the defaults lessons use (Adam, f32, train).
pub fn plan(model: ModelSpec, batch: usize) -> Plan {
    Plan {
        model,
        batch,
        optimizer: OptimizerConfig::new(OptimizerKind::Adam, None, None, None),
        mode: Mode::Train,
        amp: None,
        dtype: DType::F32,
        loss: Default::default(),
        config: AllocatorConfig::default(),
    }
}

pub const MIB: f64 = 1048576.0;

pub fn mib(b: u64) -> f64 {
    b as f64 / MIB
}

pub fn fig(name: impl Into<String>, value: f64, unit: &'static str) -> Figure {
    Figure {
        name: name.into(),
        value,
        unit,
    }
}

/// The lesson called `id` (case-insensitive; `C6` and `6` are `C06`,
/// `C28` finds `C06/C28`, and so does `C06/C28` itself, as `lessons` lists
/// it).
pub fn find(id: &str) -> Option<&'static Lesson> {
    let want = id.trim().to_ascii_uppercase();
    // C7, c07 and 7 are C07; X1 is X01 (the lessons beyond the claims).
    let norm = |s: &str| -> String {
        let (prefix, rest) = match s.strip_prefix('X') {
            Some(rest) => ('X', rest),
            None => ('C', s.strip_prefix('C').unwrap_or(s)),
        };
        match rest.parse::<u32>() {
            Ok(n) => format!("{prefix}{n:02}"),
            Err(_) => s.to_string(),
        }
    };
    let whole = |s: &str| s.split('/').map(norm).collect::<Vec<_>>().join("/");
    let want = whole(&want);
    catalog::LESSONS
        .iter()
        .find(|l| whole(l.id) == want || l.id.split('/').any(|part| norm(part) == want))
}
