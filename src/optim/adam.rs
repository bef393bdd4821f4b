//! Adam and AdamW, as torch.optim implements them. State (`exp_avg`,
//! `exp_avg_sq`, one of each per parameter) is allocated lazily at the first
//! step, as PyTorch does, so memory steps up by 2× the parameters there.

use super::Optimizer;
use crate::nn::ParamStore;
use crate::ops::fill;
use crate::tensor::{Tensor, TensorError};

const ADAM: &str = include_str!("../../shaders/adam.wgsl");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    decoupled: u32,
    _p: [u32; 2],
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
    step: i32,
    state: Vec<Option<(Tensor, Tensor)>>,
}

impl Adam {
    /// torch.optim.Adam defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn new(lr: f32) -> Adam {
        Adam {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
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
            .map(|(m, v)| m.nbytes() + v.nbytes())
            .sum()
    }

    fn step(&mut self, store: &mut ParamStore) -> Result<(), TensorError> {
        self.step += 1;
        let (b1, b2) = self.betas;
        let bc1 = 1.0 - b1.powi(self.step);
        let bc2_sqrt = (1.0 - b2.powi(self.step)).sqrt();
        self.state.resize_with(store.len(), || None);
        for (i, p) in store.iter_mut().enumerate() {
            let Some(g) = &p.grad else { continue };
            if self.state[i].is_none() {
                let e = p.value.engine();
                // zeros_like(param): the parameter's dtype (f16 after half()).
                let d = p.value.dtype();
                let m = fill::zeros_as(e, p.value.shape(), d, &format!("adam.exp_avg.{}", p.name))?;
                let v = fill::zeros_as(
                    e,
                    p.value.shape(),
                    d,
                    &format!("adam.exp_avg_sq.{}", p.name),
                )?;
                self.state[i] = Some((m, v));
            }
            let Some((m, v)) = &self.state[i] else {
                continue;
            };
            let n = p.value.numel();
            let params = Params {
                n: n as u32,
                decoupled: self.decoupled as u32,
                _p: [0; 2],
                lr: self.lr,
                beta1: b1,
                beta2: b2,
                eps: self.eps,
                weight_decay: self.weight_decay,
                bc1,
                bc2_sqrt,
                _q: 0.0,
            };
            if g.dtype() != p.value.dtype() {
                return Err(TensorError::InvalidShape {
                    op: "adam",
                    message: format!(
                        "{}: a {} gradient for a {} parameter",
                        p.name,
                        g.dtype(),
                        p.value.dtype()
                    ),
                });
            }
            crate::ops::launch_flat(
                &p.value,
                &crate::ops::typed_kernel("adam", ADAM, "main", p.value.dtype()),
                &crate::ops::same_parts(
                    &p.value,
                    &[&p.value.slice(), &g.slice(), &m.slice(), &v.slice()],
                ),
                bytemuck::bytes_of(&params),
                n,
                2,
            )?;
        }
        Ok(())
    }
}
