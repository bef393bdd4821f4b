//! The engine's one error type: every fallible function of this crate
//! returns [`EngineError`] (also known as `TensorError`, its old name).
//! Each variant carries the values involved, so the message says what to
//! fix and a caller can match on what went wrong; the errors of the layers
//! below (the allocator, the device, safetensors files) and the settings'
//! own checks ([`ConfigError`]) are folded in with `#[from]`.

use super::dtype::DType;
use crate::device::DeviceError;
use crate::io::SafetensorsError;
use crate::memory::AllocError;
use std::fmt;
use std::path::PathBuf;

/// The engine's error under its old name: tensors were its first users.
pub type TensorError = EngineError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    // ---- Shapes ----
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not match")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    /// A tensor whose shape is not the layout `op` takes: `want` names the
    /// layout (`[N, C, H, W]`), `sizes` gives the letters in it that are
    /// fixed (`D = 64`).
    #[error("{op}: needs {want}{}, got {got:?}", Sizes(.sizes))]
    WrongShape {
        op: &'static str,
        want: &'static str,
        sizes: Vec<(&'static str, usize)>,
        got: Vec<usize>,
    },
    /// Several operands whose shapes do not fit together.
    #[error("{op}: needs {want}; got {}", Shapes(.got))]
    WrongShapes {
        op: &'static str,
        want: &'static str,
        got: Vec<Vec<usize>>,
    },
    #[error("reshape: cannot view shape {from:?} ({from_numel} elements) as {to:?} ({to_numel} elements)")]
    Reshape {
        from: Vec<usize>,
        from_numel: usize,
        to: Vec<usize>,
        to_numel: usize,
    },
    #[error("{op}: no axis {axis} in shape {shape:?}")]
    AxisOutOfRange {
        op: &'static str,
        axis: usize,
        shape: Vec<usize>,
    },
    #[error("{op}: cannot reduce {shape:?} as outer {outer} × axis {mid} × inner {inner} (the axis non-empty, the three filling the shape)")]
    ReduceAxis {
        op: &'static str,
        shape: Vec<usize>,
        outer: usize,
        mid: usize,
        inner: usize,
    },
    /// A row kernel takes rows up to a fixed length
    /// (`ops::LONGEST_REDUCED_ROW`).
    #[error(
        "{op}: the last axis of {shape:?} must have 1..={max} elements (the longest row {op} takes)"
    )]
    LastAxis {
        op: &'static str,
        shape: Vec<usize>,
        max: usize,
    },
    #[error(
        "{op}: shape {shape:?} has no axis of {channels} channels with {inner} elements inside"
    )]
    NoChannelAxis {
        op: &'static str,
        shape: Vec<usize>,
        channels: usize,
        inner: usize,
    },
    #[error("{op}: kernel {}x{} is larger than the padded input {}x{}", .kernel.0, .kernel.1, .input.0, .input.1)]
    KernelTooLarge {
        op: &'static str,
        kernel: (usize, usize),
        input: (usize, usize),
    },
    #[error("{op}: kernel {kernel}, stride {stride}, padding {padding} do not fit a {}×{} input (padding must be at most half the kernel, as in PyTorch)", .input.0, .input.1)]
    PoolWindow {
        op: &'static str,
        kernel: usize,
        stride: usize,
        padding: usize,
        input: (usize, usize),
    },
    /// A pooling window past the taps one invocation walks
    /// (`ops::MAX_LOOP_ITERATIONS`).
    #[error("{op}: a {kernel}×{kernel} window has {} taps; one invocation walks at most {max} (a window up to {}×{}): llvmpipe ends an invocation's loops after 65,535 iterations, and vramlab keeps every adapter to one bound", kernel * kernel, .max.isqrt(), .max.isqrt())]
    PoolWindowTooLarge {
        op: &'static str,
        kernel: usize,
        max: usize,
    },
    #[error("{op}: a {}×{} plane has more positions than f32 indices hold exactly (2^24)", .plane.0, .plane.1)]
    PlaneTooLarge {
        op: &'static str,
        plane: (usize, usize),
    },
    #[error("{op}: training needs more than one value per channel, got input {shape:?} (PyTorch refuses it too; use a batch of 2 or more, or eval mode)")]
    OneValuePerChannel { op: &'static str, shape: Vec<usize> },
    #[error("{op}: a row bias needs {len} values of the operands' dtype {dtype}, got {got_shape:?} {got_dtype}")]
    BadBias {
        op: &'static str,
        len: usize,
        dtype: DType,
        got_shape: Vec<usize>,
        got_dtype: DType,
    },

    // ---- Sizes and limits ----
    /// A shape past what any device holds: sizes from a flag or a file.
    #[error("a tensor of shape {shape:?} ({op}) has more elements than any device can hold (over 2^62 bytes); check the sizes given")]
    TooLarge { op: &'static str, shape: Vec<usize> },
    /// The host could not hold what a tensor is made from (its values are
    /// built on the CPU first).
    #[error("{op}: the {bytes} bytes of host memory for a tensor of shape {shape:?} could not be had; use smaller sizes")]
    HostMemory {
        op: &'static str,
        shape: Vec<usize>,
        bytes: u64,
    },
    #[error("{got} values given for shape {shape:?}, which holds {want}")]
    DataLength {
        got: usize,
        want: usize,
        shape: Vec<usize>,
    },
    #[error("{op}: a tensor of shape {shape:?} has no elements; every tensor needs at least one")]
    Empty { op: &'static str, shape: Vec<usize> },
    #[error("{op}: {numel} elements exceed the 2^32 a kernel can index")]
    TooManyElements { op: &'static str, numel: usize },
    #[error("{op}: {inner} positions × {plane} rows need more workgroups than the device's {max} per dimension")]
    GridTooLarge {
        op: &'static str,
        inner: usize,
        plane: usize,
        max: usize,
    },
    /// A count outside what `op` supports; `hint` (may be empty) says what
    /// to do instead.
    #[error("{op}: {what} must be in {min}..={max}, got {value}{hint}")]
    OutOfRange {
        op: &'static str,
        what: &'static str,
        value: usize,
        min: usize,
        max: usize,
        hint: &'static str,
    },
    #[error("{op}: the {what} must be in [0, 1), got {value}")]
    Probability {
        op: &'static str,
        what: &'static str,
        value: f32,
    },
    #[error("{op}: a 16-bit output must start on a word (even offset), got {offset}")]
    Misaligned { op: &'static str, offset: usize },
    /// `tile` is the tile's name (`TileConfig::describe`).
    #[error("{op}: tile {tile} does not divide its staging loops")]
    BadTile { op: &'static str, tile: String },

    // ---- Element types ----
    #[error("{op}: operands are {lhs} and {rhs}; cast one (ops::cast) so they match")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
    },
    /// An op that runs in one dtype only (`why` says whose rule it is).
    #[error("{op}: runs in {want} ({why}), got {got}")]
    WrongDType {
        op: &'static str,
        want: DType,
        got: DType,
        why: &'static str,
    },
    #[error("{op}: operands must share a dtype and the output be f32 or that dtype; got {a}·{b} → {out}")]
    ProductDTypes {
        op: &'static str,
        a: DType,
        b: DType,
        out: DType,
    },
    #[error("{op}: {param}: a {grad} gradient for a {value} parameter")]
    GradientDType {
        op: &'static str,
        param: String,
        grad: DType,
        value: DType,
    },
    #[error("{op} is not implemented for {dtype} yet; use f32")]
    UnsupportedDType { op: &'static str, dtype: DType },

    // ---- What a combination of settings cannot do ----
    /// A combination `op` does not run; `what` says which and what to use.
    #[error("{op}: {what}")]
    NotSupported {
        op: &'static str,
        what: &'static str,
    },
    #[error("--loss {loss} runs the model's head inside the loss, which needs a bias-free linear head onto the classes (gpt's); {model}'s head is not one: use --loss cross-entropy or --loss fused")]
    NeedsLinearHead {
        /// As `--loss` takes it (`chunked:64`).
        loss: String,
        model: String,
    },
    #[error("{op}: {param}: its first gradient came after the first fused step, which made every momentum buffer; use --optimizer-impl foreach or for-loop")]
    LateGradient { op: &'static str, param: String },
    #[error("{op}: parameter {index} has no momentum buffer")]
    NoMomentumBuffer { op: &'static str, index: usize },
    #[error("{op}: tensors live on different engines")]
    DifferentEngines { op: &'static str },

    // ---- Data ----
    #[error("text: the text has {chars} characters; sequences of {seq} need at least {} (use a longer text or a shorter --seq-len)", .seq + 1)]
    TextTooShort { chars: usize, seq: usize },
    #[error("batch: a window of {len} tokens at {start} runs past the {tokens} tokens")]
    WindowPastEnd {
        start: usize,
        len: usize,
        tokens: usize,
    },
    /// A label (or token id) outside the model's classes (or vocabulary).
    #[error("batch: {what} {value} is outside 0..{classes} (the model has {classes} {})", class_word(.what))]
    ClassOutOfRange {
        what: &'static str,
        value: i64,
        classes: usize,
    },
    /// A language model's input id that is not a whole number.
    #[error("batch: token id {value} in x is not a whole number (a language model's x holds token ids in 0..{vocab}: save them as integers, e.g. int64)")]
    TokenNotWhole { value: f64, vocab: usize },
    /// A token id past 2^24, which f32 (vramlab's input type) cannot hold.
    #[error("batch: token id {value} in x is past 2^24, the largest id f32 inputs hold exactly; use a vocabulary of at most 16,777,216 tokens")]
    TokenNotExact { value: i64 },
    #[error("{}; x is {x:?}, y is {y:?}", if *.tokens { "a language model's y holds the next token of every position: its shape must be x's" } else { "y must have shape [N] with N = x's first axis (one class label a sample)" })]
    LabelShape {
        x: Vec<usize>,
        y: Vec<usize>,
        tokens: bool,
    },
    /// A batch file whose x has no samples or no elements.
    #[error("x has shape {shape:?}, which holds no samples; a batch needs at least one sample of at least one element")]
    EmptyBatch { shape: Vec<usize> },
    #[error("cannot load {path} into this model:{}", Problems(.problems))]
    Load {
        path: String,
        problems: Vec<LoadProblem>,
    },
    /// An error about the contents of a file, prefixed with its name.
    #[error("{path}: {source}")]
    InFile {
        path: String,
        #[source]
        source: Box<EngineError>,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no tuning cache file (set VRAMLAB_TUNE_CACHE or HOME)")]
    NoTuneCache,
    #[error("{0} is not a vramlab tile cache, so it is left as it is; point VRAMLAB_TUNE_CACHE at a new file, or remove this one")]
    NotATuneCache(PathBuf),
    #[error("cannot write the tuning cache: {0}")]
    TuneCacheJson(#[source] serde_json::Error),

    // ---- The layers below ----
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl EngineError {
    pub fn is_oom(&self) -> bool {
        matches!(self, EngineError::Alloc(e) if e.is_oom())
    }

    /// This error about the contents of `path` (a file or a data source).
    pub fn in_file(self, path: impl ToString) -> EngineError {
        EngineError::InFile {
            path: path.to_string(),
            source: Box::new(self),
        }
    }
}

/// One reason a file of weights does not fit a model ([`EngineError::Load`]).
#[derive(Debug, thiserror::Error)]
pub enum LoadProblem {
    #[error(transparent)]
    Read(#[from] SafetensorsError),
    #[error("{name}: the file has shape {file:?}, the model expects {model:?}")]
    Shape {
        name: String,
        file: Vec<usize>,
        model: Vec<usize>,
    },
    #[error("unexpected tensors (not parameters of this model): {names:?}{hint}", names = .0, hint = key_bias_hint(.0))]
    Unexpected(Vec<String>),
    /// Some running statistics but not all: a damaged state_dict (one of
    /// parameters alone, without any, loads).
    #[error("missing buffers (the file has the others' running statistics): {0:?}")]
    MissingBuffers(Vec<String>),
}

/// A setting (a flag, an environment variable, a configuration) that is
/// refused before anything runs. Comparable, so a parser's result can be
/// checked with `assert_eq!`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown {what} {given:?}; the choices are: {known}")]
    Unknown {
        what: &'static str,
        given: String,
        known: &'static str,
    },
    /// An environment variable's value that does not parse.
    #[error("{var}={value:?}: expected {expected}")]
    Env {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("--loss chunked:0 asks for chunks of 0 rows; give ROWS of at least 1, or plain `chunked` for PyTorch's own chunk size")]
    ChunkRowsZero,
    #[error("--loss chunked:{rows}: a chunk has at most {max} rows; give fewer, or plain `chunked` for PyTorch's own chunk size")]
    ChunkRowsTooMany { rows: usize, max: usize },
    #[error("--loss chunked:{given}: ROWS must be a whole number of rows per chunk (chunked:64), or leave it out for PyTorch's own chunk size")]
    ChunkRowsNotANumber { given: String },
    #[error("invalid {what} {value} (must be ≥ 0)")]
    Negative { what: &'static str, value: f32 },
    #[error("--momentum applies to sgd only (Adam's betas are fixed at 0.9, 0.999)")]
    MomentumNotSgd,
    /// A size that must divide by another (`dim` by `heads`).
    #[error("{what} {value} must be a multiple of {by_what} {by}")]
    NotDivisible {
        what: &'static str,
        value: usize,
        by_what: &'static str,
        by: usize,
    },
    #[error("{what} {value} must be in {min}..={max}")]
    OutOfRange {
        what: &'static str,
        value: usize,
        min: usize,
        max: usize,
    },
    /// A value outside a fixed set (`--depth 7`: 50, 101 or 152).
    #[error("{what} {value}: expected {expected}")]
    Choice {
        what: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// What a label counts: a token model's labels are its vocabulary.
fn class_word(what: &str) -> &'static str {
    if what == "token" {
        "tokens in its vocabulary"
    } else {
        "classes"
    }
}

/// ` with D = 64, P = 128`, or nothing.
struct Sizes<'a>(&'a [(&'static str, usize)]);

impl fmt::Display for Sizes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.0.iter().enumerate() {
            let sep = if i == 0 { " with " } else { ", " };
            write!(f, "{sep}{name} = {value}")?;
        }
        Ok(())
    }
}

/// `[2, 3], [4, 5] and [2]`.
struct Shapes<'a>(&'a [Vec<usize>]);

impl fmt::Display for Shapes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        for (i, s) in self.0.iter().enumerate() {
            let sep = match i {
                0 => "",
                i if i + 1 == n => " and ",
                _ => ", ",
            };
            write!(f, "{sep}{s:?}")?;
        }
        Ok(())
    }
}

/// One problem a line.
struct Problems<'a>(&'a [LoadProblem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in self.0 {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_the_values() {
        let e = EngineError::WrongShape {
            op: "attention",
            want: "input [N, S, D]",
            sizes: vec![("D", 64)],
            got: vec![2, 3],
        };
        assert_eq!(
            e.to_string(),
            "attention: needs input [N, S, D] with D = 64, got [2, 3]"
        );
        let e = EngineError::WrongShapes {
            op: "lce",
            want: "h [N, D] and w [V, D]",
            got: vec![vec![2, 3], vec![4, 5], vec![2]],
        };
        assert!(e.to_string().ends_with("got [2, 3], [4, 5] and [2]"), "{e}");
        let e = EngineError::from(ConfigError::ChunkRowsZero).in_file("x.safetensors");
        assert!(e.to_string().starts_with("x.safetensors: --loss"), "{e}");
        let e = EngineError::ClassOutOfRange {
            what: "token",
            value: 70,
            classes: 65,
        };
        assert!(e.to_string().contains("vocabulary"), "{e}");
    }
}

/// What is wrong with a zoo model's sizes (nn::spec), or with the weights
/// file they are read from: the rule broken, named by its flag and value.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("unknown model {name:?}; the zoo has: {} (see `vramlab models`)", .known.join(", "))]
    UnknownModel {
        name: String,
        known: Vec<&'static str>,
    },
    #[error("unknown GPT preset {name:?}; presets: {}", .known.join(", "))]
    UnknownPreset {
        name: String,
        known: Vec<&'static str>,
    },
    #[error("--{flag} does not apply to {model}; `vramlab models` lists each model's flags")]
    FlagDoesNotApply {
        flag: &'static str,
        model: &'static str,
    },
    #[error("a size of {size} is more than the {max} vramlab accepts for one dimension")]
    SizeTooLarge { size: usize, max: usize },
    #[error("--layers {layers} is more than the {max} layers vramlab builds (GPT-3 has 96): every layer is a module with its own parameters and passes; give fewer")]
    TooManyLayers { layers: usize, max: usize },
    /// `flags` names them as the message does: "--dim and --classes".
    #[error("{flags} must be at least 1")]
    Zero { flags: &'static str },
    #[error("--widths needs at least two positive widths (input, …, classes)")]
    Widths,
    #[error("--width {width} doubled over --depth {depth} blocks is more than {max} channels")]
    Channels {
        width: usize,
        depth: usize,
        max: usize,
    },
    #[error("needs width, depth and classes ≥ 1 and a resolution of at least 2^depth = {need}")]
    ResolutionForDepth { need: usize },
    /// What of a ResNet-50-family spec is out of range, only what is.
    #[error("{what}")]
    ResnetSizes { what: String },
    /// `kernel` takes rows up to a fixed length (`ops::LONGEST_REDUCED_ROW`).
    #[error("--{flag} {value}: {kernel} takes rows of at most {max}")]
    RowTooLong {
        flag: &'static str,
        value: usize,
        kernel: &'static str,
        max: usize,
    },
    #[error("--dim {dim} is not a multiple of --heads {heads}")]
    HeadsDoNotDivide { dim: usize, heads: usize },
    #[error("--dropout {0} is not in [0, 1)")]
    Dropout(f32),
    #[error("--seq-len {seq} is more than the {positions} positions")]
    PastPositions { seq: usize, positions: usize },
    #[error("{model} runs in f32 (its {kernels} kernels are f32 only); for 16-bit compute use --amp f16 or --amp bf16 instead of --dtype {dtype}")]
    F32Only {
        model: &'static str,
        kernels: &'static str,
        dtype: DType,
    },
    #[error("{origin}: {missing} is missing, but {later} follows it: numbered layers run from 0 without a gap (nn.Sequential's state_dict)")]
    LayerGap {
        origin: String,
        missing: String,
        later: String,
    },
    #[error("{origin} has no {name}, so it is not a {model} state_dict")]
    NotAStateDict {
        origin: String,
        name: &'static str,
        model: &'static str,
    },
    #[error(
        "{origin}: {name} has shape {shape:?}; a weight needs at least one axis of nonzero size"
    )]
    EmptyWeight {
        origin: String,
        name: String,
        shape: Vec<usize>,
    },
    #[error("{origin}: {names} must be {want}")]
    WeightRank {
        origin: String,
        names: &'static str,
        want: &'static str,
    },
    #[error("{origin}: stages of {blocks:?} blocks are not ResNet-50, 101 or 152")]
    ResnetStages { origin: String, blocks: [usize; 4] },
    #[error("{origin}: metadata {key} = {value:?} is not a number")]
    MetadataNotANumber {
        origin: String,
        key: &'static str,
        value: String,
    },
    #[error(transparent)]
    Weights(#[from] SafetensorsError),
    /// A rule of `model`'s, prefixed with its name.
    #[error("{model}: {source}")]
    InModel {
        model: &'static str,
        source: Box<SpecError>,
    },
}

/// vramlab's attention has no key bias, which PyTorch's default
/// `nn.Linear` has: where those are all a file has too many, how to load
/// it (a constant added to a query's every score, which softmax cancels).
fn key_bias_hint(names: &[String]) -> String {
    if names.is_empty() || !names.iter().all(|n| n.ends_with("k_proj.bias")) {
        return String::new();
    }
    let pops: Vec<String> = names.iter().map(|n| format!("sd.pop('{n}')")).collect();
    format!(
        "; vramlab's attention has no k_proj bias (it adds one constant to every score of a query, which the softmax cancels), so dropping it changes nothing: {} before saving",
        pops.join(", ")
    )
}
