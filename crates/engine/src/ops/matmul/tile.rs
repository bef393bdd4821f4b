//! The tile shape ([`TileConfig`]) and the direct tile family of CPU
//! adapters (`shaders/matmul_cpu.wgsl`): operands read straight from
//! storage, register tiles written out as named scalars. Shared (GPU) tiles
//! compile from `tiles_gpu.rs`.

use super::{tiles_gpu, ConvGeometry};
use crate::device::compose::{Defs, Elem};
use crate::device::Kernel;

const SOURCE: &str = include_str!("../../../../../shaders/matmul_cpu.wgsl");

/// The most B values (TN·K) a rows-outer variant holds a lane. It writes
/// out WX·TN·K multiply-adds (one group of rows), so this also bounds its
/// code: 2,048 at most.
pub const ROWS_OUTER_MAX_B: usize = 256;

/// A tile shape: of the direct family (`shaders/matmul_cpu.wgsl`), or with
/// `shared` of the GPU family (`shaders/matmul_gpu.wgsl`).
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
    /// `shaders/matmul_cpu.wgsl`).
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
    /// shader's ONE_SLICE: one set of accumulators). Longer ranges keep the
    /// blocked sum's two sets: summing two slices as one breaks the 1e-4
    /// bound against the float64 truth (`tests/torch_fixtures.rs`).
    pub fn one_slice(&self, k_range: usize) -> bool {
        k_range <= self.bk as usize
    }

    /// Whether this tile takes two steps of K an iteration where the K
    /// ranges are even and B is read element by element (the shader's K2):
    /// direct subgroup-A tiles of at most 4 columns (8-column ones gain
    /// nothing measurable). Each sum then takes both steps in a row, so
    /// where llvmpipe spills the sums each is loaded and stored once per two
    /// steps; the same order of additions.
    pub fn k2(&self) -> bool {
        self.subgroup_a && !self.shared && self.tn <= 4 && self.bk.is_multiple_of(2)
    }

    /// The K to compile into a rows-outer variant for a product whose one
    /// workgroup K range is all of `k` (the shader's ROWS_OUTER: B's K range
    /// loaded whole, then a loop over groups of WX rows, each row summed
    /// and stored before the next), or 0 for the K loop. For direct
    /// subgroup-A tiles whose height is whole groups, where B's range is
    /// at most [`ROWS_OUTER_MAX_B`] values a lane. Same bits as the K loop;
    /// only one row's sums are live, so llvmpipe spills none at each step,
    /// and the variant compiles faster.
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

    /// Whether the tile is well formed: a GPU (shared) tile by
    /// [`tiles_gpu::is_valid`], a direct one with at most 256 threads.
    pub fn is_valid(&self) -> bool {
        if self.shared {
            return tiles_gpu::is_valid(self);
        }
        let ok = self.wx > 0 && self.wy > 0 && self.tm > 0 && self.tn > 0 && self.bk > 0;
        ok && self.wx * self.wy <= 256
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
    /// compiler turns those divisions into multiplies (runtime divisions
    /// are scalar code on a CPU adapter). Without padding no bounds test is
    /// needed.
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
        let defs = Defs::elem(elem)
            .with("BIAS_ROWS", bias_rows as u8)
            .with("ACCUMULATE", accumulate as u8)
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
        let (defs, conv_name) = conv_defs(defs, conv);
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

/// The convolution's definitions for a kernel reading B as its im2col (the
/// geometry compiled in as constants: every B load divides by the kernel
/// and output widths, and by constants a compiler turns those divisions
/// into multiplies, where runtime ones are scalar code on a CPU adapter),
/// and the words naming it in the kernel's name.
pub(super) fn conv_defs(defs: Defs, conv: Option<&ConvGeometry>) -> (Defs, String) {
    let mut defs = defs
        .with("IMPLICIT_B", conv.is_some() as u8)
        .with("IMPLICIT_BT", conv.is_some_and(|c| c.transposed) as u8)
        .with("CONV_PAD0", conv.is_some_and(|c| c.pad == 0) as u8)
        .with("CONV_FLIP", conv.is_some_and(|c| c.flipped) as u8);
    let Some(cv) = conv else {
        return (defs, String::new());
    };
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
    let name = format!(
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
    (defs, name)
}
