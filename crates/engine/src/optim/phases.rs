//! What the foreach and for-loop implementations share: a temporary the
//! size of a parameter, one pass of a phase kernel over a parameter, and
//! one over lists of parameters (a foreach list op).

use crate::autograd::param::Parameter;
use crate::device::compose::Defs;
use crate::device::Kernel;
use crate::memory::Category;
use crate::tensor::{DType, Tensor, TensorError};

/// Tensors one list dispatch takes at most: the `ends` and `counts` tables
/// of the list kernels (`#include list` in their shaders).
const TABLE: usize = 16;

/// A phase kernel family's variant for `dtype` over `count` parameters
/// (1: a parameter at a time, named as before lists; more: `LIST`).
pub(super) fn kernel(name: &str, source: &'static str, dtype: DType, count: usize) -> Kernel {
    let defs = Defs::elem(dtype.elem()).with("COUNT", count);
    let (name, defs) = match (dtype, count) {
        (DType::F32, 1) => (name.to_string(), defs),
        (_, 1) => (format!("{name}[{dtype}]"), defs),
        (DType::F32, n) => (format!("{name}[list {n}]"), defs.with("LIST", 1)),
        (_, n) => (format!("{name}[{dtype} list {n}]"), defs.with("LIST", 1)),
    };
    Kernel::variant(name, source, "main", defs)
}

/// A list kernel family: its name and source, the elements each invocation
/// takes (the `PER` of `#include list`), and the most tensors a list.
pub(super) struct ListKernel {
    pub name: &'static str,
    pub source: &'static str,
    pub per_invocation: u64,
    pub most: usize,
}

/// One op over many tensors, as a foreach list op: `items[k]` binds item
/// k's tensors (the one whose elements it covers first), `shared` is bound
/// after all of them, `params` are the kernel's parameters (16-byte
/// multiple, the element count first, filled here). Lists of up to
/// `kind.most` items a dispatch where each of their tensors binds whole and
/// the device binds them all; the rest go to `alone`, an item at a time.
/// A list's items run the code they run alone, so the bits do not change.
pub(super) fn run_all(
    kind: &ListKernel,
    items: &[Vec<&Tensor>],
    shared: &[&Tensor],
    params: &[u8],
    alone: &dyn Fn(&[&Tensor]) -> Result<(), TensorError>,
) -> Result<(), TensorError> {
    let Some(first) = items.first() else {
        return Ok(());
    };
    let e = first[0].engine();
    let per = first.len();
    let most = e.gpu().filter(|g| g.list_ops()).map_or(1, |g| {
        let limit = g.limits.max_storage_buffers_per_shader_stage as usize;
        (limit.saturating_sub(shared.len()) / per).min(kind.most.min(TABLE))
    });
    let mut list: Vec<&[&Tensor]> = Vec::new();
    let mut invocations = 0u64;
    for item in items {
        let w = item[0];
        // Its invocations, in whole workgroups (run_list).
        let need = (w.numel() as u64)
            .div_ceil(kind.per_invocation)
            .div_ceil(256)
            * 256;
        let whole = e
            .gpu()
            .is_some_and(|g| item.iter().all(|t| g.binds_whole(&t.slice())));
        if most < 2 || !whole || need == 0 {
            alone(item)?;
            continue;
        }
        let joins = list.len() < most
            && list.first().is_none_or(|l| l[0].dtype() == w.dtype())
            && invocations + need <= u32::MAX as u64;
        if !joins {
            run_list(kind, &list, shared, params, alone)?;
            list.clear();
            invocations = 0;
        }
        list.push(item);
        invocations += need;
    }
    run_list(kind, &list, shared, params, alone)
}

/// One dispatch over `list` (one item alone goes to `alone`), each item in
/// whole workgroups of 256 invocations: `params`, then where each item's
/// workgroups end, then its element count.
fn run_list(
    kind: &ListKernel,
    list: &[&[&Tensor]],
    shared: &[&Tensor],
    params: &[u8],
    alone: &dyn Fn(&[&Tensor]) -> Result<(), TensorError>,
) -> Result<(), TensorError> {
    match list {
        [] => return Ok(()),
        [item] => return alone(item),
        _ => {}
    }
    let (mut ends, mut counts) = ([0u32; TABLE], [0u32; TABLE]);
    let mut groups = 0u32;
    for (k, item) in list.iter().enumerate() {
        groups += (item[0].numel() as u64)
            .div_ceil(kind.per_invocation)
            .div_ceil(256) as u32;
        ends[k] = groups;
        counts[k] = item[0].numel() as u32;
    }
    let mut bytes = params.to_vec();
    bytes[..4].copy_from_slice(&groups.to_le_bytes());
    bytes.extend_from_slice(bytemuck::cast_slice(&ends));
    bytes.extend_from_slice(bytemuck::cast_slice(&counts));
    let slices: Vec<_> = list
        .iter()
        .flat_map(|i| i.iter())
        .chain(shared)
        .map(|t| t.slice())
        .collect();
    let refs: Vec<_> = slices.iter().collect();
    let w = list[0][0];
    crate::ops::launch(
        w,
        &kernel(kind.name, kind.source, w.dtype(), list.len()),
        &refs,
        &bytes,
        groups as usize * 256,
    )
}

/// A parameter-sized temporary in the parameter's dtype (PyTorch's foreach
/// and for-loop temporaries are the parameter's dtype, f16 after half()).
pub(super) fn temporary(like: &Tensor, label: &str) -> Result<Tensor, TensorError> {
    Tensor::empty_as(
        like.engine(),
        like.shape(),
        like.dtype(),
        label,
        Some(Category::Temporary),
    )
}

/// One pass of a phase kernel (two elements per invocation) over `like`'s
/// elements; every binding holds as many elements of its dtype.
pub(super) fn run(
    kernel: &crate::device::Kernel,
    like: &Tensor,
    bindings: &[&Tensor],
    params: &[u8],
) -> Result<(), TensorError> {
    let slices: Vec<_> = bindings.iter().map(|t| t.slice()).collect();
    let refs: Vec<_> = slices.iter().collect();
    crate::ops::launch_flat(
        like,
        kernel,
        &crate::ops::same_parts(like, &refs),
        params,
        like.numel(),
        2,
    )
}

/// Drops a list of temporaries last to first, as CPython frees a list's
/// items (the event log then reads as PyTorch's).
pub(super) fn free_in_reverse(mut list: Vec<Tensor>) {
    while list.pop().is_some() {}
}

/// The gradient of `p`, refused unless it has the parameter's dtype (the
/// update kernels read both as one element type).
pub(super) fn grad_of<'a>(
    op: &'static str,
    p: &'a Parameter,
) -> Result<Option<&'a Tensor>, TensorError> {
    match &p.grad {
        Some(g) if g.dtype() != p.value.dtype() => Err(TensorError::GradientDType {
            op,
            param: p.name.clone(),
            grad: g.dtype(),
            value: p.value.dtype(),
        }),
        g => Ok(g.as_ref()),
    }
}
