//! The command line: parsing, and one file per command.

pub mod alloc_grid;
pub mod args;
pub mod bench;
pub mod bench_alloc;
pub mod demo;
pub mod doctor;
pub mod doctor_page;
pub mod estimate;
pub mod estimate_layout;
pub mod info;
pub mod layout_args;
pub mod lessons;
pub mod max_batch;
pub mod models;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod recorded;
pub mod replay;
pub mod sweep;
pub mod train;

use clap::{Parser, Subcommand};

/// vramlab: a GPU compute engine on wgpu that makes GPU memory visible.
///
/// Every tensor lives in memory handed out by vramlab's own caching allocator,
/// which follows PyTorch's CUDA caching allocator rule for rule and reports the
/// same statistics (allocated, reserved, peaks, fragmentation).
#[derive(Debug, Parser)]
#[command(name = "vramlab", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train the articles' SimpleConvNet (batch 64, Adam, 2 steps) on the GPU
    /// and show its memory next to the numbers the article printed.
    Demo(demo::DemoArgs),
    /// Show the GPU adapters, the one chosen and why, the limits that decide
    /// what fits, the features, and the driver's own allocator report.
    Info(info::InfoArgs),
    /// Train a zoo model and print, per step, the loss and allocated /
    /// reserved / peak memory; load PyTorch weights and batches, dump results.
    Train(Box<train::TrainArgs>),
    /// Predict a step's memory without a GPU (per layer, category, phase;
    /// peak allocated and reserved), optionally measured beside it.
    Estimate(Box<estimate::EstimateArgs>),
    /// The parallel layouts of a GPU count (data × tensor × pipeline, DDP /
    /// ZeRO 1-3 / FSDP, recomputation, micro-batch) whose every rank fits a
    /// GPU's memory, each rank replayed through the caching allocator,
    /// ranked by a stated step-time cost.
    ///
    /// Layouts: tensor parallel up to --max-tp (with sequence parallelism
    /// where the sequence divides by it),
    /// pipeline stages under 1F1B, the data-parallel rest with DDP, ZeRO-1,
    /// 2, 3 or FSDP, each recomputation, micro-batches of 1, 2, 4 and 8
    /// sequences (at most 200,000 layer passes a stage). Each layout's
    /// first and last stage are replayed; those listed, every stage whole.
    ///
    /// Step time: 6 · parameters · tokens / GPUs at --tflops (×4/3 with
    /// full recomputation) over 1 − the bubble (p − 1)/(m + p − 1), plus
    /// data- and pipeline-parallel bytes at --network-gbs and
    /// tensor-parallel bytes at --nvlink-gbs, none overlapped; ties go to
    /// the layout with more memory left. When none fits, the closest are
    /// listed and the command exits 1.
    Plan(Box<plan::PlanArgs>),
    /// Record every allocator event of training steps and write a timeline
    /// (SVG and interactive HTML), a Chrome trace, the snapshot at the peak
    /// and a PyTorch snapshot pickle; a step that runs out of memory still
    /// writes them, up to the refusal.
    Profile(Box<profile::ProfileArgs>),
    /// How peak memory grows with batch size, resolution or sequence length:
    /// estimated (and measured) points, a fitted line and power law, a plot.
    Sweep(Box<sweep::SweepArgs>),
    /// Kernel speed on this adapter: square matmuls, every product shape of
    /// each zoo model's step (with the time its output alone takes to write,
    /// which bounds shallow products), the whole step with device time per
    /// phase and op; --tune times tile shapes per shape class again and,
    /// where tuning is on (GPUs by default: VRAMLAB_TUNE=auto|on|off),
    /// rewrites the tile cache.
    Bench(Box<bench::BenchArgs>),
    /// Run the built-in allocation workloads (vramlab's own training traces
    /// and synthetic fragmentation patterns) through every allocator strategy.
    BenchAlloc(bench_alloc::BenchAllocArgs),
    /// The largest batch that trains within a memory limit: estimator
    /// bracket, then binary search on the GPU with out-of-memory recovery.
    MaxBatch(Box<max_batch::MaxBatchArgs>),
    /// List the model zoo: each model, its sizes, parameter count and names.
    Models(models::ModelsArgs),
    /// Run an allocation trace (JSON Lines, or a PyTorch memory snapshot
    /// pickle) through the caching allocator on a simulated device and print
    /// the statistics PyTorch would report; --allocators compares strategies.
    Replay(replay::ReplayArgs),
    /// Read a PyTorch memory snapshot and say why it ran out of memory and
    /// what would have saved it: the recorded settings beside
    /// expandable_segments, max_split_size_mb and an offline planner's
    /// packing (it knows every lifetime), each replayed; what is live at
    /// the peak by category, module and the user's code; plain advice.
    Doctor(doctor::DoctorArgs),
    /// The documents' claims, one lesson each: list them, or with --report
    /// DIR run them all into one HTML page with plots.
    Lessons(lessons::LessonsArgs),
    /// Run one lesson: the claim, the experiment, the measured figures and
    /// the verdict (holds / wrong / partly / out of scope) with why.
    Lesson(lessons::LessonArgs),
}

impl Cli {
    /// Parses `argv` as `Cli::try_parse_from` does, with negative numbers
    /// taken as values (`--headroom -0.1` reaches the flag's own range
    /// check, instead of clap's "unexpected argument '-0'").
    pub fn try_parse_args<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let mut cmd = Cli::command();
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        for name in names {
            cmd = cmd.mut_subcommand(name, |s| s.allow_negative_numbers(true));
        }
        let matches = cmd.try_get_matches_from(argv)?;
        Cli::from_arg_matches(&matches)
    }
}

impl Command {
    /// Whether the user asked for `--json`: then a failure is also written
    /// to stdout as JSON, so a program reading stdout always gets a document.
    pub fn json(&self) -> bool {
        match self {
            Command::Demo(a) => a.json,
            Command::Info(a) => a.json,
            Command::Train(a) => a.json,
            Command::Estimate(a) => a.json,
            Command::Plan(a) => a.json,
            Command::Profile(a) => a.json,
            Command::Sweep(a) => a.json,
            Command::Bench(a) => a.json,
            Command::BenchAlloc(a) => a.json,
            Command::MaxBatch(a) => a.json,
            Command::Models(a) => a.json,
            Command::Replay(a) => a.json,
            Command::Doctor(a) => a.json,
            Command::Lessons(a) => a.json,
            Command::Lesson(a) => a.json,
        }
    }
}

/// A failed command as `--json` reports it on stdout: `error` is the whole
/// message stderr shows, `causes` its chain outermost first, `exit_code`
/// the process's (1 for a failed command, 2 for bad flags).
pub fn error_json(error: &str, causes: &[String], exit_code: i32) -> String {
    let v = serde_json::Value::Object(failure(error, causes, exit_code));
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| String::from("{}"))
}

/// The fields every failure document has, for `error_json` and
/// `fail_in_json` alike.
fn failure(
    error: &str,
    causes: &[String],
    exit_code: i32,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("error".into(), error.into());
    m.insert("causes".into(), causes.into());
    m.insert("exit_code".into(), exit_code.into());
    m
}

/// An error's chain, outermost first.
fn causes(e: &anyhow::Error) -> Vec<String> {
    e.chain().map(|c| c.to_string()).collect()
}

/// A failure whose command already wrote its `--json` document (replay's
/// statistics up to a bad line, lessons that did not run): `main` adds none.
#[derive(Debug)]
pub struct AnsweredInJson(pub anyhow::Error);

/// A command that fails after its work reports both in one `--json`
/// document: `doc` (an object) gets the `error`, `causes` and `exit_code`
/// every failure document has; print it, then return the error this gives,
/// which `main` prints on stderr only.
pub fn fail_in_json(doc: &mut serde_json::Value, e: anyhow::Error) -> anyhow::Error {
    for (k, v) in failure(&format!("{e:#}"), &causes(&e), 1) {
        doc[k] = v;
    }
    AnsweredInJson(e).into()
}

impl std::fmt::Display for AnsweredInJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for AnsweredInJson {}

/// `error_json` for an error a command returned; `None` when the command
/// already answered in JSON.
pub fn command_error_json(e: &anyhow::Error) -> Option<String> {
    if e.downcast_ref::<AnsweredInJson>().is_some() {
        return None;
    }
    Some(error_json(&format!("{e:#}"), &causes(e), 1))
}

/// `error_json` for a flag clap refused: the message and its tips, without
/// the "error: " prefix and the usage lines that stderr's copy has.
pub fn flag_error_json(rendered: &str, exit_code: i32) -> String {
    let parts: Vec<&str> = rendered
        .split("\n\n")
        .map(str::trim)
        .filter(|p| {
            !p.is_empty() && !p.starts_with("Usage:") && !p.starts_with("For more information")
        })
        .collect();
    let message = parts.join("\n");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    error_json(message, &[message.to_string()], exit_code)
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    // A bad tuning or allocator setting is the user's to fix, before any
    // work, whether or not this command reads it.
    crate::ops::matmul::check_env().map_err(anyhow::Error::msg)?;
    // (The lab's parser: PyTorch's options and vramlab's own, as --alloc-conf.)
    crate::lab::strategies::vramlab::alloc_conf_from_env()
        .map_err(|e| anyhow::anyhow!("{}: {e}", crate::memory::ALLOC_CONF_ENV))?;
    let batch = match &cli.command {
        Command::Demo(a) => Some(("--batch", a.batch)),
        Command::Train(a) => Some(("--batch", a.batch)),
        Command::Estimate(a) => Some(("--batch", a.batch)),
        Command::Profile(a) => Some(("--batch", a.batch)),
        Command::Bench(a) => Some(("--batch", a.batch)),
        Command::MaxBatch(a) => Some(("--max", a.max)),
        Command::Sweep(a) => a.batch.iter().max().map(|&b| ("--batch", b)),
        _ => None,
    };
    // demo and train run the batch they are given; at 1 there is no smaller.
    let batch_one = match &cli.command {
        Command::Demo(a) => a.batch == 1,
        Command::Train(a) => a.batch == 1,
        _ => false,
    };
    dispatch(cli)
        .map_err(|e| name_the_size_flag(e, batch))
        .map_err(|e| if batch_one { at_batch_one(e) } else { e })
}

/// "1 step", "2 steps": a count of steps as a header says it.
pub(crate) fn steps(n: usize) -> String {
    count(n as u64, "step")
}

/// "1 block", "2 blocks", "3 micro-batches": a count and its noun.
pub(crate) fn count(n: u64, noun: &str) -> String {
    let plural = if n == 1 {
        ""
    } else if noun.ends_with("ch") || noun.ends_with('s') {
        "es"
    } else {
        "s"
    };
    format!("{n} {noun}{plural}")
}

/// Whether the allocator refused memory somewhere in `e`'s chain.
pub(crate) fn is_oom(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<crate::tensor::TensorError>()
            .is_some_and(|t| t.is_oom())
            || c.downcast_ref::<crate::memory::AllocError>()
                .is_some_and(|a| a.is_oom())
    })
}

/// Whether the device's binding limit (storage buffers per kernel)
/// refused a dispatch somewhere in `e`'s chain.
pub(crate) fn is_unbindable(e: &anyhow::Error) -> bool {
    use crate::device::DeviceError;
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<crate::tensor::TensorError>(),
            Some(crate::tensor::TensorError::Device(
                DeviceError::TooManyWindows { .. }
            ))
        ) || matches!(
            c.downcast_ref::<DeviceError>(),
            Some(DeviceError::TooManyWindows { .. })
        )
    })
}

/// An out-of-memory error at batch 1 says the way out is not a smaller
/// batch (the allocator's own advice, which knows no batch).
fn at_batch_one(e: anyhow::Error) -> anyhow::Error {
    if is_oom(&e) {
        e.context("batch 1 does not fit, so a smaller batch is no way out, whatever the allocator's advice below says: raise the memory limit (--memory-limit or --memory-fraction, or leave it out), or use a smaller model")
    } else {
        e
    }
}

/// A count with thousands separators: 1,079,178.
pub(crate) fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A parameter count as people say it: 110,336; 124.4M; 1.56B.
pub(crate) fn parameters(n: u64) -> String {
    match n {
        0..1_000_000 => grouped(n),
        // Below 999.95M, as "{:.1}M" would round that to 1000.0M.
        1_000_000..999_950_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.2}B", n as f64 / 1e9),
    }
}

/// A tensor too large for any device (or the host) came from the sizes the
/// user gave: the error names the batch flag where the tensor's first axis
/// is at most the batch, and the model's size flags where a sample alone is
/// huge or the tensor is a weight (its first axis past the batch).
fn name_the_size_flag(e: anyhow::Error, batch: Option<(&str, usize)>) -> anyhow::Error {
    use crate::tensor::TensorError;
    let shape = e
        .chain()
        .find_map(|c| match c.downcast_ref::<TensorError>() {
            Some(TensorError::TooLarge { shape, .. } | TensorError::HostMemory { shape, .. }) => {
                Some(shape.clone())
            }
            _ => None,
        });
    match (batch, shape) {
        // max-batch's search tries batches up to --max: the axis is at most n.
        (Some((flag, n)), Some(shape)) if shape.first().is_some_and(|&f| f <= n) => {
            // A sample's bytes (checked: the sizes may be anything).
            let sample = shape[1..]
                .iter()
                .try_fold(4usize, |a, &d| a.checked_mul(d));
            if sample.is_some_and(|b| b <= (1 << 40)) {
                return anyhow::anyhow!(
                    "{flag} {n} is too large: {e:#}. Lower {flag}"
                );
            }
            anyhow::anyhow!(
                "{flag} {n} and the model's sizes are too large together: {e:#}. Lower {flag} or the model's size flags (`vramlab models` lists them)"
            )
        }
        (_, Some(_)) => anyhow::anyhow!(
            "the model's sizes are too large: {e:#}. Lower the model's size flags (`vramlab models` lists them)"
        ),
        _ => e,
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(a) => demo::run(&a),
        Command::Info(a) => info::run(&a),
        Command::Train(a) => train::run(&a),
        Command::Models(a) => models::run(&a),
        Command::Estimate(a) => estimate::run(&a),
        Command::Plan(a) => plan::run(&a),
        Command::Profile(a) => profile::run(&a),
        Command::Sweep(a) => sweep::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::BenchAlloc(a) => bench_alloc::run(&a),
        Command::MaxBatch(a) => max_batch::run(&a),
        Command::Replay(a) => replay::run(&a),
        Command::Doctor(a) => doctor::run(&a),
        Command::Lessons(a) => lessons::run_list(&a),
        Command::Lesson(a) => lessons::run_one(&a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_parameters_read_as_people_write_them() {
        assert_eq!(count(1, "block"), "1 block");
        assert_eq!(count(0, "block"), "0 blocks");
        assert_eq!(count(3, "micro-batch"), "3 micro-batches");
        assert_eq!(parameters(110_336), "110,336");
        assert_eq!(parameters(999), "999");
        assert_eq!(parameters(124_439_808), "124.4M");
        assert_eq!(parameters(1_557_611_200), "1.56B");
        assert_eq!(parameters(999_960_000), "1.00B");
        assert_eq!(grouped(1_079_178), "1,079,178");
    }

    #[test]
    fn a_failure_inside_a_document_is_shaped_as_every_failure_and_printed_once() {
        let mut doc = serde_json::json!({"events": 3});
        let e = anyhow::anyhow!("line 4: free of id 9").context("trace.jsonl");
        let e = fail_in_json(&mut doc, e);
        assert_eq!(doc["events"], 3);
        assert_eq!(doc["error"], "trace.jsonl: line 4: free of id 9");
        assert_eq!(
            doc["causes"],
            serde_json::json!(["trace.jsonl", "line 4: free of id 9"])
        );
        assert_eq!(doc["exit_code"], 1);
        // main prints no second document for it, but stderr the same text.
        assert!(command_error_json(&e).is_none());
        assert_eq!(format!("{e:#}"), "trace.jsonl: line 4: free of id 9");
        let plain = anyhow::anyhow!("unknown model");
        let v: serde_json::Value =
            serde_json::from_str(&command_error_json(&plain).unwrap()).unwrap();
        assert_eq!(v["error"], "unknown model");
        assert_eq!(v["exit_code"], 1);
    }
}
