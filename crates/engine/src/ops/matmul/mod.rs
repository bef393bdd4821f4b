//! Matrix multiply, batched: `[.., M, K] · [.., K, N] → [.., M, N]`, from
//! a kernel family per adapter class whose tile is chosen per shape class:
//! register-blocked tiles staged in workgroup memory on GPUs
//! (`tiles_gpu`), read straight from storage on CPU adapters (`tile`,
//! `tiles_cpu`), tuned on first use where tuning is on (`tune`).
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
//! products on tensor cores; `dispatch` records one product.

mod budget;
pub mod coop;
pub mod coop_tile;
mod dispatch;
mod shapes;
mod tile;
mod tiles_cpu;
pub mod tiles_gpu;
pub mod tune;

use dispatch::{dispatch, Bias};
pub(crate) use dispatch::{MatmulParams, Oriented};
pub use shapes::{
    plan_split, ConvGeometry, Gemm, GemmShape, MatView, ShapeClass, Split, SplitTargets,
};
use tile::conv_defs;
pub use tile::{TileConfig, Variant, Vec4Io, ROWS_OUTER_MAX_B};

use super::partials::{sum_partials, Spread};
use crate::device::compose::Elem;
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

/// The kernel element type of a tensor's dtype.
pub(crate) fn elem_of(t: &Tensor) -> Elem {
    t.dtype().elem()
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

/// `gpu` takes the GPU tile family on any adapter (CI runs the kernel
/// tests through it on lavapipe); `auto` or unset, the adapter's own.
pub const TILE_FAMILY_VAR: &str = "VRAMLAB_TILE_FAMILY";

/// Every setting products read from the environment (tile family,
/// tensor-core layout and staging, K splits, tuning); an error names a bad
/// value and what it takes. The CLI checks them before any work.
pub fn check_env() -> Result<(), crate::tensor::ConfigError> {
    tile_family_forced()?;
    coop::CoopTile::from_env()?;
    coop::staging_from_env()?;
    shapes::SplitTargets::from_env()?;
    tune::check_settings()
}

/// Whether [`TILE_FAMILY_VAR`] asks for the GPU family; an error names a
/// value it does not take.
pub fn tile_family_forced() -> Result<bool, crate::tensor::ConfigError> {
    match std::env::var(TILE_FAMILY_VAR) {
        Ok(v) if !v.trim().is_empty() => match v.trim().to_ascii_lowercase().as_str() {
            "gpu" => Ok(true),
            "auto" => Ok(false),
            _ => Err(crate::tensor::ConfigError::Env {
                var: TILE_FAMILY_VAR,
                value: v,
                expected: "gpu (the GPU tile family on any adapter) or auto (the adapter's own)",
            }),
        },
        _ => Ok(false),
    }
}

impl Target {
    /// The adapter's class, or the GPU family where [`TILE_FAMILY_VAR`]
    /// asks for it.
    pub fn of(engine: &crate::tensor::Engine) -> Target {
        static FORCED_GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let forced = *FORCED_GPU.get_or_init(|| tile_family_forced().unwrap_or(false));
        if forced {
            return Target::Gpu;
        }
        match (engine.is_cpu_adapter(), engine.fixed_subgroup_size()) {
            (false, _) => Target::Gpu,
            (true, Some(8)) => Target::CpuSubgroup8,
            (true, _) => Target::Cpu,
        }
    }
}

/// The fixed tile for `class` on `target` (figures in `docs/kernels.md`).
pub fn choose_tile(class: ShapeClass, target: Target) -> TileConfig {
    match target {
        // GPUs: the GPU family's table within WebGPU's default limits
        // ([`choose_for`] uses the adapter's).
        Target::Gpu => tiles_gpu::fixed(class, &tiles_gpu::GpuLimits::DEFAULT),
        Target::Cpu | Target::CpuSubgroup8 => tiles_cpu::table(class, target),
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
    if target == Target::CpuSubgroup8 {
        tiles_cpu::fit_eight_lanes(&mut tile, g, class, transposed);
    }
    TileChoice {
        tile,
        class,
        transposed,
    }
}

/// The tile `g` runs with on `e`, operands and output of `dtypes`:
/// [`choose`] for the adapter class, the GPU table within the adapter's
/// own limits, and where tiles are tuned ([`tune`]) the tuned one in the
/// same orientation.
pub fn choose_for(
    e: &crate::tensor::Engine,
    g: &Gemm,
    dtypes: (DType, DType),
    bias: bool,
) -> TileChoice {
    let target = Target::of(e);
    let mut choice = choose(g, target, dtypes.1.is_16bit(), bias);
    if target == Target::Gpu {
        if let Some(gpu) = e.gpu() {
            choice.tile = tiles_gpu::fixed(choice.class, &tiles_gpu::GpuLimits::of(&gpu.limits));
        }
    }
    if let Some(t) = tune::tuned(e, g, &choice, dtypes, bias) {
        choice.tile = t;
    }
    choice
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

/// Every matrix product issued on an engine while on (`vramlab bench`
/// replays a step's products): an engine extension, so the engine knows
/// nothing of products.
pub struct GemmLog(Vec<GemmShape>);

/// Starts (or, with `false`, stops) logging the products issued on `e`.
pub fn log_gemms(e: &crate::tensor::Engine, on: bool) {
    e.set_extension(on.then(|| GemmLog(Vec::new())));
}

/// The products logged on `e` so far, emptying the log.
pub fn take_gemms(e: &crate::tensor::Engine) -> Vec<GemmShape> {
    e.with_extension::<GemmLog, _>(|log| log.map(|l| std::mem::take(&mut l.0)).unwrap_or_default())
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
    log_product(g, a);
    gemm_biased(g, a, b, c, bias, None, kernel)
}

/// Adds `g` to the engine's [`GemmLog`] where one is on (empty products
/// run nothing and are not logged).
fn log_product(g: &Gemm, a: &Tensor) {
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return;
    }
    a.engine().with_extension::<GemmLog, _>(|log| {
        if let Some(log) = log {
            log.0.push(GemmShape::of(g, &a.engine().current_scope().1));
        }
    });
}

/// [`gemm`] into a fresh, dense C, then `C[b, r, col] += bias[col]` (a
/// linear layer's bias, per output feature, as PyTorch's addmm adds it).
/// Where C is in the operands' type, in the product's own work: the
/// epilogue of a GPU tile bound whole, or the pass that sums a split
/// product's partial products, one dispatch fewer. An f32 C gets the bits
/// of a pass of its own; a 16-bit one is rounded once, after the bias, as
/// addmm rounds its f32 sum, where a pass rounds twice. Else in a pass.
pub fn gemm_col_bias(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: &Tensor,
    kernel: MatmulKernel,
) -> Result<(), TensorError> {
    if g.accumulate
        || g.reduce_batch
        || g.c_offset != 0
        || (g.batch > 1 && g.c_batch_stride != g.m * g.n)
    {
        return Err(TensorError::NotSupported {
            op: "matmul",
            what: "a column bias needs a fresh, dense C",
        });
    }
    if bias.numel() != g.n || bias.dtype() != c.dtype() {
        return Err(TensorError::BadBias {
            op: "matmul",
            len: g.n,
            dtype: c.dtype(),
            got_shape: bias.shape().to_vec(),
            got_dtype: bias.dtype(),
        });
    }
    log_product(g, a);
    if c.dtype() == a.dtype() && g.m > 0 {
        return gemm_biased(g, a, b, c, None, Some(bias), kernel);
    }
    gemm_biased(g, a, b, c, None, None, kernel)?;
    super::bias::add_bias(c, bias, g.n, 1)
}

/// `C += bias[col]` in a pass of its own, for a column bias the product
/// could not add.
fn col_bias_pass(g: &Gemm, c: &Tensor, col_bias: Option<&Tensor>) -> Result<(), TensorError> {
    match col_bias {
        Some(bias) => super::bias::add_bias(c, bias, g.n, 1),
        None => Ok(()),
    }
}

/// The subgroup size `g` runs on tensor cores with, or `None` where it
/// runs on the plain kernels, by either route: an unsplit product
/// ([`unsplit_cores`]) or the partial products of a split one, K split or
/// summed batch ([`partial_cores`]). f16 operands where the device has
/// them, never with a fixed tile.
pub fn tensor_cores_for(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    kernel: MatmulKernel,
) -> Option<u32> {
    let split = plan_split(g);
    if split.group == 0 {
        return unsplit_cores(g, a, b, c, bias, kernel);
    }
    // Judged on a workspace's worth of entries, as the partials run them:
    // the one-dispatch route for a batch summed past one workspace uses
    // the whole batch, which fits the tensor cores' limits wherever a
    // workspace's worth does, but past 16,384 entries (then a GPU tile).
    let part = Gemm {
        batch: split.group.min(g.batch),
        ..*g
    };
    partial_cores(&split, &part, a, b, kernel)
}

/// [`tensor_cores_for`] a product that is not split: into C itself, with
/// its bias in the epilogue.
fn unsplit_cores(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    kernel: MatmulKernel,
) -> Option<u32> {
    (kernel == MatmulKernel::Tiled && plan_split(g).group == 0)
        .then(|| coop::usable(g, a, b, c.dtype(), bias))
        .flatten()
}

/// `part` writing into the partials' workspace: each entry (or each slot
/// of a summed batch) its own dense m×n, overwritten.
fn slotted(part: &Gemm) -> Gemm {
    Gemm {
        c_offset: 0,
        c_batch_stride: part.m * part.n,
        accumulate: false,
        ..*part
    }
}

/// [`tensor_cores_for`] the entries `part` of a split product, each into an
/// f32 slot of the partials' workspace (no bias: the sum adds a column
/// bias, a pass after it a row bias), each K split into its own slot. The
/// partials are planned from shapes alone, so memory is the same on either
/// kernel.
fn partial_cores(
    split: &Split,
    part: &Gemm,
    a: &Tensor,
    b: &Tensor,
    kernel: MatmulKernel,
) -> Option<u32> {
    let entries = Gemm {
        reduce_batch: false,
        ..slotted(part)
    };
    (kernel == MatmulKernel::Tiled)
        .then(|| {
            coop::usable_split(
                &entries,
                a,
                b,
                DType::F32,
                None,
                split.splits,
                split.k_chunk,
            )
        })
        .flatten()
}

/// [`gemm_bias`], with `col_bias` (C in the operands' type, no row bias:
/// see [`gemm_col_bias`]) added by the product where it can, else in a pass.
/// Unlogged: the public entries log the product, so the f32 product a
/// 16-bit C's workspace takes ([`gemm_via_f32`]) is not counted again.
fn gemm_biased(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    col_bias: Option<&Tensor>,
    kernel: MatmulKernel,
) -> Result<(), TensorError> {
    const OP: &str = "matmul";
    // The kernels bind a column bias as the operands' type.
    if col_bias.is_some() && (bias.is_some() || c.dtype() != a.dtype()) {
        return Err(TensorError::NotSupported {
            op: OP,
            what: "a column bias in the product needs no row bias and output in the \
                   operands' type",
        });
    }
    for t in [a, b, c] {
        super::check_u32(OP, t)?;
    }
    // Operands share one type; f16 needs the adapter's SHADER_F16. The
    // output is f32 or the operands' type. Arithmetic is f32 throughout.
    if b.dtype() != a.dtype() || (c.dtype() != a.dtype() && c.dtype() != DType::F32) {
        return Err(TensorError::ProductDTypes {
            op: OP,
            a: a.dtype(),
            b: b.dtype(),
            out: c.dtype(),
        });
    }
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return Ok(());
    }
    if let Some(lanes) = unsplit_cores(g, a, b, c, bias, kernel) {
        // A 16-bit C the plain kernels cannot write in whole words
        // takes the f32 workspace here too (its product still on
        // tensor cores), so what is allocated does not depend on them.
        if c.dtype().is_16bit() && !whole_words(g) {
            return gemm_via_f32(g, a, b, c, bias, col_bias, kernel);
        }
        let epilogue = bias.map(Bias::Rows).or(col_bias.map(Bias::Cols));
        return coop::gemm(g, a, b, c, epilogue, lanes);
    }
    let fixed = |tile| TileChoice {
        tile,
        class: ShapeClass::of(g.m, g.n, g.k),
        transposed: false,
    };
    let choice = match kernel {
        MatmulKernel::Tiled => choose_for(a.engine(), g, (a.dtype(), c.dtype()), bias.is_some()),
        MatmulKernel::Naive => fixed(NAIVE_TILE),
        MatmulKernel::Fixed(t) => fixed(t),
        MatmulKernel::FixedTransposed(tile) => {
            if !transposable(g, c.dtype().is_16bit(), bias.is_some()) {
                return Err(TensorError::NotSupported {
                    op: OP,
                    what: "a product reading B as an im2col, adding a row bias or \
                           writing 16-bit output runs untransposed: use a plain tile",
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
        // f16, and always for bf16): each thread owns whole words (a GPU
        // tile's columns come in fours).
        tile.strided_cols = tile.shared;
        if !(tile.tn.is_multiple_of(2) && whole_words(g)) {
            return gemm_via_f32(g, a, b, c, bias, col_bias, kernel);
        }
    }
    if !tile.is_valid() {
        return Err(TensorError::BadTile {
            op: OP,
            tile: tile.describe(),
        });
    }
    if let Some(bias) = bias {
        if bias.numel() != g.m || bias.dtype() != a.dtype() {
            return Err(TensorError::BadBias {
                op: OP,
                len: g.m,
                dtype: a.dtype(),
                got_shape: bias.shape().to_vec(),
                got_dtype: bias.dtype(),
            });
        }
    }
    let split = plan_split(g);
    if split.group == 0 {
        // A column bias in the epilogue of a GPU tile bound whole and
        // launched whole (cutting the product into parts would move its
        // columns, and the bias has no offset to move with them).
        let fused = col_bias.filter(|cb| {
            tile.shared
                && !transposed
                && budget::fits_whole(&[a, b, c, cb])
                && budget::grid_fits_any_tile(a.engine(), g.m, g.n, g.batch)
        });
        dispatch(
            g,
            [a, b, c],
            bias.map(Bias::Rows).or(fused.map(Bias::Cols)),
            &tile,
            transposed,
            1,
            g.k.max(1),
            g.c_offset,
            g.c_batch_stride,
            g.accumulate,
            1,
        )?;
        return col_bias_pass(g, c, col_bias.filter(|_| fused.is_none()));
    }
    if bias.is_some() && (g.c_offset != 0 || g.c_batch_stride != g.m * g.n || g.accumulate) {
        return Err(TensorError::NotSupported {
            op: OP,
            what: "a row bias on a split product needs a dense C",
        });
    }
    let mn = g.m * g.n;
    // One workspace of `group` entries' partial products, allocated once
    // (shapes only: the same on every adapter, and in `estimate`).
    let parts = Tensor::empty_as(
        a.engine(),
        &[split.group * split.splits, g.m, g.n],
        DType::F32,
        "matmul.partials",
        Some(Category::Workspace),
    )?;
    let round = |b0: usize| {
        let nb = split.group.min(g.batch - b0);
        let mut part = *g;
        part.batch = nb;
        part.a.offset += b0 * g.a.batch_stride;
        part.b.offset += b0 * g.b.batch_stride;
        part
    };
    // Each entry's partial products into its slot of the workspace, or
    // with `per` > 1 (a summed batch) each slot summing `per` entries
    // ([`slotted`]); on tensor cores where they run.
    let cores_for = |part: &Gemm| partial_cores(&split, part, a, b, kernel);
    let product = |part: &Gemm, per: usize| match cores_for(part) {
        Some(lanes) => coop::gemm_grouped(
            &slotted(part),
            a,
            b,
            &parts,
            None,
            per,
            (split.splits, split.k_chunk),
            lanes,
        ),
        None => dispatch(
            part,
            [a, b, &parts],
            None,
            &tile,
            transposed,
            split.splits,
            split.k_chunk,
            0,
            mn,
            false,
            per,
        ),
    };
    // Loop iterations an invocation runs an entry: a GPU tile's K steps (at
    // least 8 deep) plus loading and storing; the tensor cores' own count.
    let cores = cores_for(g);
    let per_entry = match cores {
        // A simulated device runs no kernel, so no loop budget: one
        // product, as before (rounds of a batch of 10⁸ took minutes).
        _ if a.engine().gpu().is_none() => 0,
        Some(lanes) => {
            coop::entry_iterations(&slotted(g), a.engine(), lanes, split.splits, split.k_chunk)
        }
        None => split.k_chunk.div_ceil(8) + 2,
    };
    if let Some(per) = summed_per_slot(g, &split, per_entry).filter(|_| {
        (tile.shared || cores.is_some())
            && budget::fits_whole(&[a, b, &parts])
            && budget::grid_fits_any_tile(a.engine(), g.m, g.n, g.batch)
    }) {
        // A summed batch past one workspace: GPU tiles and tensor cores sum
        // several entries a slot, so one product and one sum instead of a
        // round of each per workspace's worth of entries.
        let slots = g.batch.div_ceil(per);
        product(g, per)?;
        sum_partials(
            &parts,
            c,
            0,
            slots * split.splits,
            mn,
            g.c_offset,
            g.accumulate,
            None,
            Spread::Auto,
        )?;
    } else {
        for b0 in (0..g.batch).step_by(split.group) {
            let part = round(b0);
            let nb = part.batch;
            product(&part, 1)?;
            if g.reduce_batch {
                sum_partials(
                    &parts,
                    c,
                    0,
                    nb * split.splits,
                    mn,
                    g.c_offset,
                    g.accumulate || b0 > 0,
                    None,
                    Spread::Auto,
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
                        col_bias,
                        Spread::Auto,
                    )?;
                }
            }
        }
    }
    drop(parts);
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

/// For a batch summed past one workspace, the entries each slot sums when
/// one product sums them all (GPU tiles and tensor cores), or `None` where
/// rounds of one entry a slot run instead (the same workspace): an
/// invocation then runs `per` × `entry_iterations` loop iterations, kept
/// within three passes of llvmpipe's budget (which ends an invocation's
/// loops after 65,535). On a GPU that falls back only at batches of
/// hundreds to thousands, where the product's own work dominates.
pub fn summed_per_slot(g: &Gemm, split: &Split, entry_iterations: usize) -> Option<usize> {
    let per = g.batch.div_ceil(split.group.max(1));
    (g.reduce_batch
        && split.group < g.batch
        && per * entry_iterations <= 3 * crate::ops::MAX_LOOP_ITERATIONS)
        .then_some(per)
}

/// Whether C's rows start and end on whole 16-bit words: the plain
/// kernels' 16-bit stores write pairs (tiles for 16-bit outputs have even
/// thread widths).
fn whole_words(g: &Gemm) -> bool {
    [g.n, g.c_offset, g.c_batch_stride]
        .iter()
        .all(|v| v.is_multiple_of(2))
}

/// A 16-bit product whose output words cannot each go to one thread (odd
/// widths or offsets): computed in an f32 workspace shaped like C, then
/// rounded into C; a column bias is added after, in a pass over C.
fn gemm_via_f32(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    col_bias: Option<&Tensor>,
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
    gemm_biased(g, a, b, &wide, bias, None, kernel)?;
    super::cast::cast_into(&wide, c)?;
    drop(wide);
    col_bias_pass(g, c, col_bias)
}

/// Splits `[.., R, C]` into (batch, R, C).
fn matrix_dims(op: &'static str, t: &Tensor) -> Result<(usize, usize, usize), TensorError> {
    let s = t.shape();
    if s.len() < 2 {
        return Err(TensorError::WrongShape {
            op,
            want: "at least 2 dimensions",
            sizes: Vec::new(),
            got: s.to_vec(),
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
