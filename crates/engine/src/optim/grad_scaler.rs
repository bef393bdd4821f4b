//! GradScaler (torch.amp.GradScaler): f16 gradients of small losses flush to
//! zero, so the loss is multiplied by a large scale before backward and the
//! parameters' gradients divided by it before the optimizer step. When any
//! gradient is inf or NaN (the scale was too large) the step is skipped and
//! the scale backs off; after `growth_interval` clean steps in a row it
//! grows. Defaults are PyTorch's: init 65536 (2^16), growth ×2, backoff
//! ×0.5, interval 2000.

use crate::autograd::param::ParamStore;
use crate::device::compose::{Defs, Elem};
use crate::device::{BufferSlice, Kernel};
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

const UNSCALE: Kernel = Kernel::fixed(
    "unscale",
    include_str!("../../../../shaders/unscale.wgsl"),
    "main",
);

/// Gradients one list dispatch takes at most (the shader's `ends` table).
const LIST_MAX: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    inv_scale: f32,
    _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ListParams {
    n: u32,
    inv_scale: f32,
    _pad: [u32; 2],
    /// Where each gradient's workgroups (256 elements each) end.
    ends: [u32; LIST_MAX],
    /// Each gradient's elements.
    counts: [u32; LIST_MAX],
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

/// Several gradients, each bound whole, in one dispatch over their
/// concatenation (one gradient alone takes the plain kernel).
fn unscale_list(list: &[&Tensor], found: &Tensor, inv: f32) -> Result<(), TensorError> {
    match list {
        [] => return Ok(()),
        [g] => return unscale_one(g, found, inv),
        _ => {}
    }
    let mut params = ListParams {
        n: 0,
        inv_scale: inv,
        _pad: [0; 2],
        ends: [0; LIST_MAX],
        counts: [0; LIST_MAX],
    };
    for (t, g) in list.iter().enumerate() {
        params.n += (g.numel() as u32).div_ceil(256);
        params.ends[t] = params.n;
        params.counts[t] = g.numel() as u32;
    }
    let kernel = Kernel::variant(
        format!("unscale[list {}]", list.len()),
        UNSCALE.source,
        "main",
        Defs::elem(Elem::F32).with("LIST", list.len()),
    );
    let slices: Vec<_> = list.iter().map(|g| g.slice()).collect();
    let found = found.slice();
    let mut bindings: Vec<&BufferSlice> = slices.iter().collect();
    bindings.push(&found);
    crate::ops::launch(
        list[0],
        &kernel,
        &bindings,
        bytemuck::bytes_of(&params),
        params.n as usize * 256,
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
        let Some(engine) = store.iter().next().map(|p| p.value.engine().clone()) else {
            return Ok(false);
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
        // Gradients go out in lists of up to `most` (bindings allowing),
        // one dispatch each; one that needs several windows goes alone.
        let most = engine.gpu().filter(|g| g.list_ops()).map_or(1, |g| {
            (g.limits.max_storage_buffers_per_shader_stage as usize)
                .saturating_sub(1)
                .min(LIST_MAX)
        });
        let mut list: Vec<&Tensor> = Vec::new();
        let mut total = 0u64;
        for p in store.iter() {
            let Some(g) = &p.grad else { continue };
            if g.dtype() != DType::F32 {
                return Err(TensorError::UnsupportedDType {
                    op: "grad_scaler.unscale",
                    dtype: g.dtype(),
                });
            }
            let n = g.numel() as u64;
            if n == 0 {
                continue;
            }
            let listed = most >= 2 && engine.gpu().is_some_and(|d| d.binds_whole(&g.slice()));
            if !listed {
                unscale_one(g, &found, inv)?;
                continue;
            }
            // Each in whole workgroups of 256 elements.
            let n = n.div_ceil(256) * 256;
            if list.len() == most || total + n > u32::MAX as u64 {
                unscale_list(&list, &found, inv)?;
                list.clear();
                total = 0;
            }
            list.push(g);
            total += n;
        }
        unscale_list(&list, &found, inv)?;
        // fill wrote 0.0 (bits 0); the kernel writes the integer 1.
        let bits = found.to_vec()?[0].to_bits();
        Ok(bits != 0)
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
