//! The tensor handle: shape, dtype, label, and shared storage in an allocator
//! block.

use super::dtype::DType;
use super::engine::{Engine, Storage};
use super::error::TensorError;
use crate::device::BufferSlice;
use crate::memory::Category;
use std::sync::Arc;

/// A tensor on the GPU. Clones share storage.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    shape: Vec<usize>,
    dtype: DType,
    label: Arc<str>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?}, {}, {:?})",
            self.shape, self.dtype, self.label
        )
    }
}

fn numel_of(op: &'static str, shape: &[usize]) -> Result<usize, TensorError> {
    // Checked: a shape from a flag or a file must not wrap around to a
    // small tensor.
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| {
            (n as u64)
                .checked_mul(4)
                .is_some_and(|b| b <= crate::memory::constants::MAX_BYTES)
        })
        .ok_or_else(|| TensorError::TooLarge {
            op,
            shape: shape.to_vec(),
        })?;
    if n == 0 {
        return Err(TensorError::Empty {
            op,
            shape: shape.to_vec(),
        });
    }
    Ok(n)
}

/// Elements [`Tensor::generated`] makes and uploads at a time: a tensor
/// larger than this never has more than a chunk of its values, their bytes
/// and their staging copy on the host at once (on a CPU adapter the tensor
/// itself already lives in the host's memory). 64 MiB of f32.
pub const GENERATE_CHUNK: usize = 1 << 24;

/// `values` as a tensor of `dtype` stores them: f32 as they are, 16-bit
/// types rounded to nearest even (PyTorch's `.to(dtype)`).
fn stored_bytes(values: &[f32], dtype: DType) -> std::borrow::Cow<'_, [u8]> {
    match dtype {
        DType::F32 => std::borrow::Cow::Borrowed(bytemuck::cast_slice(values)),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::Bf16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

impl Tensor {
    /// An uninitialised tensor (its block may hold an earlier tensor's bytes),
    /// tagged with the engine's current scope.
    pub fn empty(
        engine: &Engine,
        shape: &[usize],
        dtype: DType,
        label: &str,
    ) -> Result<Tensor, TensorError> {
        Self::empty_as(engine, shape, dtype, label, None)
    }

    /// `empty`, of an explicit category (an op's workspace or temporaries).
    pub fn empty_as(
        engine: &Engine,
        shape: &[usize],
        dtype: DType,
        label: &str,
        category: Option<Category>,
    ) -> Result<Tensor, TensorError> {
        let n = numel_of("torch.empty", shape)?;
        let storage = engine.allocate((n * dtype.size_in_bytes()) as u64, label, category)?;
        Ok(Tensor {
            storage: Arc::new(storage),
            shape: shape.to_vec(),
            dtype,
            label: Arc::from(label),
        })
    }

    /// A tensor holding `data` (row-major), f32.
    pub fn from_slice(
        engine: &Engine,
        data: &[f32],
        shape: &[usize],
        label: &str,
    ) -> Result<Tensor, TensorError> {
        Self::from_pod(engine, data, shape, DType::F32, label)
    }

    /// A tensor holding `data` stored as f16.
    pub fn from_f16(
        engine: &Engine,
        data: &[half::f16],
        shape: &[usize],
        label: &str,
    ) -> Result<Tensor, TensorError> {
        Self::from_pod(engine, data, shape, DType::F16, label)
    }

    /// A tensor holding `data` stored as bf16 (two per 32-bit word).
    pub fn from_bf16(
        engine: &Engine,
        data: &[half::bf16],
        shape: &[usize],
        label: &str,
    ) -> Result<Tensor, TensorError> {
        Self::from_pod(engine, data, shape, DType::Bf16, label)
    }

    /// A tensor of `dtype` holding what `values` makes, rounded to
    /// `dtype`: `values(n)` gives the next `n` elements, asked for in
    /// chunks of [`GENERATE_CHUNK`] in order. The memory is allocated
    /// first, so a size the device cannot hold is an error before any host
    /// memory is spent on it; on a simulated device `values` is never
    /// called (no bytes exist there).
    pub fn generated(
        engine: &Engine,
        shape: &[usize],
        dtype: DType,
        label: &str,
        mut values: impl FnMut(usize) -> Vec<f32>,
    ) -> Result<Tensor, TensorError> {
        let t = Tensor::empty(engine, shape, dtype, label)?;
        if engine.is_simulated() {
            return Ok(t);
        }
        let (n, whole, width) = (t.numel(), t.slice(), dtype.size_in_bytes());
        let mut done = 0;
        while done < n {
            let m = GENERATE_CHUNK.min(n - done);
            let data = values(m);
            let bytes = stored_bytes(&data, dtype);
            let part = crate::device::BufferSlice {
                buffer: whole.buffer.clone(),
                offset: whole.offset + (done * width) as u64,
                size: (m * width) as u64,
            };
            engine.upload(&part, &bytes)?;
            done += m;
            // The staging copies go once the GPU has taken them, so at
            // most a chunk's worth waits on the host at a time.
            if done < n {
                engine.synchronize()?;
            }
        }
        Ok(t)
    }

    /// Overwrites this tensor's values in place with `values`, rounded to
    /// its dtype (`tensor.copy_(values)`): every tensor sharing its storage
    /// sees them.
    pub fn write_f32(&self, values: &[f32]) -> Result<(), TensorError> {
        if values.len() != self.numel() {
            return Err(TensorError::DataLength {
                got: values.len(),
                want: self.numel(),
                shape: self.shape().to_vec(),
            });
        }
        self.engine()
            .upload(&self.slice(), &stored_bytes(values, self.dtype()))?;
        Ok(())
    }

    /// A tensor holding `data` rounded to `dtype` (round to nearest even, as
    /// PyTorch's `.to(dtype)`).
    pub fn from_f32_as(
        engine: &Engine,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
        label: &str,
    ) -> Result<Tensor, TensorError> {
        match dtype {
            DType::F32 => Self::from_slice(engine, data, shape, label),
            DType::F16 => {
                let h: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
                Self::from_f16(engine, &h, shape, label)
            }
            DType::Bf16 => {
                let h: Vec<half::bf16> = data.iter().map(|&v| half::bf16::from_f32(v)).collect();
                Self::from_bf16(engine, &h, shape, label)
            }
        }
    }

    fn from_pod<T: bytemuck::Pod>(
        engine: &Engine,
        data: &[T],
        shape: &[usize],
        dtype: DType,
        label: &str,
    ) -> Result<Tensor, TensorError> {
        let n = numel_of("from_slice", shape)?;
        if data.len() != n {
            return Err(TensorError::DataLength {
                got: data.len(),
                want: n,
                shape: shape.to_vec(),
            });
        }
        let t = Tensor::empty(engine, shape, dtype, label)?;
        engine.upload(&t.slice(), bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// Whether this handle is the only one to its storage (no view or
    /// saved copy shares it), so writing it in place is invisible elsewhere.
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
    }

    /// Called when backward saves this tensor: a forward output becomes an
    /// activation (parameters and inputs keep their category).
    pub fn mark_saved(&self) {
        let handle = self.storage.allocation().handle;
        let category = {
            let mut a = self.engine().allocator();
            let category = a.tag(handle).map(|t| t.0).unwrap_or(Category::Untagged);
            if category == Category::Output {
                a.retag(handle, Category::Activation);
            }
            category
        };
        self.engine().log_saved(|| super::engine::SavedTensor {
            block: handle,
            bytes: self.nbytes() as u64,
            category,
            label: self.label().to_string(),
            scope: self.engine().current_scope().1,
        });
    }

    /// The same storage seen with another shape of the same size: a view,
    /// allocating nothing (PyTorch's `view`/`reshape` on contiguous data).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, TensorError> {
        let n: usize = shape.iter().product();
        if n != self.numel() {
            return Err(TensorError::Reshape {
                from: self.shape.clone(),
                from_numel: self.numel(),
                to: shape.to_vec(),
                to_numel: n,
            });
        }
        Ok(Tensor {
            storage: self.storage.clone(),
            shape: shape.to_vec(),
            dtype: self.dtype,
            label: self.label.clone(),
        })
    }

    /// Reads the values back (waits for pending GPU work).
    pub fn to_vec(&self) -> Result<Vec<f32>, TensorError> {
        Ok(self.decode(self.download()?))
    }

    /// Reads several tensors of one engine back with one wait where they
    /// are small enough (a step's loss and GradScaler's flag): each wait
    /// for the device costs a round trip.
    pub fn read_together(tensors: &[&Tensor]) -> Result<Vec<Vec<f32>>, TensorError> {
        let Some(first) = tensors.first() else {
            return Ok(Vec::new());
        };
        let slices: Vec<_> = tensors.iter().map(|t| t.slice()).collect();
        let reads: Vec<_> = slices
            .iter()
            .zip(tensors)
            .map(|(s, t)| (s, t.nbytes() as u64))
            .collect();
        let parts = first.engine().download_many(&reads)?;
        Ok(parts
            .into_iter()
            .zip(tensors)
            .map(|(bytes, t)| t.decode(bytes))
            .collect())
    }

    fn decode(&self, bytes: Vec<u8>) -> Vec<f32> {
        match self.dtype {
            DType::F32 => bytemuck::pod_collect_to_vec(&bytes),
            DType::F16 => bytemuck::pod_collect_to_vec::<u8, half::f16>(&bytes)
                .into_iter()
                .map(f32::from)
                .collect(),
            DType::Bf16 => bytemuck::pod_collect_to_vec::<u8, half::bf16>(&bytes)
                .into_iter()
                .map(f32::from)
                .collect(),
        }
    }

    fn download(&self) -> Result<Vec<u8>, TensorError> {
        let len = self.numel() * self.dtype.size_in_bytes();
        // Copies move whole words; the half word past an odd 16-bit tensor
        // is dropped.
        let mut bytes = self
            .engine()
            .download(&self.slice(), len.div_ceil(4) as u64 * 4)?;
        bytes.truncate(len);
        Ok(bytes)
    }

    pub fn engine(&self) -> &Engine {
        self.storage.engine()
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of data (not counting the allocator's rounding).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size_in_bytes()
    }

    /// Where the tensor lives, for binding to a kernel.
    pub fn slice(&self) -> BufferSlice {
        self.storage.slice()
    }

    /// The allocator block behind this tensor.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Requires f32 for ops that only have f32 kernels.
    pub(crate) fn require_f32(&self, op: &'static str) -> Result<(), TensorError> {
        if self.dtype != DType::F32 {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype,
            });
        }
        Ok(())
    }
}
