//! SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD
//! implements it. The momentum buffer is allocated at the first step (as a
//! copy of the gradient, PyTorch's `torch.clone(d_p)`), so memory steps up by
//! one parameter-sized buffer there, and not at all without momentum.

use super::phases::{self, free_in_reverse, grad_of};
use super::{Optimizer, OptimizerImpl};
use crate::autograd::param::ParamStore;
use crate::tensor::{Tensor, TensorError};

const SGD: &str = include_str!("../../../../shaders/sgd.wgsl");
const PHASES: &str = include_str!("../../../../shaders/sgd_phases.wgsl");

/// The phase kernel as a list op: two elements an invocation, as the
/// single kernel.
const LIST: phases::ListKernel = phases::ListKernel {
    name: "sgd_phases",
    source: PHASES,
    per_invocation: 2,
    most: 16,
};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PhaseParams {
    n: u32,
    phase: u32,
    _p: [u32; 2],
    lr: f32,
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    has_momentum: u32,
    first: u32,
    nesterov: u32,
    lr: f32,
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
}

/// torch.optim.SGD.
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    pub implementation: OptimizerImpl,
    buffers: Vec<Option<Tensor>>,
    /// Whether the momentum buffers hold a step's values: not yet after a
    /// first step the device skipped (PyTorch's `_fused_sgd` made them with
    /// `empty_like` and would read that garbage next; vramlab starts them
    /// from the next step's gradients, as the unfused SGD does).
    filled: bool,
    /// Whether the last fused step was the one to fill them.
    filling: bool,
}

impl Sgd {
    /// torch.optim.SGD(lr, momentum): no dampening, no weight decay.
    pub fn new(lr: f32, momentum: f32) -> Sgd {
        Sgd {
            lr,
            momentum,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            implementation: OptimizerImpl::default(),
            buffers: Vec::new(),
            filled: false,
            filling: false,
        }
    }
}

impl Sgd {
    fn params(&self, phase: u32, n: usize) -> PhaseParams {
        PhaseParams {
            n: n as u32,
            phase,
            _p: [0; 2],
            lr: self.lr,
            momentum: self.momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
        }
    }

    fn phase(&self, phase: u32, w: &Tensor, b: [&Tensor; 3]) -> Result<(), TensorError> {
        let params = self.params(phase, w.numel());
        phases::run(
            &phases::kernel("sgd_phases", PHASES, w.dtype(), 1),
            w,
            &[w, b[0], b[1], b[2]],
            bytemuck::bytes_of(&params),
        )
    }

    /// What every step does first: a slot for each parameter's buffer, and
    /// every gradient checked.
    fn begin(&mut self, store: &ParamStore) -> Result<(), TensorError> {
        self.buffers.resize_with(store.len(), || None);
        for p in store.iter() {
            grad_of("sgd", p)?;
        }
        Ok(())
    }

    /// A new momentum buffer for parameter `i` (its first step), unfilled.
    fn new_buffer(&mut self, i: usize, w: &Tensor, name: &str) -> Result<(), TensorError> {
        self.buffers[i] = Some(Tensor::empty(
            w.engine(),
            w.shape(),
            w.dtype(),
            &format!("sgd.momentum_buffer.{name}"),
        )?);
        Ok(())
    }

    /// `_fused_sgd`: on the first step every momentum buffer is made
    /// (`torch.empty_like`) before one kernel per parameter fills it; with
    /// `found`, each kernel returns where it is set.
    fn fused(&mut self, store: &ParamStore, found: Option<&Tensor>) -> Result<(), TensorError> {
        let has_momentum = self.momentum != 0.0;
        if has_momentum && self.buffers.iter().all(Option::is_none) {
            for (i, p) in store.iter().enumerate() {
                if p.grad.is_some() {
                    self.new_buffer(i, &p.value, &p.name)?;
                }
            }
        }
        // A step with no gradient at all runs no kernel and fills nothing.
        let runs = store.iter().any(|p| p.grad.is_some());
        let first = has_momentum && !self.filled;
        self.filling = first && runs;
        self.filled |= has_momentum && runs;
        let flag = found.map(Tensor::slice);
        for (i, p) in store.iter().enumerate() {
            let Some(g) = &p.grad else { continue };
            if has_momentum && self.buffers[i].is_none() {
                // _fused_sgd makes buffers only when none exists at all.
                return Err(TensorError::LateGradient {
                    op: "sgd",
                    param: p.name.clone(),
                });
            }
            let buf = self.buffers[i]
                .as_ref()
                .filter(|_| has_momentum)
                .unwrap_or(g);
            let n = p.value.numel();
            let params = Params {
                n: n as u32,
                has_momentum: has_momentum as u32,
                first: first as u32,
                nesterov: self.nesterov as u32,
                lr: self.lr,
                momentum: self.momentum,
                dampening: self.dampening,
                weight_decay: self.weight_decay,
            };
            let slices = [p.value.slice(), g.slice(), buf.slice()];
            let mut parts = crate::ops::same_parts(&p.value, &slices.each_ref());
            let kernel = match &flag {
                Some(f) => {
                    parts.push((f, crate::device::Part::Whole));
                    super::skipping_kernel("sgd", SGD, p.value.dtype())
                }
                None => crate::ops::typed_kernel("sgd", SGD, "main", p.value.dtype()),
            };
            crate::ops::launch_flat(&p.value, &kernel, &parts, bytemuck::bytes_of(&params), n, 2)?;
        }
        Ok(())
    }

    /// `_multi_tensor_sgd`: weight decay makes a new list of gradients; a
    /// first step clones them into the momentum buffers; without Nesterov
    /// `device_grads = bufs` drops the decayed list before the update.
    fn foreach(&mut self, store: &ParamStore) -> Result<(), TensorError> {
        let live: Vec<(usize, &Tensor, &Tensor)> = store
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, &p.value, p.grad.as_ref()?)))
            .collect();
        // device_grads: handles on the gradients, or the decayed list.
        let mut grads: Vec<Tensor> = if self.weight_decay != 0.0 {
            let l = live
                .iter()
                .map(|&(_, w, _)| phases::temporary(w, "sgd._foreach_add"))
                .collect::<Result<Vec<_>, _>>()?;
            let items = live
                .iter()
                .zip(&l)
                .map(|(&(_, w, g), t)| vec![w, g, w, t])
                .collect::<Vec<_>>();
            self.list_op(0, &items)?;
            l
        } else {
            live.iter().map(|&(_, _, g)| g.clone()).collect()
        };
        if self.momentum != 0.0 {
            // A first step clones the gradients into new buffers (made in
            // parameter order), the others update theirs.
            let mut fresh = vec![false; live.len()];
            for (k, &(i, w, _)) in live.iter().enumerate() {
                if self.buffers[i].is_none() {
                    self.new_buffer(i, w, store.name_of(i))?;
                    fresh[k] = true;
                }
            }
            for (phase, first) in [(1, true), (2, false)] {
                let mut items = Vec::new();
                for ((&(i, w, _), g), &f) in live.iter().zip(&grads).zip(&fresh) {
                    if f == first {
                        items.push(vec![w, g, self.buf(i)?, w]);
                    }
                }
                self.list_op(phase, &items)?;
            }
            if self.nesterov {
                let items = live
                    .iter()
                    .zip(&grads)
                    .map(|(&(i, w, _), g)| Ok(vec![w, g, self.buf(i)?, w]))
                    .collect::<Result<Vec<_>, TensorError>>()?;
                self.list_op(3, &items)?;
            } else {
                // device_grads = bufs: the decayed list goes, last first.
                let bufs = live
                    .iter()
                    .map(|&(i, _, _)| self.buf(i).cloned())
                    .collect::<Result<_, _>>()?;
                free_in_reverse(std::mem::replace(&mut grads, bufs));
            }
        }
        let items = live
            .iter()
            .zip(&grads)
            .map(|(&(_, w, _), g)| vec![w, g, w, w])
            .collect::<Vec<_>>();
        self.list_op(5, &items)?;
        free_in_reverse(grads);
        Ok(())
    }

    /// One foreach list op over `items` (param, grad, buf, a each): lists
    /// of parameters a dispatch ([`phases::run_all`]).
    fn list_op(&self, phase: u32, items: &[Vec<&Tensor>]) -> Result<(), TensorError> {
        phases::run_all(
            &LIST,
            items,
            &[],
            bytemuck::bytes_of(&self.params(phase, 0)),
            &|t| self.phase(phase, t[0], [t[1], t[2], t[3]]),
        )
    }

    /// `_single_tensor_sgd`: a parameter at a time; the decayed gradient
    /// (or Nesterov's sum) lives until the next parameter's
    /// `grad = grads[i]`, or until `grad = buf` drops it.
    fn for_loop(&mut self, store: &ParamStore) -> Result<(), TensorError> {
        let mut grad: Option<Tensor> = None;
        for (i, p) in store.iter().enumerate() {
            let Some(g0) = &p.grad else { continue };
            let w = &p.value;
            grad = None;
            if self.weight_decay != 0.0 {
                let t = phases::temporary(w, "sgd.grad.add")?;
                self.phase(0, w, [g0, w, &t])?;
                grad = Some(t);
            }
            if self.momentum != 0.0 {
                let g = grad.clone().unwrap_or_else(|| g0.clone());
                if self.buffers[i].is_none() {
                    self.new_buffer(i, w, &p.name)?;
                    self.phase(1, w, [&g, self.buf(i)?, w])?;
                } else {
                    self.phase(2, w, [&g, self.buf(i)?, w])?;
                }
                if self.nesterov {
                    let t = phases::temporary(w, "sgd.grad.add")?;
                    self.phase(4, w, [&g, self.buf(i)?, &t])?;
                    drop(g);
                    grad = Some(t);
                } else {
                    drop(g);
                    grad = None; // grad = buf
                    let b = self.buf(i)?.clone();
                    self.phase(5, w, [&b, w, w])?;
                    continue;
                }
            }
            let g = grad.as_ref().unwrap_or(g0);
            self.phase(5, w, [g, w, w])?;
        }
        drop(grad);
        Ok(())
    }

    fn buf(&self, i: usize) -> Result<&Tensor, TensorError> {
        self.buffers
            .get(i)
            .and_then(Option::as_ref)
            .ok_or(TensorError::NoMomentumBuffer {
                op: "sgd",
                index: i,
            })
    }
}

impl Optimizer for Sgd {
    fn name(&self) -> &'static str {
        "sgd"
    }

    fn state_bytes(&self) -> usize {
        self.buffers.iter().flatten().map(Tensor::nbytes).sum()
    }

    fn step(&mut self, store: &mut ParamStore) -> Result<(), TensorError> {
        self.begin(store)?;
        match self.implementation {
            OptimizerImpl::Fused => self.fused(store, None),
            OptimizerImpl::Foreach => self.foreach(store),
            OptimizerImpl::ForLoop => self.for_loop(store),
        }
    }

    fn takes_found_inf(&self) -> bool {
        self.implementation.takes_found_inf()
    }

    /// `_fused_sgd` with GradScaler's flag: buffers made, each kernel
    /// skipping on the device where the flag is set.
    fn step_unless_found(
        &mut self,
        store: &mut ParamStore,
        found_inf: &Tensor,
    ) -> Result<(), TensorError> {
        super::fused_only(
            self.implementation,
            "sgd step with GradScaler's flag on the device",
        )?;
        self.begin(store)?;
        self.fused(store, Some(found_inf))
    }

    /// A skipped filling step left the buffers unfilled: the next fills them.
    fn was_skipped(&mut self) -> Result<(), TensorError> {
        if self.filling {
            self.filled = false;
        }
        Ok(())
    }
}
