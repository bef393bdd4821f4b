//! A tensor-core product's block layout: how many subgroups a workgroup
//! has and how many tiles each holds, what that costs in invocations and
//! workgroup memory, and its override from the environment. Apart from the
//! kernel (`coop`) so that the tuner, which the kernel asks, can keep
//! layouts without referring back to it.

use crate::tensor::ConfigError;

/// Overrides the block layout: `WMxWN,TMxTN` (subgroups, tiles a subgroup).
pub const TILE_VAR: &str = "VRAMLAB_COOP_TILE";

/// How a workgroup covers its block of C: `wm`×`wn` subgroups, each holding
/// `tm`×`tn` tiles of the matrix side; and how its staged steps run: `depth`
/// tiles of K a step, in `buffers` copies of workgroup memory (two only
/// where wide steps prefetch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopTile {
    pub wm: u32,
    pub wn: u32,
    pub tm: u32,
    pub tn: u32,
    pub depth: u32,
    pub buffers: u32,
}

impl CoopTile {
    /// A layout staged one tile deep in one copy.
    pub const fn new(wm: u32, wn: u32, tm: u32, tn: u32) -> CoopTile {
        CoopTile {
            wm,
            wn,
            tm,
            tn,
            depth: 1,
            buffers: 1,
        }
    }

    /// The same layout staged `depth` tiles deep in `buffers` copies.
    pub fn staged(self, depth: u32, buffers: u32) -> CoopTile {
        CoopTile {
            depth,
            buffers,
            ..self
        }
    }

    /// The same staging in another layout.
    pub fn with_layout(self, layout: CoopTile) -> CoopTile {
        layout.staged(self.depth, self.buffers)
    }

    /// `WMxWN,TMxTN`, each between 1 and 8 (the staging is the
    /// environment's, set by the caller).
    pub fn parse(text: &str) -> Result<CoopTile, ConfigError> {
        let bad = || {
            ConfigError::Env {
            var: TILE_VAR,
            value: text.to_string(),
            expected: "WMxWN,TMxTN: subgroups a workgroup and tiles a subgroup, each 1 to 8 (e.g. 2x2,4x4)",
        }
        };
        let pair = |s: &str| -> Option<(u32, u32)> {
            let (x, y) = s.trim().split_once('x')?;
            let (x, y) = (x.trim().parse().ok()?, y.trim().parse().ok()?);
            ((1..=8).contains(&x) && (1..=8).contains(&y)).then_some((x, y))
        };
        let (w, t) = text.split_once(',').ok_or_else(bad)?;
        let ((wm, wn), (tm, tn)) = (pair(w).ok_or_else(bad)?, pair(t).ok_or_else(bad)?);
        Ok(CoopTile::new(wm, wn, tm, tn))
    }

    /// The override in [`TILE_VAR`], if set.
    pub fn from_env() -> Result<Option<CoopTile>, ConfigError> {
        match std::env::var(TILE_VAR) {
            Ok(v) if !v.trim().is_empty() => CoopTile::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// `WMxWN,TMxTN`, as [`TILE_VAR`] takes it, then the staging where it
    /// is not one tile deep in one copy.
    pub fn describe(&self) -> String {
        let mut s = format!("{}x{},{}x{}", self.wm, self.wn, self.tm, self.tn);
        if self.depth != 1 {
            s += &format!(" {} deep", self.depth);
        }
        if self.buffers == 2 {
            s += " two copies";
        }
        s
    }

    pub(crate) fn block(&self, side: u32) -> (usize, usize) {
        (
            (self.wm * self.tm * side) as usize,
            (self.wn * self.tn * side) as usize,
        )
    }

    pub(crate) fn invocations(&self, lanes: u32) -> u32 {
        self.wm * self.wn * lanes
    }

    /// Workgroup memory in bytes: `buffers` copies of A's and B's staged
    /// slices `depth` tiles deep (f16, rows padded by 8) and one f32 tile a
    /// subgroup.
    pub(crate) fn shared_bytes(&self, side: u32) -> u32 {
        let (bm, bn) = self.block(side);
        let (bm, bn, kd) = (bm as u32, bn as u32, self.depth * side);
        2 * self.buffers * (bm * (kd + 8) + kd * (bn + 8)) + 4 * self.wm * self.wn * side * side
    }
}
