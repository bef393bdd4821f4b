//! GradScaler (torch.amp.GradScaler): f16 gradients of small losses flush to
//! zero, so the loss is multiplied by a large scale before backward and the
//! parameters' gradients divided by it before the optimizer step. When any
//! gradient is inf or NaN (the scale was too large) the step is skipped and
//! the scale backs off; after `growth_interval` clean steps in a row it
//! grows. Defaults are PyTorch's: init 65536 (2^16), growth ×2, backoff
//! ×0.5, interval 2000.

use crate::autograd::param::ParamStore;
use crate::device::Kernel;
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/unscale.wgsl");
const UNSCALE: Kernel = Kernel::fixed("unscale", SOURCE, "main");

/// The unscale as a list op: an element an invocation, up to 8 gradients
/// a dispatch.
const LIST: super::phases::ListKernel = super::phases::ListKernel {
    name: "unscale",
    source: SOURCE,
    per_invocation: 1,
    most: 8,
};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    inv_scale: f32,
    _pad: [u32; 2],
}

/// One gradient, in element ranges where it needs more windows than one
/// dispatch may bind.
fn unscale_one(g: &Tensor, found: &Tensor, inv: f32) -> Result<(), TensorError> {
    let params = Params {
        n: g.numel() as u32,
        inv_scale: inv,
        _pad: [0; 2],
    };
    crate::ops::launch_flat(
        g,
        &UNSCALE,
        &[
            (&g.slice(), crate::device::Part::Elements(4)),
            (&found.slice(), crate::device::Part::Whole),
        ],
        bytemuck::bytes_of(&params),
        g.numel(),
        1,
    )
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GradScaler {
    pub scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u32,
    /// Clean steps since the last change of scale.
    pub growth_tracker: u32,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
        }
    }
}

impl GradScaler {
    /// `scaler.unscale_(opt)`: divides every gradient by the scale in place
    /// and says whether any was inf or NaN (one readback of a flag).
    pub fn unscale(&self, store: &mut ParamStore) -> Result<bool, TensorError> {
        match self.unscale_on_device(store)? {
            Some(found) => Ok(GradScaler::found(&found.to_vec()?)),
            None => Ok(false),
        }
    }

    /// Whether a flag [`GradScaler::unscale_on_device`] wrote, read back,
    /// is set: fill wrote 0.0 (bits 0); the kernel writes the integer 1.
    pub fn found(flag: &[f32]) -> bool {
        flag.first().is_some_and(|v| v.to_bits() != 0)
    }

    /// [`GradScaler::unscale`] without the read: its flag (one element, a
    /// temporary) stays on the device for a fused optimizer to skip on, as
    /// PyTorch's GradScaler hands `found_inf` to `_step_supports_amp_scaling`
    /// optimizers. (PyTorch then only checks, with an inverse scale of 1,
    /// and the fused kernel unscales: the same values for a step that runs,
    /// the scale being a power of two; after a skipped one PyTorch's `.grad`
    /// stays scaled, vramlab's is unscaled.) None without parameters.
    pub fn unscale_on_device(&self, store: &mut ParamStore) -> Result<Option<Tensor>, TensorError> {
        let Some(engine) = store.iter().next().map(|p| p.value.engine().clone()) else {
            return Ok(None);
        };
        let found = Tensor::empty_as(
            &engine,
            &[1],
            DType::F32,
            "grad_scaler.found_inf",
            Some(Category::Temporary),
        )?;
        crate::ops::fill::fill(&found, 0.0)?;
        let inv = 1.0 / self.scale;
        let mut items: Vec<Vec<&Tensor>> = Vec::new();
        for p in store.iter() {
            let Some(g) = &p.grad else { continue };
            if g.dtype() != DType::F32 {
                return Err(TensorError::UnsupportedDType {
                    op: "grad_scaler.unscale",
                    dtype: g.dtype(),
                });
            }
            if g.numel() > 0 {
                items.push(vec![g]);
            }
        }
        // Lists of gradients a dispatch (bindings allowing); a gradient past
        // one window alone, in ranges.
        let params = Params {
            n: 0,
            inv_scale: inv,
            _pad: [0; 2],
        };
        super::phases::run_all(
            &LIST,
            &items,
            &[&found],
            bytemuck::bytes_of(&params),
            &|t| unscale_one(t[0], &found, inv),
        )?;
        Ok(Some(found))
    }

    /// `scaler.update()` after a step that found `found_inf`.
    pub fn update(&mut self, found_inf: bool) {
        if found_inf {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        }
    }
}
