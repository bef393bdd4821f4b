//! The tape's ResNet ops: BatchNorm (train and eval) and max pooling. Each
//! saves what PyTorch's autograd saves for it (BatchNorm: the input, the
//! weight, the batch mean and 1/σ; max pooling: the input and the indices),
//! so saved-for-backward bytes per stage compare with PyTorch's
//! (tests/resnet_saved.rs). The kernels are f32; under autocast the inputs
//! are widened.

use super::functions::{autocast_f32, note, op_scope, save};
use super::tape::{Tape, Value};
use crate::ops::batchnorm::{batchnorm as bn_fwd, batchnorm_backward};
use crate::ops::maxpool::{max_pool2d as pool_fwd, max_pool2d_backward, PoolConfig};
use crate::tensor::{Tensor, TensorError};

/// `batch_norm` over x `[N, C, ..]`: batch statistics (running ones
/// updated) when the tape is in training mode, running ones in eval.
pub fn batchnorm(
    tape: &Tape,
    x: &Value,
    w: &Value,
    b: &Value,
    running_mean: &Tensor,
    running_var: &Tensor,
) -> Result<Value, TensorError> {
    let scope = op_scope(x, "batchnorm");
    let x = &autocast_f32(tape, x)?;
    let train = tape.training();
    let out = bn_fwd(
        x.tensor(),
        w.tensor(),
        b.tensor(),
        running_mean,
        running_var,
        train,
    )?;
    note(&scope, &out.y);
    let (xs, ws, stats) = (
        save(tape, x.tensor()),
        save(tape, w.tensor()),
        save(tape, &out.stats),
    );
    drop(out.stats);
    let need_dx = x.requires_grad();
    Ok(tape.record(
        out.y,
        &[x, w, b],
        Box::new(move |g| {
            let (dx, dw, db) = batchnorm_backward(&xs, &ws, &stats, g, train, need_dx)?;
            Ok(vec![dx, Some(dw), Some(db)])
        }),
    ))
}

/// `max_pool2d`; saves its input and the index of each maximum.
pub fn max_pool2d(tape: &Tape, x: &Value, cfg: PoolConfig) -> Result<Value, TensorError> {
    let scope = op_scope(x, "max_pool2d");
    let x = &autocast_f32(tape, x)?;
    let (y, idx) = pool_fwd(x.tensor(), cfg)?;
    note(&scope, &y);
    let (xs, idx) = (save(tape, x.tensor()), save(tape, &idx));
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(max_pool2d_backward(&xs, &idx, g, cfg)?)])),
    ))
}
