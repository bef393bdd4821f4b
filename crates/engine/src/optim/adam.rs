//! Adam and AdamW, as torch.optim implements them (torch/optim/adam.py), in
//! each of its three implementations. State (`exp_avg`, `exp_avg_sq`, one
//! of each per parameter) is allocated lazily at the first step, as PyTorch
//! does, so memory steps up by 2× the parameters there.

use super::phases::{self, free_in_reverse, grad_of};
use super::{Optimizer, OptimizerImpl};
use crate::autograd::param::ParamStore;
use crate::ops::fill;
use crate::tensor::{DType, Tensor, TensorError};

const ADAM: &str = include_str!("../../../../shaders/adam.wgsl");
const PHASES: &str = include_str!("../../../../shaders/adam_phases.wgsl");

/// The phase kernel as a list op: two elements an invocation, as the
/// single kernel.
const LIST: phases::ListKernel = phases::ListKernel {
    name: "adam_phases",
    source: PHASES,
    per_invocation: 2,
    most: 16,
};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    decoupled: u32,
    phase: u32,
    _p: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bc1: f32,
    bc2_sqrt: f32,
    _q: f32,
}

/// Adam (`decoupled = false`) or AdamW (`decoupled = true`).
pub struct Adam {
    pub lr: f32,
    pub betas: (f32, f32),
    pub eps: f32,
    pub weight_decay: f32,
    pub decoupled: bool,
    pub implementation: OptimizerImpl,
    step: i32,
    state: Vec<Option<State>>,
}

/// A parameter's state, in the order `_init_group` makes it.
struct State {
    /// `state["step"]`: on the device only for fused (on CUDA the other
    /// implementations keep it on the CPU).
    step: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

impl Adam {
    /// torch.optim.Adam defaults: betas (0.9, 0.999), eps 1e-8, no weight
    /// decay, foreach.
    pub fn new(lr: f32) -> Adam {
        Adam {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            implementation: OptimizerImpl::default(),
            step: 0,
            state: Vec::new(),
        }
    }

    /// torch.optim.AdamW defaults: weight decay 0.01, decoupled.
    pub fn adamw(lr: f32) -> Adam {
        Adam {
            weight_decay: 0.01,
            decoupled: true,
            ..Adam::new(lr)
        }
    }

    fn params(&self, phase: u32) -> Params {
        let (b1, b2) = self.betas;
        Params {
            n: 0,
            decoupled: self.decoupled as u32,
            phase,
            _p: 0,
            lr: self.lr,
            beta1: b1,
            beta2: b2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            bc1: 1.0 - b1.powi(self.step),
            bc2_sqrt: (1.0 - b2.powi(self.step)).sqrt(),
            _q: 0.0,
        }
    }

    /// `_init_group`: every parameter with a gradient gets its state before
    /// any update runs (fused: the step count on the device first).
    fn init(&mut self, store: &ParamStore) -> Result<(), TensorError> {
        self.state.resize_with(store.len(), || None);
        for (i, p) in store.iter().enumerate() {
            if grad_of("adam", p)?.is_none() || self.state[i].is_some() {
                continue;
            }
            let e = p.value.engine();
            let step = match self.implementation {
                OptimizerImpl::Fused => Some(fill::zeros_as(
                    e,
                    &[],
                    DType::F32,
                    &format!("adam.step.{}", p.name),
                )?),
                _ => None,
            };
            // zeros_like(param): the parameter's dtype (f16 after half()).
            let d = p.value.dtype();
            let exp_avg =
                fill::zeros_as(e, p.value.shape(), d, &format!("adam.exp_avg.{}", p.name))?;
            let exp_avg_sq = fill::zeros_as(
                e,
                p.value.shape(),
                d,
                &format!("adam.exp_avg_sq.{}", p.name),
            )?;
            self.state[i] = Some(State {
                step,
                exp_avg,
                exp_avg_sq,
            });
        }
        Ok(())
    }

    /// What every step does first: the count up, the state made.
    fn begin(&mut self, store: &ParamStore) -> Result<(), TensorError> {
        self.step += 1;
        self.init(store)
    }

    /// The parameters that have a gradient, with it and their state.
    fn live<'a>(&'a self, store: &'a ParamStore) -> Vec<(&'a Tensor, &'a Tensor, &'a State)> {
        store
            .iter()
            .zip(&self.state)
            .filter_map(|(p, s)| Some((&p.value, p.grad.as_ref()?, s.as_ref()?)))
            .collect()
    }

    /// `_fused_adam_`: one kernel per parameter, after `_foreach_add_` on
    /// the step counts; with `found`, each kernel returns where it is set.
    fn fused(&self, store: &ParamStore, found: Option<&Tensor>) -> Result<(), TensorError> {
        let params = self.params(0);
        let flag = found.map(Tensor::slice);
        for (w, g, s) in self.live(store) {
            if let Some(step) = &s.step {
                fill::fill(step, self.step as f32)?;
            }
            let n = w.numel();
            let slices = [
                w.slice(),
                g.slice(),
                s.exp_avg.slice(),
                s.exp_avg_sq.slice(),
            ];
            let mut parts = crate::ops::same_parts(w, &slices.each_ref());
            let kernel = match &flag {
                Some(f) => {
                    parts.push((f, crate::device::Part::Whole));
                    super::skipping_kernel("adam", ADAM, w.dtype())
                }
                None => crate::ops::typed_kernel("adam", ADAM, "main", w.dtype()),
            };
            crate::ops::launch_flat(
                w,
                &kernel,
                &parts,
                bytemuck::bytes_of(&Params {
                    n: n as u32,
                    ..params
                }),
                n,
                2,
            )?;
        }
        Ok(())
    }

    fn phase(&self, phase: u32, w: &Tensor, b: [&Tensor; 5]) -> Result<(), TensorError> {
        let params = Params {
            n: w.numel() as u32,
            ..self.params(phase)
        };
        phases::run(
            &phases::kernel("adam_phases", PHASES, w.dtype(), 1),
            w,
            &[w, b[0], b[1], b[2], b[3], b[4]],
            bytemuck::bytes_of(&params),
        )
    }

    /// One foreach list op (phase 0, 1, 7 or 8) over every parameter of
    /// `live`: `grads[k]`, where given, replaces parameter k's gradient
    /// (the weight-decayed list) and `temps[k]` is its temporary (else the
    /// parameter is bound there); lists of parameters a dispatch
    /// ([`phases::run_all`]).
    fn list_op(
        &self,
        phase: u32,
        live: &[(&Tensor, &Tensor, &State)],
        grads: Option<&[Tensor]>,
        temps: Option<&[Tensor]>,
    ) -> Result<(), TensorError> {
        let items: Vec<Vec<&Tensor>> = live
            .iter()
            .enumerate()
            .map(|(k, (w, g, s))| {
                let g = grads.map_or(*g, |l| &l[k]);
                let a = temps.map_or(*w, |l| &l[k]);
                vec![*w, g, &s.exp_avg, &s.exp_avg_sq, a]
            })
            .collect();
        phases::run_all(
            &LIST,
            &items,
            &[],
            bytemuck::bytes_of(&self.params(phase)),
            &|t| self.phase(phase, t[0], [t[1], t[2], t[3], t[4], t[0]]),
        )
    }

    /// `_multi_tensor_adam`: a list op at a time over every parameter (one
    /// device, one dtype). Adam's weight decay makes a new list of
    /// gradients, deleted after the moments; `_foreach_sqrt` makes the
    /// denominators' list, alive until the group ends. The memory follows
    /// those lists; the arithmetic runs a parameter at a time, its list ops
    /// fused into one dispatch (phase 7, or 8 after a weight-decayed list),
    /// which gives the same bits as one dispatch per list op.
    fn foreach(&self, store: &ParamStore) -> Result<(), TensorError> {
        let live = self.live(store);
        let wd_grads = if !self.decoupled && self.weight_decay != 0.0 {
            let l = live
                .iter()
                .map(|(w, _, _)| phases::temporary(w, "adam._foreach_add"))
                .collect::<Result<Vec<_>, _>>()?;
            self.list_op(0, &live, None, Some(&l))?;
            Some(l)
        } else {
            None
        };
        // Without a weight-decayed list the moments join the last two ops.
        let phase = if wd_grads.is_none() { 7 } else { 8 };
        if let Some(l) = &wd_grads {
            self.list_op(1, &live, Some(l), None)?;
        }
        // del device_grads: CPython frees a list's items last to first.
        free_in_reverse(wd_grads.unwrap_or_default());
        let denoms = live
            .iter()
            .map(|(w, _, _)| phases::temporary(w, "adam._foreach_sqrt"))
            .collect::<Result<Vec<_>, _>>()?;
        self.list_op(phase, &live, None, Some(&denoms))?;
        free_in_reverse(denoms);
        Ok(())
    }

    /// `_single_tensor_adam`: a parameter at a time. Adam's weight-decayed
    /// gradient lives until the next parameter's `grad = grads[i]`;
    /// `exp_avg_sq.sqrt()` until its division makes `denom`, and `denom`
    /// until the next parameter's replaces it.
    fn for_loop(&self, store: &ParamStore) -> Result<(), TensorError> {
        let mut grad: Option<Tensor> = None;
        let mut denom: Option<Tensor> = None;
        for (w, g, s) in self.live(store) {
            grad = None;
            let (m, v) = (&s.exp_avg, &s.exp_avg_sq);
            if !self.decoupled && self.weight_decay != 0.0 {
                let t = phases::temporary(w, "adam.grad.add")?;
                self.phase(0, w, [g, m, v, &t, w])?;
                grad = Some(t);
            }
            let g = grad.as_ref().unwrap_or(g);
            self.phase(1, w, [g, m, v, w, w])?;
            let root = phases::temporary(w, "adam.exp_avg_sq.sqrt")?;
            self.phase(4, w, [g, m, v, &root, w])?;
            let d = phases::temporary(w, "adam.denom")?;
            self.phase(5, w, [g, m, v, &root, &d])?;
            drop(root);
            self.phase(6, w, [g, m, v, &d, w])?;
            let d = denom.insert(d);
            self.phase(3, w, [g, m, v, d, w])?;
        }
        drop((grad, denom));
        Ok(())
    }
}

impl Optimizer for Adam {
    fn name(&self) -> &'static str {
        if self.decoupled {
            "adamw"
        } else {
            "adam"
        }
    }

    fn state_bytes(&self) -> usize {
        self.state
            .iter()
            .flatten()
            .map(|s| {
                s.exp_avg.nbytes()
                    + s.exp_avg_sq.nbytes()
                    + s.step.as_ref().map_or(0, Tensor::nbytes)
            })
            .sum()
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

    /// `_fused_adam` with GradScaler's flag: state made, step counts up,
    /// each kernel skipping on the device where the flag is set.
    fn step_unless_found(
        &mut self,
        store: &mut ParamStore,
        found_inf: &Tensor,
    ) -> Result<(), TensorError> {
        super::fused_only(
            self.implementation,
            "adam step with GradScaler's flag on the device",
        )?;
        self.begin(store)?;
        self.fused(store, Some(found_inf))
    }

    /// `_foreach_sub_(state_steps, found_inf)`: the count back by one, on
    /// the device too.
    fn was_skipped(&mut self) -> Result<(), TensorError> {
        self.step -= 1;
        for s in self.state.iter().flatten() {
            if let Some(step) = &s.step {
                fill::fill(step, self.step as f32)?;
            }
        }
        Ok(())
    }
}
