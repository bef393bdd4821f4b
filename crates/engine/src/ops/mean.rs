//! Mean over one axis of a tensor viewed as `[outer, mid, inner]`, and its
//! backward (each gradient spread evenly back over the axis). Three ops are
//! this one reduction: the mean of everything (a loss), global average
//! pooling (`[N, C, H, W] → [N, C]`, mean over H·W) and the mean over a
//! sequence (`[B, S, D] → [B, D]`).

use super::{check_u32, launch, MAX_LOOP_ITERATIONS};
use crate::device::compose::Defs;
use crate::device::Kernel;
use crate::tensor::{DType, Tensor, TensorError};

const SOURCE: &str = include_str!("../../../../shaders/mean_axis.wgsl");
fn kernel(name: &str, entry: &'static str, dtype: DType) -> Kernel {
    Kernel::variant(
        if dtype == DType::F32 {
            name.to_string()
        } else {
            format!("{name}[{dtype}]")
        },
        SOURCE,
        entry,
        Defs::elem(dtype.elem()).with("BACKWARD", (entry == "backward") as u8),
    )
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    outer: u32,
    mid: u32,
    inner: u32,
    scale: f32,
    begin: u32,
    end: u32,
    accumulate: u32,
    _p: u32,
}

/// Which axis to average: the tensor is read as `[outer, mid, inner]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axis {
    pub outer: usize,
    pub mid: usize,
    pub inner: usize,
}

impl Axis {
    /// Axis `dim` of `shape`.
    pub fn of(shape: &[usize], dim: usize) -> Axis {
        Axis {
            outer: shape[..dim].iter().product(),
            mid: shape[dim],
            inner: shape[dim + 1..].iter().product(),
        }
    }

    fn params(&self, begin: usize, end: usize, accumulate: bool) -> Params {
        Params {
            outer: self.outer as u32,
            mid: self.mid as u32,
            inner: self.inner as u32,
            scale: 1.0 / self.mid as f32,
            begin: begin as u32,
            end: end as u32,
            accumulate: accumulate as u32,
            _p: 0,
        }
    }
}

/// Mean over `axis`, giving a tensor of `out_shape` (outer·inner elements).
pub fn mean_axis(
    x: &Tensor,
    axis: Axis,
    out_shape: &[usize],
    label: &str,
) -> Result<Tensor, TensorError> {
    const OP: &str = "mean";
    check_u32(OP, x)?;
    if axis.mid == 0 || axis.outer * axis.mid * axis.inner != x.numel() {
        return Err(TensorError::ReduceAxis {
            op: OP,
            shape: x.shape().to_vec(),
            outer: axis.outer,
            mid: axis.mid,
            inner: axis.inner,
        });
    }
    // Summed in f32; a 16-bit input gets a 16-bit mean, rounded once.
    let y = if x.dtype() == DType::F32 {
        Tensor::empty(x.engine(), out_shape, DType::F32, label)?
    } else {
        Tensor::empty_as(
            x.engine(),
            out_shape,
            DType::F32,
            "mean.f32_sum",
            Some(crate::memory::Category::Workspace),
        )?
    };
    let step = MAX_LOOP_ITERATIONS;
    for begin in (0..axis.mid).step_by(step) {
        let p = axis.params(begin, (begin + step).min(axis.mid), begin > 0);
        launch(
            x,
            &kernel("mean_forward", "forward", x.dtype()),
            &[&x.slice(), &y.slice()],
            bytemuck::bytes_of(&p),
            axis.outer * axis.inner,
        )?;
    }
    if x.dtype() != DType::F32 {
        return super::cast::cast(&y, x.dtype(), label);
    }
    Ok(y)
}

/// Spreads `g` (outer·inner elements) back over the axis, giving `in_shape`.
pub fn mean_axis_backward(
    g: &Tensor,
    axis: Axis,
    in_shape: &[usize],
) -> Result<Tensor, TensorError> {
    if g.numel() != axis.outer * axis.inner {
        return Err(TensorError::ShapeMismatch {
            op: "mean backward",
            lhs: g.shape().to_vec(),
            rhs: in_shape.to_vec(),
        });
    }
    let dx = Tensor::empty(g.engine(), in_shape, g.dtype(), "mean.grad_input")?;
    let p = axis.params(0, 0, false);
    super::launch_pairs(
        g,
        &kernel("mean_backward", "backward", g.dtype()),
        &[&g.slice(), &dx.slice()],
        bytemuck::bytes_of(&p),
        dx.numel(),
    )?;
    Ok(dx)
}

/// The mean of all elements, a one-element tensor `[1]`.
pub fn mean(x: &Tensor, label: &str) -> Result<Tensor, TensorError> {
    let axis = Axis {
        outer: 1,
        mid: x.numel(),
        inner: 1,
    };
    mean_axis(x, axis, &[1], label)
}

/// Global average pooling: `[N, C, H, W] → [N, C]`.
pub fn global_avg_pool(x: &Tensor) -> Result<Tensor, TensorError> {
    let s = x.shape();
    if s.len() != 4 {
        return Err(TensorError::WrongShape {
            op: "global_avg_pool",
            want: "[N, C, H, W]",
            sizes: Vec::new(),
            got: s.to_vec(),
        });
    }
    let axis = Axis {
        outer: s[0] * s[1],
        mid: s[2] * s[3],
        inner: 1,
    };
    mean_axis(x, axis, &[s[0], s[1]], "global_avg_pool.out")
}
