//! Ops: each file holds one op's kernel bindings, forward and backward
//! (autograd/ composes them into differentiable functions). Ops never call wgpu; they ask the device layer to
//! dispatch a named kernel with bindings and a small params struct.

pub mod batchnorm;
pub mod bias;
pub mod cast;
pub mod conv2d;
pub mod cross_entropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod fill;
pub mod gelu;
pub mod layernorm;
pub mod linear;
pub mod linear_cross_entropy;
pub mod matmul;
pub mod maxpool;
pub mod mean;
pub mod mse;
pub mod nll;
pub mod partials;
pub mod relu;
pub mod softmax;
pub mod swap_axes;

use crate::device::{BufferSlice, Flat, Kernel, Part, Workgroups};
use crate::tensor::{Tensor, TensorError};

/// Most loop iterations one shader invocation may run in one dispatch.
/// llvmpipe (Mesa's software rasterizer, CI's GPU) silently ends an
/// invocation's loops after 65,535 iterations counted over all of them
/// (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS), which truncated a 100,352-long
/// matmul reduction and a 50,257-class loss row to garbage. Long reductions
/// are split across dispatches that accumulate, or walked by a whole
/// workgroup (`#include row_reduce`, up to [`LONGEST_REDUCED_ROW`]).
pub const MAX_LOOP_ITERATIONS: usize = 16_384;

/// The longest row a workgroup-per-row kernel (`#include row_reduce`)
/// takes: each of its 256 invocations then walks at most
/// [`MAX_LOOP_ITERATIONS`] entries a pass, three passes under llvmpipe's
/// 65,535 iterations.
pub const LONGEST_REDUCED_ROW: usize = 256 * MAX_LOOP_ITERATIONS;

/// Refuses a tensor whose last axis is longer than `max` (or empty).
pub(crate) fn check_row_length(
    op: &'static str,
    x: &Tensor,
    max: usize,
) -> Result<(), TensorError> {
    let cols = *x.shape().last().unwrap_or(&0);
    if cols == 0 || cols > max {
        return Err(TensorError::LastAxis {
            op,
            shape: x.shape().to_vec(),
            max,
        });
    }
    Ok(())
}

/// 256 threads per workgroup for elementwise kernels (WGSL `@workgroup_size(256)`).
pub(crate) const ELEMENTWISE_WORKGROUP: u64 = 256;

/// Params for kernels that only need a count, padded to 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CountParams {
    pub n: u32,
    pub _pad: [u32; 3],
}

impl CountParams {
    pub fn new(n: usize) -> Self {
        CountParams {
            n: n as u32,
            _pad: [0; 3],
        }
    }
}

/// Errors unless both tensors have the same shape and engine.
pub(crate) fn same_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(), TensorError> {
    if !a.engine().same(b.engine()) {
        return Err(TensorError::DifferentEngines { op });
    }
    if a.shape() != b.shape() {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    Ok(())
}

/// Errors unless both tensors have the same dtype (ops convert explicitly,
/// as autocast does, never silently).
pub(crate) fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(), TensorError> {
    if a.dtype() != b.dtype() {
        return Err(TensorError::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}

/// Kernels index with u32. A simulated device runs no kernels, so it
/// models tensors of any size (what CUDA would run).
pub(crate) fn check_u32(op: &'static str, t: &Tensor) -> Result<(), TensorError> {
    if t.numel() > u32::MAX as usize && !t.engine().is_simulated() {
        return Err(TensorError::TooManyElements {
            op,
            numel: t.numel(),
        });
    }
    Ok(())
}

/// An elementwise kernel's variant for `dtype` (named plainly for f32, so
/// f32 tables read as before, and `name[f16]` / `name[bf16]` otherwise).
pub(crate) fn typed_kernel(
    name: &'static str,
    source: &'static str,
    entry: &'static str,
    dtype: crate::tensor::DType,
) -> Kernel {
    if dtype == crate::tensor::DType::F32 {
        return Kernel::fixed(name, source, entry);
    }
    Kernel::variant(
        format!("{name}[{dtype}]"),
        source,
        entry,
        crate::device::compose::Defs::elem(dtype.elem()),
    )
}

/// Dispatches a flat elementwise kernel whose bindings all hold `n`
/// elements of `t`'s dtype (see [`launch_flat`]): its `VEC4` variant (f32,
/// one invocation per vec4) where `t` is f32 and `n` a multiple of 4, else
/// its pairwise variant in `t`'s dtype. llvmpipe pays per access, not per
/// byte (docs/kernels.md, measured with an example since removed), so
/// four floats per load and store cost less than two.
pub(crate) fn launch_vec4_or_pairs(
    t: &Tensor,
    name: &'static str,
    source: &'static str,
    bindings: &[&BufferSlice],
    params: &[u8],
    n: usize,
) -> Result<(), TensorError> {
    let parts = same_parts(t, bindings);
    if t.dtype() == crate::tensor::DType::F32 && n.is_multiple_of(4) {
        let kernel = Kernel::variant(
            format!("{name}[f32 vec4]"),
            source,
            "main",
            crate::device::compose::Defs::elem(crate::device::compose::Elem::F32).with("VEC4", 1u8),
        );
        return launch_flat(t, &kernel, &parts, params, n, 4);
    }
    launch_flat(
        t,
        &typed_kernel(name, source, "main", t.dtype()),
        &parts,
        params,
        n,
        2,
    )
}

/// Every binding split by elements of `t`'s dtype: the flat kernels whose
/// tensors all share `t`'s shape and dtype.
pub(crate) fn same_parts<'a>(
    t: &Tensor,
    bindings: &[&'a BufferSlice],
) -> Vec<(&'a BufferSlice, Part)> {
    let bytes = t.dtype().size_in_bytes() as u64;
    bindings
        .iter()
        .map(|b| (*b, Part::Elements(bytes)))
        .collect()
}

/// Dispatches a flat kernel over `n` elements, `per` per invocation, 256
/// invocations per workgroup: invocation `i` touches only elements
/// `[i·per, (i+1)·per)` of each `Part::Elements` binding and `params`
/// begin with `n` as a `u32`. Where its tensors need more windows than one
/// dispatch may bind, it runs range by range (`device::flat`), so such a
/// kernel runs on tensors of any size.
pub(crate) fn launch_flat(
    t: &Tensor,
    kernel: &Kernel,
    bindings: &[(&BufferSlice, Part)],
    params: &[u8],
    n: usize,
    per: u64,
) -> Result<(), TensorError> {
    t.engine().dispatch_flat(
        kernel,
        bindings,
        params,
        Flat {
            elements: n as u64,
            per_invocation: per,
            workgroup: ELEMENTWISE_WORKGROUP,
            align: 1,
        },
    )?;
    Ok(())
}

/// Dispatches a row kernel: `workgroup` rows to a group of invocations (1:
/// a whole workgroup a row, `#include row_reduce`), each touching only its own row of every `Part::Elements`
/// binding (a part's bytes are then a row's), with `params` beginning
/// with the row count. Past the binding budget it runs in ranges of rows
/// (`device::flat`), each starting on a multiple of `align` rows.
pub(crate) fn launch_rows(
    t: &Tensor,
    kernel: &Kernel,
    bindings: &[(&BufferSlice, Part)],
    params: &[u8],
    rows: usize,
    workgroup: u64,
    align: usize,
) -> Result<(), TensorError> {
    t.engine().dispatch_flat(
        kernel,
        bindings,
        params,
        Flat {
            elements: rows as u64,
            per_invocation: 1,
            workgroup,
            align: align as u64,
        },
    )?;
    Ok(())
}

/// Dispatches a pairwise elementwise kernel (one invocation per two
/// elements, so a packed bf16 word has one writer) over `n` elements.
pub(crate) fn launch_pairs(
    t: &Tensor,
    kernel: &Kernel,
    bindings: &[&BufferSlice],
    params: &[u8],
    n: usize,
) -> Result<(), TensorError> {
    launch(t, kernel, bindings, params, n.div_ceil(2))
}

/// Dispatches an elementwise kernel (256 threads per group) over `n` items.
/// A grid for `plane` planes of `inner` positions (col2im, bias): x covers
/// the positions 256 at a time (at most the device's reach, the kernels
/// stepping by it), (y, z) the planes, so a kernel derives its plane's
/// coordinates once per workgroup instead of once per element.
pub(crate) fn plane_grid(
    x: &Tensor,
    inner: usize,
    plane: usize,
) -> Result<Workgroups, TensorError> {
    let max = x
        .engine()
        .gpu()
        .map(|g| g.limits.max_compute_workgroups_per_dimension as usize)
        .unwrap_or(65_535);
    // The kernels walk a plane longer than x's reach in strides of it.
    let gx = inner.div_ceil(256).min(max);
    let gy = plane.min(max);
    let gz = plane.div_ceil(gy.max(1));
    if gz > max {
        return Err(TensorError::GridTooLarge {
            op: "grid",
            inner,
            plane,
            max,
        });
    }
    Ok(Workgroups::Grid([gx as u32, gy as u32, gz as u32]))
}

pub fn launch(
    t: &Tensor,
    kernel: &Kernel,
    bindings: &[&BufferSlice],
    params: &[u8],
    n: usize,
) -> Result<(), TensorError> {
    t.engine().dispatch(
        kernel,
        bindings,
        params,
        Workgroups::Linear((n as u64).div_ceil(ELEMENTWISE_WORKGROUP)),
    )?;
    Ok(())
}
