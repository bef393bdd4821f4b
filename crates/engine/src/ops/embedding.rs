//! GPT's input embedding: token rows gathered from a `[V, D]` table, and
//! learned positions added with a broadcast over the batch. Backward of the
//! gather is a deterministic scatter-add (a thread per table entry over the
//! tokens, no float atomics); the table's gradient is dense `[V, D]`, as
//! PyTorch's (non-sparse) embedding backward makes it. Indices are f32
//! integers, like the cross-entropy labels.

use super::{check_u32, launch, MAX_LOOP_ITERATIONS};
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/embedding.wgsl");
const GATHER: Kernel = Kernel::fixed("embedding_gather", SOURCE, "gather");
const SCATTER: Kernel = Kernel::fixed("embedding_backward", SOURCE, "scatter");
const ADD_POS: Kernel = Kernel::fixed("position_add", SOURCE, "add_pos");
const POS_BACKWARD: Kernel = Kernel::fixed("position_backward", SOURCE, "pos_backward");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    dim: u32,
    count: u32,
    t0: u32,
    nt: u32,
    accumulate: u32,
    seq: u32,
    _p: u32,
}

fn table_dims(op: &'static str, table: &Tensor) -> Result<(usize, usize), TensorError> {
    table.require_f32(op)?;
    check_u32(op, table)?;
    match table.shape() {
        [v, d] if *v > 0 && *d > 0 => Ok((*v, *d)),
        s => Err(TensorError::WrongShape {
            op,
            want: "a table [rows, dim] with both > 0",
            sizes: Vec::new(),
            got: s.to_vec(),
        }),
    }
}

/// `table[idx]`: idx `[..]` of f32 integers in `0..V` → `[.., D]`.
pub fn embedding(table: &Tensor, idx: &Tensor) -> Result<Tensor, TensorError> {
    let (v, d) = table_dims("embedding", table)?;
    idx.require_f32("embedding (indices)")?;
    let mut shape = idx.shape().to_vec();
    shape.push(d);
    let out = Tensor::empty(table.engine(), &shape, DType::F32, "embedding.out")?;
    check_u32("embedding", &out)?;
    let p = Params {
        rows: v as u32,
        dim: d as u32,
        count: idx.numel() as u32,
        t0: 0,
        nt: 0,
        accumulate: 0,
        seq: 0,
        _p: 0,
    };
    launch(
        table,
        &GATHER,
        &[&table.slice(), &idx.slice(), &out.slice()],
        bytemuck::bytes_of(&p),
        out.numel(),
    )?;
    Ok(out)
}

/// The table's gradient `[V, D]` from the saved indices and the upstream
/// gradient `g` `[.., D]`.
pub fn embedding_backward(idx: &Tensor, g: &Tensor, rows: usize) -> Result<Tensor, TensorError> {
    g.require_f32("embedding backward")?;
    let d = *g.shape().last().unwrap_or(&0);
    if d == 0 || rows == 0 || g.numel() != idx.numel() * d {
        return Err(TensorError::ShapeMismatch {
            op: "embedding backward",
            lhs: g.shape().to_vec(),
            rhs: idx.shape().to_vec(),
        });
    }
    let dt = Tensor::empty(g.engine(), &[rows, d], DType::F32, "embedding.grad_weight")?;
    check_u32("embedding backward", &dt)?;
    let count = idx.numel();
    let mut t0 = 0;
    while t0 < count || t0 == 0 {
        let nt = MAX_LOOP_ITERATIONS.min(count - t0);
        let p = Params {
            rows: rows as u32,
            dim: d as u32,
            count: count as u32,
            t0: t0 as u32,
            nt: nt as u32,
            accumulate: (t0 > 0) as u32,
            seq: 0,
            _p: 0,
        };
        launch(
            g,
            &SCATTER,
            &[&g.slice(), &idx.slice(), &dt.slice()],
            bytemuck::bytes_of(&p),
            rows * d,
        )?;
        t0 += nt.max(1);
    }
    Ok(dt)
}

fn pos_dims(x: &Tensor, pos: &Tensor) -> Result<(usize, usize, usize, usize), TensorError> {
    let (p, d) = table_dims("position add", pos)?;
    x.require_f32("position add")?;
    match x.shape() {
        [n, s, xd] if *xd == d && *s <= p => Ok((*n, *s, d, p)),
        s => Err(TensorError::WrongShape {
            op: "position add",
            want: "x [N, S, D] with S at most the table's P positions",
            sizes: vec![("D", d), ("P", p)],
            got: s.to_vec(),
        }),
    }
}

/// `x + pos[0..S]`, broadcast over the batch: x `[N, S, D]`, pos `[P, D]`.
pub fn add_positions(x: &Tensor, pos: &Tensor) -> Result<Tensor, TensorError> {
    let (n, s, d, p) = pos_dims(x, pos)?;
    check_u32("position add", x)?;
    let out = Tensor::empty(x.engine(), x.shape(), DType::F32, "position_add.out")?;
    let prm = Params {
        rows: p as u32,
        dim: d as u32,
        count: (n * s) as u32,
        t0: 0,
        nt: 0,
        accumulate: 0,
        seq: s as u32,
        _p: 0,
    };
    launch(
        x,
        &ADD_POS,
        &[&x.slice(), &pos.slice(), &out.slice()],
        bytemuck::bytes_of(&prm),
        out.numel(),
    )?;
    Ok(out)
}

/// The position table's gradient `[P, D]` (rows past S are zero).
pub fn add_positions_backward(g: &Tensor, pos: &Tensor) -> Result<Tensor, TensorError> {
    let (n, s, d, p) = pos_dims(g, pos)?;
    let dp = Tensor::empty(g.engine(), &[p, d], DType::F32, "position.grad_weight")?;
    let mut n0 = 0;
    while n0 < n || n0 == 0 {
        let nb = MAX_LOOP_ITERATIONS.min(n - n0);
        let prm = Params {
            rows: p as u32,
            dim: d as u32,
            count: (n * s) as u32,
            t0: n0 as u32,
            nt: nb as u32,
            accumulate: (n0 > 0) as u32,
            seq: s as u32,
            _p: 0,
        };
        launch(
            g,
            &POS_BACKWARD,
            &[&g.slice(), &pos.slice(), &dp.slice()],
            bytemuck::bytes_of(&prm),
            p * d,
        )?;
        n0 += nb.max(1);
    }
    Ok(dp)
}
