//! Flags shared by several commands: which GPU, and how the allocator behaves.

use crate::device::{AdapterOptions, BackendChoice};
use crate::memory::{parse_size, AllocatorConfig, ALLOC_CONF_ENV};
use crate::tensor::Engine;
use clap::Args;

/// Choosing the GPU.
#[derive(Debug, Clone, Args)]
pub struct DeviceArgs {
    /// Only this backend (default: WGPU_BACKEND if set, else Vulkan/Metal/DX12,
    /// falling back to GL).
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
    /// Only adapters whose name contains this text (case-insensitive), e.g.
    /// "llvmpipe" or "RTX".
    #[arg(long, value_name = "SUBSTRING")]
    pub adapter: Option<String>,
    /// Leave the adapter's native f16 (SHADER_F16) unused: f16 tensors are
    /// then stored as f16 two per 32-bit word and computed in f32, as on
    /// adapters without it (same memory, other speed).
    #[arg(long)]
    pub no_shader_f16: bool,
    /// Leave cooperative matrices (tensor cores) unused where the adapter
    /// offers f16 ones: f16 products then run the plain tiled kernels.
    #[arg(long)]
    pub no_tensor_cores: bool,
    /// Bind tensors in windows of at most SIZE (e.g. 64KiB) instead of the
    /// adapter's max_storage_buffer_binding_size: to check that results do
    /// not change when tensors span many windows, or to act like an adapter
    /// with a smaller limit.
    #[arg(long, value_name = "SIZE", value_parser = parse_window)]
    pub binding_window: Option<u64>,
    /// Back memory with buffers of at most SIZE (e.g. 1MiB) instead of the
    /// adapter's max_buffer_size: to check that results do not change when
    /// a segment spans many buffers, or to act like an adapter with a
    /// smaller limit.
    #[arg(long, value_name = "SIZE", value_parser = parse_buffer_limit)]
    pub buffer_limit: Option<u64>,
    /// Keep wgpu's runtime bounds checks in every kernel, also the product
    /// kernels that are compiled without them (their own index arithmetic
    /// keeps each access in bounds): to compare speed, or to rule them out.
    #[arg(long)]
    pub bounds_checks: bool,
}

fn parse_window(s: &str) -> Result<u64, String> {
    size_of_some("a window", "64KiB", s)
}

fn parse_buffer_limit(s: &str) -> Result<u64, String> {
    size_of_some("a buffer", "256MiB", s)
}

/// A size flag's text, checked when clap reads it (a bad value exits 2,
/// as every refused flag does) and parsed again where it is used.
fn memory_flag_text(flag: &str, s: &str) -> Result<String, String> {
    parse_memory(flag, s)
        .map(|_| s.to_string())
        .map_err(|e| e.0)
}

/// `--capacity`'s text ([`memory_flag_text`]).
pub fn capacity_text(s: &str) -> Result<String, String> {
    memory_flag_text("--capacity", s)
}

/// `plan --memory`'s text ([`memory_flag_text`]).
pub fn memory_text(s: &str) -> Result<String, String> {
    memory_flag_text("--memory", s)
}

/// `--memory-limit`'s text ([`memory_flag_text`]).
pub fn memory_limit_text(s: &str) -> Result<String, String> {
    memory_flag_text("--memory-limit", s)
}

/// A size of at least one byte: `what` of none would hold nothing.
fn size_of_some(what: &str, example: &str, s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err(format!(
            "{what} must hold at least one byte; give e.g. {example}"
        )),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl DeviceArgs {
    /// The engine on the adapter these flags choose; where a size flag was
    /// capped or rounded, a note on stderr says what was used instead.
    pub fn engine(&self, config: AllocatorConfig) -> anyhow::Result<Engine> {
        let engine = Engine::new(&self.options(), config)?;
        for note in engine.gpu().map(|g| g.option_notes()).unwrap_or_default() {
            eprintln!("note: {note}");
        }
        Ok(engine)
    }

    /// A command that runs on a simulated device unless `--measure` is
    /// given refuses device flags without it: they would choose nothing.
    pub fn only_with_measure(&self, measure: bool) -> anyhow::Result<()> {
        self.only_with("--measure", measure)
    }

    /// As [`DeviceArgs::only_with_measure`], where what turns the GPU on
    /// is `flags` (`--report DIR --measure` for `lessons`).
    pub fn only_with(&self, flags: &str, measure: bool) -> anyhow::Result<()> {
        let given: Vec<&str> = [
            ("--backend", self.backend.is_some()),
            ("--adapter", self.adapter.is_some()),
            ("--no-shader-f16", self.no_shader_f16),
            ("--no-tensor-cores", self.no_tensor_cores),
            ("--binding-window", self.binding_window.is_some()),
            ("--buffer-limit", self.buffer_limit.is_some()),
            ("--bounds-checks", self.bounds_checks),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
        if measure || given.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "{} choose{} the GPU that --measure runs on; without --measure this runs on a simulated device, where {} nothing: add {flags}, or leave {} out",
            given.join(", "),
            if given.len() == 1 { "s" } else { "" },
            if given.len() == 1 { "it changes" } else { "they change" },
            if given.len() == 1 { "it" } else { "them" }
        )
    }

    pub fn options(&self) -> AdapterOptions {
        AdapterOptions {
            backend: self.backend,
            adapter: self.adapter.clone(),
            without_shader_f16: self.no_shader_f16,
            binding_limit: self.binding_window,
            buffer_limit: self.buffer_limit,
            without_cooperative_matrix: self.no_tensor_cores,
            checked_kernels: self.bounds_checks,
        }
    }
}

/// Configuring the caching allocator.
#[derive(Debug, Clone, Args)]
pub struct AllocArgs {
    /// Allocator options in PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax, e.g.
    /// "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8".
    /// Default: the VRAMLAB_ALLOC_CONF environment variable, else PyTorch's defaults.
    #[arg(long, value_name = "OPTIONS")]
    pub alloc_conf: Option<String>,
    /// Most memory the allocator may reserve, e.g. 2GiB, 512MiB, 1.5GB
    /// (PyTorch's set_per_process_memory_fraction, as a size).
    #[arg(long, value_name = "SIZE", conflicts_with = "memory_fraction", value_parser = memory_limit_text)]
    pub memory_limit: Option<String>,
    /// Most memory the allocator may reserve, as a fraction (0..1] of the
    /// device capacity (--capacity).
    #[arg(long, value_name = "FRACTION")]
    pub memory_fraction: Option<f64>,
    /// The device's size, e.g. 16GiB: what --memory-fraction is a fraction
    /// of (wgpu does not report how much memory a GPU has), and for
    /// `replay` the simulated device's capacity (default: no limit but
    /// --memory-limit).
    #[arg(long, value_name = "SIZE", value_parser = capacity_text)]
    pub capacity: Option<String>,
}

/// A flag value that cannot be used, with what to write instead.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ArgError(pub String);

impl AllocArgs {
    /// Whether --alloc-conf or VRAMLAB_ALLOC_CONF chose the allocator
    /// settings; otherwise a recording replays under its own.
    pub fn conf_given(&self) -> bool {
        self.conf_source().is_some()
    }

    /// Which of --alloc-conf and VRAMLAB_ALLOC_CONF gave the settings, if
    /// either did (the flag wins).
    pub fn conf_source(&self) -> Option<&'static str> {
        if self.alloc_conf.is_some() {
            Some("--alloc-conf")
        } else if std::env::var(ALLOC_CONF_ENV).is_ok_and(|v| !v.is_empty()) {
            Some(ALLOC_CONF_ENV)
        } else {
            None
        }
    }

    /// `--capacity`, parsed.
    pub fn capacity(&self) -> Result<Option<u64>, ArgError> {
        parse_capacity(&self.capacity)
    }

    /// The allocator configuration these flags describe. `--memory-fraction`
    /// is a fraction of `--capacity`, else of `device_capacity` (what the
    /// device reports, if anything).
    pub fn config(&self, device_capacity: Option<u64>) -> Result<AllocatorConfig, ArgError> {
        let capacity = self.capacity()?.or(device_capacity);
        let mut cfg = match &self.alloc_conf {
            // vramlab's own options too (lookahead, …): the lab parses them.
            Some(s) => crate::lab::strategies::vramlab::parse_alloc_conf(s),
            None => crate::lab::strategies::vramlab::alloc_conf_from_env(),
        }
        .map_err(|e| {
            let from = if self.alloc_conf.is_some() {
                "--alloc-conf"
            } else {
                ALLOC_CONF_ENV
            };
            ArgError(format!("{from}: {e}"))
        })?;
        if let Some(s) = &self.memory_limit {
            cfg.memory_limit = Some(parse_memory("--memory-limit", s)?);
        }
        if let Some(f) = self.memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(ArgError(format!(
                    "--memory-fraction must be in (0, 1], got {f}"
                )));
            }
            let cap = capacity.ok_or_else(|| {
                ArgError(
                    "--memory-fraction needs the device's size to take a fraction of: add --capacity SIZE, e.g. --capacity 24GiB (wgpu does not report how much memory a GPU has), or give --memory-limit SIZE instead".into(),
                )
            })?;
            let limit = (cap as f64 * f) as u64;
            // As --memory-limit 0 is: no memory at all refuses everything.
            if limit == 0 {
                return Err(ArgError(format!(
                    "--memory-fraction {} of {cap} bytes is less than a byte; give a larger fraction",
                    number_as_typed(f)
                )));
            }
            cfg.memory_limit = Some(limit);
        }
        // A limit past the device's stated size could never be reached:
        // the size binds first, and a report would name the wrong bound.
        if let (Some(limit), Some(cap), Some(_)) = (cfg.memory_limit, capacity, &self.capacity) {
            if limit > cap {
                return Err(ArgError(format!(
                    "--memory-limit {} is more than the --capacity {} of the device, which bounds what can be reserved first; give a limit at most the capacity, or leave --memory-limit out",
                    crate::memory::Mib(limit),
                    crate::memory::Mib(cap)
                )));
            }
        }
        Ok(cfg)
    }
}

/// A number as a person would have typed it: plain where that is short,
/// else in exponent form (`{}` of 1e-320 prints hundreds of digits).
pub fn number_as_typed(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// A learning rate (or other optimizer number) that training can use:
/// finite and not negative (`positive` also excludes 0). NaN would train
/// on silently, turning every weight into NaN.
pub fn check_number(flag: &str, v: f32, positive: bool) -> Result<(), ArgError> {
    if !v.is_finite() || v < 0.0 || (positive && v == 0.0) {
        let want = if positive { "above 0" } else { "0 or more" };
        return Err(ArgError(format!(
            "{flag} must be a finite number {want}, got {v}"
        )));
    }
    Ok(())
}

/// Most steps a recording command (`estimate`, `profile`, `max-batch`)
/// runs: every step's allocation events are kept, so the count bounds
/// memory. Memory reaches its steady state by step 2 or 3.
pub const MAX_RECORDED_STEPS: usize = 100;

/// `--steps` for a command that records every step.
/// `--steps` beside `--record` (max-batch, sweep): the recorder command
/// runs its own steps.
pub const STEPS_WITH_RECORD: &str =
    "--steps applies to zoo models; with --record the steps are the recorder command's";

pub fn check_recorded_steps(steps: usize) -> Result<(), ArgError> {
    if steps == 0 || steps > MAX_RECORDED_STEPS {
        return Err(ArgError(format!(
            "--steps must be 1 to {MAX_RECORDED_STEPS} (got {steps}): every step's allocations are recorded, and memory reaches its steady state by step 2 or 3"
        )));
    }
    Ok(())
}

/// The error for a step whose loss is NaN or infinite: training stops
/// there, as `torch.autograd.set_detect_anomaly(True)` would, instead of
/// updating every weight with NaN.
/// `set` names the optimizer flags given besides --lr (--momentum,
/// --weight-decay): a large one diverges as a large rate does.
pub fn non_finite_loss(step: usize, loss: f32, files: &[&str], set: &[&str]) -> ArgError {
    let lower = match set {
        [] => "lower --lr".to_string(),
        set => format!("lower --lr or {}", set.join(" or ")),
    };
    let inputs = match files {
        [] => String::new(),
        files => format!(
            " or a file holds NaN/Inf values (check {})",
            files.join(" and ")
        ),
    };
    ArgError(format!(
        "step {step}: the loss is {loss}; a NaN or infinity reached it. The run diverged ({lower}){inputs}; stopping here"
    ))
}

/// Makes the output directory a flag names, before any work: an error
/// names the flag (a path that is an existing file, or not writable, is
/// found at once, not after a long sweep).
pub fn out_dir(flag: &str, dir: &std::path::Path) -> Result<(), ArgError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        // A file where a directory should be: say which, not "File exists".
        let file = dir
            .ancestors()
            .find(|a| !a.as_os_str().is_empty() && a.exists() && !a.is_dir());
        match file {
            Some(f) => ArgError(format!(
                "{flag} {}: {} is a file, not a directory; name a directory, new or existing",
                dir.display(),
                f.display()
            )),
            None => ArgError(format!(
                "{flag} {}: cannot create the directory ({e}); name a directory, new or existing",
                dir.display()
            )),
        }
    })
}

/// `out_dir`, then checks before any work that each of `files` can be
/// written in it as the run will write it (none is a directory, the
/// directory takes new files).
pub fn out_dir_for(flag: &str, dir: &std::path::Path, files: &[&str]) -> Result<(), ArgError> {
    out_dir(flag, dir)?;
    for f in files {
        let p = dir.join(f);
        if p.is_dir() {
            return Err(ArgError(format!(
                "{flag} {}: {} is a directory, where vramlab writes its {f}; move it away or name another directory",
                dir.display(),
                p.display()
            )));
        }
        crate::io::check_writable(&p).map_err(|e| {
            ArgError(format!(
                "{flag} {}: cannot write {} ({e}); name a directory you can write to",
                dir.display(),
                p.display()
            ))
        })?;
    }
    Ok(())
}

/// Makes the directory an output file's flag names lives in, before any
/// work, as `out_dir` does, and checks the file can be written as the run
/// will write it (`io::check_writable`).
pub fn out_file_dir(flag: &str, file: &std::path::Path) -> Result<(), ArgError> {
    // `out/` names a directory, whatever is there: the write would fail.
    if file.is_dir() || file.as_os_str().to_string_lossy().ends_with('/') {
        // The example in the kind of file the flag writes.
        let example = match flag {
            "--record-trace" => "out.jsonl",
            "--export-snapshot" => "out.pickle",
            "--export-intervals" => "out.csv",
            _ => "out.safetensors",
        };
        return Err(ArgError(format!(
            "{flag} {}: is a directory; name a file (e.g. {})",
            file.display(),
            file.join(example).display()
        )));
    }
    if let Some(d) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        out_dir(flag, d)?;
    }
    crate::io::check_writable(file).map_err(|e| {
        ArgError(format!(
            "{flag} {}: cannot write there ({e}); name a file you can write",
            file.display()
        ))
    })
}

/// The file a path names, for comparing two paths: the canonical path of
/// what exists, else of its directory with the name added.
fn file_identity(p: &std::path::Path) -> std::path::PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    match (std::fs::canonicalize(dir), p.file_name()) {
        (Ok(d), Some(n)) => d.join(n),
        _ => p.to_path_buf(),
    }
}

/// Refuses an output file that is one of the inputs, or another output,
/// before any work: writing it would destroy the input (read again later,
/// or wanted afterwards) or the other output, with no error.
pub fn outputs_apart(
    outputs: &[(&str, Option<&std::path::Path>)],
    inputs: &[(&str, Option<&std::path::Path>)],
) -> Result<(), ArgError> {
    let named = |list: &[(&str, Option<&std::path::Path>)]| -> Vec<(String, std::path::PathBuf)> {
        list.iter()
            .filter_map(|(flag, p)| p.map(|p| (flag.to_string(), file_identity(p))))
            .collect()
    };
    let (outs, ins) = (named(outputs), named(inputs));
    for (i, (flag, out)) in outs.iter().enumerate() {
        if let Some((what, _)) = ins.iter().find(|(_, p)| p == out) {
            return Err(ArgError(format!(
                "{flag} {} is {what}, which this command reads; writing there would destroy it: name another file",
                out.display()
            )));
        }
        if let Some((other, _)) = outs[..i].iter().find(|(_, p)| p == out) {
            return Err(ArgError(format!(
                "{other} and {flag} both name {}; one would overwrite the other: name two files",
                out.display()
            )));
        }
    }
    Ok(())
}

/// Parses an optional `--capacity`.
pub fn parse_capacity(s: &Option<String>) -> Result<Option<u64>, ArgError> {
    s.as_ref()
        .map(|s| parse_memory("--capacity", s))
        .transpose()
}

/// A device's size or a memory limit given as `flag`: a size above 0 (a
/// device of no bytes refuses every allocation, and every figure of a run
/// on it would be empty).
pub fn parse_memory(flag: &str, s: &str) -> Result<u64, ArgError> {
    match parse_size(s) {
        Ok(0) => Err(ArgError(format!(
            "{flag} {s}: no memory at all refuses every allocation; give a size above 0, e.g. 16GiB"
        ))),
        Ok(n) => Ok(n),
        Err(e) => Err(ArgError(format!("{flag}: {e}"))),
    }
}

/// Choosing a zoo model and its sizes (see `vramlab models`).
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Zoo model: mlp, simple-cnn, resnet-mini, attention, gpt, resnet50.
    #[arg(long, default_value = "simple-cnn")]
    pub model: String,
    /// mlp: layer widths, input first and classes last (default 784,256,256,10).
    #[arg(long, value_delimiter = ',', value_name = "W,W,..")]
    pub widths: Option<Vec<usize>>,
    /// mlp: checkpoint each run of this many layers (0: off).
    #[arg(long, value_name = "K")]
    pub checkpoint_every: Option<usize>,
    /// resnet-mini, resnet50: channels of the stem and first block
    /// (resnet-mini default 16; resnet50 64, torchvision's).
    #[arg(long)]
    pub width: Option<usize>,
    /// resnet-mini: residual blocks (default 3); resnet50: 50, 101 or 152.
    #[arg(long)]
    pub depth: Option<usize>,
    /// resnet-mini, resnet50: input height = width in pixels (default 32;
    /// resnet50 224; `sweep` takes a list).
    #[arg(long, value_delimiter = ',', value_name = "PIXELS")]
    pub resolution: Option<Vec<usize>>,
    /// attention, gpt: tokens per sample (attention: default 128; gpt: the
    /// preset's positions, and a longer value grows the position table;
    /// `sweep` takes a list).
    #[arg(long, value_delimiter = ',', value_name = "TOKENS")]
    pub seq_len: Option<Vec<usize>>,
    /// attention, gpt: features per token (attention: default 64).
    #[arg(long)]
    pub dim: Option<usize>,
    /// attention: hidden width of the MLP (default 256).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// resnet-mini, attention, resnet50: output classes (default 10;
    /// resnet50 1000).
    #[arg(long)]
    pub classes: Option<usize>,
    /// gpt: sizes to start from: tiny (the default: 2 layers, 4 heads, dim
    /// 64, 64 positions, 96 characters), gpt2, gpt2-medium, gpt2-large,
    /// gpt2-xl, 7b, 70b, 175b; the flags below override them.
    #[arg(long)]
    pub preset: Option<String>,
    /// gpt: transformer blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// gpt: attention heads (dim must be a multiple).
    #[arg(long)]
    pub heads: Option<usize>,
    /// gpt: vocabulary size (the tied embedding's rows).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// gpt: drop probability of every dropout (default 0, as nanoGPT;
    /// GPT-2 trained with 0.1). Each keeps a one-byte mask for backward.
    #[arg(long, value_name = "P")]
    pub dropout: Option<f32>,
}

impl ModelArgs {
    /// The model these flags describe; a flag that does not apply to the
    /// chosen model is an error rather than silently ignored.
    pub fn spec(&self) -> Result<crate::nn::ModelSpec, ArgError> {
        for (flag, v) in [("resolution", &self.resolution), ("seq-len", &self.seq_len)] {
            if v.as_ref().is_some_and(|v| v.len() != 1) {
                return Err(ArgError(format!(
                    "--{flag} takes one value here; lists are for `vramlab sweep`"
                )));
            }
        }
        self.spec_with(
            self.resolution.as_ref().map(|v| v[0]),
            self.seq_len.as_ref().map(|v| v[0]),
        )
    }

    /// The size flags as the zoo's [`Sizes`](crate::nn::Sizes), with
    /// resolution and sequence length given explicitly (a sweep's point).
    fn sizes(&self, resolution: Option<usize>, seq_len: Option<usize>) -> crate::nn::Sizes {
        crate::nn::Sizes {
            widths: self.widths.clone(),
            checkpoint_every: self.checkpoint_every,
            width: self.width,
            depth: self.depth,
            resolution,
            seq_len,
            dim: self.dim,
            hidden: self.hidden,
            classes: self.classes,
            preset: self.preset.clone(),
            layers: self.layers,
            heads: self.heads,
            vocab: self.vocab,
            dropout: self.dropout,
        }
    }

    /// The size flags as given (a list's first value).
    pub fn sizes_given(&self) -> crate::nn::Sizes {
        let first = |v: &Option<Vec<usize>>| v.as_ref().and_then(|v| v.first().copied());
        self.sizes(first(&self.resolution), first(&self.seq_len))
    }

    /// The size flags given (`--widths`, `--resolution`, …), by name;
    /// `--checkpoint-every` and `--dropout` are not sizes.
    pub fn size_flags_given(&self) -> Vec<&'static str> {
        let first = |v: &Option<Vec<usize>>| v.as_ref().and_then(|v| v.first().copied());
        self.sizes(first(&self.resolution), first(&self.seq_len))
            .given()
            .into_iter()
            .filter(|(f, g)| *g && !["checkpoint-every", "dropout"].contains(f))
            .map(|(f, _)| f)
            .collect()
    }

    /// The model with resolution and sequence length given explicitly (a
    /// sweep's point); a flag that does not apply to the model is refused.
    pub fn spec_with(
        &self,
        resolution_value: Option<usize>,
        seq_len_value: Option<usize>,
    ) -> Result<crate::nn::ModelSpec, ArgError> {
        let arg_error = |e: crate::tensor::SpecError| ArgError(e.to_string());
        let mut spec = crate::nn::ModelSpec::default_for(&self.model).map_err(arg_error)?;
        spec.apply(&self.sizes(resolution_value, seq_len_value))
            .map_err(arg_error)?;
        Ok(spec)
    }
}

/// What a step does, for the commands that run or predict one (estimate,
/// profile, sweep, max-batch).
#[derive(Debug, Clone, Args)]
pub struct StepArgs {
    /// Optimizer (decides the optimizer state).
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: crate::train::OptimizerKind,
    /// SGD momentum (a momentum buffer per parameter when non-zero).
    #[arg(long)]
    pub momentum: Option<f32>,
    /// Weight decay (default: torch.optim's, 0.01 for adamw and 0 for the
    /// others); Adam's and SGD's make a weight-decayed copy of the
    /// gradients in foreach and for-loop.
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Which torch.optim implementation the step follows: foreach
    /// (PyTorch's default on CUDA; its temporaries are parameter-sized
    /// lists), for-loop (`foreach=False`; one parameter's temporaries at a
    /// time) or fused (`fused=True`; none). Default: foreach (a parallel
    /// layout's: foreach in fp32, fused with mixed precision).
    #[arg(long, value_enum)]
    pub optimizer_impl: Option<crate::optim::OptimizerImpl>,
    /// The loss: cross-entropy (PyTorch's F.cross_entropy: log_softmax,
    /// then nll_loss; with the logits, four vocabulary-sized buffers at its
    /// peak), fused (vramlab's one kernel; two) or chunked[:ROWS] (PyTorch
    /// 2.15's F.linear_cross_entropy with LinearCrossEntropyOptions: the head
    /// and loss ROWS rows at a time, no logits; gpt only; ROWS defaults to
    /// PyTorch's own choice).
    #[arg(long, value_name = "cross-entropy|fused|chunked[:ROWS]", default_value = "cross-entropy", value_parser = crate::train::LossMode::parse)]
    pub loss: crate::train::LossMode,
    /// train: forward, backward, optimizer; checkpoint: the same with the
    /// model's segments checkpointed; inference: a no_grad forward.
    #[arg(long, value_enum, default_value = "train")]
    pub mode: crate::train::Mode,
    /// Mixed precision (torch.autocast): convolutions and products in f16
    /// or bf16, losses and softmax in f32, f32 master weights, gradients and
    /// optimizer state; f16 adds a GradScaler.
    #[arg(long, value_name = "f16|bf16", value_parser = parse_amp)]
    pub amp: Option<crate::tensor::DType>,
}

/// `--dtype`: f32, f16 or bf16 (PyTorch's names too).
pub fn parse_dtype(s: &str) -> Result<crate::tensor::DType, String> {
    crate::tensor::DType::parse(s)
        .ok_or_else(|| format!("unknown dtype {s:?}; use f32, f16 or bf16"))
}

/// `--amp`: a 16-bit dtype.
pub fn parse_amp(s: &str) -> Result<crate::tensor::DType, String> {
    use crate::tensor::DType;
    match DType::parse(s) {
        Some(d @ (DType::F16 | DType::Bf16)) => Ok(d),
        Some(DType::F32) => Err("autocast to f32 is a plain f32 run: leave --amp out".into()),
        None => Err(format!("unknown dtype {s:?}; --amp takes f16 or bf16")),
    }
}

impl StepArgs {
    /// The optimizer with torch.optim's defaults, validated.
    pub fn optimizer(&self) -> Result<crate::train::OptimizerConfig, ArgError> {
        // An inference step runs no optimizer: its flags would change nothing.
        if self.mode == crate::train::Mode::Inference {
            let given = [
                ("--momentum", self.momentum.is_some()),
                ("--weight-decay", self.weight_decay.is_some()),
                ("--optimizer-impl", self.optimizer_impl.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                return Err(ArgError(format!(
                    "{flag} sets the optimizer, which --mode inference does not run; leave it out"
                )));
            }
        }
        // The same checks as train's.
        if let Some(m) = self.momentum {
            check_number("--momentum", m, false)?;
        }
        if let Some(w) = self.weight_decay {
            check_number("--weight-decay", w, false)?;
        }
        let o = crate::train::OptimizerConfig::new(
            self.optimizer,
            None,
            self.momentum,
            self.weight_decay,
        )
        .with_impl(self.optimizer_impl.unwrap_or_default());
        o.validate().map_err(|e| ArgError(e.to_string()))?;
        Ok(o)
    }

    /// One step of `model` at `batch` under `config`, with this optimizer
    /// and mode.
    pub fn plan(
        &self,
        model: crate::nn::ModelSpec,
        batch: usize,
        config: crate::memory::AllocatorConfig,
    ) -> Result<crate::estimate::Plan, ArgError> {
        Ok(crate::estimate::Plan {
            model,
            batch,
            optimizer: self.optimizer()?,
            mode: self.mode,
            amp: self.amp,
            dtype: crate::tensor::DType::F32,
            loss: self.loss,
            config,
        })
    }
}

/// The first of `counts` that is 0, named: "--steps must be at least 1".
pub fn at_least_one(counts: &[(&str, u64)]) -> anyhow::Result<()> {
    match counts.iter().find(|(_, n)| *n == 0) {
        Some((flag, _)) => anyhow::bail!("{flag} must be at least 1"),
        None => Ok(()),
    }
}

/// Refuses a value `flag` lists twice (a sweep's point or a bench's size
/// would be run twice for nothing).
pub fn listed_once<T: PartialEq + std::fmt::Display>(
    flag: &str,
    values: &[T],
) -> anyhow::Result<()> {
    match values
        .iter()
        .enumerate()
        .find(|(i, v)| values[..*i].contains(v))
    {
        Some((_, v)) => anyhow::bail!("{flag} {v} is given more than once; list each value once"),
        None => Ok(()),
    }
}
