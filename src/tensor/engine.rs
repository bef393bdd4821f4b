//! The engine: one GPU and the caching allocator that owns all of its tensor
//! memory. Cloning an engine is cheap; tensors keep theirs alive.

use super::error::TensorError;
use crate::device::{AdapterOptions, BufferSlice, DeviceError, Gpu, WgpuSource};
use crate::memory::{Allocation, AllocatorConfig, CachingAllocator};
use std::sync::{Arc, Mutex, MutexGuard};

struct EngineInner {
    gpu: Gpu,
    allocator: Mutex<CachingAllocator<WgpuSource>>,
}

/// A GPU plus its allocator.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl Engine {
    /// Opens the adapter `options` choose, with an allocator configured by
    /// `config`.
    pub fn new(options: &AdapterOptions, config: AllocatorConfig) -> Result<Engine, DeviceError> {
        let gpu = Gpu::new(options)?;
        let source = WgpuSource::new(gpu.device.clone(), &gpu.limits, &gpu.info.name);
        Ok(Engine {
            inner: Arc::new(EngineInner {
                gpu,
                allocator: Mutex::new(CachingAllocator::new(source, config)),
            }),
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.inner.gpu
    }

    /// The allocator, for statistics, snapshots and `empty_cache`.
    pub fn allocator(&self) -> MutexGuard<'_, CachingAllocator<WgpuSource>> {
        self.inner
            .allocator
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn same(&self, other: &Engine) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Takes `bytes` from the allocator for a tensor called `label`.
    pub(crate) fn allocate(&self, bytes: u64, label: &str) -> Result<Storage, TensorError> {
        self.gpu().check_binding(label, bytes)?;
        let mut alloc = self.allocator();
        let a = alloc.malloc(bytes, label)?;
        let buffer =
            alloc.source().buffer(a.segment).cloned().ok_or_else(|| {
                DeviceError::Wgpu(format!("segment {:?} has no buffer", a.segment))
            })?;
        drop(alloc);
        Ok(Storage {
            engine: self.clone(),
            allocation: a,
            buffer,
            bytes,
        })
    }
}

/// A tensor's memory: one allocator block. Dropping the last handle returns
/// it to the allocator, so Rust ownership rules out double frees.
pub struct Storage {
    engine: Engine,
    allocation: Allocation,
    buffer: wgpu::Buffer,
    bytes: u64,
}

impl Storage {
    /// The bound range: the tensor's bytes (rounded to 4), not the whole block.
    pub fn slice(&self) -> BufferSlice {
        BufferSlice {
            buffer: self.buffer.clone(),
            offset: self.allocation.offset,
            size: self.bytes.div_ceil(4) * 4,
        }
    }

    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // A valid handle cannot fail to free; there is nothing to report from
        // a destructor anyway.
        let _ = self.engine.allocator().free(self.allocation.handle);
    }
}
