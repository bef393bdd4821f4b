//! The ops the tape knows, each a thin wrapper: run the op's forward, save
//! what its backward needs (exactly what PyTorch saves), record. The saved
//! clones are cheap handles; when the tape is not recording, `record` drops
//! them at once, so `no_grad` keeps nothing alive.

use super::tape::{Tape, Value};
use crate::ops::conv2d::{conv2d as conv2d_fwd, conv2d_backward, Conv2dConfig};
use crate::ops::cross_entropy::{cross_entropy as ce_fwd, cross_entropy_backward};
use crate::ops::linear::{linear as linear_fwd, linear_backward};
use crate::ops::relu::{relu as relu_fwd, relu_backward};
use crate::tensor::{Tensor, TensorError};

/// conv2d; saves the input and the weight.
pub fn conv2d(
    tape: &Tape,
    x: &Value,
    w: &Value,
    b: &Value,
    cfg: Conv2dConfig,
) -> Result<Value, TensorError> {
    let y = conv2d_fwd(x.tensor(), w.tensor(), Some(b.tensor()), cfg)?;
    let (xs, ws) = (x.tensor().clone(), w.tensor().clone());
    let need_dx = x.requires_grad();
    Ok(tape.record(
        y,
        &[x, w, b],
        Box::new(move |g| {
            let (dx, dw, db) = conv2d_backward(&xs, &ws, g, cfg, need_dx)?;
            Ok(vec![dx, Some(dw), Some(db)])
        }),
    ))
}

/// ReLU; saves its output (its backward masks by it).
pub fn relu(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let y = relu_fwd(x.tensor())?;
    let saved = y.clone();
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(relu_backward(&saved, g)?)])),
    ))
}

/// A view with another shape; allocates nothing and saves nothing.
pub fn reshape(tape: &Tape, x: &Value, shape: &[usize]) -> Result<Value, TensorError> {
    let y = x.tensor().reshape(shape)?;
    let original = x.tensor().shape().to_vec();
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(g.reshape(&original)?)])),
    ))
}

/// Flattens all but the first dimension.
pub fn flatten(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let s = x.tensor().shape();
    let rest: usize = s[1..].iter().product();
    reshape(tape, x, &[s[0], rest])
}

/// linear; saves the input and the weight.
pub fn linear(tape: &Tape, x: &Value, w: &Value, b: &Value) -> Result<Value, TensorError> {
    let y = linear_fwd(x.tensor(), w.tensor(), Some(b.tensor()))?;
    let (xs, ws) = (x.tensor().clone(), w.tensor().clone());
    let need_dx = x.requires_grad();
    Ok(tape.record(
        y,
        &[x, w, b],
        Box::new(move |g| {
            let (dx, dw, db) = linear_backward(&xs, &ws, g, need_dx)?;
            Ok(vec![dx, Some(dw), Some(db)])
        }),
    ))
}

/// Mean cross-entropy against integer labels; saves the logits and labels.
pub fn cross_entropy(tape: &Tape, logits: &Value, labels: &Tensor) -> Result<Value, TensorError> {
    let loss = ce_fwd(logits.tensor(), labels)?;
    let (l, y) = (logits.tensor().clone(), labels.clone());
    Ok(tape.record(
        loss,
        &[logits],
        Box::new(move |g| Ok(vec![Some(cross_entropy_backward(&l, &y, g)?)])),
    ))
}
