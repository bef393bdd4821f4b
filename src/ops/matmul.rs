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
    _pad: u32,
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
    for t in [a, b, &out] {
        super::check_u32(OP, t)?;
    }
    // Row-major [R, C]: element (r, c) at r*C + c; transposed reads swap strides.
    let (a_rs, a_cs) = if transpose_a { (1, ca) } else { (ca, 1) };
    let (b_rs, b_cs) = if transpose_b { (1, cb) } else { (cb, 1) };
    let params = MatmulParams {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        batch: batch as u32,
        a_rs: a_rs as u32,
        a_cs: a_cs as u32,
        b_rs: b_rs as u32,
        b_cs: b_cs as u32,
        a_bs: if ba == 1 && batch > 1 {
            0
        } else {
            (ra * ca) as u32
        },
        b_bs: if bb == 1 && batch > 1 {
            0
        } else {
            (rb * cb) as u32
        },
        c_bs: (m * n) as u32,
        _pad: 0,
    };
    let (kernel, tile) = match kernel {
        MatmulKernel::Tiled => (&TILED, 64),
        MatmulKernel::Naive => (&NAIVE, 16),
    };
    let grid = [
        n.div_ceil(tile) as u32,
        m.div_ceil(tile) as u32,
        batch as u32,
    ];
    a.engine().gpu().dispatch(
        kernel,
        &[&a.slice(), &b.slice(), &out.slice()],
        bytemuck::bytes_of(&params),
        Workgroups::Grid(grid),
    )?;
    Ok(out)
}
