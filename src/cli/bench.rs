//! `vramlab bench`: kernel speed on this adapter. Square matmuls (GFLOP/s),
//! every matrix product shape each zoo model's training step issues (logged
//! from a step, then replayed alone, each beside the time its output takes
//! to write with K = 1, which bounds products with little work per output),
//! and the whole step per model with its device time per phase. `--tune`
//! tries a grid of tile shapes per shape class and prints the best, which is
//! how `choose_tile` (and the 8-lane rules in `choose`) were filled in.
//!
//! Timing: wall clock around a product and a wait for the GPU, median of
//! `--reps`; device time from timestamp queries beside it where the adapter
//! has them. Benchmarks compare as ratios within one run.

use super::args::DeviceArgs;
use crate::estimate::run::Plan;
use crate::memory::mib;
use crate::memory::AllocatorConfig;
use crate::nn::init::Rng;
use crate::nn::ModelSpec;
use crate::ops::matmul::tiles_gpu::{self, GpuLimits};
use crate::ops::matmul::{
    choose_for, plan_split, Gemm, GemmShape, MatmulKernel, ShapeClass, Target, TileConfig,
};
use crate::optim::OptimizerImpl;
use crate::profile::OpTimes;
use crate::tensor::{DType, Engine, Tensor};
use crate::train::{Mode, OptimizerConfig, OptimizerKind};
use clap::Args;
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Square matmul sizes n (n×n · n×n).
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048")]
    pub sizes: Vec<usize>,
    /// Zoo models whose step shapes and whole step to time ("none" for none).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "simple-cnn,mlp,resnet-mini,attention"
    )]
    pub models: Vec<String>,
    /// Batch for the model steps (simple-cnn's article batch is 64).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Timed repetitions per figure (median reported), after one warm-up.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Also time the naive kernel (one output per thread) at each size.
    #[arg(long)]
    pub naive: bool,
    /// Try a grid of tile shapes per shape class and report the best; where
    /// tile tuning is on (GPUs, by default), also time every shape class
    /// again and rewrite the tile cache. On CPU adapters tuning is off
    /// (VRAMLAB_TUNE=on turns it on), and the report says no cache was written.
    #[arg(long)]
    pub tune: bool,
    /// Run the model steps under autocast to this dtype (f16 with the
    /// GradScaler's loss scaling, as `train --amp`): each product shape and
    /// its 1024³ reference square timed in that dtype (on tensor cores where
    /// they run), and the whole step with its device time per op and
    /// kernel. The square sizes, --tune and the mixed-precision section stay
    /// as they are.
    #[arg(long, value_name = "f16|bf16", value_parser = super::args::parse_amp)]
    pub amp: Option<DType>,
    /// The model steps' Adam as torch.optim implements it: foreach
    /// (PyTorch's default on CUDA), for-loop or fused. Under `--amp f16`,
    /// fused takes GradScaler's flag on the device, so the step has no
    /// mid-step wait (the mixed-precision section times both anyway).
    #[arg(long, value_enum, default_value = "foreach")]
    pub optimizer_impl: OptimizerImpl,
    /// Skip the mixed-precision section (square matmul in f16 and bf16 beside
    /// f32; each model's step under autocast f16 / bf16 beside f32,
    /// interleaved rep by rep).
    #[arg(long)]
    pub no_precision: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct SquareRow {
    n: usize,
    tile: String,
    seconds: f64,
    gflops: f64,
    naive_gflops: Option<f64>,
}

#[derive(Debug, Serialize)]
struct ShapeRow {
    shape: GemmShape,
    /// How many times the step issues it.
    count: usize,
    /// The class of the product as issued.
    class: ShapeClass,
    /// Run as Cᵀ = Bᵀ·Aᵀ (with the tile of the transposed product's class).
    transposed: bool,
    tile: String,
    splits: usize,
    seconds: f64,
    gflops: f64,
    /// GFLOP/s over the 1024³ square product's, the square timed again
    /// beside this shape rep by rep; the median of the per-rep ratios.
    of_square: f64,
    /// The 1024³ square product's GFLOP/s in those reps (median).
    square_gflops: f64,
    /// Seconds for the same product with K = 1: writing the output (and
    /// any partial sums) alone. A product with little work per output
    /// cannot run faster than this.
    write_floor_seconds: f64,
    /// The best `of_square` that floor allows.
    ceiling_of_square: f64,
}

#[derive(Debug, Serialize)]
struct StepRow {
    model: String,
    batch: usize,
    /// The autocast dtype the step ran under (`--amp`), or null for f32.
    amp: Option<DType>,
    /// Adam's implementation (`--optimizer-impl`).
    optimizer_impl: OptimizerImpl,
    /// Wall clock of a step with the kernel timer on, and a wait.
    seconds_median: f64,
    seconds_all: Vec<f64>,
    /// Wall clock of the same step with the timer off, each rep right
    /// after a timed one, and the device time of that timed one; their
    /// difference is what the host adds (recording, binding, waiting).
    untimed_seconds_all: Vec<f64>,
    device_seconds_all: Vec<f64>,
    untimed_seconds_median: f64,
    device_seconds_median: f64,
    host_seconds_median: f64,
    device_time: Option<OpTimes>,
    shapes: Vec<ShapeRow>,
}

#[derive(Debug, Serialize)]
struct TuneRow {
    class: String,
    shape: String,
    best: String,
    best_gflops: f64,
    chosen: String,
    chosen_gflops: f64,
    tried: Vec<(String, f64)>,
}

#[derive(Debug, Serialize)]
struct PrecisionRow {
    /// "matmul 1024³" or a model's name.
    what: String,
    /// "f32", "f16", "bf16" (matmul: operands and output) or "amp f16",
    /// "amp bf16" (steps).
    mode: String,
    seconds: f64,
    /// f32's seconds over this mode's (above 1: faster than f32).
    speedup_vs_f32: f64,
    peak_allocated_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
struct BenchReport {
    adapter: String,
    backend: String,
    cpu_adapter: bool,
    /// Whether f16 products run on cooperative matrices (tensor cores).
    tensor_cores: bool,
    /// "device timestamps" or "wall clock with a wait".
    products_timed_by: &'static str,
    reps: usize,
    /// Host time to record and submit one small dispatch (timer off).
    dispatch_overhead: DispatchOverhead,
    square: Vec<SquareRow>,
    models: Vec<StepRow>,
    precision: Vec<PrecisionRow>,
    tune: Vec<TuneRow>,
    /// What tile tuning did in this run (`VRAMLAB_TUNE`; see
    /// `crates/engine/src/ops/matmul/tune.rs`): classes tuned, tiles timed, classes read
    /// from the cache file, and each class's tile.
    tuning: crate::ops::matmul::tune::Stats,
    /// How far K is split (`VRAMLAB_SPLIT_GROUPS`, `VRAMLAB_SPLIT_MIN_K`),
    /// so runs with other values tell themselves apart.
    split: crate::ops::matmul::SplitTargets,
}

/// What the host spends per kernel dispatch: `count` one-element fills
/// recorded with the timer off, submitted as one, then one wait.
#[derive(Debug, Serialize)]
struct DispatchOverhead {
    count: usize,
    /// Median over reps of the recording time per dispatch (validation,
    /// bind group, pass commands; no submit).
    record_micros: f64,
    /// Median over reps of the submit's time, per dispatch.
    submit_micros: f64,
    /// Recording, submit and the wait for the device to finish them.
    total_micros: f64,
    /// Tensors' bind groups made and reused over these dispatches
    /// (`VRAMLAB_BIND_GROUP_CACHE=0` makes one for each).
    bind_groups_made: u64,
    bind_groups_reused: u64,
    /// Median over reps of one 4-byte read back to the host on an idle
    /// device (copy, submit, wait, map): what a loss read or GradScaler's
    /// `found_inf` costs a step (`VRAMLAB_READBACK_REUSE=0`: a new
    /// mappable buffer each read).
    readback_micros: f64,
    /// Median over reps of one fill recorded, submitted and waited for on
    /// an idle device: what each synchronized product pays besides its
    /// kernel (the burn peer's wall clock times such products).
    round_trip_micros: f64,
}

/// Most timed repetitions a figure takes (a bound, so a typo cannot run
/// for days).
const MAX_REPS: usize = 10_000;

/// Measures [`DispatchOverhead`]: `reps` timed runs after a warm-up.
fn dispatch_overhead(e: &Engine, reps: usize) -> anyhow::Result<DispatchOverhead> {
    // Fewer than a submit's worth (MAX_PENDING_COMMANDS), so the recording
    // time is the host's alone, not the device's work started by a submit.
    const COUNT: usize = 200;
    e.stop_timing()?;
    // No early submit inside the 200: the recording is timed alone.
    if let Some(g) = e.gpu() {
        g.hold_submits(true);
    }
    let counts = || e.gpu().map_or((0, 0), |g| g.bind_groups().counts());
    let (made0, reused0) = counts();
    let timed = (|| -> anyhow::Result<[Vec<f64>; 5]> {
        let t = crate::ops::fill::zeros(e, &[1], "bench.dispatch")?;
        let (mut record, mut submit, mut total, mut read, mut trip) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let micros = |d: std::time::Duration| d.as_secs_f64() / COUNT as f64 * 1e6;
        for rep in 0..=reps {
            e.synchronize()?;
            let t0 = Instant::now();
            for i in 0..COUNT {
                crate::ops::fill::fill(&t, i as f32)?;
            }
            let recorded = t0.elapsed();
            if let Some(g) = e.gpu() {
                g.flush();
            }
            let submitted = t0.elapsed();
            e.synchronize()?;
            let waited = t0.elapsed();
            let t1 = Instant::now();
            t.to_vec()?;
            let t2 = Instant::now();
            crate::ops::fill::fill(&t, 0.0)?;
            e.synchronize()?;
            // The first rep compiles the kernel and warms the caches.
            if rep > 0 {
                record.push(micros(recorded));
                submit.push(micros(submitted - recorded));
                total.push(micros(waited));
                read.push((t2 - t1).as_secs_f64() * 1e6);
                trip.push(t2.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok([record, submit, total, read, trip])
    })();
    if let Some(g) = e.gpu() {
        g.hold_submits(false);
    }
    let [record, submit, total, read, trip] = timed?;
    let (made1, reused1) = counts();
    e.start_timing();
    Ok(DispatchOverhead {
        count: COUNT,
        record_micros: median(record),
        submit_micros: median(submit),
        total_micros: median(total),
        bind_groups_made: made1 - made0,
        bind_groups_reused: reused1 - reused0,
        readback_micros: median(read),
        round_trip_micros: median(trip),
    })
}

/// The median of `v` (the upper one of an even count; NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Random operands for `shape`, and its output, all in `dtype`.
fn operands(
    e: &Engine,
    shape: &GemmShape,
    rng: &mut Rng,
    dtype: DType,
) -> anyhow::Result<[Tensor; 3]> {
    let (na, nb, nc) = shape.sizes();
    // Device memory first: a size the device cannot hold is an error before
    // any host memory is spent on its values.
    Ok([
        Tensor::generated(e, &[na], dtype, "bench.a", |n| rng.uniform(n, 1.0))?,
        Tensor::generated(e, &[nb], dtype, "bench.b", |n| rng.uniform(n, 1.0))?,
        Tensor::generated(e, &[nc], dtype, "bench.c", |n| vec![0.0; n])?,
    ])
}

/// Median seconds of `shape` with `kernel`: device time (the sum of its
/// dispatches' timestamps) where the adapter has timestamp queries, else
/// wall clock around the product and a wait.
fn time_gemm(
    e: &Engine,
    shape: &GemmShape,
    kernel: MatmulKernel,
    reps: usize,
    rng: &mut Rng,
) -> anyhow::Result<f64> {
    time_gemm_in(e, shape, kernel, reps, rng, DType::F32)
}

/// [`time_gemm`] with operands and output in `dtype`.
fn time_gemm_in(
    e: &Engine,
    shape: &GemmShape,
    kernel: MatmulKernel,
    reps: usize,
    rng: &mut Rng,
    dtype: DType,
) -> anyhow::Result<f64> {
    let timed = Timed::new(e, shape, kernel, rng, dtype)?;
    let [times] = interleaved(e, [&timed], reps)?;
    Ok(median(times))
}

/// A product with its operands allocated, to be timed run by run.
struct Timed {
    g: Gemm,
    abc: [Tensor; 3],
    kernel: MatmulKernel,
}

impl Timed {
    /// Allocates `shape`'s operands and output in `dtype`, to run with
    /// `kernel`.
    fn new(
        e: &Engine,
        shape: &GemmShape,
        kernel: MatmulKernel,
        rng: &mut Rng,
        dtype: DType,
    ) -> anyhow::Result<Timed> {
        Ok(Timed {
            g: shape.gemm(),
            abc: operands(e, shape, rng, dtype)?,
            kernel,
        })
    }

    /// Whether the tiled kernel runs this product on tensor cores.
    fn on_tensor_cores(&self) -> bool {
        let [a, b, c] = &self.abc;
        crate::ops::matmul::tensor_cores_for(&self.g, a, b, c, None, MatmulKernel::Tiled).is_some()
    }

    /// One run of `kernel` on these operands: device time (the sum of its
    /// dispatches' timestamps) where the adapter has timestamp queries,
    /// else wall clock and a wait.
    fn once_with(&self, e: &Engine, kernel: MatmulKernel) -> anyhow::Result<f64> {
        let [a, b, c] = &self.abc;
        Ok(crate::ops::matmul::tune::seconds_of(
            e,
            &self.g,
            [a, b, c],
            None,
            kernel,
        )?)
    }
}

/// The seconds of each run of each product, the products taken in turn
/// rep by rep after one warm-up each, so that ratios between them share
/// the machine's state (a CPU adapter's speed drifts by half within
/// minutes).
fn interleaved<const N: usize>(
    e: &Engine,
    items: [&Timed; N],
    reps: usize,
) -> anyhow::Result<[Vec<f64>; N]> {
    let runs = items.map(|t| (t, t.kernel));
    let times = in_turn(e, &runs, reps)?;
    times
        .try_into()
        .map_err(|_| anyhow::anyhow!("one time series per product"))
}

/// [`interleaved`] over (product, kernel) pairs: one series per pair.
fn in_turn(
    e: &Engine,
    runs: &[(&Timed, MatmulKernel)],
    reps: usize,
) -> anyhow::Result<Vec<Vec<f64>>> {
    for (t, k) in runs {
        t.once_with(e, *k)?;
    }
    let mut times = vec![Vec::new(); runs.len()];
    for _ in 0..reps.max(1) {
        for ((t, k), v) in runs.iter().zip(times.iter_mut()) {
            v.push(t.once_with(e, *k)?);
        }
    }
    Ok(times)
}

/// The plain n×n · n×n product.
fn square(n: usize) -> GemmShape {
    GemmShape {
        op: format!("square {n}"),
        m: n,
        n,
        k: n,
        batch: 1,
        a_transposed: false,
        b_transposed: false,
        a_shared: false,
        b_shared: false,
        reduce_batch: false,
        conv: None,
    }
}

/// The distinct products one training step of `spec` issues, with counts.
fn step_shapes(
    spec: &ModelSpec,
    batch: usize,
    amp: Option<DType>,
) -> anyhow::Result<Vec<(GemmShape, usize)>> {
    let e = Engine::simulated(AllocatorConfig::default(), None);
    crate::ops::matmul::log_gemms(&e, true);
    let (mut trainer, data) = plan(spec, batch, amp, OptimizerImpl::default()).trainer(&e, 0)?;
    trainer.step(&data)?;
    // Products of one shape from different ops (attention's q, k, v and
    // out projections) share a row, named by the first op and how many
    // others it stands for.
    let mut shapes: Vec<(GemmShape, usize, Vec<String>)> = Vec::new();
    for s in crate::ops::matmul::take_gemms(&e) {
        match shapes.iter_mut().find(|(x, ..)| {
            GemmShape {
                op: s.op.clone(),
                ..x.clone()
            } == s
        }) {
            Some((_, n, ops)) => {
                *n += 1;
                if !ops.contains(&s.op) {
                    ops.push(s.op.clone());
                }
            }
            None => {
                let op = s.op.clone();
                shapes.push((s, 1, vec![op]));
            }
        }
    }
    Ok(shapes
        .into_iter()
        .map(|(mut s, n, ops)| {
            if ops.len() > 1 {
                s.op = format!("{} +{} ops", ops[0], ops.len() - 1);
            }
            (s, n)
        })
        .collect())
}

/// One Adam training step of `spec` at `batch` (torch.optim's defaults),
/// under autocast to `amp` where given.
fn plan(spec: &ModelSpec, batch: usize, amp: Option<DType>, implementation: OptimizerImpl) -> Plan {
    Plan {
        model: spec.clone(),
        batch,
        optimizer: OptimizerConfig::new(OptimizerKind::Adam, None, None, None)
            .with_impl(implementation),
        mode: Mode::Train,
        amp,
        dtype: crate::tensor::DType::F32,
        loss: Default::default(),
        config: AllocatorConfig::default(),
    }
}

/// Tile shapes `--tune` tries: the GPU family within the adapter's
/// limits on GPUs; on CPU adapters the direct family (staging in workgroup
/// memory never paid there), and on 8-lane ones its subgroup-A tiles.
fn candidates(e: &Engine, cpu: bool, subgroup8: bool) -> Vec<TileConfig> {
    let mut v = Vec::new();
    if !cpu {
        let limits = e
            .gpu()
            .map_or(GpuLimits::DEFAULT, |g| GpuLimits::of(&g.limits));
        for class in [ShapeClass::Square, ShapeClass::Narrow, ShapeClass::Short] {
            for t in tiles_gpu::candidates(class, 16, &limits) {
                if !v.contains(&t) {
                    v.push(t);
                }
            }
        }
        return v;
    }
    if subgroup8 {
        // Sharing A's loads wins on 8-lane subgroups (26 vs 9 GFLOP/s at
        // 1024³ on llvmpipe): tune within that family, with the vec4
        // accesses the chosen tiles ask for, columns contiguous or strided
        // across the lanes, and thread tiles up to 64 rows, so the chosen
        // tile is among the candidates and the best is a like-for-like
        // rival.
        for wy in [1, 2, 4] {
            for (tm, tn) in [
                (16, 4),
                (16, 8),
                (32, 2),
                (32, 4),
                (32, 8),
                (32, 16),
                (48, 8),
                (64, 4),
                (64, 8),
            ] {
                for strided in [false, true] {
                    let mut t = TileConfig::new(8, wy, tm, tn, 16, false)
                        .with_subgroup_a()
                        .with_vec4();
                    t.strided_cols = strided;
                    v.push(t);
                }
            }
        }
        return v;
    }
    for (wx, wy) in [
        (8, 8),
        (16, 16),
        (8, 16),
        (16, 8),
        (16, 4),
        (4, 16),
        (32, 8),
        (8, 32),
    ] {
        for (tm, tn) in [(2, 2), (4, 4), (4, 8), (8, 4), (8, 8), (2, 4), (4, 2)] {
            for strided in [false, true] {
                let mut t = TileConfig::new(wx, wy, tm, tn, 16, false);
                t.strided_cols = strided;
                if t.is_valid() && wx * wy >= 32 {
                    v.push(t);
                }
            }
        }
    }
    v
}

/// Runs `vramlab bench`: each section in turn over one engine, then the
/// JSON report with `--json`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let specs = check_flags(args)?;
    if args.tune {
        // Every shape class timed again, and the cache file's entries for
        // them replaced.
        crate::ops::matmul::tune::retune();
    }
    let mut ctx = Ctx::new(args)?;
    let mut report = start_report(&ctx)?;
    squares(&mut ctx, &mut report)?;
    let reference = Reference::new(&mut ctx)?;
    for (name, spec) in specs {
        let row = model_step(&mut ctx, &reference, name, &spec)?;
        report.models.push(row);
    }
    if !args.no_precision {
        precision(&mut ctx, &mut report)?;
    }
    if args.tune {
        tune(&mut ctx, &mut report)?;
    }
    finish(&ctx, &mut report)
}

/// Refuses bad flags before the first (possibly long) measurement;
/// returns the models to time, by name.
fn check_flags(args: &BenchArgs) -> anyhow::Result<Vec<(String, ModelSpec)>> {
    super::args::at_least_one(&[("--reps", args.reps as u64), ("--batch", args.batch as u64)])?;
    if args.reps > MAX_REPS {
        anyhow::bail!(
            "--reps {} is more than {MAX_REPS}: each figure is the median of that many timed runs; a median settles within tens",
            args.reps
        );
    }
    if args.sizes.contains(&0) {
        anyhow::bail!("--sizes: 0 is not a matrix size");
    }
    if let Some(n) = args.sizes.iter().find(|&&n| {
        n.checked_mul(n)
            .and_then(|e| e.checked_mul(4))
            .is_none_or(|b| b as u64 > crate::memory::constants::MAX_BYTES)
    }) {
        anyhow::bail!(
            "--sizes {n}: an {n}×{n} f32 matrix is more than 2^62 bytes, more than any device holds; give sizes such as 1024,2048"
        );
    }
    // A size or model listed twice would be timed twice.
    super::args::listed_once("--sizes", &args.sizes)?;
    super::args::listed_once("--models", &args.models)?;
    if args.models.len() > 1 && args.models.iter().any(|m| m == "none") {
        anyhow::bail!("--models none times no model: give it alone, or list the models to time");
    }
    if args.amp.is_some() && args.models.iter().all(|m| m == "none") {
        anyhow::bail!("--amp runs the model steps under autocast, and --models none times no model; list the models to time (the square products are f32 either way)");
    }
    args.models
        .iter()
        .filter(|m| m.as_str() != "none")
        .map(|m| ModelSpec::default_for(m).map(|s| (m.clone(), s)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::from)
}

/// What every section shares: the flags, the engine (timing on), what the
/// adapter is, and the rng the operands come from.
struct Ctx<'a> {
    args: &'a BenchArgs,
    e: Engine,
    cpu: bool,
    target: Target,
    timing: Option<crate::device::TimingSource>,
    rng: Rng,
}

impl<'a> Ctx<'a> {
    /// Opens the engine and turns its kernel timer on.
    fn new(args: &'a BenchArgs) -> anyhow::Result<Ctx<'a>> {
        let e = args.device.engine(AllocatorConfig::default())?;
        let cpu = e.is_cpu_adapter();
        let target = Target::of(&e);
        let timing = e.start_timing();
        Ok(Ctx {
            args,
            e,
            cpu,
            target,
            timing,
            rng: Rng::new(1),
        })
    }

    /// The dtype the model steps' products run in (`--amp`, else f32).
    fn step_dtype(&self) -> DType {
        self.args.amp.unwrap_or(DType::F32)
    }

    /// Prints a line of text (nothing with `--json`).
    fn say(&self, s: String) {
        if !self.args.json {
            println!("{s}");
        }
    }

    /// How products are timed on this adapter.
    fn timed_by(&self) -> &'static str {
        if self.e.has_timestamp_queries() {
            "device timestamps"
        } else {
            "wall clock with a wait"
        }
    }
}

/// Prints the adapter, the f16 products' kernels and the host's cost per
/// dispatch (measured here); the report with those filled in.
fn start_report(ctx: &Ctx) -> anyhow::Result<BenchReport> {
    let (e, args) = (&ctx.e, ctx.args);
    ctx.say(format!(
        "vramlab bench on {} ({}), {} adapter; median of {} after a warm-up; products timed by {}",
        e.device_name(),
        e.backend_name(),
        if ctx.cpu { "CPU" } else { "GPU" },
        super::count(args.reps as u64, "run"),
        ctx.timed_by()
    ));
    let tensor_cores = e.tensor_core_lanes();
    ctx.say(format!(
        "f16 products: {}",
        match tensor_cores {
            Some(lanes) => {
                let side = e.tensor_core_size().unwrap_or(8);
                format!(
                    "on tensor cores (cooperative matrices, {side}×{side}×{side} f16→f32, subgroups of {lanes} lanes; a K split's slices each on them)"
                )
            }
            None => "plain tiled kernels (no f16 cooperative matrices in use; see `vramlab info`)".into(),
        }
    ));
    let report = BenchReport {
        adapter: e.device_name(),
        backend: e.backend_name().into(),
        cpu_adapter: ctx.cpu,
        tensor_cores: tensor_cores.is_some(),
        products_timed_by: ctx.timed_by(),
        reps: args.reps,
        dispatch_overhead: dispatch_overhead(e, args.reps)?,
        square: Vec::new(),
        models: Vec::new(),
        precision: Vec::new(),
        tune: Vec::new(),
        tuning: Default::default(),
        split: crate::ops::matmul::SplitTargets::in_effect(),
    };
    let o = &report.dispatch_overhead;
    ctx.say(format!(
        "host cost per dispatch ({} one-element fills, timer off, one submit): {:.2} µs to record, {:.2} µs to submit, {:.1} µs with the wait; bind groups {} made, {} reused\none dispatch recorded, submitted and waited for: {:.1} µs; a 4-byte read back to the host (a loss, GradScaler's found_inf): {:.1} µs",
        o.count, o.record_micros, o.submit_micros, o.total_micros, o.bind_groups_made, o.bind_groups_reused, o.round_trip_micros, o.readback_micros
    ));
    Ok(report)
}

/// The square matmuls of `--sizes` (and the naive kernel with `--naive`),
/// printed and added to the report.
fn squares(ctx: &mut Ctx, report: &mut BenchReport) -> anyhow::Result<()> {
    let args = ctx.args;
    ctx.say("\nsquare matmul (n×n · n×n):".into());
    for &n in &args.sizes {
        let s = square(n);
        let secs = time_gemm(&ctx.e, &s, MatmulKernel::Tiled, args.reps, &mut ctx.rng)
            .map_err(|e| square_too_large(e, n))?;
        let naive = if args.naive {
            Some(
                s.flops()
                    / time_gemm(
                        &ctx.e,
                        &s,
                        MatmulKernel::Naive,
                        args.reps.min(2),
                        &mut ctx.rng,
                    )?
                    / 1e9,
            )
        } else {
            None
        };
        let row = SquareRow {
            n,
            tile: choose_for(&ctx.e, &s.gemm(), (DType::F32, DType::F32), false).describe(),
            seconds: secs,
            gflops: s.flops() / secs / 1e9,
            naive_gflops: naive,
        };
        ctx.say(format!(
            "  {n:>5}³  {:>9.2} GFLOP/s  {:>9.3} ms  tile {}{}",
            row.gflops,
            secs * 1e3,
            row.tile,
            naive
                .map(|g| format!("  (naive {g:.2} GFLOP/s)"))
                .unwrap_or_default()
        ));
        report.square.push(row);
    }
    Ok(())
}

/// An out-of-memory error of an `--sizes` product says which size and what
/// to change (the allocator's own advice is about batches).
fn square_too_large(e: anyhow::Error, n: usize) -> anyhow::Error {
    let bytes = 3u64
        .saturating_mul((n as u64).saturating_pow(2))
        .saturating_mul(4);
    // The device's binding limit refuses it too (a K split's partial sums
    // can pass it before the matrices pass the memory): its own advice
    // names a batch, which --sizes has none of.
    if super::is_unbindable(&e) {
        return anyhow::anyhow!(
            "--sizes {n}: the {n}³ product (three f32 matrices of {}, and the partial sums of its K split) binds more memory in one kernel than this device can; give smaller --sizes, or do what the device says: {e:#}",
            crate::memory::format_size(bytes)
        );
    }
    if !super::is_oom(&e) {
        return e;
    }
    anyhow::anyhow!(
        "--sizes {n}: the {n}³ product's three f32 matrices ({}) do not fit this device; give smaller --sizes. The allocator said: {e:#}",
        crate::memory::format_size(bytes)
    )
}

/// The square product each shape's share is taken against, timed again
/// beside every shape, rep by rep: 1024³ whatever `--sizes` holds, so
/// shares compare across runs and a large size does not multiply the
/// run's length.
struct Reference {
    n: usize,
    shape: GemmShape,
    timed: Timed,
}

impl Reference {
    /// Allocates the 1024³ reference product's operands in the model
    /// steps' dtype (kept to the end of the run).
    fn new(ctx: &mut Ctx) -> anyhow::Result<Reference> {
        let n = 1024;
        let shape = square(n);
        let dtype = ctx.step_dtype();
        let timed = Timed::new(&ctx.e, &shape, MatmulKernel::Tiled, &mut ctx.rng, dtype)?;
        Ok(Reference { n, shape, timed })
    }
}

/// One model's section: every product its step issues, timed beside the
/// reference square, then the whole step.
fn model_step(
    ctx: &mut Ctx,
    reference: &Reference,
    name: String,
    spec: &ModelSpec,
) -> anyhow::Result<StepRow> {
    ctx.say(format!(
        "\n{} step, batch {}, Adam{}{} (each product's share of the {}³ {} square's rate: the square timed beside it, rep by rep):",
        spec.describe(),
        ctx.args.batch,
        match ctx.args.optimizer_impl {
            OptimizerImpl::Foreach => String::new(),
            i => format!(" ({})", i.name()),
        },
        ctx.args
            .amp
            .map(|d| format!(", autocast {d}"))
            .unwrap_or_default(),
        reference.n,
        ctx.step_dtype()
    ));
    let step = step_shapes(spec, ctx.args.batch, ctx.args.amp)?;
    // The op column fits the longest op name, so every row lines up.
    let width = step
        .iter()
        .map(|(s, _)| s.op.chars().count())
        .max()
        .unwrap_or(0)
        .max(16);
    let mut shapes = Vec::new();
    for (shape, count) in step {
        shapes.push(shape_row(ctx, reference, shape, count, width)?);
    }
    whole_step(ctx, name, spec, shapes)
}

/// One product of a model's step: timed beside the reference square and
/// beside its own K = 1 floor, printed.
fn shape_row(
    ctx: &mut Ctx,
    reference: &Reference,
    shape: GemmShape,
    count: usize,
    width: usize,
) -> anyhow::Result<ShapeRow> {
    let (e, dtype) = (&ctx.e, ctx.step_dtype());
    let choice = choose_for(e, &shape.gemm(), (dtype, dtype), false);
    // The same outputs from a one-deep product: what writing them
    // (and any partial sums) costs with no arithmetic to speak of.
    let floor_shape = GemmShape {
        k: 1,
        conv: None,
        ..shape.clone()
    };
    let product = Timed::new(e, &shape, MatmulKernel::Tiled, &mut ctx.rng, dtype)?;
    let on_cores = product.on_tensor_cores();
    let [times, square_times, floor_times] = interleaved(
        e,
        [
            &product,
            &reference.timed,
            &Timed::new(e, &floor_shape, MatmulKernel::Tiled, &mut ctx.rng, dtype)?,
        ],
        ctx.args.reps,
    )?;
    let secs = median(times.clone());
    let floor = median(floor_times.clone());
    let gflops = shape.flops() / secs / 1e9;
    // Shares rep by rep (against the square timed beside it), then
    // their median.
    let share = |t: &[f64]| {
        median(
            t.iter()
                .zip(&square_times)
                .map(|(x, sq)| sq / x * shape.flops() / reference.shape.flops())
                .collect(),
        )
    };
    let row = ShapeRow {
        write_floor_seconds: floor,
        ceiling_of_square: share(&floor_times),
        square_gflops: reference.shape.flops() / median(square_times.clone()) / 1e9,
        count,
        class: ShapeClass::of(shape.m, shape.n, shape.k),
        transposed: choice.transposed && !on_cores,
        tile: if on_cores {
            TENSOR_CORES.to_string()
        } else {
            choice.describe()
        },
        splits: plan_split(&shape.gemm()).splits,
        seconds: secs,
        gflops,
        of_square: share(&times),
        shape,
    };
    ctx.say(shape_line(&row, width));
    Ok(row)
}

/// A shape row's tile where the product runs on cooperative matrices.
const TENSOR_CORES: &str = "tensor cores";

/// A product's line: its shape, rate, share of the square's, the bound
/// writing its output sets, its class and split; the op name padded to
/// `width`.
fn shape_line(row: &ShapeRow, width: usize) -> String {
    let s = &row.shape;
    format!(
        "  {:<width$} ×{:<2} {:>5}×{:<6}·K {:<6} batch {:<3}{}{} {:>8.2} GFLOP/s ({:>3.0}% of square{}) {:?}{}, split {}",
        s.op,
        row.count,
        s.m,
        s.n,
        s.k,
        s.batch,
        if s.reduce_batch { " summed" } else { "       " },
        match (s.a_transposed, s.b_transposed) {
            (true, true) => " AᵀBᵀ",
            (true, false) => " AᵀB ",
            (false, true) => " ABᵀ ",
            (false, false) => " AB  ",
        },
        row.gflops,
        row.of_square * 100.0,
        // Said only where writing the output bounds the rate below the
        // square's, and the product did not outrun that bound (then the
        // floor's timing was noise).
        if row.ceiling_of_square < 1.0 && row.ceiling_of_square >= row.of_square {
            format!(
                "; writing C alone {:.1} ms: at most {:.0}%",
                row.write_floor_seconds * 1e3,
                row.ceiling_of_square * 100.0
            )
        } else {
            String::new()
        },
        row.class,
        if row.transposed {
            format!(
                " run as Cᵀ ({:?})",
                ShapeClass::of(row.shape.n, row.shape.m, row.shape.k)
            )
        } else if row.tile == TENSOR_CORES {
            " on tensor cores".to_string()
        } else {
            String::new()
        },
        row.splits
    )
}

/// The whole training step of `spec`: wall clock with the timer on, and
/// each rep again untimed beside it (the host's share); printed.
fn whole_step(
    ctx: &mut Ctx,
    name: String,
    spec: &ModelSpec,
    shapes: Vec<ShapeRow>,
) -> anyhow::Result<StepRow> {
    let (e, args) = (&ctx.e, ctx.args);
    let (mut t, data) = plan(spec, args.batch, args.amp, args.optimizer_impl).trainer(e, 0)?;
    t.step(&data)?;
    e.take_dispatch_times()?;
    let (mut secs, mut untimed, mut device) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..args.reps {
        let t0 = Instant::now();
        t.step(&data)?;
        e.synchronize()?;
        secs.push(t0.elapsed().as_secs_f64());
        last = e.take_dispatch_times()?;
        if let Some((_, times)) = &last {
            device.push(times.iter().map(|d| d.seconds).sum::<f64>());
            // The same step untimed: its wall clock less the device
            // time just measured is the host's share.
            e.stop_timing()?;
            let t0 = Instant::now();
            t.step(&data)?;
            e.synchronize()?;
            untimed.push(t0.elapsed().as_secs_f64());
            e.start_timing();
        }
    }
    let device_time = match (ctx.timing, last) {
        (Some(_), Some((source, times))) => Some(OpTimes::of(source, &times)),
        _ => None,
    };
    let med = median(secs.clone());
    ctx.say(format!("  whole step: {:.1} ms (median)", med * 1e3));
    let host: Vec<f64> = untimed.iter().zip(&device).map(|(w, d)| w - d).collect();
    let (untimed_med, device_med, host_med) = if host.is_empty() {
        (f64::NAN, f64::NAN, f64::NAN)
    } else {
        (
            median(untimed.clone()),
            median(device.clone()),
            median(host),
        )
    };
    if !device.is_empty() {
        // An untimed step under its device time is run-to-run noise (a CPU
        // adapter's timestamps and clock share its cores): nothing to add.
        let host = if host_med >= 0.0 {
            format!("the host adds {:.2} ms", host_med * 1e3)
        } else {
            format!(
                "the host adds nothing measurable (the untimed step ran {:.2} ms under: noise)",
                -host_med * 1e3
            )
        };
        ctx.say(format!(
            "  untimed step {:.2} ms, device time {:.2} ms: {host} (medians of {})",
            untimed_med * 1e3,
            device_med * 1e3,
            super::count(device.len() as u64, "pair")
        ));
    }
    if let Some(d) = &device_time {
        ctx.say(d.table(8));
    }
    Ok(StepRow {
        model: name,
        batch: args.batch,
        amp: args.amp,
        optimizer_impl: args.optimizer_impl,
        seconds_median: med,
        seconds_all: secs,
        untimed_seconds_all: untimed,
        device_seconds_all: device,
        untimed_seconds_median: untimed_med,
        device_seconds_median: device_med,
        host_seconds_median: host_med,
        device_time,
        shapes,
    })
}

/// `--tune`: every candidate tile on the first square size and on each
/// distinct product the models issued, the best beside the chosen one.
fn tune(ctx: &mut Ctx, report: &mut BenchReport) -> anyhow::Result<()> {
    ctx.say("\ntuning (every candidate tile per shape class, each timed again here, so a figure may differ from the same tile's above):".into());
    let first = ctx.args.sizes.first().copied().unwrap_or(1024);
    let mut probes: Vec<(String, GemmShape)> = vec![("square".into(), square(first))];
    for m in &report.models {
        for s in &m.shapes {
            let class = format!("{:?}", s.class).to_lowercase();
            if !probes
                .iter()
                .any(|(_, p)| p.m == s.shape.m && p.n == s.shape.n && p.k == s.shape.k)
            {
                probes.push((class, s.shape.clone()));
            }
        }
    }
    let bar = super::progress::bar(probes.len() as u64, "tune", ctx.args.json);
    for (class, shape) in probes {
        bar.set_message(class.clone());
        let row = tune_one(ctx, class, shape)?;
        ctx.say(format!(
            "  {:<8} {:<44} best {:<28} {:>8.2} GFLOP/s; chosen {} {:.2} GFLOP/s",
            row.class, row.shape, row.best, row.best_gflops, row.chosen, row.chosen_gflops
        ));
        report.tune.push(row);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if !crate::ops::matmul::tune::enabled(&ctx.e) {
        ctx.say(
            "  (tile tuning is off on this adapter, so these timings choose nothing and no tile cache was written: VRAMLAB_TUNE=auto leaves it off on CPU adapters; VRAMLAB_TUNE=on tunes and caches)".into(),
        );
    }
    Ok(())
}

/// Every candidate tile (and the chosen one) on one product, ranked by
/// GFLOP/s.
fn tune_one(ctx: &mut Ctx, class: String, shape: GemmShape) -> anyhow::Result<TuneRow> {
    // Every candidate on one set of operands, taken in turn rep by
    // rep, so the ranking is not the machine's drift.
    let e = &ctx.e;
    let timed = Timed::new(e, &shape, MatmulKernel::Tiled, &mut ctx.rng, DType::F32)?;
    let mut kernels: Vec<(String, MatmulKernel)> =
        candidates(e, ctx.cpu, ctx.target == Target::CpuSubgroup8)
            .into_iter()
            .map(|t| (t.describe(), MatmulKernel::Fixed(t)))
            .collect();
    let chosen = choose_for(e, &shape.gemm(), (DType::F32, DType::F32), false).describe();
    // A transposed choice is not among the candidates (they run
    // as issued): time it as the models run it.
    if !kernels.iter().any(|(name, _)| *name == chosen) {
        kernels.push((chosen.clone(), MatmulKernel::Tiled));
    }
    let runs: Vec<(&Timed, MatmulKernel)> = kernels.iter().map(|(_, k)| (&timed, *k)).collect();
    let times = in_turn(e, &runs, ctx.args.reps.min(3))?;
    let mut tried: Vec<(String, f64)> = kernels
        .into_iter()
        .zip(times)
        .map(|((name, _), t)| (name, shape.flops() / median(t) / 1e9))
        .collect();
    let chosen_gflops = tried
        .iter()
        .find(|t| t.0 == chosen)
        .map_or(f64::NAN, |t| t.1);
    tried.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(TuneRow {
        class: class.clone(),
        shape: format!(
            "{} {}×{}·K{} batch {}",
            shape.op, shape.m, shape.n, shape.k, shape.batch
        ),
        best: tried[0].0.clone(),
        best_gflops: tried[0].1,
        chosen,
        chosen_gflops,
        tried: tried.into_iter().take(8).collect(),
    })
}

/// Adds what tile tuning did in this run to the report, says it, and
/// prints the JSON report with `--json`.
fn finish(ctx: &Ctx, report: &mut BenchReport) -> anyhow::Result<()> {
    report.tuning = crate::ops::matmul::tune::stats();
    let t = &report.tuning;
    if t.tuned + t.from_cache > 0 {
        ctx.say(format!(
            "\ntile tuning: {} shape classes timed ({} tiles, {} kernels compiled ahead), {} read from {}",
            t.tuned,
            t.timed,
            t.compiled_ahead,
            t.from_cache,
            t.cache.as_deref().unwrap_or("no cache file")
        ));
    }
    if ctx.args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// Mixed precision on this adapter: the square product at 1024 (or the
/// first size) in each dtype, then each model's step under autocast.
fn precision(ctx: &mut Ctx, report: &mut BenchReport) -> anyhow::Result<()> {
    let dtypes = [DType::F32, DType::F16, DType::Bf16];
    if !ctx.e.has_shader_f16() {
        ctx.say(
            "\n(no native f16 on this adapter: f16 is stored packed and computed in f32)".into(),
        );
    }
    precision_square(ctx, report, &dtypes)?;
    for name in ctx.args.models.iter().filter(|m| m.as_str() != "none") {
        precision_step(ctx, report, name, &dtypes)?;
    }
    Ok(())
}

/// The square product at 1024 (or the first size) with operands and
/// output in each dtype, beside f32's speed.
fn precision_square(
    ctx: &mut Ctx,
    report: &mut BenchReport,
    dtypes: &[DType],
) -> anyhow::Result<()> {
    let args = ctx.args;
    let n = if args.sizes.contains(&1024) {
        1024
    } else {
        args.sizes.first().copied().unwrap_or(1024)
    };
    ctx.say(format!(
        "\nmixed precision: matmul {n}³, operands and output in each dtype:"
    ));
    let s = square(n);
    let mut f32_secs = f64::NAN;
    for &d in dtypes {
        let secs = time_gemm_in(&ctx.e, &s, MatmulKernel::Tiled, args.reps, &mut ctx.rng, d)?;
        if d == DType::F32 {
            f32_secs = secs;
        }
        ctx.say(format!(
            "  {:<5} {:>9.2} GFLOP/s  {:>9.3} ms  {:.2}× f32's speed",
            d.to_string(),
            s.flops() / secs / 1e9,
            secs * 1e3,
            f32_secs / secs
        ));
        report.precision.push(PrecisionRow {
            what: format!("matmul {n}³"),
            mode: d.to_string(),
            seconds: secs,
            speedup_vs_f32: f32_secs / secs,
            peak_allocated_bytes: None,
        });
    }
    Ok(())
}

/// Model `name`'s training step in f32 and under autocast to each 16-bit
/// dtype, the trainers stepped in turn each rep so the ratios share the
/// machine's state; each with its simulated peak.
fn precision_step(
    ctx: &Ctx,
    report: &mut BenchReport,
    name: &str,
    dtypes: &[DType],
) -> anyhow::Result<()> {
    let (e, args) = (&ctx.e, ctx.args);
    let spec = ModelSpec::default_for(name).map_err(anyhow::Error::msg)?;
    let amps: Vec<Option<DType>> = std::iter::once(None)
        .chain(dtypes.iter().skip(1).map(|&d| Some(d)))
        .collect();
    // Then f16 autocast with fused Adam, whose kernels take GradScaler's
    // flag on the device (no wait mid-step), beside f32 with fused Adam.
    let mut modes: Vec<(Option<DType>, OptimizerImpl)> = amps
        .iter()
        .map(|&a| (a, OptimizerImpl::default()))
        .collect();
    if amps.contains(&Some(DType::F16)) {
        modes.push((None, OptimizerImpl::Fused));
        modes.push((Some(DType::F16), OptimizerImpl::Fused));
    }
    let mut runs = Vec::new();
    for &(amp, implementation) in &modes {
        let p = plan(&spec, args.batch, amp, implementation);
        // The steady-state peak of this model alone (the trainers share
        // the device here): two steps on a simulated device.
        let sim = Engine::simulated(AllocatorConfig::default(), None);
        let profile = crate::estimate::run::run_steps(sim, &p, 0, 2)?;
        let peak =
            crate::estimate::analyze(&profile.events, &profile.layer_outputs).peak_allocated_bytes;
        let (mut t, data) = p.trainer(e, 0)?;
        t.step(&data)?;
        runs.push((t, data, Vec::new(), peak));
    }
    e.synchronize()?;
    e.take_dispatch_times()?;
    // Wall clock with the kernel timer off, as a user's step runs: timed,
    // every dispatch has its own pass and submit, which weighs on the
    // 16-bit steps' extra casts out of proportion.
    e.stop_timing()?;
    for _ in 0..args.reps {
        for (t, data, secs, _) in runs.iter_mut() {
            let t0 = Instant::now();
            t.step(data)?;
            e.synchronize()?;
            secs.push(t0.elapsed().as_secs_f64());
        }
    }
    if ctx.timing.is_some() {
        e.start_timing();
    }
    ctx.say(format!(
        "  {} step, batch {} (interleaved, wall clock, kernel timer off):",
        spec.describe(),
        args.batch
    ));
    let base = median(runs[0].2.clone());
    for ((amp, implementation), (_, _, secs, peak)) in modes.iter().zip(runs) {
        let med = median(secs);
        let mut mode = amp.map_or("f32".to_string(), |d| format!("amp {d}"));
        if *implementation == OptimizerImpl::Fused {
            mode += ", fused Adam";
        }
        ctx.say(format!(
            "    {:<20} {:>9.1} ms  {:.2}× f32's speed  peak {:.2} MiB",
            mode,
            med * 1e3,
            base / med,
            mib(peak)
        ));
        report.precision.push(PrecisionRow {
            what: name.to_string(),
            mode,
            seconds: med,
            speedup_vs_f32: base / med,
            peak_allocated_bytes: Some(peak),
        });
    }
    Ok(())
}
