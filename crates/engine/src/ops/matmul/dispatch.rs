//! Recording one product: its parameters as the kernel reads them, its
//! orientation, and the kernel variant its operands' layout allows (vec4
//! accesses, one slice, rows outer), handed to `budget.rs` to bind.

use super::{budget, elem_of, tiles_gpu, Gemm, MatView, TileConfig, Variant, Vec4Io};
use crate::device::compose::Elem;
use crate::device::Kernel;
use crate::tensor::{Tensor, TensorError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MatmulParams {
    pub(crate) m: u32,
    pub(crate) n: u32,
    pub(crate) k: u32,
    pub(crate) batch: u32,
    pub(crate) a_rs: u32,
    pub(crate) a_cs: u32,
    pub(crate) b_rs: u32,
    pub(crate) b_cs: u32,
    pub(crate) a_bs: u32,
    pub(crate) b_bs: u32,
    pub(crate) c_bs: u32,
    pub(crate) accumulate: u32,
    pub(crate) a_off: u32,
    pub(crate) b_off: u32,
    pub(crate) c_off: u32,
    pub(crate) splits: u32,
    pub(crate) k_chunk: u32,
    pub(crate) c_rs: u32,
    pub(crate) c_cs: u32,
    /// Batch entries each slot of C sums (GPU tiles; 1: one entry a slot).
    pub(crate) group: u32,
}

/// A product as the kernel runs it: as given, or as Cᵀ (n×m) = Bᵀ·Aᵀ,
/// where the kernel's A is B read with its strides swapped, its B is A
/// likewise, and its rows are C's columns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Oriented {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) a: MatView,
    pub(crate) b: MatView,
    pub(crate) c_rs: usize,
    pub(crate) c_cs: usize,
}

impl Oriented {
    pub(crate) fn of(g: &Gemm, transposed: bool) -> Oriented {
        if !transposed {
            return Oriented {
                m: g.m,
                n: g.n,
                a: g.a,
                b: g.b,
                c_rs: g.n,
                c_cs: 1,
            };
        }
        let t = |v: MatView| MatView {
            row_stride: v.col_stride,
            col_stride: v.row_stride,
            ..v
        };
        Oriented {
            m: g.n,
            n: g.m,
            a: t(g.b),
            b: t(g.a),
            c_rs: 1,
            c_cs: g.n,
        }
    }
}

impl MatmulParams {
    /// The kernels' uniform for `g` run as `o`, its K in `splits` slices of
    /// `k_chunk`, C at `c_offset` with `c_batch_stride` between entries.
    pub(crate) fn new(
        g: &Gemm,
        o: &Oriented,
        splits: usize,
        k_chunk: usize,
        c_offset: usize,
        c_batch_stride: usize,
        accumulate: bool,
    ) -> MatmulParams {
        let u = |x: usize| x as u32;
        MatmulParams {
            m: u(o.m),
            n: u(o.n),
            k: u(g.k),
            batch: u(g.batch),
            a_rs: u(o.a.row_stride),
            a_cs: u(o.a.col_stride),
            b_rs: u(o.b.row_stride),
            b_cs: u(o.b.col_stride),
            a_bs: u(o.a.batch_stride),
            b_bs: u(o.b.batch_stride),
            c_bs: u(c_batch_stride),
            accumulate: accumulate as u32,
            a_off: u(o.a.offset),
            b_off: u(o.b.offset),
            c_off: u(c_offset),
            splits: u(splits),
            k_chunk: u(k_chunk),
            c_rs: u(o.c_rs),
            c_cs: u(o.c_cs),
            group: 1,
        }
    }
}

/// A bias the product's epilogue adds: one per row of C (a convolution's,
/// per output channel) or one per column (a linear layer's, per output
/// feature: GPU tiles bound whole and unsplit, or tensor cores; C in the
/// operands' type).
#[derive(Clone, Copy)]
pub(crate) enum Bias<'a> {
    Rows(&'a Tensor),
    Cols(&'a Tensor),
}

impl<'a> Bias<'a> {
    pub(crate) fn tensor(self) -> &'a Tensor {
        match self {
            Bias::Rows(t) | Bias::Cols(t) => t,
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn dispatch(
    g: &Gemm,
    [a, b, c]: [&Tensor; 3],
    bias: Option<Bias<'_>>,
    tile: &TileConfig,
    transposed: bool,
    splits: usize,
    k_chunk: usize,
    c_offset: usize,
    c_batch_stride: usize,
    accumulate: bool,
    group: usize,
) -> Result<(), TensorError> {
    let o = Oriented::of(g, transposed);
    let mut params =
        MatmulParams::new(g, &o, splits, k_chunk, c_offset, c_batch_stride, accumulate);
    params.group = group.max(1) as u32;
    if group > 1 && !tile.shared {
        return Err(TensorError::NotSupported {
            op: "matmul",
            what: "summing several batch entries a slot needs a GPU tile",
        });
    }
    let Oriented {
        m: _,
        n,
        a: av,
        b: bv,
        c_rs,
        c_cs,
    } = o;
    let (a, b) = if transposed { (b, a) } else { (a, b) };
    let (bm, bn) = tile.block();
    if tile.shared {
        return dispatch_gpu(g, [a, b, c], bias, tile, &o, params, k_chunk, accumulate);
    }
    let bias = match bias {
        Some(Bias::Cols(_)) => {
            return Err(TensorError::NotSupported {
                op: "matmul",
                what: "a column bias in the product needs a GPU tile",
            })
        }
        b => b.map(Bias::tensor),
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
    let steps = cut_steps(vec4.b || vec4.c, vec4.k, k2, a, c);
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
    record(
        g,
        [a, b, c],
        bias,
        (bm, bn),
        steps,
        &variant,
        accumulate,
        params,
    )
}

/// [`dispatch`] for a GPU tile: the vec4 accesses and staging orders the
/// operands' layout allows (see `shaders/matmul_gpu.wgsl`).
#[allow(clippy::too_many_arguments)]
fn dispatch_gpu(
    g: &Gemm,
    [a, b, c]: [&Tensor; 3],
    bias: Option<Bias<'_>>,
    tile: &TileConfig,
    o: &Oriented,
    params: MatmulParams,
    k_chunk: usize,
    accumulate: bool,
) -> Result<(), TensorError> {
    let (av, bv) = (&o.a, &o.b);
    let (stage_a4, stage_b4) = tiles_gpu::vec_staging(tile);
    let f32s = |t: &Tensor| elem_of(t) == Elem::F32;
    let dense_b = g.implicit_b.is_none();
    // A along K in fours: every K range starts and ends on a multiple of 4
    // (K and the split are), and each row's start is one.
    let vec_a = stage_a4
        && f32s(a)
        && av.col_stride == 1
        && fours(&[g.k, k_chunk])
        && in_fours(av, av.row_stride, a);
    let vec_b = stage_b4
        && f32s(b)
        && dense_b
        && bv.col_stride == 1
        && o.n.is_multiple_of(4)
        && in_fours(bv, bv.row_stride, b);
    let c_bs = params.c_bs as usize;
    let vec_c =
        f32s(c) && o.c_cs == 1 && fours(&[o.n, o.c_rs, params.c_off as usize, c_bs, c.numel()]);
    let b_along_n = match &g.implicit_b {
        // im2col: neighbouring columns are neighbouring output positions.
        Some(cv) => !cv.transposed,
        None => bv.col_stride == 1,
    };
    let variant = |accumulate: bool, _whole_k: bool| {
        tiles_gpu::kernel(
            tile,
            elem_of(a),
            elem_of(c),
            g.implicit_b.as_ref(),
            tiles_gpu::GpuVariant {
                bias_rows: matches!(bias, Some(Bias::Rows(_))),
                bias_cols: matches!(bias, Some(Bias::Cols(_))),
                accumulate,
                vec_a,
                vec_b,
                vec_c,
                a_along_k: av.col_stride == 1,
                b_along_n,
                // Several entries a slot add their slices to running sums.
                one_slice: params.group == 1 && tile.one_slice(k_chunk.min(g.k)),
            },
        )
    };
    let steps = cut_steps(vec_b || vec_c, vec_a, false, a, c);
    record(
        g,
        [a, b, c],
        bias.map(Bias::tensor),
        tile.block(),
        steps,
        &variant,
        accumulate,
        params,
    )
}

/// Whether every index is a multiple of 4: vec4 accesses need each index
/// they form in fours, and the bound array to end on a whole vec4.
fn fours(xs: &[usize]) -> bool {
    xs.iter().all(|x| x.is_multiple_of(4))
}

/// Whether a view can be read (or written) as vec4 along its unit stride:
/// its other stride, offset, batch stride and the whole tensor in fours.
fn in_fours(v: &MatView, other_stride: usize, t: &Tensor) -> bool {
    fours(&[other_stride, v.offset, v.batch_stride, t.numel()])
}

/// What a cut of the product along N and along K must be a multiple of
/// (`budget.rs`): 4 along what vec4 accesses run, 2 where 16-bit words are
/// written in pairs (N), or read in pairs or two K steps taken at a time
/// (`k2`), else 1.
fn cut_steps(vec_cols: bool, vec_k: bool, k2: bool, a: &Tensor, c: &Tensor) -> (u32, u32) {
    let pairs = |on: bool| if on { 2 } else { 1 };
    (
        if vec_cols {
            4
        } else {
            pairs(elem_of(c) != Elem::F32)
        },
        if vec_k {
            4
        } else {
            pairs(k2 || elem_of(a) != Elem::F32)
        },
    )
}

/// Records the product with `variant`'s kernel for the whole of K (and,
/// where K may be cut — no bias in the epilogue, no im2col B — for its
/// parts), in parts where one dispatch cannot bind it.
#[allow(clippy::too_many_arguments)]
fn record(
    g: &Gemm,
    operands: [&Tensor; 3],
    bias: Option<&Tensor>,
    block: (usize, usize),
    steps: (u32, u32),
    variant: &dyn Fn(bool, bool) -> Kernel,
    accumulate: bool,
    params: MatmulParams,
) -> Result<(), TensorError> {
    budget::Product {
        kernel: variant(accumulate, true),
        k_part: (bias.is_none() && g.implicit_b.is_none()).then_some(variant),
        operands,
        bias,
        block,
        steps,
        implicit: g.implicit_b.as_ref(),
    }
    .dispatch(params)
}
