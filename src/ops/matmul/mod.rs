//! Matrix multiply, batched: `[.., M, K] · [.., K, N] → [.., M, N]`, from
//! one kernel family (`shaders/matmul.wgsl`) whose tile shape is chosen per
//! shape class and adapter: register-blocked tiles, staged in workgroup
//! memory on GPUs and read straight from storage on CPU adapters (llvmpipe).
//! Few output tiles over a long K (the fc layer: 64×10 outputs, K = 100,352)
//! split K across workgroups into a workspace of partial products that
//! `sum_partials` adds up; a batch whose products are summed (conv weight
//! gradients, one product per sample) goes the same way in one dispatch
//! instead of a loop of one-workgroup dispatches. Operands are read through
//! strides, so `transpose_a` / `transpose_b` cost no copy, and C is written
//! through strides, so a narrow product can run as Cᵀ = Bᵀ·Aᵀ ([`choose`]).
//!
//! The split and its workspace depend only on the shapes, never on the
//! adapter, so a simulated device allocates exactly what a real one does.
//! `budget` cuts a product past the binding budget; `coop` runs f16
//! products on tensor cores.

mod budget;
pub mod coop;

use super::partials::sum_partials;
use crate::device::compose::{Defs, Elem};
use crate::device::Kernel;
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../shaders/matmul.wgsl");
/// The kernel element type of a tensor's dtype.
pub(crate) fn elem_of(t: &Tensor) -> Elem {
    t.dtype().elem()
}

/// Output tiles (counted at 64×64, whatever kernel runs) below which K is
/// split: enough workgroups to fill a GPU's multiprocessors or a CPU's cores.
const TARGET_GROUPS: usize = 128;
/// The shortest K range one split is given.
const MIN_SPLIT_K: usize = 256;
/// The most workspace one batch of partial products may take; a larger
/// reduced batch is done in groups that accumulate.
const MAX_PARTIALS_BYTES: usize = 4 << 20;
/// The most B values (TN·K) a rows-outer variant holds a lane. It writes
/// out WX·TN·K multiply-adds (one group of rows), so this also bounds its
/// code: 2,048 at most.
pub const ROWS_OUTER_MAX_B: usize = 256;

/// A tile shape of the matmul family (see `shaders/matmul.wgsl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct TileConfig {
    /// Threads per workgroup along columns and rows.
    pub wx: u32,
    pub wy: u32,
    /// Outputs per thread along rows and columns.
    pub tm: u32,
    pub tn: u32,
    /// Depth of one K slice (the blocked-summation block).
    pub bk: u32,
    /// Stage A and B slices in workgroup memory.
    pub shared: bool,
    /// Thread x owns columns x, x+wx, … rather than a contiguous run.
    pub strided_cols: bool,
    /// Share A's loads across a subgroup (direct tiles with wx = the
    /// adapter's fixed subgroup size; tm need not be a multiple of it: the
    /// last load is made by the lanes that hold rows; see
    /// `shaders/matmul.wgsl`).
    pub subgroup_a: bool,
    /// Load B and store C as vec4 where the layout allows (direct tiles,
    /// f32, tn a multiple of 4, B or C dense along rows with n and every
    /// offset a multiple of 4; decided per dispatch, see [`Vec4Io`]).
    pub vec4: bool,
}

/// What one dispatch asks of the family beyond its tile and element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Variant {
    /// C gets a bias per row, added in the epilogue (conv's bias).
    pub bias_rows: bool,
    /// C += product, instead of C = product.
    pub accumulate: bool,
    /// Which operands go through vec4 accesses.
    pub vec4: Vec4Io,
    /// Each workgroup's K range fits one BK slice, so one set of
    /// accumulators holds the whole sum.
    pub one_slice: bool,
    /// For a subgroup-A direct tile in one split: the K range's length (a
    /// constant of the variant), B's range loaded whole, then summed row by
    /// row ([`TileConfig::rows_outer`]). 0: the K loop.
    pub rows_outer: u32,
    /// Two steps of K an iteration (even K ranges; [`TileConfig::k2`]).
    pub k2: bool,
}

/// Which of a product's operands go through vec4 accesses in one dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Vec4Io {
    /// B along its rows (N).
    pub b: bool,
    /// C along its rows.
    pub c: bool,
    /// A and B along K (both dense along K: the fc forward run as Cᵀ).
    pub k: bool,
}

impl TileConfig {
    /// Whether a workgroup K range of `k_range` fits one slice (the
    /// shader's ONE_SLICE: one set of accumulators). Summing up to two
    /// slices as one ran conv1's forward (K = 27) 17.1 → 14.7 ms, but the
    /// changed rounding took simple-cnn-adam's conv1 weight gradient to
    /// 2.4e-4 from the float64 truth (bound 1e-4; `tests/torch_fixtures.rs`),
    /// so longer ranges keep the blocked sum's two sets.
    pub fn one_slice(&self, k_range: usize) -> bool {
        k_range <= self.bk as usize
    }

    /// Whether this tile takes two steps of K an iteration where the K
    /// ranges are even and B is read element by element (the shader's K2):
    /// direct subgroup-A tiles of at most 4 columns. Each sum then takes
    /// both steps in a row, so where llvmpipe spills the sums each is loaded
    /// and stored once per two steps; the same order of additions. conv1's
    /// weight gradient (64×4, 512 sums a lane with the blocked summation's
    /// two sets) ran 16.2 → 10.0 ms (`shape_speed`, medians of six runs
    /// alternated with one step an iteration, every pair in its favour);
    /// conv2's 64×8 products gained nothing measurable.
    pub fn k2(&self) -> bool {
        self.subgroup_a && !self.shared && self.tn <= 4 && self.bk.is_multiple_of(2)
    }

    /// The K to compile into a rows-outer variant for a product whose one
    /// workgroup K range is all of `k` (the shader's ROWS_OUTER: B's K range
    /// loaded whole, then a loop over groups of WX rows, each row summed
    /// and stored before the next), or 0 for the K loop. For direct
    /// subgroup-A tiles whose height is whole groups, where B's range is
    /// at most [`ROWS_OUTER_MAX_B`] values a lane. Same bits as the K loop;
    /// conv1's forward (K = 27, 64×8) ran 17.1 → 12.5 ms and the fc input
    /// gradient (K = 10, 32×16) 10.9 → 9.5 (`shape_speed`, medians of
    /// three runs alternated with the K loop), and both variants compile
    /// faster (cold: 1.8 s against 2.3, 0.8 against 1.5).
    pub fn rows_outer(&self, k: usize) -> u32 {
        let b_values = self.tn as usize * k;
        if self.subgroup_a
            && !self.shared
            && k > 0
            && self.tm.is_multiple_of(self.wx)
            && b_values <= ROWS_OUTER_MAX_B
        {
            k as u32
        } else {
            0
        }
    }

    pub const fn new(wx: u32, wy: u32, tm: u32, tn: u32, bk: u32, shared: bool) -> TileConfig {
        TileConfig {
            wx,
            wy,
            tm,
            tn,
            bk,
            shared,
            strided_cols: shared,
            subgroup_a: false,
            vec4: false,
        }
    }

    /// The same tile with vec4 loads of B and stores of C where they fit.
    pub const fn with_vec4(mut self) -> TileConfig {
        self.vec4 = true;
        self
    }

    /// The same tile sharing A's loads across a subgroup.
    pub const fn with_subgroup_a(mut self) -> TileConfig {
        self.subgroup_a = true;
        self
    }

    /// The same tile with thread x owning columns x, x+wx, ….
    pub const fn with_strided_cols(mut self) -> TileConfig {
        self.strided_cols = true;
        self
    }

    /// Output rows and columns one workgroup computes.
    pub fn block(&self) -> (usize, usize) {
        ((self.wy * self.tm) as usize, (self.wx * self.tn) as usize)
    }

    /// Whether the staging loops divide evenly (shared tiles only).
    pub fn is_valid(&self) -> bool {
        let threads = self.wx * self.wy;
        let ok = self.wx > 0 && self.wy > 0 && self.tm > 0 && self.tn > 0 && self.bk > 0;
        ok && threads <= 256
            && (!self.subgroup_a || !self.shared)
            && (!self.shared
                || ((self.bk * self.wy * self.tm).is_multiple_of(threads)
                    && (self.bk * self.wx * self.tn).is_multiple_of(threads)))
    }

    /// "16x16 4x4 k16 shared": workgroup, thread tile, K slice, staging.
    pub fn describe(&self) -> String {
        format!(
            "{}x{} {}x{} k{} {}{}{}",
            self.wx,
            self.wy,
            self.tm,
            self.tn,
            self.bk,
            if self.shared {
                "shared"
            } else if self.subgroup_a {
                "direct sgA"
            } else {
                "direct"
            },
            if self.strided_cols != self.shared {
                if self.strided_cols {
                    " strided"
                } else {
                    " contiguous"
                }
            } else {
                ""
            },
            if self.vec4 { " vec4" } else { "" }
        )
    }

    /// The family's kernel for this tile, operands in `elem` and the
    /// output in `out`; with `conv`, B is the im2col (or im2colᵀ) of that
    /// convolution's input, read in place. The geometry is compiled into
    /// the variant as constants: the index arithmetic of every B load
    /// divides by the kernel and output widths, and by constants a
    /// compiler turns those divisions into multiplies (on llvmpipe runtime
    /// divisions cost the conv products 40% of their speed). Without
    /// padding no bounds test is needed.
    pub fn kernel(
        &self,
        elem: Elem,
        out: Elem,
        conv: Option<&ConvGeometry>,
        variant: Variant,
    ) -> Kernel {
        let Variant {
            bias_rows,
            accumulate,
            vec4,
            one_slice,
            rows_outer,
            k2,
        } = variant;
        let mut defs = Defs::elem(elem)
            .with("BIAS_ROWS", bias_rows as u8)
            .with("ACCUMULATE", accumulate as u8)
            .with("IMPLICIT_B", conv.is_some() as u8)
            .with("IMPLICIT_BT", conv.is_some_and(|c| c.transposed) as u8)
            .with("CONV_PAD0", conv.is_some_and(|c| c.pad == 0) as u8)
            .with("CONV_FLIP", conv.is_some_and(|c| c.flipped) as u8)
            .with("ELEM_C", out.name())
            .with("TC", out.storage())
            .with("WX", self.wx)
            .with("WY", self.wy)
            .with("THREADS", self.wx * self.wy)
            .with("TM", self.tm)
            // A's loads per lane with SUBGROUP_A: TM rows over WX lanes.
            .with("QA", self.tm.div_ceil(self.wx))
            // Of which QA_FULL fill every lane, and a last one A_REM lanes.
            .with("QA_FULL", self.tm / self.wx)
            .with("A_REM", self.tm % self.wx)
            .with("TN", self.tn)
            .with("BK", self.bk)
            .with("SHARED", self.shared as u8)
            .with("STRIDED_COLS", self.strided_cols as u8)
            .with("SUBGROUP_A", self.subgroup_a as u8)
            .with("PAIR_STORE", out.is_16bit() as u8)
            .with("VEC_B", vec4.b as u8)
            .with("VEC_C", vec4.c as u8)
            .with("VEC_K", vec4.k as u8)
            .with("B4", (vec4.b || vec4.k) as u8)
            .with("COLS4", (vec4.b || vec4.c) as u8)
            .with("ONE_SLICE", one_slice as u8)
            .with("ROWS_OUTER", (rows_outer > 0) as u8)
            // Steps of K a loop iteration: KSTEP loaded one by one (two
            // with K2), K_ADVANCE in all (a vec4's four with VEC_K).
            .with("KSTEP", if k2 { 2 } else { 1 })
            .with(
                "K_ADVANCE",
                if vec4.k {
                    4
                } else if k2 {
                    2
                } else {
                    1
                },
            )
            .with("KC", rows_outer)
            .with("KC_SLICES", rows_outer.div_ceil(self.bk))
            // The store block's rows per pass: one group of WX in the
            // rows-outer loop, else the whole thread tile.
            .with("ROWS_EMIT", if rows_outer > 0 { self.wx } else { self.tm });
        let mut conv_name = String::new();
        if let Some(cv) = conv {
            for (name, v) in [
                "CV_C",
                "CV_H",
                "CV_W",
                "CV_KH",
                "CV_KW",
                "CV_STRIDE",
                "CV_PAD",
                "CV_WO",
            ]
            .iter()
            .zip(cv.params())
            {
                defs = defs.with(name, v);
            }
            conv_name = format!(
                " implicit im2col{}{} {}x{}x{} k{}x{} s{} p{} wo{}",
                if cv.transposed { "ᵀ" } else { "" },
                if cv.flipped { " flipped" } else { "" },
                cv.c,
                cv.h,
                cv.w,
                cv.kh,
                cv.kw,
                cv.stride,
                cv.pad,
                cv.wo
            );
        }
        Kernel::variant(
            format!(
                "matmul[{}→{} {}{}{}{}{}{}]",
                elem.name(),
                out.name(),
                // What the tile asks for vec4 is named by what it got.
                TileConfig {
                    vec4: false,
                    ..*self
                }
                .describe(),
                conv_name,
                if bias_rows { " +bias" } else { "" },
                if accumulate { " +=" } else { "" },
                match (rows_outer, one_slice, k2) {
                    (0, true, true) => " one slice k2".to_string(),
                    (0, true, false) => " one slice".to_string(),
                    (0, false, true) => " k2".to_string(),
                    (0, false, false) => String::new(),
                    (k, _, _) => format!(" rows outer k={k}"),
                },
                match (vec4.b, vec4.c, vec4.k) {
                    (true, true, _) => " vec4 B C",
                    (true, false, _) => " vec4 B",
                    (false, true, true) => " vec4 K C",
                    (false, true, false) => " vec4 C",
                    (false, false, true) => " vec4 K",
                    (false, false, false) => "",
                }
            ),
            SOURCE,
            "main",
            defs,
        )
    }
}

/// Which kernel to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    /// The tile shape chosen for the shape class and adapter ([`choose_tile`]).
    Tiled,
    /// One output per thread, no reuse: the benchmark baseline.
    Naive,
    /// A given tile shape (benchmarks and tuning).
    Fixed(TileConfig),
    /// A given tile shape run as Cᵀ = Bᵀ·Aᵀ, the orientation [`choose`]
    /// gives narrow products on 8-lane CPU adapters (benchmarks and tuning
    /// of those: the fc forward).
    FixedTransposed(TileConfig),
}

/// The shape classes the models issue, each with its own tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShapeClass {
    /// Both output sides at least 32.
    Square,
    /// Few output columns (the fc forward: N = 10; conv1's weight gradient: N = 27).
    Narrow,
    /// Few output rows (the fc weight gradient: M = 10).
    Short,
    /// A short reduction (conv1 forward: K = 27; the fc input gradient:
    /// K = 10): little work per output, so many small workgroups.
    Shallow,
}

impl ShapeClass {
    pub fn of(m: usize, n: usize, k: usize) -> ShapeClass {
        if n < 32 && n <= m {
            ShapeClass::Narrow
        } else if m < 32 {
            ShapeClass::Short
        } else if k < 64 {
            ShapeClass::Shallow
        } else {
            ShapeClass::Square
        }
    }
}

/// What tile choice depends on about the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A GPU: tiles staged in workgroup memory.
    Gpu,
    /// A CPU adapter (llvmpipe, WARP, SwiftShader): tiles read straight
    /// from storage, sized for caches.
    Cpu,
    /// A CPU adapter whose subgroups are 8 lanes (lavapipe on AVX2): the
    /// same, with A's loads shared across the subgroup.
    CpuSubgroup8,
}

impl Target {
    pub fn of(engine: &crate::tensor::Engine) -> Target {
        match (engine.is_cpu_adapter(), engine.fixed_subgroup_size()) {
            (false, _) => Target::Gpu,
            (true, Some(8)) => Target::CpuSubgroup8,
            (true, _) => Target::Cpu,
        }
    }
}

/// The tile for `class` on `target`, chosen with `vramlab bench --tune`
/// `examples/matmul_speed.rs` and `examples/shape_speed.rs` (figures in the
/// README's kernel section).
pub fn choose_tile(class: ShapeClass, target: Target) -> TileConfig {
    match (target, class) {
        // Columns strided across the lanes (lane x owns x, x+8, …: one
        // B load or C store of the 8 lanes touches 8 neighbouring floats).
        // K slices stay 16 deep: 32 were 5–17% faster on the square and
        // conv2 products (`examples/shape_speed.rs`) but cost simple-cnn-adam's
        // conv1 gradient its 1e-4 accuracy against the float64 truth. The
        // square tile's height is fitted to the rows in [`choose`].
        // vec4 B loads and C stores wherever the layout allows: llvmpipe
        // pays per access, and interleaved (`examples/shape_speed.rs`) the
        // fc input gradient ran 1.31× faster with them, its weight gradient
        // 1.33×, conv1's forward 1.20× and the square 1024³ 1.18×.
        (Target::CpuSubgroup8, ShapeClass::Square) => TileConfig::new(8, 4, 32, 8, 16, false)
            .with_subgroup_a()
            .with_strided_cols()
            .with_vec4(),
        (Target::CpuSubgroup8, ShapeClass::Shallow) => TileConfig::new(8, 1, 32, 8, 16, false)
            .with_subgroup_a()
            .with_strided_cols()
            .with_vec4(),
        (Target::CpuSubgroup8, ShapeClass::Narrow) => TileConfig::new(8, 1, 32, 4, 16, false)
            .with_subgroup_a()
            .with_vec4(),
        (Target::CpuSubgroup8, ShapeClass::Short) => TileConfig::new(8, 1, 16, 8, 16, false)
            .with_subgroup_a()
            .with_vec4(),
        (Target::Cpu, ShapeClass::Square | ShapeClass::Shallow) => {
            TileConfig::new(8, 16, 8, 8, 16, false)
        }
        (Target::Cpu, ShapeClass::Narrow) => TileConfig::new(8, 16, 4, 2, 16, false),
        (Target::Cpu, ShapeClass::Short) => TileConfig::new(16, 4, 2, 8, 16, false),
        (Target::Gpu, ShapeClass::Square | ShapeClass::Shallow) => {
            TileConfig::new(8, 8, 4, 4, 16, true)
        }
        (Target::Gpu, ShapeClass::Narrow) => TileConfig::new(16, 16, 2, 2, 16, true),
        (Target::Gpu, ShapeClass::Short) => TileConfig::new(64, 4, 4, 2, 16, true),
    }
}

/// The tile a product runs with, and whether it runs transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileChoice {
    pub tile: TileConfig,
    /// The class of the product as run (the transposed one's when transposed).
    pub class: ShapeClass,
    /// Run as Cᵀ = Bᵀ·Aᵀ, written back through C's strides.
    pub transposed: bool,
}

impl TileChoice {
    /// "8x1 16x8 k16 direct sgA (as Cᵀ)".
    pub fn describe(&self) -> String {
        let t = self.tile.describe();
        if self.transposed {
            format!("{t} (as Cᵀ)")
        } else {
            t
        }
    }
}

/// Whether `g` can run as Cᵀ = Bᵀ·Aᵀ: not where it reads B as an im2col in
/// place, adds a row bias or writes packed 16-bit words (those need B, the
/// rows and whole output words as they are).
fn transposable(g: &Gemm, out_16bit: bool, bias: bool) -> bool {
    g.implicit_b.is_none() && !bias && !out_16bit
}

/// The tile for `g` on `target`. A narrow product (few columns, many rows:
/// the fc forward, 64×10) runs transposed on 8-lane CPU adapters: there
/// the 8 lanes of a subgroup lie along the columns, so 10 columns filled
/// 10 of a tile's 32 (31% useful work); as Cᵀ (10×64) the 64 lie along
/// the lanes and the tile is 10 of 16 rows full (62.5%). Products that
/// cannot be transposed ([`transposable`]) keep their orientation.
pub fn choose(g: &Gemm, target: Target, out_16bit: bool, bias: bool) -> TileChoice {
    let class = ShapeClass::of(g.m, g.n, g.k);
    let transposed = target == Target::CpuSubgroup8
        && class == ShapeClass::Narrow
        && transposable(g, out_16bit, bias);
    let class = if transposed {
        ShapeClass::of(g.n, g.m, g.k)
    } else {
        class
    };
    let mut tile = choose_tile(class, target);
    let rows = if transposed { g.n } else { g.m };
    if target == Target::CpuSubgroup8 {
        // The 8-lane tiles' shape from the product's rows and depth: one
        // rule per class, so which one applies is plain.
        match class {
            ShapeClass::Short => {
                // Fewer than 32 rows: a thread tile of exactly that many
                // (lane x loads rows x, x+8, …, the rest clamped), so no
                // multiply-add is spent on padded rows. The fc forward (as
                // Cᵀ, 10 rows) and weight gradient in 16-row tiles computed
                // 6 padded rows in 16; with 10 they ran 16.1 → 13.9 and
                // 16.9 → 14.7 ms (interleaved).
                tile.tm = rows.clamp(1, 32) as u32;
                // And 16 columns a lane where that pads no more columns
                // than 8: each of the few rows' A loads then serves twice
                // the columns. The fc weight gradient (10×100,352, K = 64)
                // ran 12.1 → 9.6 ms (`shape_speed`, interleaved). Run as
                // Cᵀ, 4 (below).
                let cols = if transposed { g.m } else { g.n };
                let padded = |tn: u32| cols.next_multiple_of((tile.wx * tn) as usize);
                if transposed {
                    // As Cᵀ each column is a row of the long operand (the
                    // fc forward: a row of X, 401 KB from the next), so a
                    // lane's columns are separate streams through memory
                    // and its accumulators spill: 4 a lane, strided (lane
                    // x owns x, x+8, …), ran the fc forward 12.3 → 10.1 ms
                    // where 8 contiguous ones did (`shape_speed`,
                    // interleaved; 2 a lane reloads A twice as often: 11.2).
                    tile.tn = 4;
                    tile.strided_cols = true;
                } else if padded(16) <= padded(8) {
                    tile.tn = 16;
                }
                if transposed && plan_split(g).k_chunk.min(g.k) >= 512 {
                    // The fc forward as Cᵀ sums K ranges of 784 (K split
                    // 128 ways): 32-deep slices bound its rounding error
                    // by 784/32 + 32 = 56.5 units where 16-deep ones give
                    // 65 (from 512 on, 32 bounds it no worse), and ran it
                    // 3–5% faster (`shape_speed`, interleaved, three runs:
                    // 10.44 → 10.16, 10.58 → 10.11, 10.41 → 9.87 ms; 64
                    // deep was faster still but bounds it by 76).
                    tile.bk = 32;
                }
            }
            ShapeClass::Shallow if g.k < tile.bk as usize => {
                // Less than one K slice (the fc input gradient: K = 10):
                // the product is mostly its output, and 16 columns a lane
                // write it faster than 8 (`bench --tune`, then
                // `shape_speed` interleaved: 18.7 against 31.3 ms; with
                // K = 1, 18.4 against 26.4). conv1's forward (K = 27)
                // keeps 64×8 (33.4 against 38.1). Rows outer
                // ([`TileConfig::rows_outer`]) keeps one row's sums live,
                // so 64 rows cost no spills and read B once for twice the
                // rows: 9.6 → 8.6 ms against 32 (three interleaved runs).
                let padded = |tm: usize| rows.next_multiple_of(tm);
                tile.tm = if padded(64) <= padded(32) { 64 } else { 32 };
                tile.tn = 16;
            }
            _ => {
                // The thread tile's height and the workgroup's: as few
                // padded rows as the heights allow, ties to the first
                // listed. 64-row thread tiles read each B element for
                // twice the rows, which pays where B's loads are dear (the
                // im2col read in place: conv2's forward and weight
                // gradient 1.2× faster, conv1's weight gradient 1.25×, its
                // forward 1.1×, in `examples/shape_speed.rs`, interleaved)
                // and is even on the dense square. A 64-row product (a
                // stride-1 convolution's input gradient with 64 input
                // channels) in 128-row tiles did half its work on clamped
                // rows, 556 ms where 64-row tiles take 287.
                let heights: &[(u32, u32)] = if class == ShapeClass::Square {
                    &[(64, 2), (64, 1), (32, 4), (32, 2), (32, 1)]
                } else {
                    &[(64, 1), (32, 1)]
                };
                let padded = |&(tm, wy): &(u32, u32)| rows.next_multiple_of((tm * wy) as usize);
                if let Some(&(tm, wy)) = heights.iter().min_by_key(|h| padded(h)) {
                    tile.tm = tm;
                    tile.wy = wy;
                }
            }
        }
    }
    TileChoice {
        tile,
        class,
        transposed,
    }
}

const NAIVE_TILE: TileConfig = TileConfig {
    wx: 16,
    wy: 16,
    tm: 1,
    tn: 1,
    bk: 16,
    shared: false,
    strided_cols: false,
    subgroup_a: false,
    vec4: false,
};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct MatmulParams {
    pub(super) m: u32,
    pub(super) n: u32,
    pub(super) k: u32,
    pub(super) batch: u32,
    pub(super) a_rs: u32,
    pub(super) a_cs: u32,
    pub(super) b_rs: u32,
    pub(super) b_cs: u32,
    pub(super) a_bs: u32,
    pub(super) b_bs: u32,
    pub(super) c_bs: u32,
    pub(super) accumulate: u32,
    pub(super) a_off: u32,
    pub(super) b_off: u32,
    pub(super) c_off: u32,
    pub(super) splits: u32,
    pub(super) k_chunk: u32,
    pub(super) c_rs: u32,
    pub(super) c_cs: u32,
    pub(super) _pad: u32,
}

/// Where a matrix (or a batch of matrices) sits inside a tensor, in elements:
/// element (b, r, c) is at `offset + b*batch_stride + r*row_stride + c*col_stride`.
/// Strides express transposes; a batch stride of 0 shares one matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatView {
    pub offset: usize,
    pub row_stride: usize,
    pub col_stride: usize,
    pub batch_stride: usize,
}

impl MatView {
    /// A row-major `rows × cols` matrix at `offset`, repeated every
    /// `rows*cols` elements; transposed reading when `transpose`.
    pub fn dense(offset: usize, rows: usize, cols: usize, transpose: bool) -> MatView {
        let (row_stride, col_stride) = if transpose { (1, cols) } else { (cols, 1) };
        MatView {
            offset,
            row_stride,
            col_stride,
            batch_stride: rows * cols,
        }
    }

    pub fn shared(mut self) -> MatView {
        self.batch_stride = 0;
        self
    }
}

/// One general matrix multiply: `C[b] (+)= A[b] · B[b]` for `batch` matrices,
/// A viewed as m×k, B as k×n, C row-major m×n at `c_offset` + b·`c_batch_stride`;
/// or, with `reduce_batch`, `C (+)= Σ_b A[b] · B[b]` (one C).
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: MatView,
    pub b: MatView,
    pub c_offset: usize,
    pub c_batch_stride: usize,
    /// Add to C instead of overwriting it.
    pub accumulate: bool,
    /// Sum the batch's products into one C.
    pub reduce_batch: bool,
    /// B is the im2col of this convolution's input (B's view then gives
    /// only the offset and the per-sample stride).
    pub implicit_b: Option<ConvGeometry>,
}

/// A convolution whose im2col a product reads in place as its B operand
/// (`[C·KH·KW, HO·WO]` per sample): implicit GEMM, no im2col buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ConvGeometry {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad: usize,
    /// Output width (the output height follows from the column count).
    pub wo: usize,
    /// B is im2colᵀ (positions × rows) rather than im2col.
    pub transposed: bool,
    /// The kernel window is read rotated by 180° (row (c, ky, kx) reads
    /// tap (KH−1−ky, KW−1−kx)): the input gradient as a convolution.
    pub flipped: bool,
}

impl ConvGeometry {
    fn params(&self) -> [u32; 8] {
        [
            self.c,
            self.h,
            self.w,
            self.kh,
            self.kw,
            self.stride,
            self.pad,
            self.wo,
        ]
        .map(|v| v as u32)
    }
}

/// A product's shape as a model issued it, for `vramlab bench` to replay:
/// sizes, whether each operand is read transposed or shared across the
/// batch, and the op that issued it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GemmShape {
    pub op: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
    pub a_shared: bool,
    pub b_shared: bool,
    pub reduce_batch: bool,
    /// B read as a convolution's im2col in place.
    pub conv: Option<ConvGeometry>,
}

impl GemmShape {
    pub fn of(g: &Gemm, op: &str) -> GemmShape {
        GemmShape {
            op: op.to_string(),
            m: g.m,
            n: g.n,
            k: g.k,
            batch: g.batch,
            a_transposed: g.a.col_stride != 1 && g.k > 1,
            b_transposed: g.b.col_stride != 1 && g.n > 1,
            a_shared: g.a.batch_stride == 0,
            b_shared: g.b.batch_stride == 0,
            reduce_batch: g.reduce_batch,
            conv: g.implicit_b,
        }
    }

    /// Multiply-adds ×2.
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batch) as f64
    }

    /// The same product as a [`Gemm`] over fresh dense operands.
    pub fn gemm(&self) -> Gemm {
        let mut a = MatView::dense(0, self.m, self.k, false);
        if self.a_transposed {
            a = MatView::dense(0, self.k, self.m, true);
        }
        let mut b = MatView::dense(0, self.k, self.n, false);
        if self.b_transposed {
            b = MatView::dense(0, self.n, self.k, true);
        }
        if self.a_shared {
            a = a.shared();
        }
        if let Some(cv) = self.conv {
            b = MatView {
                offset: 0,
                row_stride: 0,
                col_stride: 0,
                batch_stride: cv.c * cv.h * cv.w,
            };
        }
        if self.b_shared {
            b = b.shared();
        }
        Gemm {
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
            a,
            b,
            c_offset: 0,
            c_batch_stride: if self.reduce_batch {
                0
            } else {
                self.m * self.n
            },
            accumulate: false,
            reduce_batch: self.reduce_batch,
            implicit_b: self.conv,
        }
    }

    /// Elements of A, B and C the product touches.
    pub fn sizes(&self) -> (usize, usize, usize) {
        let batches = |shared: bool| if shared { 1 } else { self.batch };
        let c = if self.reduce_batch { 1 } else { self.batch };
        let b = match self.conv {
            Some(cv) => cv.c * cv.h * cv.w,
            None => self.k * self.n,
        };
        (
            batches(self.a_shared) * self.m * self.k,
            batches(self.b_shared) * b,
            c * self.m * self.n,
        )
    }
}

/// How a product is cut: K splits per batch entry, and batch entries per
/// group of partial products (all of them when no workspace is needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Split {
    pub splits: usize,
    pub k_chunk: usize,
    /// Batch entries per workspace group; 0 when no workspace is used.
    pub group: usize,
}

/// The split for `g`: shapes only, never the adapter (so a simulated run
/// allocates the same workspace as a real one).
pub fn plan_split(g: &Gemm) -> Split {
    let tiles = g.m.div_ceil(64) * g.n.div_ceil(64);
    let loop_cap = super::MAX_LOOP_ITERATIONS;
    let mut splits = 1;
    // Every batch entry is its own set of workgroups, reduced or not.
    if tiles * g.batch < TARGET_GROUPS {
        let want = TARGET_GROUPS.div_ceil(tiles * g.batch.max(1));
        splits = want.min(g.k / MIN_SPLIT_K).max(1);
    }
    // llvmpipe ends a loop after 65,535 iterations: bound each split's K.
    splits = splits.max(g.k.div_ceil(loop_cap));
    let k_chunk = g.k.div_ceil(splits).max(1);
    let splits = g.k.div_ceil(k_chunk).max(1);
    let partials = splits > 1 || (g.reduce_batch && g.batch > 1);
    if !partials {
        return Split {
            splits: 1,
            k_chunk,
            group: 0,
        };
    }
    let per_entry = splits * g.m * g.n * 4;
    let group = (MAX_PARTIALS_BYTES / per_entry.max(1)).clamp(1, g.batch.max(1));
    Split {
        splits,
        k_chunk,
        group,
    }
}

/// Runs `g` on existing tensors. The caller guarantees the views lie inside
/// the tensors (ops build them from shapes they checked).
pub fn gemm(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    kernel: MatmulKernel,
) -> Result<(), TensorError> {
    gemm_bias(g, a, b, c, None, kernel)
}

/// [`gemm`], then `C[b, r, col] += bias[r]` (a bias per output row, as a
/// convolution's per channel): in the product's epilogue when it runs in
/// one pass, else as a separate pass over C (which must then be dense:
/// `c_offset` 0, batch stride m·n, no accumulation).
pub fn gemm_bias(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    kernel: MatmulKernel,
) -> Result<(), TensorError> {
    const OP: &str = "matmul";
    for t in [a, b, c] {
        super::check_u32(OP, t)?;
    }
    // Operands share one type; f16 needs the adapter's SHADER_F16. The
    // output is f32 or the operands' type. Arithmetic is f32 throughout.
    if b.dtype() != a.dtype() || (c.dtype() != a.dtype() && c.dtype() != DType::F32) {
        return Err(TensorError::InvalidShape {
            op: OP,
            message: format!(
                "operands must share a dtype and the output be f32 or that dtype; got {:?}·{:?} → {:?}",
                a.dtype(),
                b.dtype(),
                c.dtype()
            ),
        });
    }
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return Ok(());
    }
    a.engine()
        .note_gemm(|| GemmShape::of(g, &a.engine().current_scope().1));
    // f16 products on tensor cores where the device has them; split
    // products keep the plain kernels (their partials are planned from
    // shapes alone, so memory is the same either way).
    if kernel == MatmulKernel::Tiled && bias.is_none() && plan_split(g).group == 0 {
        if let Some(lanes) = coop::usable(g, a, b, c) {
            return coop::gemm(g, a, b, c, lanes);
        }
    }
    let fixed = |tile| TileChoice {
        tile,
        class: ShapeClass::of(g.m, g.n, g.k),
        transposed: false,
    };
    let choice = match kernel {
        MatmulKernel::Tiled => choose(
            g,
            Target::of(a.engine()),
            c.dtype().is_16bit(),
            bias.is_some(),
        ),
        MatmulKernel::Naive => fixed(NAIVE_TILE),
        MatmulKernel::Fixed(t) => fixed(t),
        MatmulKernel::FixedTransposed(tile) => {
            if !transposable(g, c.dtype().is_16bit(), bias.is_some()) {
                return Err(TensorError::InvalidShape {
                    op: OP,
                    message: "a product reading B as an im2col, adding a row bias or \
                              writing 16-bit output runs untransposed: use a plain tile"
                        .into(),
                });
            }
            TileChoice {
                tile,
                class: ShapeClass::of(g.n, g.m, g.k),
                transposed: true,
            }
        }
    };
    let transposed = choice.transposed;
    let mut tile = choice.tile;
    if c.dtype().is_16bit() {
        // 16-bit output (packed in words where the adapter has no native
        // f16, and always for bf16): each thread owns whole words.
        tile.strided_cols = false;
        let even = |v: usize| v.is_multiple_of(2);
        let pairs =
            even(tile.tn as usize) && even(g.n) && even(g.c_offset) && even(g.c_batch_stride);
        if !pairs {
            return gemm_via_f32(g, a, b, c, bias, kernel);
        }
    }
    if !tile.is_valid() {
        return Err(TensorError::InvalidShape {
            op: OP,
            message: format!("tile {} does not divide its staging loops", tile.describe()),
        });
    }
    if let Some(bias) = bias {
        if bias.numel() != g.m || bias.dtype() != a.dtype() {
            return Err(TensorError::InvalidShape {
                op: OP,
                message: format!(
                    "a row bias needs {} values of the operands' dtype {}, got {:?} {}",
                    g.m,
                    a.dtype(),
                    bias.shape(),
                    bias.dtype()
                ),
            });
        }
    }
    let split = plan_split(g);
    if split.group == 0 {
        return dispatch(
            g,
            [a, b, c],
            bias,
            &tile,
            transposed,
            1,
            g.k.max(1),
            g.c_offset,
            g.c_batch_stride,
            g.accumulate,
        );
    }
    if bias.is_some() && (g.c_offset != 0 || g.c_batch_stride != g.m * g.n || g.accumulate) {
        return Err(TensorError::InvalidShape {
            op: OP,
            message: "a row bias on a split product needs a dense C".into(),
        });
    }
    let mn = g.m * g.n;
    for b0 in (0..g.batch).step_by(split.group) {
        let nb = split.group.min(g.batch - b0);
        let parts = Tensor::empty_as(
            a.engine(),
            &[nb * split.splits, g.m, g.n],
            DType::F32,
            "matmul.partials",
            Some(Category::Workspace),
        )?;
        let mut part = *g;
        part.batch = nb;
        part.a.offset += b0 * g.a.batch_stride;
        part.b.offset += b0 * g.b.batch_stride;
        dispatch(
            &part,
            [a, b, &parts],
            None,
            &tile,
            transposed,
            split.splits,
            split.k_chunk,
            0,
            mn,
            false,
        )?;
        if g.reduce_batch {
            sum_partials(
                &parts,
                c,
                0,
                nb * split.splits,
                mn,
                g.c_offset,
                g.accumulate || b0 > 0,
            )?;
        } else {
            for e in 0..nb {
                sum_partials(
                    &parts,
                    c,
                    e * split.splits * mn,
                    split.splits,
                    mn,
                    g.c_offset + (b0 + e) * g.c_batch_stride,
                    g.accumulate,
                )?;
            }
        }
    }
    if let Some(bias) = bias {
        // A 16-bit product summed in an f32 workspace (gemm_via_f32) has a
        // 16-bit bias: widened first (exactly), then added in f32.
        let wide;
        let bias = if bias.dtype() != c.dtype() {
            wide = super::cast::cast(bias, c.dtype(), "matmul.bias_f32")?;
            &wide
        } else {
            bias
        };
        super::bias::add_bias(c, bias, g.m, g.n)?;
    }
    Ok(())
}

/// A bf16 product whose output words cannot each go to one thread (odd
/// widths or offsets): computed in an f32 workspace shaped like C, then
/// rounded into C.
fn gemm_via_f32(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    kernel: MatmulKernel,
) -> Result<(), TensorError> {
    let wide = Tensor::empty_as(
        a.engine(),
        c.shape(),
        DType::F32,
        "matmul.f32_out",
        Some(Category::Workspace),
    )?;
    if g.accumulate {
        super::cast::cast_into(c, &wide)?;
    }
    gemm_bias(g, a, b, &wide, bias, kernel)?;
    super::cast::cast_into(&wide, c)
}

#[allow(clippy::too_many_arguments)]
fn dispatch(
    g: &Gemm,
    [a, b, c]: [&Tensor; 3],
    bias: Option<&Tensor>,
    tile: &TileConfig,
    transposed: bool,
    splits: usize,
    k_chunk: usize,
    c_offset: usize,
    c_batch_stride: usize,
    accumulate: bool,
) -> Result<(), TensorError> {
    let u = |x: usize| x as u32;
    // Transposed: Cᵀ (n×m) = Bᵀ·Aᵀ, so the kernel's A is B read with its
    // strides swapped, its B is A likewise, and its rows are C's columns.
    let (m, n, av, bv, (a, b)) = if transposed {
        let t = |v: MatView| MatView {
            row_stride: v.col_stride,
            col_stride: v.row_stride,
            ..v
        };
        (g.n, g.m, t(g.b), t(g.a), (b, a))
    } else {
        (g.m, g.n, g.a, g.b, (a, b))
    };
    let (c_rs, c_cs) = if transposed { (1, g.n) } else { (g.n, 1) };
    let params = MatmulParams {
        m: u(m),
        n: u(n),
        k: u(g.k),
        batch: u(g.batch),
        a_rs: u(av.row_stride),
        a_cs: u(av.col_stride),
        b_rs: u(bv.row_stride),
        b_cs: u(bv.col_stride),
        a_bs: u(av.batch_stride),
        b_bs: u(bv.batch_stride),
        c_bs: u(c_batch_stride),
        accumulate: accumulate as u32,
        a_off: u(av.offset),
        b_off: u(bv.offset),
        c_off: u(c_offset),
        splits: u(splits),
        k_chunk: u(k_chunk),
        c_rs: u(c_rs),
        c_cs: u(c_cs),
        _pad: 0,
    };
    let (bm, bn) = tile.block();
    // vec4 accesses need every index they form to be a multiple of 4 (and
    // the bound array to end on a whole vec4).
    let fours = |xs: &[usize]| xs.iter().all(|x| x.is_multiple_of(4));
    // A view read (or written) as vec4 along its unit stride: its other
    // stride, offset, batch stride and the whole tensor in fours.
    let in_fours = |v: &MatView, other_stride: usize, t: &Tensor| {
        fours(&[other_stride, v.offset, v.batch_stride, t.numel()])
    };
    let asked = tile.vec4 && !tile.shared;
    let cols4 = asked && tile.tn.is_multiple_of(4) && n.is_multiple_of(4);
    let dense_b = g.implicit_b.is_none() && elem_of(b) == Elem::F32;
    let vec_b = cols4 && dense_b && bv.col_stride == 1 && in_fours(&bv, bv.row_stride, b);
    let vec4 = Vec4Io {
        b: vec_b,
        c: cols4
            && elem_of(c) == Elem::F32
            && c_cs == 1
            && fours(&[c_rs, c_offset, c_batch_stride, c.numel()]),
        // Every K slice starts at a multiple of 4: the split and the slice
        // depth are, and K ends on one.
        k: asked
            && !vec_b
            && dense_b
            && av.col_stride == 1
            && bv.row_stride == 1
            && fours(&[g.k, k_chunk, tile.bk as usize])
            && in_fours(&av, av.row_stride, a)
            && in_fours(&bv, bv.col_stride, b),
    };
    let rows_outer = if splits == 1 && !vec4.k {
        tile.rows_outer(g.k)
    } else {
        0
    };
    let k2 = rows_outer == 0
        && tile.k2()
        && !vec4.k
        && !vec4.b
        && [g.k, k_chunk].iter().all(|x| x.is_multiple_of(2));
    let pairs = |on: bool| if on { 2 } else { 1 };
    let steps = (
        if vec4.b || vec4.c {
            4
        } else {
            pairs(elem_of(c) != Elem::F32)
        },
        if vec4.k {
            4
        } else {
            pairs(k2 || elem_of(a) != Elem::F32)
        },
    );
    // A part of K (budget) runs the K loop: rows_outer compiles
    // K's length in, and one variant per part length compiles slowly.
    let variant = |accumulate: bool, whole_k: bool| {
        let rows_outer = if whole_k { rows_outer } else { 0 };
        tile.kernel(
            elem_of(a),
            elem_of(c),
            g.implicit_b.as_ref(),
            Variant {
                bias_rows: bias.is_some(),
                accumulate,
                vec4,
                one_slice: tile.one_slice(k_chunk.min(g.k)),
                rows_outer,
                k2,
            },
        )
    };
    budget::Product {
        kernel: variant(accumulate, true),
        k_part: (bias.is_none() && g.implicit_b.is_none())
            .then_some(&variant as &dyn Fn(_, _) -> _),
        operands: [a, b, c],
        bias,
        block: (bm, bn),
        steps,
        implicit: g.implicit_b.as_ref(),
    }
    .dispatch(params)
}

/// Splits `[.., R, C]` into (batch, R, C).
fn matrix_dims(op: &'static str, t: &Tensor) -> Result<(usize, usize, usize), TensorError> {
    let s = t.shape();
    if s.len() < 2 {
        return Err(TensorError::InvalidShape {
            op,
            message: format!("needs at least 2 dimensions, got shape {s:?}"),
        });
    }
    let batch = s[..s.len() - 2].iter().product();
    Ok((batch, s[s.len() - 2], s[s.len() - 1]))
}

/// `a · b` with the tiled kernel.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    matmul_ex(a, b, false, false, MatmulKernel::Tiled)
}

/// `op(a) · op(b)`, where op transposes the last two dimensions when asked.
/// Batch dimensions must match, or one side may have none (it is then shared).
pub fn matmul_ex(
    a: &Tensor,
    b: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
    kernel: MatmulKernel,
) -> Result<Tensor, TensorError> {
    const OP: &str = "matmul";
    if !a.engine().same(b.engine()) {
        return Err(TensorError::DifferentEngines { op: OP });
    }
    super::same_dtype(OP, a, b)?;
    let (ba, ra, ca) = matrix_dims(OP, a)?;
    let (bb, rb, cb) = matrix_dims(OP, b)?;
    let (m, k) = if transpose_a { (ca, ra) } else { (ra, ca) };
    let (k2, n) = if transpose_b { (cb, rb) } else { (rb, cb) };
    let batch_shape_a = &a.shape()[..a.shape().len() - 2];
    let batch_shape_b = &b.shape()[..b.shape().len() - 2];
    let batch_ok =
        batch_shape_a == batch_shape_b || batch_shape_a.is_empty() || batch_shape_b.is_empty();
    if k != k2 || !batch_ok {
        return Err(TensorError::ShapeMismatch {
            op: OP,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    let batch = ba.max(bb);
    let batch_shape = if batch_shape_a.is_empty() {
        batch_shape_b
    } else {
        batch_shape_a
    };
    let mut out_shape = batch_shape.to_vec();
    out_shape.extend([m, n]);
    let out = Tensor::empty(a.engine(), &out_shape, a.dtype(), "matmul.out")?;
    let mut av = MatView::dense(0, ra, ca, transpose_a);
    let mut bv = MatView::dense(0, rb, cb, transpose_b);
    if ba == 1 && batch > 1 {
        av = av.shared();
    }
    if bb == 1 && batch > 1 {
        bv = bv.shared();
    }
    let g = Gemm {
        m,
        n,
        k,
        batch,
        a: av,
        b: bv,
        c_offset: 0,
        c_batch_stride: m * n,
        accumulate: false,
        reduce_batch: false,
        implicit_b: None,
    };
    gemm(&g, a, b, &out, kernel)?;
    Ok(out)
}
