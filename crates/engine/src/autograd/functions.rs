//! The ops the tape knows, each a thin wrapper: run the op's forward, save
//! what its backward needs (exactly what PyTorch saves), record. The saved
//! clones are cheap handles; when the tape is not recording, `record` drops
//! them at once, so `no_grad` keeps nothing alive.

use super::param::ParamStore;
use super::tape::{Tape, Value};
use crate::ops::cast::cast as cast_fwd;
use crate::ops::conv2d::{conv2d as conv2d_fwd, conv2d_backward, conv2d_backward_ex, Conv2dConfig};
use crate::ops::cross_entropy::{cross_entropy as ce_fwd, cross_entropy_backward};
use crate::ops::elementwise::add as add_fwd;
use crate::ops::linear::{linear as linear_fwd, linear_backward};
use crate::ops::linear_cross_entropy as lce;
use crate::ops::matmul::{matmul_ex, MatmulKernel};
use crate::ops::mean::{mean_axis, mean_axis_backward, Axis};
use crate::ops::mse::{mse as mse_fwd, mse_backward};
use crate::ops::nll::{
    log_softmax as log_softmax_fwd, log_softmax_backward, nll_loss as nll_fwd, nll_loss_backward,
};
use crate::ops::relu::{relu as relu_fwd, relu_backward};
use crate::ops::softmax::{softmax as softmax_fwd, softmax_backward};
use crate::tensor::{DType, ScopeGuard, Tensor, TensorError};

/// A model-level op (not inside a layer) is numbered (`relu1`, `relu2`) and
/// tags its allocations `relu1.forward`; inside a layer the layer's name wins.
pub(super) struct OpScope {
    _guard: ScopeGuard,
    name: std::sync::Arc<str>,
}

pub(super) fn op_scope(x: &Value, name: &str) -> Option<OpScope> {
    let engine = x.tensor().engine();
    (&*engine.current_scope().1 == "forward").then(|| {
        let name: std::sync::Arc<str> = engine.numbered(name).into();
        OpScope {
            _guard: engine.op_scope(&format!("{name}.forward")),
            name,
        }
    })
}

/// Notes a model-level op's output shape for per-layer reports.
pub(super) fn note(scope: &Option<OpScope>, y: &Tensor) {
    if let Some(s) = scope {
        y.engine().note_layer_output(&s.name, y.shape());
    }
}

/// A tensor backward will need: kept alive by the tape (a cheap handle) and,
/// when recording, re-categorised from forward output to activation.
pub(super) fn save(tape: &Tape, t: &Tensor) -> Tensor {
    if tape.grad_enabled() {
        t.mark_saved();
    }
    t.clone()
}

/// `x.to(dtype)`: a new tensor (or `x` itself when it already is `dtype`);
/// backward converts the gradient back to x's dtype (PyTorch's
/// ToCopyBackward). Saves nothing.
pub fn cast(tape: &Tape, x: &Value, dtype: DType, label: &str) -> Result<Value, TensorError> {
    if x.tensor().dtype() == dtype {
        return Ok(x.clone());
    }
    let from = x.tensor().dtype();
    let y = cast_fwd(x.tensor(), dtype, label)?;
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(cast_fwd(g, from, "cast.grad_input")?)])),
    ))
}

/// An input of an op autocast runs in low precision (convolutions,
/// products): cast to the autocast dtype if it is f32. A parameter's cast
/// is made once per autocast region and cached (PyTorch's autocast cache).
fn autocast_low(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let Some(dtype) = tape.autocast_dtype() else {
        return Ok(x.clone());
    };
    if x.tensor().dtype() != DType::F32 {
        return Ok(x.clone());
    }
    if let Some(c) = tape.cached_cast(x) {
        return Ok(c);
    }
    let is_param = tape.is_param(x);
    let label = if is_param {
        "autocast.weight"
    } else {
        "autocast.input"
    };
    // A weight's cast is memory of its own kind: the autocast cache.
    let engine = x.tensor().engine().clone();
    let _cache = is_param.then(|| {
        let op = engine.current_scope().1;
        engine.scope(crate::memory::Category::CastCache, &op)
    });
    let c = cast(tape, x, dtype, label)?;
    tape.cache_cast(x, &c);
    Ok(c)
}

/// An input of an op autocast runs in f32 (losses, softmax): widened if it
/// is 16-bit.
pub(super) fn autocast_f32(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    if tape.autocast_dtype().is_some() && x.tensor().dtype() != DType::F32 {
        return cast(tape, x, DType::F32, "autocast.f32");
    }
    Ok(x.clone())
}

/// conv2d; saves the input and the weight. Under autocast it runs in the
/// low dtype (input, weight and bias cast).
pub fn conv2d(
    tape: &Tape,
    x: &Value,
    w: &Value,
    b: &Value,
    cfg: Conv2dConfig,
) -> Result<Value, TensorError> {
    let scope = op_scope(x, "conv2d");
    let (x, w, b) = (
        &autocast_low(tape, x)?,
        &autocast_low(tape, w)?,
        &autocast_low(tape, b)?,
    );
    let y = conv2d_fwd(x.tensor(), w.tensor(), Some(b.tensor()), cfg)?;
    note(&scope, &y);
    let (xs, ws) = (save(tape, x.tensor()), save(tape, w.tensor()));
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

/// conv2d without a bias (`bias=False`, as ResNet's convolutions are);
/// saves the input and the weight.
pub fn conv2d_nobias(
    tape: &Tape,
    x: &Value,
    w: &Value,
    cfg: Conv2dConfig,
) -> Result<Value, TensorError> {
    let scope = op_scope(x, "conv2d");
    let (x, w) = (&autocast_low(tape, x)?, &autocast_low(tape, w)?);
    let y = conv2d_fwd(x.tensor(), w.tensor(), None, cfg)?;
    note(&scope, &y);
    let (xs, ws) = (save(tape, x.tensor()), save(tape, w.tensor()));
    let need_dx = x.requires_grad();
    Ok(tape.record(
        y,
        &[x, w],
        Box::new(move |g| {
            let (dx, dw, _) = conv2d_backward_ex(&xs, &ws, g, cfg, need_dx, false)?;
            Ok(vec![dx, Some(dw)])
        }),
    ))
}

/// ReLU; saves its output (its backward masks by it).
pub fn relu(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let scope = op_scope(x, "relu");
    let y = relu_fwd(x.tensor())?;
    note(&scope, &y);
    let saved = save(tape, &y);
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

/// linear, with or without a bias; saves the input and the weight.
pub fn linear(tape: &Tape, x: &Value, w: &Value, b: Option<&Value>) -> Result<Value, TensorError> {
    let scope = op_scope(x, "linear");
    let (x, w) = (&autocast_low(tape, x)?, &autocast_low(tape, w)?);
    let b = match b {
        Some(b) => Some(autocast_low(tape, b)?),
        None => None,
    };
    let b = b.as_ref();
    let y = linear_fwd(x.tensor(), w.tensor(), b.map(|b| b.tensor()))?;
    note(&scope, &y);
    let (xs, ws) = (save(tape, x.tensor()), save(tape, w.tensor()));
    let need_dx = x.requires_grad();
    let has_bias = b.is_some();
    let mut inputs = vec![x, w];
    inputs.extend(b);
    Ok(tape.record(
        y,
        &inputs,
        Box::new(move |g| {
            let (dx, dw, db) = linear_backward(&xs, &ws, g, need_dx, has_bias)?;
            let mut grads = vec![dx, Some(dw)];
            if has_bias {
                grads.push(db);
            }
            Ok(grads)
        }),
    ))
}

/// Mean cross-entropy against integer labels; saves the logits and labels.
pub fn cross_entropy(tape: &Tape, logits: &Value, labels: &Tensor) -> Result<Value, TensorError> {
    let scope = op_scope(logits, "cross_entropy");
    // The loss kernel reads f32 (as autocast's policy has it; after
    // model.half() a 16-bit logits tensor is widened here too).
    let logits = &cast(tape, logits, DType::F32, "autocast.f32")?;
    let loss = ce_fwd(logits.tensor(), labels)?;
    note(&scope, &loss);
    let (l, y) = (save(tape, logits.tensor()), save(tape, labels));
    Ok(tape.record(
        loss,
        &[logits],
        Box::new(move |g| Ok(vec![Some(cross_entropy_backward(&l, &y, g)?)])),
    ))
}

/// `F.cross_entropy(logits, labels)` as PyTorch runs it: `log_softmax`
/// (in f32, autocast's rule), then `nll_loss`; see `ops::nll` for what each
/// allocates and saves. After model.half() PyTorch runs both in 16 bits;
/// vramlab's kernels are f32, so there it widens the logits first (a
/// deviation: one more buffer, and f32 log-probabilities and gradients).
pub fn cross_entropy_torch(
    tape: &Tape,
    logits: &Value,
    labels: &Tensor,
) -> Result<Value, TensorError> {
    let scope = op_scope(logits, "cross_entropy");
    let logits = &cast(tape, logits, DType::F32, "autocast.f32")?;
    let logp = log_softmax(tape, logits)?;
    let (loss, total_weight) = nll_fwd(logp.tensor(), labels)?;
    note(&scope, &loss);
    let (lp, y, tw) = (
        save(tape, logp.tensor()),
        save(tape, labels),
        save(tape, &total_weight),
    );
    Ok(tape.record(
        loss,
        &[&logp],
        Box::new(move |g| Ok(vec![Some(nll_loss_backward(&lp, &y, g, &tw)?)])),
    ))
}

/// PyTorch's chunked `F.linear_cross_entropy(h, W, labels, options=…)`
/// (`ops::linear_cross_entropy`): the loss and both gradients in the forward
/// pass, `rows` rows at a time (`None`: PyTorch's heuristic). Its backward
/// scales the stored gradients by the loss's gradient in place and hands
/// them on; having given them away it cannot run again (PyTorch's default
/// `allow_retain_graph=False`).
pub fn linear_cross_entropy(
    tape: &Tape,
    h: &Value,
    w: &Value,
    labels: &Tensor,
    rows: Option<usize>,
) -> Result<Value, TensorError> {
    let scope = op_scope(h, "linear_cross_entropy");
    let (hs, ws) = (h.tensor().shape(), w.tensor().shape());
    if hs.len() != 2 || ws.len() != 2 {
        return Err(TensorError::ShapeMismatch {
            op: "linear_cross_entropy",
            lhs: hs.to_vec(),
            rhs: ws.to_vec(),
        });
    }
    let rows = lce::chunk_rows(hs[0], hs[1], ws[0], rows);
    let grads = tape.grad_enabled();
    let out = lce::forward(
        h.tensor(),
        w.tensor(),
        labels,
        rows,
        grads && h.requires_grad(),
        grads && w.requires_grad(),
    )?;
    note(&scope, &out.loss);
    let held = std::cell::RefCell::new(Some((out.grad_input, out.grad_weight)));
    Ok(tape.record(
        out.loss,
        &[h, w],
        Box::new(move |g| {
            let (gi, gw) = held.borrow_mut().take().ok_or(TensorError::NotSupported {
                op: "linear_cross_entropy backward",
                what: "ran twice: the chunked loss hands on the gradients its forward made \
                       (PyTorch's allow_retain_graph=False); retaining the graph needs \
                       --loss cross-entropy or --loss fused",
            })?;
            for t in gi.iter().chain(gw.iter()) {
                lce::scale_by(t, g)?;
            }
            Ok(vec![gi, gw])
        }),
    ))
}

/// `torch.log_softmax(x, dim=1)` over `[rows, classes]`; saves its output.
pub fn log_softmax(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let y = log_softmax_fwd(x.tensor())?;
    let ys = save(tape, &y);
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(log_softmax_backward(g, &ys)?)])),
    ))
}

/// `a + b` (residual connections); saves nothing, passes the gradient to both.
pub fn add(tape: &Tape, a: &Value, b: &Value) -> Result<Value, TensorError> {
    let scope = op_scope(a, "add");
    // Type promotion (f16 + f32 is f32), as PyTorch's binary ops do.
    let (a, b) = match (a.tensor().dtype(), b.tensor().dtype()) {
        (x, y) if x == y => (a.clone(), b.clone()),
        (DType::F32, _) => (a.clone(), cast(tape, b, DType::F32, "add.promoted")?),
        (_, DType::F32) => (cast(tape, a, DType::F32, "add.promoted")?, b.clone()),
        (x, y) => {
            return Err(TensorError::DTypeMismatch {
                op: "add",
                lhs: x,
                rhs: y,
            })
        }
    };
    let (a, b) = (&a, &b);
    let y = add_fwd(a.tensor(), b.tensor())?;
    note(&scope, &y);
    Ok(tape.record(
        y,
        &[a, b],
        Box::new(move |g| Ok(vec![Some(g.clone()), Some(g.clone())])),
    ))
}

/// Batched `op(a) · op(b)` over matching batch dimensions, where op
/// transposes the last two axes when asked (attention's Q·Kᵀ); saves both
/// operands. For C = op(A)·op(B): dA = G·op(B)ᵀ (or its transpose when A was
/// read transposed), dB = op(A)ᵀ·G (likewise).
pub fn matmul(
    tape: &Tape,
    a: &Value,
    b: &Value,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Value, TensorError> {
    let (sa, sb) = (a.tensor().shape(), b.tensor().shape());
    if sa.len() != sb.len() || sa[..sa.len().saturating_sub(2)] != sb[..sb.len().saturating_sub(2)]
    {
        return Err(TensorError::ShapeMismatch {
            op: "matmul (autograd needs equal batch dimensions)",
            lhs: sa.to_vec(),
            rhs: sb.to_vec(),
        });
    }
    let k = MatmulKernel::Tiled;
    let scope = op_scope(a, "matmul");
    let (a, b) = (&autocast_low(tape, a)?, &autocast_low(tape, b)?);
    let y = matmul_ex(a.tensor(), b.tensor(), transpose_a, transpose_b, k)?;
    note(&scope, &y);
    let (at, bt) = (save(tape, a.tensor()), save(tape, b.tensor()));
    let (need_a, need_b) = (a.requires_grad(), b.requires_grad());
    Ok(tape.record(
        y,
        &[a, b],
        Box::new(move |g| {
            let da = match (need_a, transpose_a) {
                (false, _) => None,
                (true, false) => Some(matmul_ex(g, &bt, false, !transpose_b, k)?),
                (true, true) => Some(matmul_ex(&bt, g, transpose_b, true, k)?),
            };
            let db = match (need_b, transpose_b) {
                (false, _) => None,
                (true, false) => Some(matmul_ex(&at, g, !transpose_a, false, k)?),
                (true, true) => Some(matmul_ex(g, &at, true, transpose_a, k)?),
            };
            Ok(vec![da, db])
        }),
    ))
}

/// `softmax(scale · x)` over the last axis; saves its output.
pub fn softmax(tape: &Tape, x: &Value, scale: f32) -> Result<Value, TensorError> {
    let scope = op_scope(x, "softmax");
    // Autocast runs softmax in f32 (CUDA's policy) and leaves it there;
    // a 16-bit model (half()) gets its dtype back, the kernel being f32.
    let back_to = match tape.autocast_dtype() {
        Some(_) => None,
        None => Some(x.tensor().dtype()).filter(|d| *d != DType::F32),
    };
    let x = &cast(tape, x, DType::F32, "softmax.f32_input")?;
    let y = softmax_fwd(x.tensor(), scale)?;
    note(&scope, &y);
    let saved = save(tape, &y);
    let y = tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(softmax_backward(&saved, g, scale)?)])),
    );
    match back_to {
        Some(d) => cast(tape, &y, d, "softmax.out"),
        None => Ok(y),
    }
}

/// Mean over axis `dim`, which disappears from the shape; saves nothing.
pub fn mean_dim(tape: &Tape, x: &Value, dim: usize) -> Result<Value, TensorError> {
    let shape = x.tensor().shape().to_vec();
    if dim >= shape.len() {
        return Err(TensorError::AxisOutOfRange {
            op: "mean",
            axis: dim,
            shape,
        });
    }
    let axis = Axis::of(&shape, dim);
    let mut out_shape = shape.clone();
    out_shape.remove(dim);
    let scope = op_scope(x, "mean");
    let y = mean_axis(x.tensor(), axis, &out_shape, "mean.out")?;
    note(&scope, &y);
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |g| Ok(vec![Some(mean_axis_backward(g, axis, &shape)?)])),
    ))
}

/// The mean of all elements, shape `[1]`; saves nothing.
pub fn mean(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let flat = reshape(tape, x, &[1, x.tensor().numel()])?;
    mean_dim(tape, &flat, 1)
}

/// Global average pooling `[N, C, H, W] → [N, C]`; saves nothing.
pub fn global_avg_pool(tape: &Tape, x: &Value) -> Result<Value, TensorError> {
    let s = x.tensor().shape();
    if s.len() != 4 {
        return Err(TensorError::WrongShape {
            op: "global_avg_pool",
            want: "[N, C, H, W]",
            sizes: Vec::new(),
            got: s.to_vec(),
        });
    }
    let flat = reshape(tape, x, &[s[0], s[1], s[2] * s[3]])?;
    mean_dim(tape, &flat, 2)
}

/// Mean squared error against a constant target; saves both.
pub fn mse(tape: &Tape, pred: &Value, target: &Tensor) -> Result<Value, TensorError> {
    let scope = op_scope(pred, "mse");
    let pred = &autocast_f32(tape, pred)?;
    let loss = mse_fwd(pred.tensor(), target)?;
    note(&scope, &loss);
    let (p, t) = (save(tape, pred.tensor()), save(tape, target));
    Ok(tape.record(
        loss,
        &[pred],
        Box::new(move |g| Ok(vec![Some(mse_backward(&p, &t, g)?)])),
    ))
}

/// A segment of a model: reads its parameters from the store, records on the
/// tape it is given.
pub trait Segment: Fn(&Tape, &ParamStore, &Value) -> Result<Value, TensorError> + 'static {}
impl<F: Fn(&Tape, &ParamStore, &Value) -> Result<Value, TensorError> + 'static> Segment for F {}

/// Runs `f` on `tape` under autocast to `amp` (if any) and in train or eval
/// mode as given.
fn in_state<R>(tape: &Tape, amp: Option<DType>, training: bool, f: impl FnOnce() -> R) -> R {
    let run = || match amp {
        Some(d) => tape.autocast(d, f),
        None => f(),
    };
    if training {
        run()
    } else {
        tape.eval(run)
    }
}

/// `torch.utils.checkpoint.checkpoint(f, x)`: runs `f` without recording, so
/// only its input is kept (saved by this node) and its output; backward
/// re-runs `f` on a fresh tape, backpropagates through it into the
/// parameters, and hands on the input's gradient. Activation memory of the
/// segment is traded for one extra forward.
pub fn checkpoint(
    tape: &Tape,
    store: &ParamStore,
    x: &Value,
    f: impl Segment,
) -> Result<Value, TensorError> {
    if !tape.grad_enabled() {
        return f(tape, store, x);
    }
    // The segment runs, and is re-run in backward, under the autocast dtype
    // and train/eval mode of the forward that called it, as PyTorch's
    // checkpoint restores them: an f16 input meets f16 weights in both.
    let (amp, training) = (tape.autocast_dtype(), tape.training());
    let quiet = Tape::new();
    let input = Value::constant(x.tensor().clone());
    let y = quiet.no_grad(|| in_state(&quiet, amp, training, || f(&quiet, store, &input)))?;
    drop(input);
    let saved = save(tape, x.tensor());
    let need_dx = x.requires_grad();
    Ok(tape.record_opaque(
        y.tensor().clone(),
        &[x],
        Box::new(move |g, store| {
            let sub = Tape::new();
            let xin = if need_dx {
                sub.leaf(saved.clone())
            } else {
                Value::constant(saved.clone())
            };
            let out = in_state(&sub, amp, training, || f(&sub, store, &xin))?;
            let dx = sub.backward_from(&out, g.clone(), store, Some(&xin))?;
            Ok(vec![dx])
        }),
    ))
}
