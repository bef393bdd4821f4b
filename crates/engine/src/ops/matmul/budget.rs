//! Products past the binding budget.
//!
//! A product binds A, B and C (and a bias) whole; in windows, that may
//! need more bindings than one dispatch has (32 on lavapipe). Such a
//! product runs as several dispatches of the same kernel, each over a part
//! that touches a narrow range of every operand: batch entries, then
//! K slices (where the product already sums K slices in a workspace),
//! then row blocks of A and C, then column blocks of B and C, then K
//! halves (the second adding to C what the first wrote). Each part
//! binds only the elements it touches, its offsets rebased, so its windows
//! shrink with it. A product that fits is one dispatch, bound as before.

use super::{ConvGeometry, MatmulParams};
use crate::device::{BufferSlice, Kernel, Workgroups};
use crate::tensor::{Engine, Tensor, TensorError};

/// What every part of one product shares.
pub(super) struct Product<'a> {
    pub kernel: Kernel,
    /// The kernel for a part of K (`false`: not the whole of it), adding
    /// to C when asked (K halves after the first add their sums to what
    /// it wrote); None where K may not be cut: a bias in the epilogue, or
    /// B read as an im2col.
    pub k_part: Option<&'a dyn Fn(bool, bool) -> Kernel>,
    /// A, B and C as the kernel reads them (B and A swapped for a
    /// transposed product).
    pub operands: [&'a Tensor; 3],
    pub bias: Option<&'a Tensor>,
    /// The kernel's block of rows and columns.
    pub block: (usize, usize),
    /// What a cut along N and along K must be a multiple of: 4 where the
    /// kernel reads or writes `vec4`s along it, 2 for pairs, else 1.
    pub steps: (u32, u32),
    /// B read as a convolution's im2col: its offset then moves by whole
    /// samples only.
    pub implicit: Option<&'a ConvGeometry>,
}

impl Product<'_> {
    /// Records the product, in parts where one dispatch cannot bind it.
    pub fn dispatch(&self, p: MatmulParams) -> Result<(), TensorError> {
        let engine = self.operands[0].engine();
        let whole: Vec<BufferSlice> = self
            .operands
            .iter()
            .chain(&self.bias)
            .map(|t| t.slice())
            .collect();
        if fits(engine, &whole) && self.grid_fits(engine, &p) {
            return self.record(engine, &self.kernel, &whole, &p);
        }
        self.part(engine, &self.kernel, p)
    }

    /// The workgroup grid of `p` (blocks of columns, of rows, and batch
    /// entries times K slices).
    fn grid(&self, p: &MatmulParams) -> [u32; 3] {
        let (bm, bn) = self.block;
        [
            (p.n as usize).div_ceil(bn) as u32,
            (p.m as usize).div_ceil(bm) as u32,
            p.batch.div_ceil(p.group.max(1)) * p.splits,
        ]
    }

    /// Whether the device launches `p`'s grid in one dispatch: each of its
    /// dimensions at most `max_compute_workgroups_per_dimension` (65,535
    /// on most). Past it, the product runs in parts as past the bindings
    /// (millions of rows: a batch of 5,000,000 through a linear layer).
    fn grid_fits(&self, engine: &Engine, p: &MatmulParams) -> bool {
        let max = max_grid_dimension(engine);
        self.grid(p).iter().all(|&d| d as usize <= max)
    }

    fn record(
        &self,
        engine: &Engine,
        kernel: &Kernel,
        slices: &[BufferSlice],
        p: &MatmulParams,
    ) -> Result<(), TensorError> {
        let refs: Vec<&BufferSlice> = slices.iter().collect();
        let grid = self.grid(p);
        engine.dispatch(kernel, &refs, bytemuck::bytes_of(p), Workgroups::Grid(grid))?;
        Ok(())
    }

    /// `p` bound to the ranges it touches, or cut in two (or in its K
    /// slices) and each part recorded the same way.
    fn part(&self, engine: &Engine, kernel: &Kernel, p: MatmulParams) -> Result<(), TensorError> {
        if p.group > 1 {
            // The caller sums several entries a slot only where the whole
            // product binds in one dispatch (`fits_whole`).
            return Err(TensorError::NotSupported {
                op: "matmul",
                what: "a product summing several entries a slot cut into parts",
            });
        }
        let (slices, rebased) = self.narrowed(engine, &p);
        if fits(engine, &slices) && self.grid_fits(engine, &p) {
            return self.record(engine, kernel, &slices, &rebased);
        }
        let (bm, bn) = self.block;
        let both = |[first, rest]: [MatmulParams; 2]| {
            self.part(engine, kernel, first)?;
            self.part(engine, kernel, rest)
        };
        if p.batch > 1 {
            return both(halves(
                p,
                p.batch / 2,
                |q| &mut q.batch,
                |q, h| {
                    q.a_off += h * p.a_bs;
                    q.b_off += h * p.b_bs;
                    q.c_off += h * p.splits * p.c_bs;
                },
            ));
        }
        if p.splits > 1 && self.implicit.is_none() {
            // One K slice at a time, each into its own place in the
            // workspace of partial products.
            for s in 0..p.splits {
                let k0 = s * p.k_chunk;
                if k0 >= p.k {
                    break;
                }
                let mut one = p;
                one.splits = 1;
                one.k = p.k_chunk.min(p.k - k0);
                one.a_off += k0 * p.a_cs;
                one.b_off += k0 * p.b_rs;
                one.c_off += s * p.c_bs;
                one.c_bs = p.splits * p.c_bs;
                self.part(engine, kernel, one)?;
            }
            return Ok(());
        }
        // Row blocks need the bias to move with them, and it cannot.
        // Whole blocks while there are several, then single rows (a row
        // of a transposed operand may be a long stretch of memory).
        if p.m > 1 && self.bias.is_none() {
            return both(halves(
                p,
                cut(p.m, bm, 1),
                |q| &mut q.m,
                |q, h| {
                    q.a_off += h * p.a_rs;
                    q.c_off += h * p.c_rs;
                },
            ));
        }
        let (n_step, k_step) = self.steps;
        if p.n > n_step {
            return both(halves(
                p,
                cut(p.n, bn, n_step),
                |q| &mut q.n,
                |q, h| {
                    q.b_off += h * p.b_cs;
                    q.c_off += h * p.c_cs;
                },
            ));
        }
        // K halves, the second adding to what the first wrote.
        if let (Some(k_part), true) = (self.k_part, p.k > k_step) {
            let [first, mut rest] = halves(
                p,
                cut(p.k, 64, k_step),
                |q| &mut q.k,
                |q, h| {
                    q.a_off += h * p.a_cs;
                    q.b_off += h * p.b_rs;
                },
            );
            rest.accumulate = 1;
            self.part(engine, &k_part(p.accumulate != 0, false), first)?;
            return self.part(engine, &k_part(true, false), rest);
        }
        // Nothing left to cut: the dispatch names what does not fit.
        self.record(engine, kernel, &slices, &rebased)
    }

    /// The ranges of A, B and C that `p` touches (the bias whole), and
    /// `p` with its offsets counted from their starts. A range starts on
    /// the device's offset unit and ends on a whole `vec4`, so every
    /// access the kernel makes stays as aligned as before.
    fn narrowed(&self, engine: &Engine, p: &MatmulParams) -> (Vec<BufferSlice>, MatmulParams) {
        let unit = engine.gpu().map_or(16, |g| g.offset_unit());
        let last = |v: u32| v.saturating_sub(1) as u64;
        let a_end = p.a_off as u64
            + last(p.batch) * p.a_bs as u64
            + last(p.m) * p.a_rs as u64
            + last(p.k) * p.a_cs as u64
            + 1;
        let b_end = match self.implicit {
            Some(cv) => {
                p.b_off as u64 + last(p.batch) * p.b_bs as u64 + (cv.c * cv.h * cv.w) as u64
            }
            None => {
                p.b_off as u64
                    + last(p.batch) * p.b_bs as u64
                    + last(p.k) * p.b_rs as u64
                    + last(p.n) * p.b_cs as u64
                    + 1
            }
        };
        let c_end = p.c_off as u64
            + (last(p.batch) * p.splits as u64 + last(p.splits)) * p.c_bs as u64
            + last(p.m) * p.c_rs as u64
            + last(p.n) * p.c_cs as u64
            + 1;
        let mut q = *p;
        let mut slices = Vec::new();
        for (t, (start, end, off)) in self.operands.iter().zip([
            (p.a_off, a_end, &mut q.a_off),
            (p.b_off, b_end, &mut q.b_off),
            (p.c_off, c_end, &mut q.c_off),
        ]) {
            let whole = t.slice();
            let bytes = t.dtype().size_in_bytes() as u64;
            let lo = (start as u64 * bytes) / unit * unit;
            let hi = (end * bytes).next_multiple_of(16).min(whole.size).max(lo);
            *off = start - (lo / bytes) as u32;
            slices.push(BufferSlice {
                buffer: whole.buffer.clone(),
                offset: whole.offset + lo,
                size: hi - lo,
            });
        }
        slices.extend(self.bias.map(|t| t.slice()));
        (slices, q)
    }
}

/// `p` cut in two along one dimension: the first part its first `at`
/// (`len` names the dimension's length), the rest moved past them by
/// `shift`.
fn halves(
    p: MatmulParams,
    at: u32,
    len: fn(&mut MatmulParams) -> &mut u32,
    shift: impl Fn(&mut MatmulParams, u32),
) -> [MatmulParams; 2] {
    let (mut first, mut rest) = (p, p);
    *len(&mut first) = at;
    *len(&mut rest) -= at;
    shift(&mut rest, at);
    [first, rest]
}

/// Where to cut `len` in two: at a whole `block` past half of it while
/// it spans more than one, else at half rounded up to `step`; always
/// inside `1..len`.
fn cut(len: u32, block: usize, step: u32) -> u32 {
    let half = len.div_ceil(2);
    let at = if len as usize > block {
        (half as usize).next_multiple_of(block) as u32
    } else {
        half.next_multiple_of(step)
    };
    at.clamp(1, len - 1)
}

/// Whether a product of `m` rows and `n` columns over `layers` workgroup
/// layers launches in one grid whatever its tile (a tile's block is at
/// least one element): the routes that cannot run in parts (a column bias
/// in the epilogue, several summed entries a slot) are taken only then.
pub(super) fn grid_fits_any_tile(engine: &Engine, m: usize, n: usize, layers: usize) -> bool {
    let max = max_grid_dimension(engine);
    m <= max && n <= max && layers <= max
}

/// The most workgroups a dispatch's grid may have along one dimension
/// (none on a simulated device, which runs no kernel).
fn max_grid_dimension(engine: &Engine) -> usize {
    engine.gpu().map_or(usize::MAX, |g| {
        g.limits.max_compute_workgroups_per_dimension as usize
    })
}

/// Whether one dispatch binds `tensors` whole (no parts needed).
pub(super) fn fits_whole(tensors: &[&Tensor]) -> bool {
    let slices: Vec<BufferSlice> = tensors.iter().map(|t| t.slice()).collect();
    tensors.first().is_none_or(|t| fits(t.engine(), &slices))
}

fn fits(engine: &Engine, slices: &[BufferSlice]) -> bool {
    let refs: Vec<&BufferSlice> = slices.iter().collect();
    engine.gpu().is_none_or(|g| g.fits_one_dispatch(&refs))
}
