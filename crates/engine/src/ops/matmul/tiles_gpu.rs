//! The GPU tile family (`shaders/matmul_gpu.wgsl`): block tiles of up to
//! 128×128 staged in double-buffered workgroup memory, TM×TN outputs a
//! thread in whole vec4s of the staged tiles, vec4 global loads and stores
//! where a dispatch finds the layout in fours. A [`TileConfig`] with
//! `shared` set is one of these; [`fixed`] is the table used where tiles are
//! not tuned, [`candidates`] what the tuner times (`tune.rs`).

use super::{conv_defs, ConvGeometry, ShapeClass, TileConfig};
use crate::device::compose::{Defs, Elem};
use crate::device::Kernel;

const SOURCE: &str = include_str!("../../../../../shaders/matmul_gpu.wgsl");

/// What one dispatch of a GPU tile asks beyond its tile and element types
/// (decided from the operands' layout, see `dispatch.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuVariant {
    pub bias_rows: bool,
    /// A bias per column of C (f32), added in the epilogue.
    pub bias_cols: bool,
    pub accumulate: bool,
    /// A staged four steps of K a load (A dense along K, in fours).
    pub vec_a: bool,
    /// B staged four columns a load (B dense along N, in fours).
    pub vec_b: bool,
    /// C stored four columns at a time.
    pub vec_c: bool,
    /// Scalar staging walks A along K (A dense along K), else along M.
    pub a_along_k: bool,
    /// Scalar staging walks B along N, else along K.
    pub b_along_n: bool,
    /// Each workgroup's K range fits one slice: one set of sums.
    pub one_slice: bool,
}

/// The adapter limits a GPU tile must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuLimits {
    pub invocations: u32,
    pub size_x: u32,
    pub size_y: u32,
    pub workgroup_bytes: u32,
}

impl GpuLimits {
    pub fn of(l: &wgpu::Limits) -> GpuLimits {
        GpuLimits {
            invocations: l.max_compute_invocations_per_workgroup,
            size_x: l.max_compute_workgroup_size_x,
            size_y: l.max_compute_workgroup_size_y,
            workgroup_bytes: l.max_compute_workgroup_storage_size,
        }
    }

    /// WebGPU's defaults: what any adapter offers.
    pub const DEFAULT: GpuLimits = GpuLimits {
        invocations: 256,
        size_x: 256,
        size_y: 256,
        workgroup_bytes: 16384,
    };

    pub fn fits(&self, t: &TileConfig) -> bool {
        t.wx * t.wy <= self.invocations
            && t.wx <= self.size_x
            && t.wy <= self.size_y
            && workgroup_bytes(t) <= self.workgroup_bytes as u64
    }
}

/// Workgroup memory a GPU tile takes: two halves of BK rows of A's and B's
/// tiles, f32.
pub fn workgroup_bytes(t: &TileConfig) -> u64 {
    let (bm, bn) = t.block();
    2 * t.bk as u64 * (bm + bn) as u64 * 4
}

/// Whether a GPU tile is well formed: whole vec4s a thread, and staging
/// loops that divide evenly among the threads.
pub fn is_valid(t: &TileConfig) -> bool {
    let threads = t.wx * t.wy;
    let (bm, bn) = t.block();
    let (bm, bn) = (bm as u32, bn as u32);
    t.wx > 0
        && t.wy > 0
        && t.bk > 0
        && t.tm.is_multiple_of(4)
        && t.tn.is_multiple_of(4)
        && t.tm > 0
        && t.tn > 0
        && !t.subgroup_a
        && (t.bk * bm).is_multiple_of(threads)
        && (t.bk * bn).is_multiple_of(threads)
}

/// Whether vec4 staging of A (along K) and of B (along N) divides evenly.
pub fn vec_staging(t: &TileConfig) -> (bool, bool) {
    let threads = t.wx * t.wy;
    let (bm, bn) = t.block();
    let four = t.bk.is_multiple_of(4);
    (
        four && (t.bk * bm as u32 / 4).is_multiple_of(threads),
        (t.bk * bn as u32 / 4).is_multiple_of(threads),
    )
}

/// The GPU kernel for `t` (a shared tile), operands in `elem`, output in
/// `out`; with `conv`, B is read as that convolution's im2col.
pub fn kernel(
    t: &TileConfig,
    elem: Elem,
    out: Elem,
    conv: Option<&ConvGeometry>,
    v: GpuVariant,
) -> Kernel {
    let (bm, bn) = t.block();
    let defs = Defs::elem(elem)
        .with("BIAS_ROWS", v.bias_rows as u8)
        .with("BIAS_COLS", v.bias_cols as u8)
        .with("ACCUMULATE", v.accumulate as u8)
        .with("ELEM_C", out.name())
        .with("TC", out.storage())
        .with("WX", t.wx)
        .with("WY", t.wy)
        .with("THREADS", t.wx * t.wy)
        .with("TM", t.tm)
        .with("TN", t.tn)
        .with("BK", t.bk)
        .with("BM", bm)
        .with("BN", bn)
        .with("VEC_A", v.vec_a as u8)
        .with("VEC_B", v.vec_b as u8)
        // matmul_common's B loader is for element-wise B.
        .with("B4", v.vec_b as u8)
        .with("VEC_C", v.vec_c as u8)
        .with("A_ALONG_K", v.a_along_k as u8)
        .with("B_ALONG_N", v.b_along_n as u8)
        .with("ONE_SLICE", v.one_slice as u8)
        .with("PAIR_STORE", out.is_16bit() as u8);
    let (defs, conv_name) = conv_defs(defs, conv);
    let flag = |on: bool, name: &'static str| if on { name } else { "" };
    Kernel::variant(
        format!(
            "matmul[{}→{} {}{}{}{}{}{}{}{}{}{}]",
            elem.name(),
            out.name(),
            t.describe(),
            conv_name,
            flag(v.bias_rows, " +bias"),
            flag(v.bias_cols, " +col bias"),
            flag(v.accumulate, " +="),
            flag(v.one_slice, " one slice"),
            flag(v.vec_a, " vec4 A"),
            flag(v.vec_b, " vec4 B"),
            flag(v.vec_c, " vec4 C"),
            match (v.vec_a || v.a_along_k, v.vec_b || v.b_along_n) {
                (true, true) => " A→K B→N",
                (true, false) => " A→K B→K",
                (false, true) => " A→M B→N",
                (false, false) => " A→M B→K",
            },
        ),
        SOURCE,
        "main",
        defs,
    )
    // Every global index is clamped into the operand or guarded by the
    // product's sizes, every workgroup index is built from constants and
    // local ids (docs/kernels.md, Bounds).
    .trusted()
}

/// The GPU tile for `class` where tiles are not tuned: 64×64 blocks of
/// 4×4 a thread on square products (16 KiB of workgroup memory, within
/// WebGPU's defaults; the old kernel's 32×32 blocks beat 128×128 ones on an
/// H100, `docs/kernels.md`, so the larger blocks wait for the tuner), and
/// narrow and short products a block 16 wide on their short side.
pub fn fixed(class: ShapeClass, limits: &GpuLimits) -> TileConfig {
    let table: &[TileConfig] = match class {
        ShapeClass::Square | ShapeClass::Shallow => &[
            TileConfig::new(16, 16, 4, 4, 16, true),
            TileConfig::new(8, 8, 4, 4, 16, true),
        ],
        ShapeClass::Narrow => &[
            TileConfig::new(4, 32, 4, 4, 16, true),
            TileConfig::new(4, 16, 4, 4, 16, true),
        ],
        ShapeClass::Short => &[
            TileConfig::new(32, 4, 4, 4, 16, true),
            TileConfig::new(16, 4, 4, 4, 16, true),
        ],
    };
    table
        .iter()
        .copied()
        .find(|t| limits.fits(t))
        .unwrap_or(TileConfig::new(4, 4, 4, 4, 16, true))
}

/// The GPU tiles the tuner tries for `class` (first the [`fixed`] one),
/// with K slices `bk` deep (the depth fixes the summation's rounding, so
/// every candidate gives the same bits), within `limits`.
pub fn candidates(class: ShapeClass, bk: u32, limits: &GpuLimits) -> Vec<TileConfig> {
    let mut v = vec![fixed(class, limits)];
    let shapes: &[(u32, u32)] = match class {
        ShapeClass::Narrow => &[(4, 16), (4, 32), (4, 64), (8, 16), (8, 32)],
        ShapeClass::Short => &[(16, 4), (32, 4), (64, 4), (16, 8), (32, 8)],
        ShapeClass::Square | ShapeClass::Shallow => &[
            (16, 16),
            (8, 8),
            (16, 8),
            (8, 16),
            (32, 8),
            (8, 32),
            (32, 16),
            (16, 32),
        ],
    };
    for &(wx, wy) in shapes {
        for (tm, tn) in [(8, 8), (4, 4), (8, 4), (4, 8)] {
            let t = TileConfig::new(wx, wy, tm, tn, bk, true);
            if is_valid(&t) && limits.fits(&t) && !v.contains(&t) {
                v.push(t);
            }
        }
    }
    v
}

/// The share of a block grid's outputs that lie inside an m×n product.
pub fn inside_share(t: &TileConfig, m: usize, n: usize) -> f64 {
    let (bm, bn) = t.block();
    let padded = |len: usize, block: usize| len.max(1).div_ceil(block) * block;
    (m.max(1) * n.max(1)) as f64 / (padded(m, bm) * padded(n, bn)) as f64
}

/// Orders candidates for an m×n product: after the first (the fixed tile),
/// those whose blocks pad it little, then the rest, each group in the
/// family's order. The tuner times only what its budget allows, and a
/// block twice the product's height spends half its work on padding.
pub fn rank_for_shape(tiles: &mut [TileConfig], m: usize, n: usize) {
    let Some((_, rest)) = tiles.split_first_mut() else {
        return;
    };
    let best = rest
        .iter()
        .map(|t| inside_share(t, m, n))
        .fold(0.0, f64::max);
    rest.sort_by_key(|t| inside_share(t, m, n) < PADDING_KEPT * best);
}

/// Candidates within this share of the least padded one are timed first.
const PADDING_KEPT: f64 = 0.8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_is_valid_and_fits() {
        for class in [
            ShapeClass::Square,
            ShapeClass::Shallow,
            ShapeClass::Narrow,
            ShapeClass::Short,
        ] {
            for limits in [
                GpuLimits::DEFAULT,
                GpuLimits {
                    workgroup_bytes: 49152,
                    invocations: 1024,
                    size_x: 1024,
                    size_y: 1024,
                },
            ] {
                let c = candidates(class, 16, &limits);
                assert!(c.len() > 3, "{class:?}: {}", c.len());
                for t in c {
                    assert!(is_valid(&t) && limits.fits(&t), "{class:?} {t:?}");
                }
            }
        }
        // 128×128 blocks need 32 KiB: not within WebGPU's default 16 KiB.
        let big = TileConfig::new(16, 16, 8, 8, 16, true);
        assert_eq!(workgroup_bytes(&big), 32768);
        assert!(!GpuLimits::DEFAULT.fits(&big));
    }

    #[test]
    fn tiles_that_pad_the_product_by_half_are_timed_last() {
        let limits = GpuLimits {
            workgroup_bytes: 49152,
            invocations: 1024,
            size_x: 1024,
            size_y: 1024,
        };
        // conv2's input gradient: 64 rows (channels), 900 columns (30×30).
        let (m, n) = (64, 900);
        let mut c = candidates(ShapeClass::Square, 16, &limits);
        let before = c.clone();
        rank_for_shape(&mut c, m, n);
        assert_eq!(c[0], before[0], "the fixed tile stays first");
        let mut sorted = c.clone();
        sorted.sort_by_key(|t| (t.wx, t.wy, t.tm, t.tn));
        let mut all = before.clone();
        all.sort_by_key(|t| (t.wx, t.wy, t.tm, t.tn));
        assert_eq!(sorted, all, "the same candidates, reordered");
        // Every tile of 128-row blocks comes after every tile that pads
        // the product by at most a quarter more than the best.
        let best = c.iter().map(|t| inside_share(t, m, n)).fold(0.0, f64::max);
        let kept = |t: &TileConfig| inside_share(t, m, n) >= 0.8 * best;
        let first_dropped = c[1..].iter().position(|t| !kept(t)).unwrap() + 1;
        assert!(c[first_dropped..].iter().all(|t| !kept(t)), "{c:?}");
        assert!(c[1..first_dropped].iter().all(|t| t.block().0 <= m));
        assert!(first_dropped >= 6, "{c:?}");
        // Before, the second and third tiles timed had 128-row blocks.
        assert!(before[1..3].iter().all(|t| t.block().0 > m), "{before:?}");
        // A square product pads no tile more than another: order unchanged.
        let mut square = before.clone();
        rank_for_shape(&mut square, 2048, 2048);
        assert_eq!(square, before);
    }
}
