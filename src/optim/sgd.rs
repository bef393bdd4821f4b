//! SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD
//! implements it. The momentum buffer is allocated at the first step (as a
//! copy of the gradient, PyTorch's `torch.clone(d_p)`), so memory steps up by
//! one parameter-sized buffer there, and not at all without momentum.

use super::Optimizer;
use crate::nn::ParamStore;
use crate::tensor::{Tensor, TensorError};

const SGD: &str = include_str!("../../shaders/sgd.wgsl");

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
    buffers: Vec<Option<Tensor>>,
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
            buffers: Vec::new(),
        }
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
        self.buffers.resize_with(store.len(), || None);
        let has_momentum = self.momentum != 0.0;
        for (i, p) in store.iter_mut().enumerate() {
            let Some(g) = &p.grad else { continue };
            let first = has_momentum && self.buffers[i].is_none();
            if first {
                let label = format!("sgd.momentum_buffer.{}", p.name);
                self.buffers[i] = Some(Tensor::empty(
                    p.value.engine(),
                    p.value.shape(),
                    p.value.dtype(),
                    &label,
                )?);
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
            if g.dtype() != p.value.dtype() {
                return Err(TensorError::InvalidShape {
                    op: "sgd",
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
                &crate::ops::typed_kernel("sgd", SGD, "main", p.value.dtype()),
                &crate::ops::same_parts(&p.value, &[&p.value.slice(), &g.slice(), &buf.slice()]),
                bytemuck::bytes_of(&params),
                n,
                2,
            )?;
        }
        Ok(())
    }
}
