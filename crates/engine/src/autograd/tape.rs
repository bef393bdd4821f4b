//! The tape: ops record how to compute their inputs' gradients; `backward`
//! replays those records in reverse.
//!
//! Memory follows PyTorch's rules because the tape holds only what backward
//! needs: each record keeps the tensors its backward saved (and nothing else),
//! is consumed by `backward` (so saved tensors are freed as soon as they have
//! been used), and a parameter's gradient lands in its `.grad` as soon as the
//! last op using it has run, staying there until `zero_grad`. Values the caller
//! holds stay alive as long as the caller holds them, exactly as Python
//! references do. With gradients disabled (`no_grad`) nothing is recorded and
//! nothing is saved. `backward_retain` (PyTorch's `retain_graph=True`) keeps
//! every record and what it saved, so a graph kept across steps grows memory
//! step after step; `checkpoint` (in functions.rs) records one node whose
//! backward re-runs a segment on a fresh tape.

use super::param::{ParamId, ParamStore};
use crate::memory::Category;
use crate::ops::{elementwise, fill};
use crate::tensor::{DType, Tensor, TensorError};
use std::cell::RefCell;
use std::collections::HashMap;

type VarId = usize;

/// Computes input gradients from the output gradient; `None` where an input
/// needs none. `Fn`, not `FnOnce`, so a retained graph can run again.
pub type BackwardFn = Box<dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>, TensorError>>;

/// A backward that also needs the parameters: a checkpointed segment re-runs
/// its forward (reading them) and backpropagates into them. Only
/// [`Tape::record_opaque`] takes one.
pub type ParamBackwardFn =
    Box<dyn Fn(&Tensor, &mut ParamStore) -> Result<Vec<Option<Tensor>>, TensorError>>;

/// What a node runs in backward.
enum Backward {
    Plain(BackwardFn),
    WithParams(ParamBackwardFn),
}

/// A tensor plus, when it is part of the recorded graph, its place there.
#[derive(Clone, Debug)]
pub struct Value {
    tensor: Tensor,
    var: Option<VarId>,
}

impl Value {
    /// A value outside the graph (inputs, labels): no gradient flows into it.
    pub fn constant(tensor: Tensor) -> Value {
        Value { tensor, var: None }
    }

    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Whether a gradient will be computed for this value.
    pub fn requires_grad(&self) -> bool {
        self.var.is_some()
    }
}

struct Node {
    /// The op that recorded it ("conv1.forward"); backward runs as "conv1.backward".
    op: std::sync::Arc<str>,
    output: VarId,
    inputs: Vec<Option<VarId>>,
    backward: Backward,
}

struct Inner {
    nodes: Vec<Node>,
    next_var: VarId,
    params: HashMap<VarId, ParamId>,
    grad_enabled: bool,
    /// The low-precision dtype inside `autocast`.
    autocast: Option<DType>,
    /// Autocast's weight-cast cache: a parameter cast once per autocast
    /// region however many ops read it (PyTorch caches casts of leaf
    /// tensors that require grad the same way, until the region ends).
    cast_cache: HashMap<VarId, Value>,
    /// `model.train()` (true, the default) or `model.eval()`: BatchNorm
    /// uses batch statistics and updates its running ones only in training.
    training: bool,
}

/// The recording of one forward pass.
pub struct Tape {
    inner: RefCell<Inner>,
}

impl Default for Tape {
    fn default() -> Self {
        Tape::new()
    }
}

impl Tape {
    pub fn new() -> Tape {
        Tape {
            inner: RefCell::new(Inner {
                nodes: Vec::new(),
                next_var: 0,
                params: HashMap::new(),
                grad_enabled: true,
                autocast: None,
                cast_cache: HashMap::new(),
                training: true,
            }),
        }
    }

    fn new_var(inner: &mut Inner) -> VarId {
        inner.next_var += 1;
        inner.next_var
    }

    /// A parameter as a graph leaf: its gradient goes to the parameter's `.grad`.
    pub fn param(&self, store: &ParamStore, id: ParamId) -> Value {
        let tensor = store.get(id).value.clone();
        let mut inner = self.inner.borrow_mut();
        if !inner.grad_enabled {
            return Value::constant(tensor);
        }
        let var = Self::new_var(&mut inner);
        inner.params.insert(var, id);
        Value {
            tensor,
            var: Some(var),
        }
    }

    /// A graph leaf that is not a parameter (a checkpointed segment's input):
    /// its gradient is what `backward_from` returns.
    pub fn leaf(&self, tensor: Tensor) -> Value {
        let mut inner = self.inner.borrow_mut();
        if !inner.grad_enabled {
            return Value::constant(tensor);
        }
        let var = Self::new_var(&mut inner);
        Value {
            tensor,
            var: Some(var),
        }
    }

    /// Records an op's output. If gradients are off, or no input needs one,
    /// the backward closure (and every tensor it saved) is dropped at once.
    pub fn record(&self, output: Tensor, inputs: &[&Value], backward: BackwardFn) -> Value {
        self.record_node(output, inputs, Backward::Plain(backward), false)
    }

    /// Like `record`, but keeps the node even when no input needs a gradient,
    /// because its backward reaches parameters the tape cannot see (a
    /// checkpointed segment).
    pub fn record_opaque(
        &self,
        output: Tensor,
        inputs: &[&Value],
        backward: ParamBackwardFn,
    ) -> Value {
        self.record_node(output, inputs, Backward::WithParams(backward), true)
    }

    fn record_node(
        &self,
        output: Tensor,
        inputs: &[&Value],
        backward: Backward,
        opaque: bool,
    ) -> Value {
        let mut inner = self.inner.borrow_mut();
        if !inner.grad_enabled || (!opaque && inputs.iter().all(|v| v.var.is_none())) {
            drop(backward);
            return Value::constant(output);
        }
        let var = Self::new_var(&mut inner);
        inner.nodes.push(Node {
            op: output.engine().current_scope().1,
            output: var,
            inputs: inputs.iter().map(|v| v.var).collect(),
            backward,
        });
        Value {
            tensor: output,
            var: Some(var),
        }
    }

    /// Runs `f` with autocast to `dtype` (PyTorch's `torch.autocast`):
    /// products and convolutions run in `dtype`, losses and softmax in f32
    /// (see `functions`). Leaving the outermost region empties the
    /// weight-cast cache; casts that backward saved stay alive until
    /// backward has used them.
    pub fn autocast<R>(&self, dtype: DType, f: impl FnOnce() -> R) -> R {
        let before = self.inner.borrow_mut().autocast.replace(dtype);
        let r = f();
        let mut inner = self.inner.borrow_mut();
        inner.autocast = before;
        if before.is_none() {
            inner.cast_cache.clear();
        }
        r
    }

    /// The autocast dtype in effect, if any.
    pub fn autocast_dtype(&self) -> Option<DType> {
        self.inner.borrow().autocast
    }

    /// A parameter's cached autocast cast, if it has one.
    pub(crate) fn cached_cast(&self, v: &Value) -> Option<Value> {
        let inner = self.inner.borrow();
        v.var.and_then(|var| inner.cast_cache.get(&var).cloned())
    }

    /// Caches `cast` as parameter `v`'s autocast cast (other values are
    /// cast at each use, as PyTorch does).
    pub(crate) fn cache_cast(&self, v: &Value, cast: &Value) {
        let mut inner = self.inner.borrow_mut();
        if let Some(var) = v.var {
            if inner.params.contains_key(&var) {
                inner.cast_cache.insert(var, cast.clone());
            }
        }
    }

    /// Whether `v` is a parameter leaf of this tape.
    pub(crate) fn is_param(&self, v: &Value) -> bool {
        v.var
            .is_some_and(|var| self.inner.borrow().params.contains_key(&var))
    }

    /// Whether ops record right now.
    pub fn grad_enabled(&self) -> bool {
        self.inner.borrow().grad_enabled
    }

    /// Runs `f` without recording (PyTorch's `torch.no_grad()`).
    pub fn no_grad<R>(&self, f: impl FnOnce() -> R) -> R {
        let before = std::mem::replace(&mut self.inner.borrow_mut().grad_enabled, false);
        let r = f();
        self.inner.borrow_mut().grad_enabled = before;
        r
    }

    /// Runs `f` with the model in eval mode (`model.eval()`): BatchNorm
    /// normalises with its running statistics and leaves them unchanged.
    /// Independent of [`Tape::no_grad`], as in PyTorch.
    pub fn eval<R>(&self, f: impl FnOnce() -> R) -> R {
        let before = std::mem::replace(&mut self.inner.borrow_mut().training, false);
        let r = f();
        self.inner.borrow_mut().training = before;
        r
    }

    /// `model.training`.
    pub fn training(&self) -> bool {
        self.inner.borrow().training
    }

    /// Number of recorded ops still waiting for backward.
    pub fn len(&self) -> usize {
        self.inner.borrow().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Backpropagates from the scalar `loss`, accumulating into the `.grad` of
    /// every parameter it depends on, and consumes the recording (each saved
    /// tensor is freed as soon as its op's backward has run).
    pub fn backward(&self, loss: &Value, store: &mut ParamStore) -> Result<(), TensorError> {
        self.backward_scalar(loss, store, false, 1.0)
    }

    /// `scaler.scale(loss).backward()`: backward from `scale · loss` (the
    /// seed gradient is `scale`), so small 16-bit gradients do not flush
    /// to zero; GradScaler unscales the parameters' gradients afterwards.
    pub fn backward_scaled(
        &self,
        loss: &Value,
        store: &mut ParamStore,
        scale: f32,
    ) -> Result<(), TensorError> {
        self.backward_scalar(loss, store, false, scale)
    }

    /// `backward(retain_graph=True)`: the recording and everything it saved
    /// stay, so backward can run again (and memory stays held).
    pub fn backward_retain(&self, loss: &Value, store: &mut ParamStore) -> Result<(), TensorError> {
        self.backward_scalar(loss, store, true, 1.0)
    }

    fn backward_scalar(
        &self,
        loss: &Value,
        store: &mut ParamStore,
        retain: bool,
        seed: f32,
    ) -> Result<(), TensorError> {
        if loss.var.is_none() {
            return Err(TensorError::NotSupported {
                op: "backward",
                what: "the loss does not depend on any parameter (was it computed under no_grad?)",
            });
        }
        if loss.tensor.numel() != 1 {
            return Err(TensorError::WrongShape {
                op: "backward",
                want: "a scalar loss (one element)",
                sizes: Vec::new(),
                got: loss.tensor.shape().to_vec(),
            });
        }
        if loss.tensor.dtype() != DType::F32 {
            return Err(TensorError::WrongDType {
                op: "backward",
                want: DType::F32,
                got: loss.tensor.dtype(),
                why: "losses are f32: autocast computes them in f32",
            });
        }
        let seed = fill::full(loss.tensor.engine(), &[1], seed, "loss.grad")?;
        self.run_backward(loss, seed, store, retain, None)?;
        Ok(())
    }

    /// Backpropagates `grad` (shaped like `root`) from `root`, consuming the
    /// recording, and returns the gradient of the leaf `wrt` if asked.
    pub fn backward_from(
        &self,
        root: &Value,
        grad: Tensor,
        store: &mut ParamStore,
        wrt: Option<&Value>,
    ) -> Result<Option<Tensor>, TensorError> {
        if root.var.is_none() {
            return Ok(None);
        }
        self.run_backward(root, grad, store, false, wrt.and_then(|v| v.var))
    }

    fn run_backward(
        &self,
        root: &Value,
        seed: Tensor,
        store: &mut ParamStore,
        retain: bool,
        wrt: Option<VarId>,
    ) -> Result<Option<Tensor>, TensorError> {
        let Some(root_var) = root.var else {
            return Ok(None);
        };
        let (mut nodes, params) = {
            let mut inner = self.inner.borrow_mut();
            let params = if retain {
                inner.params.clone()
            } else {
                std::mem::take(&mut inner.params)
            };
            (std::mem::take(&mut inner.nodes), params)
        };
        // How many recorded ops still have to deliver a gradient to each value.
        let mut pending: HashMap<VarId, usize> = HashMap::new();
        for n in &nodes {
            for v in n.inputs.iter().flatten() {
                *pending.entry(*v).or_default() += 1;
            }
        }
        let mut grads: HashMap<VarId, Tensor> = HashMap::new();
        let engine = seed.engine().clone();
        grads.insert(root_var, seed);
        let mut kept = Vec::new();
        let result = (|| {
            while let Some(node) = nodes.pop() {
                let name = match node.op.strip_suffix(".forward") {
                    Some(layer) => format!("{layer}.backward"),
                    None if node.op.is_empty() => "backward".to_string(),
                    None => format!("{}.backward", node.op),
                };
                let _scope = engine.scope(Category::Temporary, &name);
                let input_grads = match grads.remove(&node.output) {
                    Some(g) => match &node.backward {
                        Backward::Plain(f) => f(&g)?,
                        Backward::WithParams(f) => f(&g, store)?,
                    },
                    None => Vec::new(),
                };
                let mut input_grads = input_grads.into_iter();
                for var in &node.inputs {
                    let g = input_grads.next().flatten();
                    let Some(var) = *var else { continue };
                    if let Some(g) = g {
                        let total = elementwise::accumulate(grads.remove(&var), g)?;
                        grads.insert(var, total);
                    }
                    let left = pending.get_mut(&var).map(|c| {
                        *c -= 1;
                        *c
                    });
                    // A parameter's gradient is complete once its last user has
                    // run: move it into `.grad` now, as PyTorch's AccumulateGrad does.
                    if left == Some(0) {
                        if let Some(&pid) = params.get(&var) {
                            if let Some(g) = grads.remove(&var) {
                                store.accumulate_grad(pid, g)?;
                            }
                        }
                    }
                }
                if retain {
                    kept.push(node);
                }
                // Otherwise the node, and every tensor its backward saved, drops here.
            }
            Ok(wrt.and_then(|v| grads.remove(&v)))
        })();
        if retain {
            kept.reverse();
            let mut inner = self.inner.borrow_mut();
            kept.append(&mut inner.nodes);
            inner.nodes = kept;
        }
        result
    }
}
