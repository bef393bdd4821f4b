//! PyTorch 2.15's chunked `F.linear_cross_entropy(h, W, y,
//! options=LinearCrossEntropyOptions())`: the head's product and the
//! cross-entropy over a chunk of rows at a time, so the `[N, V]` logits never
//! exist, with every gradient made in the forward pass (backward only scales
//! them by the upstream gradient). Follows
//! `torch/nn/modules/linear_cross_entropy.py`'s
//! `_linear_cross_entropy_batch_chunked_accumulator` on its f32, class-index,
//! mean-reduction, bias-free, `compact` path (what CUDA runs for a GPT's tied
//! head, also under autocast: the op is on no autocast list and its inputs
//! are f32), allocating what it allocates, in its order. Left out: its
//! N-sized index tensors (`target == ignore_index`, the corrected targets,
//! the mask; 10 bytes a row, small-pool blocks) and its 4-byte scalars,
//! since vramlab's labels never hold `ignore_index`.

use super::linear::plain;
use super::matmul::{gemm, Gemm, MatView, MatmulKernel};
use super::{check_u32, fill, launch, launch_flat, MAX_LOOP_ITERATIONS};
use crate::device::{Kernel, Part, Workgroups};
use crate::tensor::{DType, Tensor, TensorError};

const OP: &str = "linear_cross_entropy";

const SHIFT: Kernel = Kernel::fixed(
    "lce_shift",
    include_str!("../../../../shaders/lce_shift.wgsl"),
    "main",
);
const SOFTMAX: Kernel = Kernel::fixed(
    "lce_softmax",
    include_str!("../../../../shaders/lce_softmax.wgsl"),
    "main",
);
const DOT: Kernel = Kernel::fixed(
    "lce_dot",
    include_str!("../../../../shaders/lce_dot.wgsl"),
    "main",
);
const ROWS: Kernel = Kernel::fixed(
    "lce_rows",
    include_str!("../../../../shaders/lce_rows.wgsl"),
    "main",
);
const INDEX_ADD: Kernel = Kernel::fixed(
    "lce_index_add",
    include_str!("../../../../shaders/lce_index_add.wgsl"),
    "main",
);
const SCALE_BY: Kernel = Kernel::fixed(
    "scale_by",
    include_str!("../../../../shaders/scale_by.wgsl"),
    "main",
);

/// The most rows one chunk may have: the loss kernel's 256 invocations each
/// walk a stride of the chunk's rows under the loop limit.
pub const MAX_CHUNK_ROWS: usize = 256 * MAX_LOOP_ITERATIONS;

/// The rows of each chunk: `rows` when given (at most `n`), else PyTorch's
/// `chunking_method="auto"` under the `compact` policy
/// (`LinearCrossEntropyOptions._compute_batch_chunk_size` and `_adjust`):
/// the power of two at or above `n / ceil(v / d)`, so a chunk's logits are
/// about the size of the input, capped at the largest power of two not above
/// `n·v / (4·d)`, and at `n`.
pub fn chunk_rows(n: usize, d: usize, v: usize, rows: Option<usize>) -> usize {
    let chunk = match rows {
        Some(r) => r.min(n),
        None => {
            let per = v.div_ceil(d.max(1)).max(1);
            let target = n.div_ceil(per).max(1);
            let aspect = target.next_power_of_two().min(n);
            let cap = n.saturating_mul(v) / (4 * d.max(1));
            let cap = if cap >= 1 { 1 << cap.ilog2() } else { 1 };
            aspect.min(cap).min(MAX_CHUNK_ROWS)
        }
    };
    chunk.max(1)
}

/// What the forward pass leaves: the mean loss (`[1]`) and, where asked,
/// the gradients of `h` and `W` for a loss gradient of 1.
pub struct Chunked {
    pub loss: Tensor,
    pub grad_input: Option<Tensor>,
    pub grad_weight: Option<Tensor>,
    /// Rows per chunk.
    pub rows: usize,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RowParams {
    rows: u32,
    classes: u32,
    start: u32,
    _p: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct DotParams {
    rows: u32,
    start: u32,
    sign: f32,
    _p: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CopyParams {
    rows: u32,
    dim: u32,
    start: u32,
    src_row: u32,
    dst_off: u32,
    gather: u32,
    scale: u32,
    classes: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct IndexAddParams {
    dim: u32,
    start: u32,
    b0: u32,
    nb: u32,
    classes: u32,
    _p: [u32; 3],
}

fn check(h: &Tensor, w: &Tensor, labels: &Tensor) -> Result<(usize, usize, usize), TensorError> {
    let (hs, ws) = (h.shape(), w.shape());
    if hs.len() != 2 || ws.len() != 2 || hs[1] != ws[1] || labels.shape() != [hs[0]] {
        return Err(TensorError::WrongShapes {
            op: OP,
            want: "the head's input [N, D], its weight [V, D] and N labels",
            got: vec![hs.to_vec(), ws.to_vec(), labels.shape().to_vec()],
        });
    }
    for t in [h, w, labels] {
        if t.dtype() != DType::F32 {
            return Err(TensorError::WrongDType {
                op: OP,
                want: DType::F32,
                got: t.dtype(),
                why: "its inputs are f32 under autocast too",
            });
        }
        check_u32(OP, t)?;
    }
    if ws[0] == 0 || hs[1] == 0 {
        return Err(TensorError::WrongShape {
            op: OP,
            want: "a weight W [V, D] with at least one class and one feature",
            sizes: Vec::new(),
            got: ws.to_vec(),
        });
    }
    // A row's 256 invocations each walk a stride of the classes.
    if ws[0] > MAX_CHUNK_ROWS {
        return Err(TensorError::OutOfRange {
            op: OP,
            what: "the number of classes (its row kernels walk them)",
            value: ws[0],
            min: 1,
            max: MAX_CHUNK_ROWS,
            hint: "; use --loss fused or cross-entropy",
        });
    }
    Ok((hs[0], hs[1], ws[0]))
}

/// The forward pass over chunks of `rows` rows (see [`chunk_rows`]), making
/// `h`'s gradient when `need_input` and `W`'s when `need_weight` (PyTorch's
/// `compute_input_grad`, `compute_linear_weight_grad`).
pub fn forward(
    h: &Tensor,
    w: &Tensor,
    labels: &Tensor,
    rows: usize,
    need_input: bool,
    need_weight: bool,
) -> Result<Chunked, TensorError> {
    let (n, d, v) = check(h, w, labels)?;
    if rows == 0 || rows > MAX_CHUNK_ROWS {
        return Err(TensorError::OutOfRange {
            op: OP,
            what: "the rows of a chunk",
            value: rows,
            min: 1,
            max: MAX_CHUNK_ROWS,
            hint: "",
        });
    }
    let b = rows.min(n.max(1));
    let e = h.engine();
    // _ChunkContext.build: the chunk's logits, `tmp`, the zero loss; then
    // the loop's grad_input (empty) and grad_linear_weight (zeros).
    let logits = Tensor::empty(e, &[b, v], DType::F32, "linear_cross_entropy.logits")?;
    check_u32(OP, &logits)?;
    let tmp = Tensor::empty(e, &[b], DType::F32, "linear_cross_entropy.tmp")?;
    let loss = fill::zeros(e, &[1], "loss")?;
    let grad_input = need_input
        .then(|| Tensor::empty(e, &[n, d], DType::F32, "linear_cross_entropy.grad_input"))
        .transpose()?;
    let grad_weight = need_weight
        .then(|| fill::zeros(e, &[v, d], "linear_cross_entropy.grad_weight"))
        .transpose()?;
    // neg_weight_target: −1/N a row (the mean over rows none of which is ignored).
    let weight = fill::full(
        e,
        &[n],
        -1.0 / n.max(1) as f32,
        "linear_cross_entropy.weight",
    )?;
    let mut denom: Option<Tensor> = None;
    let mut scaled: Option<Tensor> = None;
    let mut start = 0;
    while start < n {
        let rows = b.min(n - start);
        let rp = RowParams {
            rows: rows as u32,
            classes: v as u32,
            start: start as u32,
            _p: 0,
        };
        // logits = h[chunk] · Wᵀ
        let g = plain(
            rows,
            v,
            d,
            MatView::dense(start * d, rows, d, false),
            MatView::dense(0, v, d, true),
        );
        gemm(&g, h, w, &logits, MatmulKernel::Tiled)?;
        // Shift by the row max; the loss gains Σ w·(picked logit).
        let picked = Tensor::empty(e, &[rows], DType::F32, "linear_cross_entropy.picked")?;
        e.dispatch(
            &SHIFT,
            &[
                &logits.slice(),
                &labels.slice(),
                &tmp.slice(),
                &picked.slice(),
            ],
            bytemuck::bytes_of(&rp),
            Workgroups::Linear(rows as u64),
        )?;
        dot(&weight, &picked, &loss, rows, start, 1.0)?;
        drop(picked);
        // softmax_denom = Σ exp (a new tensor each chunk, the last one's
        // freed once this one exists); logits become the gradient's rows.
        let den = Tensor::empty(e, &[rows], DType::F32, "linear_cross_entropy.softmax_denom")?;
        denom = Some(den.clone());
        e.dispatch(
            &SOFTMAX,
            &[&logits.slice(), &weight.slice(), &tmp.slice(), &den.slice()],
            bytemuck::bytes_of(&rp),
            Workgroups::Linear(rows as u64),
        )?;
        dot(&weight, &den, &loss, rows, start, -1.0)?;
        drop(den);
        if let Some(gi) = &grad_input {
            // grad_input[chunk] = W[labels]·w (index_select, then mul.out),
            // then += g · W.
            let selected = Tensor::empty(
                e,
                &[rows, d],
                DType::F32,
                "linear_cross_entropy.index_select",
            )?;
            copy_rows(
                w, labels, &weight, &selected, rows, d, v, start, true, 0, false, 0,
            )?;
            copy_rows(
                &selected,
                labels,
                &weight,
                gi,
                rows,
                d,
                v,
                start,
                false,
                0,
                true,
                start * d,
            )?;
            drop(selected);
            let g = Gemm {
                c_offset: start * d,
                accumulate: true,
                ..plain(
                    rows,
                    d,
                    v,
                    MatView::dense(0, rows, v, false),
                    MatView::dense(0, v, d, false),
                )
            };
            gemm(&g, &logits, w, gi, MatmulKernel::Tiled)?;
        }
        if let Some(gw) = &grad_weight {
            // grad_W += gᵀ · h[chunk], then += h[chunk]·w at the label rows
            // (index_add_), from h·w written into the logits' buffer where
            // it fits (V ≥ D, PyTorch's `ctx.mul` out=), else into a new
            // tensor that lives until the next chunk's replaces it.
            let g = Gemm {
                c_offset: 0,
                accumulate: true,
                ..plain(
                    v,
                    d,
                    rows,
                    MatView::dense(0, rows, v, true),
                    MatView::dense(start * d, rows, d, false),
                )
            };
            gemm(&g, &logits, h, gw, MatmulKernel::Tiled)?;
            let hw = if v >= d {
                logits.clone()
            } else {
                let t = Tensor::empty(e, &[rows, d], DType::F32, "linear_cross_entropy.mul")?;
                scaled = Some(t.clone());
                t
            };
            copy_rows(
                h, labels, &weight, &hw, rows, d, v, start, false, start, true, 0,
            )?;
            index_add(gw, labels, &hw, rows, d, v, start)?;
        }
        start += rows;
    }
    drop((denom, scaled, weight, tmp, logits));
    Ok(Chunked {
        loss,
        grad_input,
        grad_weight,
        rows: b,
    })
}

fn dot(
    weight: &Tensor,
    v: &Tensor,
    out: &Tensor,
    rows: usize,
    start: usize,
    sign: f32,
) -> Result<(), TensorError> {
    let p = DotParams {
        rows: rows as u32,
        start: start as u32,
        sign,
        _p: 0,
    };
    weight.engine().dispatch(
        &DOT,
        &[&weight.slice(), &v.slice(), &out.slice()],
        bytemuck::bytes_of(&p),
        Workgroups::Linear(1),
    )?;
    Ok(())
}

/// `dst[dst_off + b·dim + d] = src[row(b)·dim + d] (· weight[start + b])`
/// for the chunk's `rows` rows; row(b) is the label of row start + b when
/// `gather`, else `src_row + b`.
#[allow(clippy::too_many_arguments)]
fn copy_rows(
    src: &Tensor,
    labels: &Tensor,
    weight: &Tensor,
    dst: &Tensor,
    rows: usize,
    dim: usize,
    classes: usize,
    start: usize,
    gather: bool,
    src_row: usize,
    scale: bool,
    dst_off: usize,
) -> Result<(), TensorError> {
    let p = CopyParams {
        rows: rows as u32,
        dim: dim as u32,
        start: start as u32,
        src_row: src_row as u32,
        dst_off: dst_off as u32,
        gather: gather as u32,
        scale: scale as u32,
        classes: classes as u32,
    };
    launch(
        dst,
        &ROWS,
        &[&src.slice(), &labels.slice(), &weight.slice(), &dst.slice()],
        bytemuck::bytes_of(&p),
        rows * dim,
    )
}

/// `gw.index_add_(0, labels[start..start+rows], src)`, the rows in runs
/// under the loop limit.
fn index_add(
    gw: &Tensor,
    labels: &Tensor,
    src: &Tensor,
    rows: usize,
    dim: usize,
    classes: usize,
    start: usize,
) -> Result<(), TensorError> {
    let mut b0 = 0;
    while b0 < rows {
        let nb = MAX_LOOP_ITERATIONS.min(rows - b0);
        let p = IndexAddParams {
            dim: dim as u32,
            start: start as u32,
            b0: b0 as u32,
            nb: nb as u32,
            classes: classes as u32,
            _p: [0; 3],
        };
        launch(
            gw,
            &INDEX_ADD,
            &[&gw.slice(), &labels.slice(), &src.slice()],
            bytemuck::bytes_of(&p),
            dim,
        )?;
        b0 += nb;
    }
    Ok(())
}

/// `t.mul_(s)` for a one-element `s` (the chunked backward's scaling of the
/// precomputed gradients by the loss's gradient).
pub fn scale_by(t: &Tensor, s: &Tensor) -> Result<(), TensorError> {
    t.require_f32("scale_by")?;
    s.require_f32("scale_by")?;
    check_u32("scale_by", t)?;
    if s.numel() != 1 {
        return Err(TensorError::WrongShape {
            op: "scale_by",
            want: "a scale of one value",
            sizes: Vec::new(),
            got: s.shape().to_vec(),
        });
    }
    let n = t.numel();
    let params = [n as u32, 0, 0, 0];
    launch_flat(
        t,
        &SCALE_BY,
        &[(&t.slice(), Part::Elements(4)), (&s.slice(), Part::Whole)],
        bytemuck::cast_slice(&params),
        n,
        1,
    )
}

#[cfg(test)]
mod tests {
    use super::chunk_rows;

    #[test]
    fn chunk_rows_follows_pytorchs_auto_heuristic() {
        // gpt2 at 8 × 512: ceil(50257 / 768) = 66, 4096 / 66 → 63 → 64.
        assert_eq!(chunk_rows(4096, 768, 50257, None), 64);
        // gpt2-xl at 1 × 1024: ceil(50257 / 1600) = 32, 1024 / 32 = 32.
        assert_eq!(chunk_rows(1024, 1600, 50257, None), 32);
        // A head narrower than its input: one chunk by the aspect ratio,
        // capped at N·V/(4·D) = 16·96/1024 = 1.5 → 1.
        assert_eq!(chunk_rows(16, 256, 96, None), 1);
        // 128 rows, D 64, V 1000: ceil(1000/64) = 16, 128/16 = 8.
        assert_eq!(chunk_rows(128, 64, 1000, None), 8);
        assert_eq!(chunk_rows(10, 8, 100, Some(64)), 10);
        assert_eq!(chunk_rows(10, 8, 100, Some(3)), 3);
        assert_eq!(chunk_rows(0, 8, 100, None), 1);
    }
}
