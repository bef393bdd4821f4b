//! The tile table of CPU adapters (llvmpipe, WARP, SwiftShader) and the
//! rules that fit the 8-lane (subgroup-A) tiles to a product's rows and
//! depth. The timings behind each entry are in `docs/kernels.md`.

use super::{plan_split, Gemm, ShapeClass, Target, TileConfig};

/// The CPU adapter tile for `class` (`target` is `Cpu` or `CpuSubgroup8`).
pub(super) fn table(class: ShapeClass, target: Target) -> TileConfig {
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
