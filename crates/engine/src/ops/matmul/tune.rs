//! Autotuned tiles. The first product of a shape class on an adapter times
//! a bounded set of candidate tiles (a time budget, a progress line on
//! stderr), keeps the fastest and writes it to a cache file keyed by
//! adapter and driver; later products of that class, and later runs, read
//! it and time nothing.
//!
//! Candidates run on a second device of the same adapter, on operands of
//! the product's shape filled with a constant, so tuning allocates nothing
//! in the caching allocator the product runs under: what `estimate` and
//! the observatory count is the same whichever tile wins. Every candidate
//! keeps the fixed tile's K-slice depth, so they all give the same bits.
//!
//! Settings (environment, read once per process):
//! - `VRAMLAB_TUNE`: `auto` (default: on for GPUs, off for CPU adapters,
//!   where each candidate compiles for seconds and the 8-lane table was
//!   tuned by hand), `on`, `off` (the fixed table per adapter class).
//! - `VRAMLAB_TUNE_CACHE`: the cache file (default
//!   `$XDG_CACHE_HOME/vramlab/tiles.json`, else `~/.cache/vramlab/tiles.json`).
//! - `VRAMLAB_TUNE_BUDGET_MS`: time for one shape class (default 2000).
//! - `VRAMLAB_TUNE_CANDIDATES`: the most tiles timed for one (default 24).

use super::coop_tile::CoopTile;
use super::tiles_gpu::{self, GpuLimits};
use super::{gemm_bias, Gemm, GemmShape, MatmulKernel, Target, TileChoice, TileConfig};
use crate::device::compose::Elem;
use crate::memory::AllocatorConfig;
use crate::tensor::{ConfigError, DType, Engine, Tensor, TensorError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Bumped whenever a kernel family changes, so old timings are not trusted.
const CACHE_VERSION: u32 = 2;

/// Whether products choose their tiles by timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// On GPUs, off on CPU adapters.
    Auto,
    On,
    Off,
}

impl Mode {
    pub fn parse(s: &str) -> Result<Mode, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Mode::Auto),
            "on" | "1" | "yes" | "true" => Ok(Mode::On),
            "off" | "0" | "no" | "false" => Ok(Mode::Off),
            other => Err(ConfigError::Env {
                var: "VRAMLAB_TUNE",
                value: other.to_string(),
                expected: "auto, on or off (off uses the fixed tile table)",
            }),
        }
    }
}

/// The tuner's settings, from the environment; an error names a bad value
/// (`matmul::check_env` checks them with the products' other settings).
pub fn check_settings() -> Result<(), ConfigError> {
    Settings::from_env().map(|_| ())
}

#[derive(Debug, Clone)]
struct Settings {
    mode: Mode,
    path: Option<PathBuf>,
    budget: Duration,
    max_candidates: usize,
}

impl Settings {
    fn from_env() -> Result<Settings, ConfigError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let mode = Mode::parse(&var("VRAMLAB_TUNE").unwrap_or_default())?;
        let number = |k: &'static str, default: u64| -> Result<u64, ConfigError> {
            crate::device::settings::number_setting(k, default as usize, 0)
                .map(|n| n as u64)
                .map_err(|value| ConfigError::Env {
                    var: k,
                    value,
                    expected: "a whole number",
                })
        };
        let path = var("VRAMLAB_TUNE_CACHE").map(PathBuf::from).or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("vramlab").join("tiles.json"))
        });
        Ok(Settings {
            mode,
            path,
            budget: Duration::from_millis(number("VRAMLAB_TUNE_BUDGET_MS", DEFAULT_BUDGET_MS)?),
            max_candidates: number("VRAMLAB_TUNE_CANDIDATES", DEFAULT_CANDIDATES)?.max(1) as usize,
        })
    }

    /// Every setting at its default (what a library user with a bad
    /// environment gets; the CLI refuses it first, see [`check_settings`]).
    fn defaults() -> Settings {
        Settings {
            mode: Mode::Auto,
            path: None,
            budget: Duration::from_millis(DEFAULT_BUDGET_MS),
            max_candidates: DEFAULT_CANDIDATES as usize,
        }
    }
}

/// Time for one shape class, and the most tiles timed for one.
const DEFAULT_BUDGET_MS: u64 = 2000;
const DEFAULT_CANDIDATES: u64 = 24;

/// One tuned shape class: the tile that won and what it ran at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub wx: u32,
    pub wy: u32,
    pub tm: u32,
    pub tn: u32,
    pub bk: u32,
    pub shared: bool,
    pub strided_cols: bool,
    pub subgroup_a: bool,
    pub vec4: bool,
    pub gflops: f64,
    /// The tiles timed, and the fixed table's tile's rate among them.
    pub candidates: usize,
    pub fixed_gflops: f64,
}

impl Entry {
    fn tile(&self) -> TileConfig {
        TileConfig {
            wx: self.wx,
            wy: self.wy,
            tm: self.tm,
            tn: self.tn,
            bk: self.bk,
            shared: self.shared,
            strided_cols: self.strided_cols,
            subgroup_a: self.subgroup_a,
            vec4: self.vec4,
        }
    }
}

/// One tuned tensor-core shape class: the block layout and staging that
/// won. Fields this build does not know are kept and written back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoopEntry {
    pub wm: u32,
    pub wn: u32,
    pub tm: u32,
    pub tn: u32,
    /// Absent where a build from before staging was tuned rewrote the
    /// entry (it drops fields it does not know): the class is timed again.
    #[serde(default)]
    pub depth: Option<u32>,
    #[serde(default)]
    pub buffers: Option<u32>,
    pub gflops: f64,
    /// The layouts timed, and the fixed layout's rate among them.
    pub candidates: usize,
    pub fixed_gflops: f64,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl CoopEntry {
    /// The winner, where the entry names its staging.
    fn tile(&self) -> Option<CoopTile> {
        Some(CoopTile::new(self.wm, self.wn, self.tm, self.tn).staged(self.depth?, self.buffers?))
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    /// Adapter (name, backend, driver, ids) → shape class key → entry.
    adapters: BTreeMap<String, BTreeMap<String, Entry>>,
    /// The same for tensor-core layouts (absent from files written before
    /// they were tuned).
    #[serde(default)]
    coop: BTreeMap<String, BTreeMap<String, CoopEntry>>,
    /// Fields of a later build's file, written back as read.
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// What tuning did in this process, for `bench --json` and the tests.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub mode: Option<Mode>,
    pub cache: Option<String>,
    /// Shape classes tuned (timed) in this process.
    pub tuned: usize,
    /// Candidate tiles timed in this process.
    pub timed: usize,
    /// Kernels compiled ahead of their timing, several at once.
    pub compiled_ahead: usize,
    /// Shape classes whose tile came from the cache file.
    pub from_cache: usize,
    /// Every choice made: shape class key → tile.
    pub choices: BTreeMap<String, String>,
}

struct State {
    settings: Settings,
    /// The cache file's entries, read once; `None` until read.
    file: Option<CacheFile>,
    /// A second device per adapter, for candidates.
    probes: BTreeMap<String, Engine>,
    /// Keys already answered in this process (and whether from timing).
    known: BTreeMap<(String, String), Option<TileConfig>>,
    known_coop: BTreeMap<(String, String), Option<CoopTile>>,
    retune: bool,
    stats: Stats,
    warned: bool,
}

impl State {
    /// The cache file's entries, read at the first ask.
    fn file(&mut self) -> &CacheFile {
        self.file
            .get_or_insert_with(|| read_cache(self.settings.path.as_ref()))
    }

    /// The second device of `e`'s adapter that candidates run on, opened
    /// at the first ask (a handle to it: engines share their state).
    fn probe(&mut self, e: &Engine, adapter: &str) -> Option<Engine> {
        if !self.probes.contains_key(adapter) {
            let options = e.gpu()?.options.clone();
            let probe = Engine::new(&options, AllocatorConfig::default()).ok()?;
            self.probes.insert(adapter.to_string(), probe);
        }
        self.probes.get(adapter).cloned()
    }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<State>> {
    let mut s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if s.is_none() {
        let settings = Settings::from_env().unwrap_or_else(|_| Settings::defaults());
        *s = Some(State {
            stats: Stats {
                mode: Some(settings.mode),
                cache: settings.path.as_ref().map(|p| p.display().to_string()),
                ..Stats::default()
            },
            settings,
            file: None,
            probes: BTreeMap::new(),
            known: BTreeMap::new(),
            known_coop: BTreeMap::new(),
            retune: false,
            warned: false,
        });
    }
    s
}

/// Time every shape class again in this process (`bench --tune`),
/// replacing what the cache holds for them.
pub fn retune() {
    if let Some(s) = state().as_mut() {
        s.retune = true;
        s.known.clear();
        s.known_coop.clear();
    }
}

/// What tuning did so far in this process.
pub fn stats() -> Stats {
    state()
        .as_ref()
        .map(|s| s.stats.clone())
        .unwrap_or_default()
}

/// Whether products on `e` choose tiles by timing.
pub fn enabled(e: &Engine) -> bool {
    let mode = state().as_ref().map_or(Mode::Off, |s| s.settings.mode);
    e.gpu().is_some()
        && match mode {
            Mode::On => true,
            Mode::Off => false,
            Mode::Auto => !e.is_cpu_adapter(),
        }
}

fn adapter_key(e: &Engine) -> Option<String> {
    let g = e.gpu()?;
    let i = &g.info;
    Some(format!(
        "{} | {:?} | {} {} | {:#06x}:{:#06x}",
        i.name, i.backend, i.driver, i.driver_info, i.vendor, i.device
    ))
}

/// The shape class key: class, element types, how B is read, which
/// operands are transposed, bias, orientation and the work's size (each
/// factor of 4 its own class), so a 64³ and a 4096³ product tune apart.
fn class_key(g: &Gemm, choice: &TileChoice, elem: Elem, out: Elem, bias: bool) -> String {
    let size = log4((g.m as f64) * (g.n as f64) * (g.k.max(1) as f64) * (g.batch as f64));
    let (a, b) = operand_names(g);
    format!(
        "{:?} {}→{} {a}·{b}{}{}{} 4^{size}",
        choice.class,
        elem.name(),
        out.name(),
        if g.reduce_batch { " Σbatch" } else { "" },
        if bias { " +bias" } else { "" },
        if choice.transposed { " as Cᵀ" } else { "" },
    )
    .to_lowercase()
}

/// How a shape class names its operands: A or Aᵀ, and B, Bᵀ, an im2col
/// or an im2colᵀ.
pub(crate) fn operand_names(g: &Gemm) -> (&'static str, &'static str) {
    let a = if g.a.col_stride != 1 && g.k > 1 {
        "Aᵀ"
    } else {
        "A"
    };
    let b = match g.implicit_b {
        None if g.b.col_stride != 1 && g.n > 1 => "Bᵀ",
        None => "B",
        Some(c) if c.transposed => "im2colᵀ",
        Some(_) => "im2col",
    };
    (a, b)
}

/// A size's class: each factor of 4 its own.
pub(crate) fn log4(x: f64) -> i64 {
    (x.max(1.0).log2() / 2.0).floor() as i64
}

/// The tiles to time for `choice` on `e`: the fixed choice first, then the
/// adapter class's family, all with its K-slice depth.
fn candidates(e: &Engine, g: &Gemm, choice: &TileChoice, out16: bool) -> Vec<TileConfig> {
    let fixed = choice.tile;
    let mut v = vec![fixed];
    let more: Vec<TileConfig> = match Target::of(e) {
        Target::Gpu => {
            let limits = e
                .gpu()
                .map_or(GpuLimits::DEFAULT, |g| GpuLimits::of(&g.limits));
            let mut c = tiles_gpu::candidates(choice.class, fixed.bk, &limits);
            tiles_gpu::rank_for_shape(&mut c, g.m, g.n);
            c
        }
        Target::CpuSubgroup8 => {
            let mut c = Vec::new();
            for (tm, tn) in [(fixed.tm, fixed.tn), (32, 8), (64, 8), (32, 4), (16, 8)] {
                for wy in [1, 2, 4] {
                    for strided in [fixed.strided_cols, !fixed.strided_cols] {
                        let mut t = fixed;
                        t.tm = tm;
                        t.tn = tn;
                        t.wy = wy;
                        t.strided_cols = strided;
                        c.push(t);
                    }
                }
            }
            c
        }
        Target::Cpu => [(8, 16, 8, 8), (8, 8, 8, 8), (16, 8, 4, 4), (8, 16, 4, 2)]
            .iter()
            .map(|&(wx, wy, tm, tn)| {
                let mut t = TileConfig::new(wx, wy, tm, tn, fixed.bk, false);
                t.vec4 = fixed.vec4;
                t
            })
            .collect(),
    };
    for t in more {
        // 16-bit outputs are stored in whole words: an even thread width,
        // as the fixed tile has (else the product would take an f32
        // workspace, and tuning must not change what is allocated).
        let words = !out16 || t.tn.is_multiple_of(2);
        if t.is_valid() && words && !v.contains(&t) {
            v.push(t);
        }
    }
    v
}

/// The tile `g` runs with on `e` when tiles are tuned: from this process's
/// answers, the cache file, or by timing now. `None` where tuning is off,
/// the device is simulated, or timing failed (the fixed choice runs).
pub fn tuned(
    e: &Engine,
    g: &Gemm,
    choice: &TileChoice,
    dtypes: (DType, DType),
    bias: bool,
) -> Option<TileConfig> {
    if !enabled(e) {
        return None;
    }
    let adapter = adapter_key(e)?;
    let (elem, out) = (dtypes.0.elem(), dtypes.1.elem());
    let key = class_key(g, choice, elem, out, bias);
    let mut guard = state();
    let s = guard.as_mut()?;
    if let Some(known) = s.known.get(&(adapter.clone(), key.clone())) {
        return *known;
    }
    if !s.retune {
        let cached = s
            .file()
            .adapters
            .get(&adapter)
            .and_then(|m| m.get(&key))
            .map(Entry::tile)
            .filter(|t| t.is_valid() && t.bk == choice.tile.bk);
        if let Some(t) = cached {
            s.stats.from_cache += 1;
            s.stats.choices.insert(key.clone(), t.describe());
            s.known.insert((adapter, key), Some(t));
            return Some(t);
        }
    }
    let found = time_candidates(s, e, &adapter, &key, g, choice, dtypes, bias);
    s.known.insert(
        (adapter.clone(), key.clone()),
        found.as_ref().map(|x| x.tile()),
    );
    let entry = found?;
    s.stats.tuned += 1;
    s.stats.choices.insert(key.clone(), entry.tile().describe());
    let tile = entry.tile();
    if let Some(file) = s.file.as_mut() {
        file.adapters
            .entry(adapter.clone())
            .or_default()
            .insert(key.clone(), entry);
    }
    if let Err(why) = write_cache(s.settings.path.as_ref(), &adapter, &key, s.file.as_ref()) {
        if !s.warned {
            eprintln!("vramlab: tuned tiles kept for this run only: {why}");
            s.warned = true;
        }
    }
    Some(tile)
}

/// A rate as the cache file keeps it: JSON has no NaN, so 0 where the
/// fixed candidate did not run.
fn json_rate(rate: f64) -> f64 {
    if rate.is_finite() {
        rate
    } else {
        0.0
    }
}

/// Times `tiles` on the probe device, with how many kernels it compiled
/// ahead: what [`tuned_coop`] asks of the product's own code.
pub(crate) type TimeLayouts<'a> = dyn Fn(&Engine, &[CoopTile]) -> (Vec<Option<f64>>, usize) + 'a;

/// The tensor-core layout a product of class `key` runs with on `e` when
/// tiles are tuned, as [`tuned`] for tiles: from this process's answers,
/// the cache file, or by timing `candidates` (the fixed layout first) in
/// rounds while the budget lasts. `None` where tuning is off or no
/// candidate could be timed (the fixed layout runs). Every layout adds
/// each entry's K steps in the same order, so they give the same bits, and
/// none allocates: what is allocated does not depend on the winner.
pub(crate) fn tuned_coop(
    e: &Engine,
    key: &str,
    g: &Gemm,
    candidates: &[CoopTile],
    time: &TimeLayouts<'_>,
) -> Option<CoopTile> {
    if !enabled(e) || candidates.is_empty() {
        return None;
    }
    let adapter = adapter_key(e)?;
    let mut guard = state();
    let s = guard.as_mut()?;
    let id = (adapter.clone(), key.to_string());
    // An answer of this process stands only if it is still a candidate.
    if let Some(&known) = s.known_coop.get(&id) {
        if known.is_none_or(|t| candidates.contains(&t)) {
            return known;
        }
    }
    if !s.retune {
        // A layout this adapter no longer offers is timed again.
        let cached = s
            .file()
            .coop
            .get(&adapter)
            .and_then(|m| m.get(key))
            .and_then(CoopEntry::tile)
            .filter(|t| candidates.contains(t));
        if let Some(t) = cached {
            s.stats.from_cache += 1;
            s.stats.choices.insert(key.to_string(), t.describe());
            s.known_coop.insert(id, Some(t));
            return Some(t);
        }
    }
    let started = Instant::now();
    let mut tiles = candidates.to_vec();
    tiles.truncate(s.settings.max_candidates);
    let probe = &s.probe(e, &adapter)?;
    let flops = 2.0 * (g.m * g.n * g.k.max(1) * g.batch.max(1)) as f64;
    eprint!(
        "vramlab: tuning tensor-core layouts for {key} ({}×{}·K{} ×{}), {} candidates …",
        g.m,
        g.n,
        g.k,
        g.batch,
        tiles.len()
    );
    let mut compiled = 0;
    let Rounds {
        best,
        fixed_rate,
        timed,
    } = time_in_rounds(&tiles, flops, started, s.settings.budget, &mut |round| {
        let (times, ahead) = time(probe, round);
        compiled += ahead;
        times
    });
    s.stats.timed += timed;
    s.stats.compiled_ahead += compiled;
    let Some((tile, gflops)) = best else {
        eprintln!(" none ran; the fixed layout runs");
        s.known_coop.insert(id, None);
        return None;
    };
    eprintln!(
        " {} at {gflops:.1} GFLOP/s (fixed {} at {fixed_rate:.1}), {:.1} s",
        tile.describe(),
        candidates[0].describe(),
        started.elapsed().as_secs_f64()
    );
    s.stats.tuned += 1;
    s.stats.choices.insert(key.to_string(), tile.describe());
    s.known_coop.insert(id, Some(tile));
    let entry = CoopEntry {
        wm: tile.wm,
        wn: tile.wn,
        tm: tile.tm,
        tn: tile.tn,
        depth: Some(tile.depth),
        buffers: Some(tile.buffers),
        gflops,
        candidates: timed,
        fixed_gflops: json_rate(fixed_rate),
        other: BTreeMap::new(),
    };
    if let Some(file) = s.file.as_mut() {
        file.coop
            .entry(adapter.clone())
            .or_default()
            .insert(key.to_string(), entry.clone());
    }
    let merge = |f: &mut CacheFile| {
        f.coop
            .entry(adapter.clone())
            .or_default()
            .insert(key.to_string(), entry.clone());
    };
    if let Err(why) = write_merged(s.settings.path.as_ref(), &merge) {
        if !s.warned {
            eprintln!("vramlab: tuned tiles kept for this run only: {why}");
            s.warned = true;
        }
    }
    Some(tile)
}

#[allow(clippy::too_many_arguments)]
fn time_candidates(
    s: &mut State,
    e: &Engine,
    adapter: &str,
    key: &str,
    g: &Gemm,
    choice: &TileChoice,
    (dtype, out): (DType, DType),
    bias: bool,
) -> Option<Entry> {
    let started = Instant::now();
    let mut tiles = candidates(e, g, choice, out.is_16bit());
    tiles.truncate(s.settings.max_candidates);
    let probe = &s.probe(e, adapter)?;
    let shape = GemmShape::of(g, "tune");
    let pg = shape.gemm();
    let (na, nb, nc) = shape.sizes();
    let filled = |n: usize, dt: DType, name: &str| {
        Tensor::generated(probe, &[n.max(1)], dt, name, |n| vec![0.5; n])
    };
    let operands = (|| {
        Ok::<_, crate::tensor::TensorError>((
            filled(na, dtype, "tune.a")?,
            filled(nb, dtype, "tune.b")?,
            filled(nc, out, "tune.c")?,
            if bias {
                Some(filled(g.m, dtype, "tune.bias")?)
            } else {
                None
            },
        ))
    })();
    let Ok((a, b, c, bias_t)) = operands else {
        // Too large for a second copy beside the run: the fixed tile.
        probe.allocator().empty_cache();
        return None;
    };
    let flops = shape.flops().max(1.0);
    eprint!(
        "vramlab: tuning matmul tiles for {key} ({}×{}·K{} ×{}), {} candidates …",
        g.m,
        g.n,
        g.k,
        g.batch,
        tiles.len()
    );
    let kernel_for = |t: &TileConfig| {
        if choice.transposed {
            MatmulKernel::FixedTransposed(*t)
        } else {
            MatmulKernel::Fixed(*t)
        }
    };
    // Each round's kernels compiled together before any is timed.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut compiled = 0;
    let Rounds {
        best,
        fixed_rate,
        timed,
    } = time_in_rounds(&tiles, flops, started, s.settings.budget, &mut |round| {
        if let Some(gpu) = probe.gpu() {
            let mut kernels = Vec::new();
            for t in round {
                let run = || gemm_bias(&pg, &a, &b, &c, bias_t.as_ref(), kernel_for(t));
                kernels.extend(gpu.kernels_of(run).1);
            }
            compiled += gpu.precompile(&kernels, threads);
        }
        round
            .iter()
            .map(|t| time_one(probe, &pg, [&a, &b, &c], bias_t.as_ref(), kernel_for(t)))
            .collect()
    });
    s.stats.compiled_ahead += compiled;
    drop((a, b, c, bias_t));
    probe.allocator().empty_cache();
    s.stats.timed += timed;
    let (tile, gflops) = best?;
    eprintln!(
        " {} at {:.1} GFLOP/s (fixed {} at {:.1}), {:.1} s",
        tile.describe(),
        gflops,
        choice.tile.describe(),
        fixed_rate,
        started.elapsed().as_secs_f64()
    );
    Some(Entry {
        wx: tile.wx,
        wy: tile.wy,
        tm: tile.tm,
        tn: tile.tn,
        bk: tile.bk,
        shared: tile.shared,
        strided_cols: tile.strided_cols,
        subgroup_a: tile.subgroup_a,
        vec4: tile.vec4,
        gflops,
        candidates: timed,
        fixed_gflops: json_rate(fixed_rate),
    })
}

/// What timing candidates in rounds found: the fastest and its rate in
/// GFLOP/s, the first (fixed) candidate's rate (NaN where it did not run),
/// and how many ran.
struct Rounds<T> {
    best: Option<(T, f64)>,
    fixed_rate: f64,
    timed: usize,
}

/// Times `candidates` (the fixed one first) of a product of `flops` in
/// rounds of as many as the host compiles at once, the fixed one and one
/// rival at least, 8 at most (should a driver compile one at a time, a
/// round overruns the budget by a few compiles only); rounds go on while
/// `budget` since `started` lasts. `time` gives a round's seconds, `None`
/// for one that failed; a rate that is not finite is not kept.
fn time_in_rounds<T: Copy>(
    candidates: &[T],
    flops: f64,
    started: Instant,
    budget: Duration,
    time: &mut dyn FnMut(&[T]) -> Vec<Option<f64>>,
) -> Rounds<T> {
    let per_round = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(2, 8);
    let mut found = Rounds {
        best: None,
        fixed_rate: f64::NAN,
        timed: 0,
    };
    let mut first = 0;
    while first < candidates.len() && (first == 0 || started.elapsed() <= budget) {
        let round = &candidates[first..(first + per_round).min(candidates.len())];
        for (j, (t, secs)) in round.iter().zip(time(round)).enumerate() {
            let Some(rate) = secs.map(|s| flops / s / 1e9).filter(|r| r.is_finite()) else {
                continue;
            };
            found.timed += 1;
            if first + j == 0 {
                found.fixed_rate = rate;
            }
            if found.best.is_none_or(|(_, r)| rate > r) {
                found.best = Some((*t, rate));
            }
        }
        first += round.len();
    }
    found
}

/// The fastest of a warm-up and three runs, in seconds: device time where
/// the adapter has timestamp queries, else wall clock and a wait.
fn time_one(
    e: &Engine,
    g: &Gemm,
    [a, b, c]: [&Tensor; 3],
    bias: Option<&Tensor>,
    kernel: MatmulKernel,
) -> Option<f64> {
    best_seconds(e, &|| gemm_bias(g, a, b, c, bias, kernel))
}

/// [`time_one`] for any `run` of dispatches on `e`.
pub(crate) fn best_seconds(e: &Engine, run: &dyn Fn() -> Result<(), TensorError>) -> Option<f64> {
    run().ok()?;
    e.synchronize().ok()?;
    let timing = e.start_timing();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        best = best.min(seconds_with(e, run).ok()?);
    }
    if timing.is_some() {
        e.stop_timing().ok()?;
    }
    (best.is_finite() && best > 0.0).then_some(best)
}

/// One run of the product in seconds: the sum of its dispatches' device
/// timestamps where the engine's timer has them, else wall clock around
/// the product and a wait (`vramlab bench` times its products with it too).
pub fn seconds_of(
    e: &Engine,
    g: &Gemm,
    [a, b, c]: [&Tensor; 3],
    bias: Option<&Tensor>,
    kernel: MatmulKernel,
) -> Result<f64, crate::tensor::TensorError> {
    seconds_with(e, &|| gemm_bias(g, a, b, c, bias, kernel))
}

fn seconds_with(e: &Engine, run: &dyn Fn() -> Result<(), TensorError>) -> Result<f64, TensorError> {
    e.take_dispatch_times()?;
    let t0 = Instant::now();
    run()?;
    e.synchronize()?;
    let wall = t0.elapsed().as_secs_f64();
    Ok(match e.take_dispatch_times()? {
        Some((crate::device::TimingSource::TimestampQueries, t)) if !t.is_empty() => {
            t.iter().map(|d| d.seconds).sum()
        }
        _ => wall,
    })
}

fn read_cache(path: Option<&PathBuf>) -> CacheFile {
    let fresh = CacheFile {
        version: CACHE_VERSION,
        ..Default::default()
    };
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return fresh;
    };
    match serde_json::from_str::<CacheFile>(&text) {
        Ok(f) if f.version == CACHE_VERSION => f,
        // Another version's timings, or a damaged file: tuned again and
        // rewritten.
        _ => fresh,
    }
}

/// Whether the cache may be written over what `path` holds: nothing, an
/// empty file, or a tile cache of any version, damaged ones included (the
/// text names both of its keys). Anything else is someone's file, named
/// by mistake.
fn replaceable(path: &std::path::Path) -> bool {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            text.trim().is_empty()
                || (text.trim_start().starts_with('{')
                    && text.contains("\"version\"")
                    && text.contains("\"adapters\""))
        }
        // Missing, or unreadable: the write says why, if it fails.
        Err(_) => true,
    }
}

/// Writes `key`'s tile entry into the file ([`write_merged`]).
fn write_cache(
    path: Option<&PathBuf>,
    adapter: &str,
    key: &str,
    ours: Option<&CacheFile>,
) -> Result<(), TensorError> {
    let Some(entry) = ours
        .and_then(|f| f.adapters.get(adapter))
        .and_then(|m| m.get(key))
    else {
        return match path {
            Some(_) => Ok(()),
            None => Err(TensorError::NoTuneCache),
        };
    };
    write_merged(path, &|file: &mut CacheFile| {
        file.adapters
            .entry(adapter.to_string())
            .or_default()
            .insert(key.to_string(), entry.clone());
    })
}

/// The cache file as it is now (another run may have added entries) with
/// `merge` applied, written whole to a temporary file and renamed over the
/// old one, so a reader never sees half a file.
fn write_merged(path: Option<&PathBuf>, merge: &dyn Fn(&mut CacheFile)) -> Result<(), TensorError> {
    let Some(path) = path else {
        return Err(TensorError::NoTuneCache);
    };
    if !replaceable(path) {
        return Err(TensorError::NotATuneCache(path.clone()));
    }
    let mut file = read_cache(Some(path));
    merge(&mut file);
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| TensorError::Io { path, source }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let text = serde_json::to_string_pretty(&file).map_err(TensorError::TuneCacheJson)?;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_bad_values_say_what_is_expected() {
        assert_eq!(Mode::parse("").unwrap(), Mode::Auto);
        assert_eq!(Mode::parse("ON").unwrap(), Mode::On);
        assert_eq!(Mode::parse("0").unwrap(), Mode::Off);
        let e = Mode::parse("fast").unwrap_err().to_string();
        assert!(e.contains("auto, on or off"), "{e}");
    }

    /// A later build's fields (this build's tensor-core layouts, to the
    /// build before it) survive a write by this one.
    #[test]
    fn fields_this_build_does_not_know_are_written_back() {
        let dir = std::env::temp_dir().join(format!("vramlab-tune-later-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tiles.json");
        std::fs::write(
            &p,
            format!(r#"{{"version":{CACHE_VERSION},"adapters":{{}},"later":{{"gpu":[1,2]}}}}"#),
        )
        .unwrap();
        write_merged(Some(&p), &|f: &mut CacheFile| {
            f.coop.entry("gpu".into()).or_default();
        })
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["later"], serde_json::json!({"gpu": [1, 2]}), "{v}");
        assert!(v["coop"]["gpu"].is_object(), "{v}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A tensor-core entry keeps fields it does not know, and one without
    /// its staging (rewritten by a build from before staging was tuned)
    /// names no winner, so its class is timed again.
    #[test]
    fn coop_entries_keep_later_fields_and_need_their_staging() {
        let base = r#""wm":2,"wn":4,"tm":4,"tn":4,"gflops":1.5,"candidates":23,"fixed_gflops":1.0"#;
        let old: CoopEntry = serde_json::from_str(&format!("{{{base}}}")).unwrap();
        assert_eq!(old.tile(), None);
        let text = format!(r#"{{{base},"depth":2,"buffers":2,"later":[1]}}"#);
        let new: CoopEntry = serde_json::from_str(&text).unwrap();
        assert_eq!(new.tile(), Some(CoopTile::new(2, 4, 4, 4).staged(2, 2)));
        let back = serde_json::to_value(&new).unwrap();
        assert_eq!(back["later"], serde_json::json!([1]), "{back}");
        assert_eq!(
            (back["depth"].as_u64(), back["buffers"].as_u64()),
            (Some(2), Some(2))
        );
    }

    #[test]
    fn a_damaged_or_old_cache_is_read_as_empty() {
        let dir = std::env::temp_dir().join(format!("vramlab-tune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tiles.json");
        std::fs::write(&p, "{not json").unwrap();
        assert!(read_cache(Some(&p)).adapters.is_empty());
        std::fs::write(&p, r#"{"version":0,"adapters":{"x":{}}}"#).unwrap();
        assert!(read_cache(Some(&p)).adapters.is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A cache of any version, or a damaged one, is retuned over;
    /// someone's other file, named by mistake, is left alone with an error
    /// that says so.
    #[test]
    fn a_file_that_is_not_a_tile_cache_is_not_written_over() {
        let dir = std::env::temp_dir().join(format!("vramlab-tune-other-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let notes = dir.join("notes.txt");
        std::fs::write(&notes, "my important notes\n").unwrap();
        let mut ours = CacheFile::default();
        ours.adapters.entry("gpu".into()).or_default().insert(
            "k".into(),
            Entry {
                wx: 8,
                wy: 8,
                tm: 4,
                tn: 4,
                bk: 8,
                shared: true,
                strided_cols: false,
                subgroup_a: false,
                vec4: true,
                gflops: 1.0,
                candidates: 1,
                fixed_gflops: 1.0,
            },
        );
        let e = write_cache(Some(&notes), "gpu", "k", Some(&ours)).unwrap_err();
        assert!(matches!(e, TensorError::NotATuneCache(_)), "{e}");
        assert_eq!(
            std::fs::read_to_string(&notes).unwrap(),
            "my important notes\n"
        );
        let old = dir.join("tiles.json");
        for cache in [
            r#"{"version":0,"adapters":{}}"#,
            r#"{"version":2,"adapters":{"x":"#,
        ] {
            std::fs::write(&old, cache).unwrap();
            write_cache(Some(&old), "gpu", "k", Some(&ours)).unwrap();
            assert_eq!(read_cache(Some(&old)).adapters["gpu"].len(), 1, "{cache}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
