//! Matrix multiply, batched: `[.., M, K] · [.., K, N] → [.., M, N]`, with a
//! tiled kernel (64×64 tiles in workgroup memory, 4×4 outputs per thread) and
//! the naive one-output-per-thread kernel kept as the benchmark baseline.
//! Operands are read through strides, so `transpose_a` / `transpose_b` cost no
//! copy (backward passes need Aᵀ·G and G·Bᵀ).

use crate::device::{Kernel, Workgroups};
use crate::tensor::{DType, Tensor, TensorError};

const TILED: Kernel = Kernel {
    name: "matmul_tiled",
    source: include_str!("../../shaders/matmul_tiled.wgsl"),
    entry: "main",
};
const NAIVE: Kernel = Kernel {
    name: "matmul_naive",
    source: include_str!("../../shaders/matmul_naive.wgsl"),
    entry: "main",
};

/// Which kernel to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    Tiled,
    Naive,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    a_bs: u32,
    b_bs: u32,
    c_bs: u32,
    accumulate: u32,
    a_off: u32,
    b_off: u32,
    c_off: u32,
    _pad: u32,
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
/// A viewed as m×k, B as k×n, C row-major m×n at `c_offset` + b·`c_batch_stride`.
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
}

/// Runs `g` on existing tensors. The caller guarantees the views lie inside
/// the tensors (ops build them from shapes they checked). A long K is split
/// into accumulating dispatches of at most [`super::MAX_LOOP_ITERATIONS`].
pub fn gemm(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    kernel: MatmulKernel,
) -> Result<(), TensorError> {
    const OP: &str = "matmul";
    for t in [a, b, c] {
        t.require_f32(OP)?;
        super::check_u32(OP, t)?;
    }
    let step = super::MAX_LOOP_ITERATIONS;
    for k0 in (0..g.k.max(1)).step_by(step) {
        let mut part = *g;
        part.k = step.min(g.k - k0);
        part.a.offset += k0 * g.a.col_stride;
        part.b.offset += k0 * g.b.row_stride;
        part.accumulate = g.accumulate || k0 > 0;
        gemm_once(&part, a, b, c, kernel)?;
    }
    Ok(())
}

fn gemm_once(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    kernel: MatmulKernel,
) -> Result<(), TensorError> {
    let u = |x: usize| x as u32;
    let params = MatmulParams {
        m: u(g.m),
        n: u(g.n),
        k: u(g.k),
        batch: u(g.batch),
        a_rs: u(g.a.row_stride),
        a_cs: u(g.a.col_stride),
        b_rs: u(g.b.row_stride),
        b_cs: u(g.b.col_stride),
        a_bs: u(g.a.batch_stride),
        b_bs: u(g.b.batch_stride),
        c_bs: u(g.c_batch_stride),
        accumulate: g.accumulate as u32,
        a_off: u(g.a.offset),
        b_off: u(g.b.offset),
        c_off: u(g.c_offset),
        _pad: 0,
    };
    let (kernel, tile) = match kernel {
        MatmulKernel::Tiled => (&TILED, 64),
        MatmulKernel::Naive => (&NAIVE, 16),
    };
    let grid = [
        g.n.div_ceil(tile) as u32,
        g.m.div_ceil(tile) as u32,
        g.batch as u32,
    ];
    a.engine().dispatch(
        kernel,
        &[&a.slice(), &b.slice(), &c.slice()],
        bytemuck::bytes_of(&params),
        Workgroups::Grid(grid),
    )?;
    Ok(())
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
    a.require_f32(OP)?;
    b.require_f32(OP)?;
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
    let out = Tensor::empty(a.engine(), &out_shape, DType::F32, "matmul.out")?;
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
    };
    gemm(&g, a, b, &out, kernel)?;
    Ok(out)
}
