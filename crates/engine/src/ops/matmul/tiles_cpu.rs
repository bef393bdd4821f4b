//! The tile table of CPU adapters (llvmpipe, WARP, SwiftShader) and the
//! rules that fit the 8-lane (subgroup-A) tiles to a product's rows and
//! depth. The timings behind each entry are in `docs/kernels.md`.

use super::{plan_split, Gemm, ShapeClass, Target, TileConfig};

/// The CPU adapter tile for `class` (`target` is `Cpu` or `CpuSubgroup8`).
pub(super) fn table(class: ShapeClass, target: Target) -> TileConfig {
    match (target, class) {
        // Columns strided across the lanes (lane x owns x, x+8, …: one
        // B load or C store of the 8 lanes touches 8 neighbouring floats).
        // K slices stay 16 deep: deeper ones, though faster, cost
        // simple-cnn-adam's conv1 gradient its 1e-4 accuracy against the
        // float64 truth. The square tile's height is fitted to the rows in
        // [`choose`]. vec4 B loads and C stores wherever the layout allows:
        // llvmpipe pays per access, not per byte.
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
        (_, class) => table(class, Target::Cpu),
    }
}

/// Fits an 8-lane tile to `g` (run as Cᵀ when `transposed`): one rule per
/// class, so which one applies is plain.
pub(super) fn fit_eight_lanes(
    tile: &mut TileConfig,
    g: &Gemm,
    class: ShapeClass,
    transposed: bool,
) {
    let rows = if transposed { g.n } else { g.m };
    // The 8-lane tiles' shape from the product's rows and depth: one
    // rule per class, so which one applies is plain.
    match class {
        ShapeClass::Short => {
            // Fewer than 32 rows: a thread tile of exactly that many
            // (lane x loads rows x, x+8, …, the rest clamped), so no
            // multiply-add is spent on padded rows.
            tile.tm = rows.clamp(1, 32) as u32;
            // And 16 columns a lane where that pads no more columns
            // than 8: each of the few rows' A loads then serves twice
            // the columns. Run as Cᵀ, 4 (below).
            let cols = if transposed { g.m } else { g.n };
            let padded = |tn: u32| cols.next_multiple_of((tile.wx * tn) as usize);
            if transposed {
                // As Cᵀ each column is a row of the long operand (the
                // fc forward: a row of X, 401 KB from the next), so a
                // lane's columns are separate streams through memory
                // and its accumulators spill: 4 a lane, strided (lane
                // x owns x, x+8, …), where 8 keep more streams and sums
                // live and 2 reload A twice as often.
                tile.tn = 4;
                tile.strided_cols = true;
            } else if padded(16) <= padded(8) {
                tile.tn = 16;
            }
            if transposed && plan_split(g).k_chunk.min(g.k) >= 512 {
                // The fc forward as Cᵀ sums K ranges of 784 (K split
                // 128 ways): 32-deep slices bound its rounding error
                // by 784/32 + 32 = 56.5 units where 16-deep ones give
                // 65 and 64-deep ones 76 (from 512 on, 32 bounds it no
                // worse than 16), and run it faster.
                tile.bk = 32;
            }
        }
        ShapeClass::Shallow if g.k < tile.bk as usize => {
            // Less than one K slice (the fc input gradient: K = 10):
            // the product is mostly its output, and 16 columns a lane
            // write it faster than 8. conv1's forward (K = 27) keeps
            // 64×8, its faster tile. Rows outer ([`TileConfig::rows_outer`])
            // keeps one row's sums live, so 64 rows cost no spills and
            // read B once for twice the rows.
            let padded = |tm: usize| rows.next_multiple_of(tm);
            tile.tm = if padded(64) <= padded(32) { 64 } else { 32 };
            tile.tn = 16;
        }
        _ => {
            // The thread tile's height and the workgroup's: as few
            // padded rows as the heights allow, ties to the first
            // listed. 64-row thread tiles read each B element for
            // twice the rows, which pays where B's loads are dear (the
            // im2col read in place) and is even on the dense square.
            // Fitting the height matters: a 64-row product (a stride-1
            // convolution's input gradient with 64 input channels) in
            // 128-row tiles would do half its work on clamped rows.
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
