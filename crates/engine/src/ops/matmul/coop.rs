//! f16 products on cooperative matrices (tensor cores): A and B f16, the
//! sum in f32, C f32 or f16. One subgroup per 8×8 tile of C, the tiles of A
//! and B staged in workgroup memory with zeros past the edges, so any sizes,
//! strides (transposes), offsets and batches run. Used where the device
//! enabled f16 cooperative matrices (`Engine::tensor_core_lanes`); products
//! that need a K split keep the plain kernels.

use super::{Gemm, MatmulParams, Oriented};
use crate::device::compose::{Defs, Elem};
use crate::device::{Kernel, Workgroups};
use crate::ops::MAX_LOOP_ITERATIONS;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../../shaders/matmul_coop.wgsl");

/// The subgroup size to run `g` with on tensor cores, or `None` where the
/// plain kernels must run it: no f16 cooperative matrices, operands not
/// f16, a bf16 output, an implicit (im2col) B, a summed batch, or a grid or
/// K loop past the device's limits.
pub fn usable(g: &Gemm, a: &Tensor, b: &Tensor, c: &Tensor) -> Option<u32> {
    let e = a.engine();
    let lanes = e.tensor_core_lanes()?;
    let max_dim =
        e.gpu()
            .map_or(65_535, |g| g.limits.max_compute_workgroups_per_dimension) as usize;
    let fits = [g.m.div_ceil(8), g.n.div_ceil(8), g.batch]
        .iter()
        .all(|&d| d <= max_dim);
    (a.dtype() == DType::F16
        && b.dtype() == DType::F16
        && matches!(c.dtype(), DType::F32 | DType::F16)
        && e.has_shader_f16()
        && g.implicit_b.is_none()
        && !g.reduce_batch
        && (1..=64).contains(&lanes)
        && g.k.div_ceil(8) <= MAX_LOOP_ITERATIONS
        && fits)
        .then_some(lanes)
}

/// Runs `g` on tensor cores with `lanes` invocations (one subgroup) per
/// 8×8 tile; the caller has checked [`usable`].
pub fn gemm(g: &Gemm, a: &Tensor, b: &Tensor, c: &Tensor, lanes: u32) -> Result<(), TensorError> {
    let u = |x: usize| x as u32;
    let o = Oriented::of(g, false);
    let params = MatmulParams::new(g, &o, 1, g.k, g.c_offset, g.c_batch_stride, g.accumulate);
    let out = c.dtype().elem();
    let defs = Defs::elem(Elem::F16)
        .with("ELEM_C", out.name())
        .with("TC", out.storage())
        .with("SG", lanes);
    let kernel = Kernel::variant(
        format!("matmul_coop[f16→{}, {lanes} lanes]", out.name()),
        SOURCE,
        "main",
        defs,
    );
    a.engine().dispatch(
        &kernel,
        &[&a.slice(), &b.slice(), &c.slice()],
        bytemuck::bytes_of(&params),
        Workgroups::Grid([u(g.n.div_ceil(8)), u(g.m.div_ceil(8)), u(g.batch)]),
    )?;
    Ok(())
}
