//! f16 products on cooperative matrices (tensor cores): A and B f16, the
//! sum in f32, C f32 or f16. A workgroup of WM×WN subgroups owns a block of
//! C, each subgroup TM×TN tiles of the adapter's matrix side (16 on NVIDIA,
//! 8 on lavapipe). Interior steps load tiles straight from storage where the
//! layout allows it; edges, odd strides and windowed tensors are staged in
//! workgroup memory with zeros past the edges, so any sizes, strides,
//! offsets and batches run. Convolutions read B as the im2col in place, a
//! bias per row is added in the epilogue, and summed batches (weight
//! gradients) accumulate in the same tiles. A product cut into K splits
//! writes each split's f32 partial product into its own slot, as the plain
//! kernels do. Used where the device enabled f16 cooperative matrices
//! (`Engine::tensor_core_lanes`).

pub use super::coop_tile::{CoopTile, TILE_VAR};
use super::dispatch::Bias;
use super::tile::conv_defs;
use super::{Gemm, MatView, MatmulParams, Oriented};
use crate::device::compose::{Defs, Elem};
use crate::device::settings::word_setting;
use crate::device::{Kernel, Workgroups};
use crate::ops::MAX_LOOP_ITERATIONS;
use crate::tensor::{ConfigError, DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../../shaders/matmul_coop.wgsl");

/// How interior steps read A and B ([`Loads`]): `direct`, `staged` or
/// `wide`; to compare them.
pub const LOADS_VAR: &str = "VRAMLAB_COOP_LOADS";
/// Tiles of K a staged step copies at once (1 to 4, default 1).
pub const DEPTH_VAR: &str = "VRAMLAB_COOP_STAGE_DEPTH";
/// `0` turns off reading the next staged step into registers during this
/// one's products (wide loads only); to compare.
pub const PREFETCH_VAR: &str = "VRAMLAB_COOP_PREFETCH";
/// `2` stages steps in two copies of workgroup memory, one barrier a step
/// (prefetching wide loads only); to compare.
pub const BUFFERS_VAR: &str = "VRAMLAB_COOP_BUFFERS";
/// `1` reads a wide item as two 8-byte loads of halves stored as they are,
/// rather than one 16-byte load unpacked to f32 and converted back; to
/// compare (not measured on a GPU yet).
pub const HALVES_VAR: &str = "VRAMLAB_COOP_HALVES";
/// One tile deep: on an H200, f16 4096³ ran at 82.6 TFLOP/s staged one
/// tile deep, 62.9 two deep, 33.7 four deep (docs/tensor_cores.md).
const DEFAULT_DEPTH: u32 = 1;
/// One copy: on an H200 two copies ran f16 4096³ at 68.0 TFLOP/s against
/// 119.0 in the default layout (docs/tensor_cores.md).
const DEFAULT_BUFFERS: u32 = 1;

/// How the steps of K inside a block read A and B, where the operands'
/// layout allows (else staged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loads {
    /// Each subgroup loads its tiles straight from storage.
    Direct,
    /// The workgroup copies slices into workgroup memory, a half a load.
    Staged,
    /// As staged, eight halves (16 bytes) a load.
    Wide,
}

/// How staged steps run: tiles of K a step, the interior loads, whether
/// wide steps prefetch the next step, copies of workgroup memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staging {
    pub depth: u32,
    pub loads: Loads,
    pub prefetch: bool,
    pub buffers: u32,
    /// Wide items as two loads of halves ([`HALVES_VAR`]).
    pub halves: bool,
}

/// A `1`/`0` setting: `default` where unset, an error naming what it takes
/// otherwise.
fn on_off(var: &'static str, default: bool, expected: &'static str) -> Result<bool, ConfigError> {
    word_setting(var, &[("1", true), ("0", false)], default).map_err(|value| ConfigError::Env {
        var,
        value,
        expected,
    })
}

/// The staging from the environment: depth ([`DEPTH_VAR`]), interior
/// loads ([`LOADS_VAR`]), prefetching ([`PREFETCH_VAR`]), copies
/// ([`BUFFERS_VAR`]) and halves ([`HALVES_VAR`]).
pub fn staging_from_env() -> Result<Staging, ConfigError> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let depth = match var(DEPTH_VAR) {
        None => DEFAULT_DEPTH,
        Some(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|d| (1..=4).contains(d))
            .ok_or(ConfigError::Env {
                var: DEPTH_VAR,
                value: v,
                expected: "1, 2, 3 or 4 tiles of K a staged step",
            })?,
    };
    // Wide by default: on an H200, 82.6 TFLOP/s against 47.5 staged a half
    // a load and 75.6 loaded direct (docs/tensor_cores.md).
    let loads = match var(LOADS_VAR).map(|v| v.trim().to_ascii_lowercase()) {
        None => Loads::Wide,
        Some(v) => match v.as_str() {
            "direct" => Loads::Direct,
            "staged" => Loads::Staged,
            "wide" => Loads::Wide,
            _ => {
                return Err(ConfigError::Env {
                    var: LOADS_VAR,
                    value: v,
                    expected: "direct, staged or wide",
                })
            }
        },
    };
    let prefetch = on_off(
        PREFETCH_VAR,
        true,
        "1 (read the next step during this one's products) or 0",
    )?;
    let buffers = match var(BUFFERS_VAR).as_deref().map(str::trim) {
        None => DEFAULT_BUFFERS,
        Some("1") => 1,
        Some("2") => 2,
        Some(v) => {
            return Err(ConfigError::Env {
                var: BUFFERS_VAR,
                value: v.to_string(),
                expected: "1 or 2 copies of the staged slices",
            })
        }
    };
    let halves = on_off(
        HALVES_VAR,
        false,
        "1 (wide items as two 8-byte loads of halves) or 0 (one 16-byte load, unpacked)",
    )?;
    Ok(Staging {
        depth,
        loads,
        prefetch,
        buffers,
        halves,
    })
}

/// The staged depth, the loads, prefetching and the layout override from the
/// environment, read once: every product asks for them.
fn settings() -> &'static (Staging, Option<CoopTile>) {
    static SETTINGS: std::sync::OnceLock<(Staging, Option<CoopTile>)> = std::sync::OnceLock::new();
    SETTINGS.get_or_init(|| {
        let staging = staging_from_env().unwrap_or(Staging {
            depth: DEFAULT_DEPTH,
            loads: Loads::Wide,
            prefetch: true,
            buffers: DEFAULT_BUFFERS,
            halves: false,
        });
        (staging, CoopTile::from_env().ok().flatten())
    })
}

/// The block layout for `g`, staged `depth` deep in `buffers` copies: the
/// override if set, else large blocks where they still give two workgroups
/// for each of ~132 multiprocessors, smaller ones for small products;
/// shrunk until the adapter's limits hold.
fn layout(
    g: &Gemm,
    side: u32,
    lanes: u32,
    depth: u32,
    buffers: u32,
    chosen: Option<CoopTile>,
    limits: &wgpu::Limits,
) -> CoopTile {
    let fits = |t: &CoopTile| fits(t, side, lanes, limits);
    let wanted = chosen.unwrap_or_else(|| {
        // 16×16: 2×4 subgroups of 4×2 tiles (a 128×128 block, 256
        // invocations) ran f16 4096³ at 119.0 TFLOP/s on an H200 with
        // prefetching, 2×2 of 4×4 at 96.9 (docs/tensor_cores.md).
        let (big, small) = if side >= 16 {
            (CoopTile::new(2, 4, 4, 2), CoopTile::new(2, 2, 2, 2))
        } else {
            (CoopTile::new(2, 2, 2, 2), CoopTile::new(2, 2, 1, 1))
        };
        let (bm, bn) = big.block(side);
        if g.m.div_ceil(bm) * g.n.div_ceil(bn) * g.batch >= 264 {
            big
        } else {
            small
        }
    });
    let wanted = wanted.staged(depth, buffers);
    [
        wanted,
        CoopTile {
            tm: 1,
            tn: 1,
            ..wanted
        },
        CoopTile::new(1, 1, 1, 1).staged(depth, buffers),
    ]
    .into_iter()
    .find(fits)
    .unwrap_or(CoopTile::new(1, 1, 1, 1).staged(depth, buffers))
}

/// Whether the adapter runs layout `t`: its invocations and its workgroup
/// memory within the limits.
fn fits(t: &CoopTile, side: u32, lanes: u32, limits: &wgpu::Limits) -> bool {
    t.invocations(lanes) <= limits.max_compute_invocations_per_workgroup
        && t.invocations(lanes) <= limits.max_compute_workgroup_size_x
        && t.shared_bytes(side) <= limits.max_compute_workgroup_storage_size
}

/// Layouts the tuner times for a product whose fixed layout is `default`
/// (first): blocks from 32 to 256 a side, of 4 to 16 subgroups' worth of
/// tiles, staged as `default` is; after the first round of eight, the
/// fixed layout and 2×4 of 4×4 also staged each of `stagings` ((depth,
/// copies)), since the best staging moves with the layout
/// (docs/tensor_cores.md); those
/// the adapter runs (`fits`). With a `budget` (a CPU adapter, tuning there
/// only when asked) none whose invocations run more loop iterations an
/// entry than it: the summed batch's loop budget was planned with the fixed
/// layout's.
fn layout_candidates(
    default: CoopTile,
    stagings: &[(u32, u32)],
    fits: &dyn Fn(&CoopTile) -> bool,
    iterations: &dyn Fn(&CoopTile) -> usize,
    budget: Option<usize>,
) -> Vec<CoopTile> {
    let tile = CoopTile::new;
    let layouts = [
        tile(2, 4, 4, 2),
        tile(4, 2, 2, 4),
        tile(2, 2, 4, 4),
        tile(2, 4, 2, 2),
        tile(2, 2, 2, 2),
        tile(1, 4, 4, 2),
        tile(2, 2, 2, 4),
        tile(4, 2, 2, 2),
        tile(2, 2, 4, 2),
        tile(4, 1, 2, 4),
        tile(4, 4, 2, 2),
        tile(2, 4, 2, 4),
        tile(1, 2, 4, 4),
        tile(2, 1, 4, 4),
        tile(2, 2, 1, 2),
        tile(2, 2, 1, 1),
    ]
    .map(|t| default.with_layout(t));
    let mut v = vec![default];
    let add = |t: CoopTile, v: &mut Vec<CoopTile>| {
        let within = budget.is_none_or(|b| iterations(&t) <= b);
        if within && fits(&t) && !v.contains(&t) {
            v.push(t);
        }
    };
    // Rounds of up to 8 are timed while the budget lasts: the first holds
    // the most different shapes (128×128, 64×128, 64×64, 128×64 blocks).
    let mut rest = layouts.iter().copied();
    while v.len() < ROUND {
        let Some(t) = rest.next() else { break };
        add(t, &mut v);
    }
    // Then the fixed layout and 2×4 subgroups of 4×4 tiles (which two
    // copies lifted from 97.8 to 107.8 TFLOP/s on an H200's f16 4096³,
    // docs/tensor_cores.md) in each other staging.
    for t in [default, default.with_layout(CoopTile::new(2, 4, 4, 4))] {
        add(t, &mut v);
        for &(d, b) in stagings {
            add(t.staged(d, b), &mut v);
        }
    }
    for t in rest {
        add(t, &mut v);
    }
    v
}

/// Candidates a round of tuning times, the first round all in the fixed
/// staging.
const ROUND: usize = 8;

/// The tuner's shape class of a product on tensor cores: C's type, the
/// operands' orientation, a summed batch, a bias, a K split, how interior
/// steps load (`staging`), the sizes of M, N and the work (each factor of
/// 4 its own class), and the fixed layout, whose loop budget bounds the
/// candidates on a CPU adapter.
fn class_key(
    g: &Gemm,
    out: Elem,
    bias: bool,
    splits: usize,
    staging: &str,
    fixed: CoopTile,
) -> String {
    use super::tune::log4;
    let work = (g.m as f64) * (g.n as f64) * (g.k.max(1) as f64) * (g.batch.max(1) as f64);
    let (a, b) = super::tune::operand_names(g);
    format!(
        "coop f16→{} {a}·{b}{}{}{} {staging} m4^{} n4^{} 4^{} fixed {}",
        out.name(),
        if g.reduce_batch { " Σbatch" } else { "" },
        if bias { " +bias" } else { "" },
        if splits > 1 { " split" } else { "" },
        log4(g.m as f64),
        log4(g.n as f64),
        log4(work),
        fixed.describe(),
    )
    .to_lowercase()
}

/// `(column-major, leading stride)` of a view the kernel reads by rows or
/// by columns, or `None` where neither stride is 1.
fn major(v: &MatView) -> Option<(bool, usize)> {
    if v.col_stride == 1 {
        Some((false, v.row_stride))
    } else if v.row_stride == 1 {
        Some((true, v.col_stride))
    } else {
        None
    }
}

/// Whether interior tiles may be loaded straight from storage: the tensor
/// binds whole (the kernel names its array) and every tile's rows start on
/// 16 bytes (8 halves), as cooperative loads require.
fn direct_ok(v: &MatView, t: &Tensor, batch: usize) -> bool {
    let whole = t
        .engine()
        .gpu()
        .is_some_and(|gpu| gpu.binds_whole(&t.slice()));
    whole
        && major(v).is_some_and(|(_, lead)| lead.is_multiple_of(8))
        && v.offset.is_multiple_of(8)
        && (batch == 1 || v.batch_stride.is_multiple_of(8))
}

/// The subgroup size to run `g` with on tensor cores, or `None` where the
/// plain kernels must run it: no f16 cooperative matrices, operands not
/// f16, a bf16 output, a bias that is not one f16 value per row, or a grid
/// or loop past the device's limits.
pub fn usable(g: &Gemm, a: &Tensor, b: &Tensor, c: DType, bias: Option<&Tensor>) -> Option<u32> {
    usable_split(g, a, b, c, bias, 1, g.k)
}

/// [`usable`] for `g` cut into `splits` slices of K `k_chunk` deep (one
/// workgroup layer a slice and entry, each slice's loop bounded by its
/// depth, rounded up to whole staged steps as [`gemm_grouped`] runs it).
pub fn usable_split(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: DType,
    bias: Option<&Tensor>,
    splits: usize,
    k_chunk: usize,
) -> Option<u32> {
    let e = a.engine();
    let lanes = e.tensor_core_lanes()?;
    let side = e.tensor_core_size()? as usize;
    let max_dim =
        e.gpu()
            .map_or(65_535, |g| g.limits.max_compute_workgroups_per_dimension) as usize;
    let fits = [
        g.m.div_ceil(side),
        g.n.div_ceil(side),
        g.batch * splits.max(1),
    ]
    .iter()
    .all(|&d| d <= max_dim);
    let slice = chunk_depth(splits, k_chunk, g.k, step_of(e));
    (a.dtype() == DType::F16
        && b.dtype() == DType::F16
        && matches!(c, DType::F32 | DType::F16)
        && e.has_shader_f16()
        && bias.is_none_or(|t| t.numel() == g.m && t.dtype() == DType::F16)
        && (1..=64).contains(&lanes)
        && slice.div_ceil(side) <= MAX_LOOP_ITERATIONS
        && g.batch <= MAX_LOOP_ITERATIONS
        && fits)
        .then_some(lanes)
}

/// The adapter's limits, or wgpu's defaults where the engine has no GPU.
fn limits_of(e: &crate::tensor::Engine) -> std::borrow::Cow<'_, wgpu::Limits> {
    match e.gpu() {
        Some(gpu) => std::borrow::Cow::Borrowed(&gpu.limits),
        None => std::borrow::Cow::Owned(wgpu::Limits::default()),
    }
}

/// K a staged step takes on `e` (`KD` in the shader): the matrix side times
/// the staged depth.
fn step_of(e: &crate::tensor::Engine) -> usize {
    (e.tensor_core_size().unwrap_or(8) * settings().0.depth) as usize
}

/// The K slice each split runs: the whole K unsplit, else `k_chunk`
/// rounded up to whole staged steps, so every slice starts on whole
/// 16-byte items (wide and direct loads) and only the last has a tail.
/// Splits past K then run empty and write zeros into their slots.
fn chunk_depth(splits: usize, k_chunk: usize, k: usize, step: usize) -> usize {
    if splits <= 1 {
        k
    } else {
        k_chunk.max(1).next_multiple_of(step.max(1))
    }
}

/// Loop iterations one invocation of [`gemm_grouped`] runs for each entry
/// of `g` (its K in `splits` slices `k_chunk` deep), as llvmpipe counts
/// them against its budget: a K loop iteration a staged step, and where
/// steps are staged a half a load, two copy loops that start at the
/// invocation's index (not unrolled) of BM·KD/NT and BN·KD/NT iterations;
/// one more a loop for its exit. An upper bound for wide and direct steps,
/// whose copies are unrolled.
pub(crate) fn entry_iterations(
    g: &Gemm,
    e: &crate::tensor::Engine,
    lanes: u32,
    splits: usize,
    k_chunk: usize,
) -> usize {
    let side = e.tensor_core_size().unwrap_or(8);
    let &(st, chosen) = settings();
    let tile = layout(g, side, lanes, st.depth, 1, chosen, &limits_of(e));
    tile_iterations(g, &tile, side, lanes, step_of(e), splits, k_chunk)
}

/// [`entry_iterations`] for layout `tile` (its own depth a staged step),
/// K slices rounded to `step` as the product's are.
fn tile_iterations(
    g: &Gemm,
    tile: &CoopTile,
    side: u32,
    lanes: u32,
    step: usize,
    splits: usize,
    k_chunk: usize,
) -> usize {
    let (bm, bn) = tile.block(side);
    let nt = tile.invocations(lanes) as usize;
    let kd = (tile.depth * side) as usize;
    let steps = chunk_depth(splits, k_chunk, g.k, step).div_ceil(kd);
    steps * (2 + (bm * kd).div_ceil(nt) + 1 + (bn * kd).div_ceil(nt) + 1) + 2
}

/// Runs `g` on tensor cores with subgroups of `lanes` invocations, adding
/// `bias` per row or per column (of C's type) in the epilogue; the caller
/// has checked [`usable`]. A summed batch goes into one C.
pub(crate) fn gemm(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<Bias>,
    lanes: u32,
) -> Result<(), TensorError> {
    gemm_grouped(g, a, b, c, bias, g.batch.max(1), (1, g.k), lanes)
}

/// [`gemm`] where a summed batch is summed `group` entries at a time, each
/// group into its own C (`c_batch_stride` apart): the partial products of
/// a weight gradient past one workspace, in one dispatch. With `(splits,
/// k_chunk)` past one split, each group's (or entry's) K is cut into that
/// many slices, slice s of slot z writing C's entry z·splits + s (the
/// partials' layout); the caller has checked [`usable_split`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_grouped(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<Bias>,
    group: usize,
    split: (usize, usize),
    lanes: u32,
) -> Result<(), TensorError> {
    gemm_grouped_with(g, a, b, c, bias, group, split, lanes, None)
}

/// `g` on tensor cores in layout `tile`, else as [`gemm_grouped`]
/// chooses: a bias per row, `group` entries a slot of a summed batch,
/// `(splits, k_chunk)` K slices (C's entries then slot·splits + slice).
/// The tests' way to run each layout the tuner may pick.
#[doc(hidden)]
pub fn gemm_on_layout(
    g: &Gemm,
    [a, b, c]: [&Tensor; 3],
    bias_rows: Option<&Tensor>,
    group: usize,
    split: (usize, usize),
    tile: Option<CoopTile>,
) -> Result<(), TensorError> {
    let lanes = a
        .engine()
        .tensor_core_lanes()
        .ok_or(TensorError::NotSupported {
            op: "matmul_coop",
            what: "this device has no f16 cooperative matrices",
        })?;
    let forced = tile.map(|tile| Forced {
        tile,
        aligned: true,
    });
    let bias = bias_rows.map(Bias::Rows);
    gemm_grouped_with(g, a, b, c, bias, group, split, lanes, forced)
}

/// Every layout the tuner may time for `g` on `e` (the fixed one first),
/// before a CPU adapter's loop-budget filter: for the tests, which run each.
#[doc(hidden)]
pub fn candidate_layouts(g: &Gemm, e: &crate::tensor::Engine) -> Vec<CoopTile> {
    let (Some(side), Some(lanes)) = (e.tensor_core_size(), e.tensor_core_lanes()) else {
        return Vec::new();
    };
    let &(st, chosen) = settings();
    // Two copies where prefetching asks for them: a layout that fits them
    // fits one.
    let buffers = if st.prefetch { st.buffers } else { 1 };
    let limits = &*limits_of(e);
    let fixed = layout(g, side, lanes, st.depth, buffers, chosen, limits);
    let fits = |t: &CoopTile| fits(t, side, lanes, limits);
    layout_candidates(fixed, &stagings(st.prefetch), &fits, &|_| 0, None)
}

/// The stagings ((depth, copies)) the tuner tries besides the fixed one:
/// two tiles deep, and where wide steps prefetch two copies, one and two
/// deep. On an H200 each lost on the square f16 4096³ in the fixed layout
/// (81.0 and 68.0 TFLOP/s against 119.0), but two copies came within 10% in
/// 2×4 of 4×4 (docs/tensor_cores.md); other shapes may differ.
fn stagings(prefetch: bool) -> Vec<(u32, u32)> {
    if prefetch {
        vec![(2, 1), (1, 2), (2, 2)]
    } else {
        vec![(2, 1)]
    }
}

/// A layout a run must take, and whether it may load aligned operands
/// wide or direct (a probe run: not where the product it times cannot).
#[derive(Clone, Copy)]
struct Forced {
    tile: CoopTile,
    aligned: bool,
}

/// [`gemm_grouped`] in layout `forced`, else the [`TILE_VAR`] override,
/// else the tuned layout where tiles are tuned, else the fixed one.
#[allow(clippy::too_many_arguments)]
fn gemm_grouped_with(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<Bias>,
    group: usize,
    (splits, k_chunk): (usize, usize),
    lanes: u32,
    forced: Option<Forced>,
) -> Result<(), TensorError> {
    let u = |x: usize| x as u32;
    let e = a.engine();
    let side = e.tensor_core_size().unwrap_or(8);
    let limits = &*limits_of(e);
    let &(st, chosen) = settings();
    let Staging {
        depth,
        loads,
        prefetch,
        ..
    } = st;
    let o = Oriented::of(g, false);
    let splits = splits.max(1);
    let chunk = chunk_depth(splits, k_chunk, g.k, step_of(e));
    let mut params = MatmulParams::new(
        g,
        &o,
        splits,
        chunk,
        g.c_offset,
        g.c_batch_stride,
        g.accumulate,
    );
    let group = group.clamp(1, g.batch.max(1));
    params.group = group as u32;
    let conv = g.implicit_b.as_ref();
    // A probe run loads as the product it times does, where it can.
    let aligned = conv.is_none()
        && direct_ok(&o.a, a, g.batch)
        && direct_ok(&o.b, b, g.batch)
        && forced.is_none_or(|f| f.aligned);
    let direct = aligned && loads == Loads::Direct;
    let wide = aligned && loads == Loads::Wide;
    let prefetch = wide && prefetch;
    let halves = wide && st.halves;
    let buffers = if prefetch { st.buffers } else { 1 };
    let fixed = layout(g, side, lanes, depth, buffers, chosen, limits);
    let tile = match forced {
        Some(f) => f.tile,
        None if chosen.is_none() && super::tune::enabled(e) => {
            let staging = match (direct, wide, prefetch) {
                (true, _, _) => "direct".to_string(),
                (_, true, pf) => format!(
                    "wide{}{}{}",
                    if pf { " prefetch" } else { "" },
                    if halves { " halves" } else { "" },
                    if buffers == 2 { " two copies" } else { "" },
                ),
                _ => "staged".to_string(),
            };
            // The fixed staging, and that depth and copies are tuned too
            // (classes tuned before they were are timed again).
            let staging = format!("{staging} {depth} deep, staging tuned");
            let step = step_of(e);
            let iterations =
                |t: &CoopTile| tile_iterations(g, t, side, lanes, step, splits, k_chunk);
            // The loop budget was planned with the layout entry_iterations
            // takes (one copy of workgroup memory).
            let planned = layout(g, side, lanes, depth, 1, chosen, limits);
            let budget = e.is_cpu_adapter().then(|| iterations(&planned));
            let fits = |t: &CoopTile| fits(t, side, lanes, limits);
            let candidates =
                layout_candidates(fixed, &stagings(prefetch), &fits, &iterations, budget);
            let key = class_key(g, c.dtype().elem(), bias.is_some(), splits, &staging, fixed);
            let time = |probe: &crate::tensor::Engine, tiles: &[CoopTile]| {
                time_layouts(
                    probe,
                    g,
                    (c.dtype(), bias),
                    group,
                    (splits, k_chunk),
                    lanes,
                    aligned,
                    tiles,
                )
            };
            super::tune::tuned_coop(e, &key, g, &candidates, &time).unwrap_or(fixed)
        }
        None => fixed,
    };
    // Two copies only where wide steps prefetch (a forced candidate may
    // ask for them elsewhere: it runs with one).
    let (depth, buffers) = (tile.depth, if prefetch { tile.buffers } else { 1 });
    let (bm, bn) = tile.block(side);
    let (kd, nt) = ((depth * side) as usize, tile.invocations(lanes) as usize);
    let a_col = major(&o.a).is_some_and(|(col, _)| col);
    // An im2colᵀ runs along K in memory, an im2col along N.
    let b_col = match conv {
        Some(cv) => cv.transposed,
        None => major(&o.b).is_some_and(|(col, _)| col),
    };
    let out = c.dtype().elem();
    let defs = Defs::elem(Elem::F16)
        .with("ELEM_C", out.name())
        .with("TC", out.storage())
        .with("SG", lanes)
        .with("S", side)
        .with("WM", tile.wm)
        .with("WN", tile.wn)
        .with("TM", tile.tm)
        .with("TN", tile.tn)
        .with("KS", depth)
        .with("DIRECT", u32::from(direct))
        .with("WIDE", u32::from(wide))
        .with("PREFETCH", u32::from(prefetch))
        .with("BUF", buffers)
        .with("HALVES", u32::from(halves))
        // Wide items (8 halves) of A's and B's slices each invocation moves.
        .with("PA", (bm * kd / 8).div_ceil(nt))
        .with("PB", (kd * bn / 8).div_ceil(nt))
        .with("A_COL", u32::from(a_col))
        .with("B_COL", u32::from(b_col))
        .with("REDUCE", u32::from(g.reduce_batch))
        .with("BIAS_ROWS", u32::from(matches!(bias, Some(Bias::Rows(_)))))
        .with("BIAS_COLS", u32::from(matches!(bias, Some(Bias::Cols(_)))))
        // matmul_common's element loader for B is not wanted by WIDE.
        .with("B4", u32::from(wide));
    let (defs, conv_name) = conv_defs(defs, conv);
    let flag = |on: bool, name: &'static str| if on { name } else { "" };
    let kernel = Kernel::variant(
        format!(
            "matmul_coop[f16→{}, {side}×{side}, {}×{} subgroups of {}×{} tiles, staged {depth} deep, {lanes} lanes{}{}{}{}{}{}{}{}{}{}{conv_name}]",
            out.name(),
            tile.wm,
            tile.wn,
            tile.tm,
            tile.tn,
            flag(direct, ", direct"),
            flag(wide, ", wide"),
            flag(prefetch, ", prefetch"),
            flag(halves, ", halves"),
            flag(buffers == 2, ", two copies"),
            flag(a_col, ", Aᵀ"),
            flag(b_col, ", Bᵀ"),
            flag(g.reduce_batch, ", summed batch"),
            flag(splits > 1, ", K split"),
            match bias {
                Some(Bias::Rows(_)) => ", +bias",
                Some(Bias::Cols(_)) => ", +col bias",
                None => "",
            },
        ),
        SOURCE,
        "main",
        defs,
    )
    // Direct loads only inside A, B and C, staged ones clamped with select,
    // stores guarded by C's sizes, workgroup indices from constants and
    // local ids (docs/tensor_cores.md).
    .trusted();
    let z = splits
        * if g.reduce_batch {
            g.batch.div_ceil(group)
        } else {
            g.batch
        };
    let mut bindings = vec![a.slice(), b.slice(), c.slice()];
    bindings.extend(bias.map(|b| b.tensor().slice()));
    let refs: Vec<_> = bindings.iter().collect();
    e.dispatch(
        &kernel,
        &refs,
        bytemuck::bytes_of(&params),
        Workgroups::Grid([u(g.n.div_ceil(bn)), u(g.m.div_ceil(bm)), u(z)]),
    )?;
    Ok(())
}

/// Seconds each of `tiles` takes for a product shaped as `g` on `probe`
/// (the tuner's second device), on fresh operands laid out as `g`'s C is
/// written (`group` entries summed a slot, `split` as given); `None` for
/// one that failed, all `None` where the operands do not fit beside the
/// run. With the kernels compiled ahead of the timing.
#[allow(clippy::too_many_arguments)]
fn time_layouts(
    probe: &crate::tensor::Engine,
    g: &Gemm,
    (out, bias): (DType, Option<Bias>),
    group: usize,
    split: (usize, usize),
    lanes: u32,
    aligned: bool,
    tiles: &[CoopTile],
) -> (Vec<Option<f64>>, usize) {
    let shape = super::GemmShape::of(g, "tune");
    let mut pg = shape.gemm();
    pg.accumulate = g.accumulate;
    pg.c_batch_stride = if g.c_batch_stride == 0 { 0 } else { g.m * g.n };
    let group = group.clamp(1, g.batch.max(1));
    let slots = if g.reduce_batch {
        g.batch.div_ceil(group)
    } else {
        g.batch
    };
    let z = split.0.max(1) * slots.max(1);
    let (na, nb, _) = shape.sizes();
    let nc = (z - 1) * pg.c_batch_stride + g.m * g.n;
    let filled = |n: usize, dt: DType, name: &str| {
        Tensor::generated(probe, &[n.max(1)], dt, name, |n| vec![0.5; n])
    };
    let operands = (|| {
        Ok::<_, TensorError>((
            filled(na, DType::F16, "tune.a")?,
            filled(nb, DType::F16, "tune.b")?,
            filled(nc, out, "tune.c")?,
            match bias {
                Some(Bias::Rows(t)) => Some(filled(g.m, t.dtype(), "tune.bias")?),
                Some(Bias::Cols(t)) => Some(filled(g.n, t.dtype(), "tune.bias")?),
                None => None,
            },
        ))
    })();
    let Ok((a, b, c, bias_t)) = operands else {
        probe.allocator().empty_cache();
        return (vec![None; tiles.len()], 0);
    };
    let probe_bias = match (bias, bias_t.as_ref()) {
        (Some(Bias::Rows(_)), Some(t)) => Some(Bias::Rows(t)),
        (Some(Bias::Cols(_)), Some(t)) => Some(Bias::Cols(t)),
        _ => None,
    };
    let run = |tile: CoopTile| {
        let forced = Forced { tile, aligned };
        gemm_grouped_with(
            &pg,
            &a,
            &b,
            &c,
            probe_bias,
            group,
            split,
            lanes,
            Some(forced),
        )
    };
    // Every candidate's kernel compiled ahead, several at once.
    let mut compiled = 0;
    if let Some(gpu) = probe.gpu() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut kernels = Vec::new();
        for &t in tiles {
            kernels.extend(gpu.kernels_of(|| run(t)).1);
        }
        compiled = gpu.precompile(&kernels, threads);
    }
    let times = tiles
        .iter()
        .map(|&t| super::tune::best_seconds(probe, &|| run(t)))
        .collect();
    drop((a, b, c, bias_t));
    probe.allocator().empty_cache();
    (times, compiled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_override_parses_or_names_the_form() {
        assert_eq!(
            CoopTile::parse("2x2, 4x4").unwrap(),
            CoopTile::new(2, 2, 4, 4)
        );
        for bad in ["2x2", "2x2,4", "0x2,4x4", "2x2,9x1", "axb,1x1"] {
            let e = CoopTile::parse(bad).unwrap_err().to_string();
            assert!(e.contains("WMxWN,TMxTN"), "{bad}: {e}");
        }
    }

    #[test]
    fn layouts_shrink_to_the_limits() {
        let g = |m, n| Gemm {
            m,
            n,
            k: 64,
            batch: 1,
            a: MatView::dense(0, m, 64, false),
            b: MatView::dense(0, 64, n, false),
            c_offset: 0,
            c_batch_stride: m * n,
            accumulate: false,
            reduce_batch: false,
            implicit_b: None,
        };
        // An H200's limits.
        let limits = wgpu::Limits {
            max_compute_workgroup_storage_size: 48 * 1024,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroup_size_x: 1024,
            ..wgpu::Limits::default()
        };
        let big = layout(&g(4096, 4096), 16, 32, 1, 1, None, &limits);
        assert_eq!((big.wm, big.wn, big.tm, big.tn), (2, 4, 4, 2));
        assert_eq!(layout(&g(64, 64), 16, 32, 1, 1, None, &limits).tn, 2);
        // 8 KiB of workgroup memory cannot hold a 128×128 block's slices.
        let tight = wgpu::Limits {
            max_compute_workgroup_storage_size: 8192,
            ..limits
        };
        let t = layout(&g(4096, 4096), 16, 32, 2, 1, None, &tight);
        assert_eq!((t.depth, t.buffers), (2, 1));
        assert!(t.shared_bytes(16) <= 8192, "{t:?}");
    }

    /// The tuner's candidates: the fixed layout first, a first round of
    /// eight in its staging, then exactly the fixed layout and 2×4 of 4×4 in
    /// each other staging (those that fit), at most the 24 timed, none
    /// twice; the loop budget counted with each candidate's own staging.
    #[test]
    fn candidates_restage_two_layouts_after_the_first_round() {
        let limits = wgpu::Limits {
            max_compute_workgroup_storage_size: 48 * 1024,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroup_size_x: 1024,
            ..wgpu::Limits::default()
        };
        let fits = |t: &CoopTile| fits(t, 16, 32, &limits);
        let named = |t: &CoopTile| (t.wm, t.wn, t.tm, t.tn, t.depth, t.buffers);
        let big = CoopTile::new(2, 4, 4, 4);
        for fixed in [
            CoopTile::new(2, 4, 4, 2),
            CoopTile::new(2, 2, 2, 2).staged(2, 1),
        ] {
            for prefetch in [true, false] {
                let extra = stagings(prefetch);
                let v = layout_candidates(fixed, &extra, &fits, &|_| 0, None);
                let own = (fixed.depth, fixed.buffers);
                assert_eq!(v[0], fixed);
                assert!(v.len() <= 24, "{}", v.len());
                for (i, t) in v.iter().enumerate() {
                    assert!(!v[..i].contains(t), "{t:?} twice");
                }
                assert!(
                    v[..ROUND].iter().all(|t| (t.depth, t.buffers) == own),
                    "{v:?}"
                );
                assert!(v.contains(&fixed.with_layout(big)));
                let mut got: Vec<_> = v
                    .iter()
                    .filter(|t| (t.depth, t.buffers) != own)
                    .map(named)
                    .collect();
                let mut want: Vec<_> = [fixed, fixed.with_layout(big)]
                    .iter()
                    .flat_map(|t| extra.iter().map(|&(d, b)| t.staged(d, b)))
                    .filter(|t| (t.depth, t.buffers) != own && fits(t))
                    .map(|t| named(&t))
                    .collect();
                got.sort();
                want.sort();
                assert!(!prefetch || !want.is_empty());
                assert_eq!(got, want, "fixed {fixed:?}, prefetch {prefetch}");
            }
        }
        // Only candidates within the budget, counted in their own staging.
        let count = |t: &CoopTile| (t.depth * 100 + t.buffers) as usize;
        let v = layout_candidates(
            CoopTile::new(2, 4, 4, 2),
            &stagings(true),
            &fits,
            &count,
            Some(101),
        );
        assert!(
            v.len() > 1 && v.iter().all(|t| (t.depth, t.buffers) == (1, 1)),
            "{v:?}"
        );
    }
}
