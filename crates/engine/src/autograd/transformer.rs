//! The tape's transformer ops (GPT): embedding, learned positions, LayerNorm,
//! GELU, the head split and merge, and the causal softmax. Each saves what
//! PyTorch's autograd saves for the same op in f32, so the saved-for-backward
//! bytes of a block match PyTorch's (tests/gpt_saved.rs checks it against
//! `torch.autograd.graph.saved_tensors_hooks`). The kernels are f32; under
//! autocast these ops take f32 inputs (LayerNorm and softmax are on CUDA
//! autocast's f32 list; GELU and the copies are widened here too).

use super::functions::{autocast_f32, note, op_scope, save};
use super::tape::{Tape, Value};
use crate::ops::embedding::{
    add_positions as add_pos_fwd, add_positions_backward, embedding as embedding_fwd,
    embedding_backward,
};
use crate::ops::gelu::{gelu as gelu_fwd, gelu_backward};
use crate::ops::layernorm::{layernorm as layernorm_fwd, layernorm_backward};
use crate::ops::softmax::{softmax_backward, softmax_causal as causal_fwd};
use crate::ops::swap_axes::swap_axes_12;
use crate::tensor::{Tensor, TensorError};

/// `table[idx]` (`nn.Embedding`); saves the indices (PyTorch saves them as
/// int64, 8 bytes each; vramlab's are f32, 4 bytes).
pub fn embedding(tape: &Tape, table: &Value, idx: &Tensor) -> Result<Value, TensorError> {
    let scope = op_scope(table, "embedding");
    let y = embedding_fwd(table.tensor(), idx)?;
    note(&scope, &y);
    let saved = save(tape, idx);
    let rows = table.tensor().shape()[0];
    Ok(tape.record(
        y,
        &[table],
        Box::new(move |g| Ok(vec![Some(embedding_backward(&saved, g, rows)?)])),
    ))
}

/// `x + pos[0..S]` over x `[N, S, D]` (GPT's learned positions: PyTorch's
/// `wpe(arange(S))` then a broadcast add); saves nothing.
pub fn add_positions(tape: &Tape, x: &Value, pos: &Value) -> Result<Value, TensorError> {
    let y = add_pos_fwd(x.tensor(), pos.tensor())?;
    let table = pos.tensor().clone();
    Ok(tape.record(
        y,
        &[x, pos],
        Box::new(move |g| {
            let dp = add_positions_backward(g, &table)?;
            Ok(vec![Some(g.clone()), Some(dp)])
        }),
    ))
}

/// LayerNorm over the last axis; saves the input, the weight and bias
/// (parameters: no new memory) and the per-row mean and rstd.
pub fn layernorm(
    tape: &Tape,
    x: &Value,
    w: &Value,
    b: &Value,
    eps: f32,
) -> Result<Value, TensorError> {
    let scope = op_scope(x, "layernorm");
    let x = &autocast_f32(tape, x)?;
    let out = layernorm_fwd(x.tensor(), w.tensor(), b.tensor(), eps)?;
    note(&scope, &out.y);
    let (xs, ws) = (save(tape, x.tensor()), save(tape, w.tensor()));
    let (mean, rstd) = (save(tape, &out.mean), save(tape, &out.rstd));
    drop(out.mean);
    drop(out.rstd);
    Ok(tape.record(
        out.y,
        &[x, w, b],
        Box::new(move |g| {
            let (dx, dw, db) = layernorm_backward(&xs, &ws, &mean, &rstd, g)?;
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }),
    ))
}

/// GELU (tanh approximation); saves its input.
pub fn gelu(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let scope = op_scope(x, "gelu");
    let x = &autocast_f32(tape, x)?;
    let y = gelu_fwd(x.tensor())?;
    note(&scope, &y);
    let saved = save(tape, x.tensor());
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(gelu_backward(&saved, g)?)])),
    ))
}

/// `x.transpose(1, 2).contiguous()` of a 4-D x (`[N, S, H, hd] ↔ [N, H, S,
/// hd]`); saves nothing (its backward is the same exchange).
pub fn swap_axes(tape: &Tape, x: &Value, label: &'static str) -> Result<Value, TensorError> {
    let x = &autocast_f32(tape, x)?;
    let y = swap_axes_12(x.tensor(), label)?;
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(swap_axes_12(g, "swap_axes.grad_input")?)])),
    ))
}

/// Causal `softmax(scale · x)` over `[.., S, S]` scores; saves its output
/// (PyTorch saves the same: softmax's output, and nothing for a mask added
/// as a constant -inf bias).
pub fn softmax_causal(tape: &Tape, x: &Value, scale: f32) -> Result<Value, TensorError> {
    let scope = op_scope(x, "softmax");
    let x = &autocast_f32(tape, x)?;
    let y = causal_fwd(x.tensor(), scale)?;
    note(&scope, &y);
    let saved = save(tape, &y);
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(softmax_backward(&saved, g, scale)?)])),
    ))
}

/// Dropout with probability `p` in training (identity in eval or at p = 0,
/// saving nothing, as PyTorch); saves the one-byte-per-element mask.
pub fn dropout(tape: &Tape, x: &Value, p: f32, seed: u64) -> Result<Value, TensorError> {
    if p == 0.0 || !tape.training() {
        return Ok(x.clone());
    }
    let scope = op_scope(x, "dropout");
    let x = &autocast_f32(tape, x)?;
    let (y, mask) = crate::ops::dropout::dropout(x.tensor(), p, seed)?;
    note(&scope, &y);
    let mask = save(tape, &mask);
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| {
            Ok(vec![Some(crate::ops::dropout::dropout_backward(
                g, &mask, p,
            )?)])
        }),
    ))
}
