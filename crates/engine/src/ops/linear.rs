//! `linear(x, W, b) = x · Wᵀ + b` in PyTorch's layout (W `[out, in]`, b
//! `[out]`), and its backward: `dx = dy · W`, `dW = dyᵀ · x`, `db = Σ_rows dy`.

use super::bias::{check_bias, sum_channels};
use super::matmul::{gemm, gemm_col_bias, Gemm, MatView, MatmulKernel};
use crate::tensor::{Tensor, TensorError};

fn dims(x: &Tensor, w: &Tensor) -> Result<(usize, usize, usize), TensorError> {
    super::same_dtype("linear", x, w)?;
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() != 2 || ws.len() != 2 || xs[1] != ws[1] {
        return Err(TensorError::ShapeMismatch {
            op: "linear",
            lhs: xs.to_vec(),
            rhs: ws.to_vec(),
        });
    }
    Ok((xs[0], xs[1], ws[0]))
}

/// One product (batch 1) writing a fresh C: the layers' products.
pub(super) fn plain(m: usize, n: usize, k: usize, a: MatView, b: MatView) -> Gemm {
    Gemm {
        m,
        n,
        k,
        batch: 1,
        a,
        b,
        c_offset: 0,
        c_batch_stride: 0,
        accumulate: false,
        reduce_batch: false,
        implicit_b: None,
    }
}

/// x `[N, in]` → `[N, out]`.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, TensorError> {
    let (n, i, o) = dims(x, w)?;
    let y = Tensor::empty(x.engine(), &[n, o], x.dtype(), "linear.out")?;
    let g = plain(
        n,
        o,
        i,
        MatView::dense(0, n, i, false),
        MatView::dense(0, o, i, true),
    );
    match b {
        Some(b) => {
            // The bias pass's own checks, before any work.
            check_bias(&y, b, o)?;
            gemm_col_bias(&g, x, w, &y, b, MatmulKernel::Tiled)?
        }
        None => gemm(&g, x, w, &y, MatmulKernel::Tiled)?,
    }
    Ok(y)
}

/// `(dx, dW, db)` for upstream gradient `dy` `[N, out]`; `dx` only when
/// `need_dx`, `db` only when the layer has a bias (`need_db`).
pub fn linear_backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    need_dx: bool,
    need_db: bool,
) -> Result<(Option<Tensor>, Tensor, Option<Tensor>), TensorError> {
    let (n, i, o) = dims(x, w)?;
    super::same_dtype("linear backward", x, dy)?;
    if dy.shape() != [n, o] {
        return Err(TensorError::ShapeMismatch {
            op: "linear backward",
            lhs: dy.shape().to_vec(),
            rhs: vec![n, o],
        });
    }
    let dx = if need_dx {
        let dx = Tensor::empty(x.engine(), &[n, i], dy.dtype(), "linear.grad_input")?;
        gemm(
            &plain(
                n,
                i,
                o,
                MatView::dense(0, n, o, false),
                MatView::dense(0, o, i, false),
            ),
            dy,
            w,
            &dx,
            MatmulKernel::Tiled,
        )?;
        Some(dx)
    } else {
        None
    };
    let dw = Tensor::empty(x.engine(), &[o, i], w.dtype(), "linear.grad_weight")?;
    gemm(
        &plain(
            o,
            i,
            n,
            MatView::dense(0, n, o, true),
            MatView::dense(0, n, i, false),
        ),
        dy,
        x,
        &dw,
        MatmulKernel::Tiled,
    )?;
    let db = if need_db {
        Some(sum_channels(dy, o, 1, "linear.grad_bias")?)
    } else {
        None
    };
    Ok((dx, dw, db))
}
