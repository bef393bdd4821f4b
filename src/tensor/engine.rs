//! The engine: one GPU and the caching allocator that owns all of its tensor
//! memory. Cloning an engine is cheap; tensors keep theirs alive.

use super::error::TensorError;
use crate::device::gpu::lock;
use crate::device::{AdapterOptions, BufferSlice, DeviceError, Gpu, WgpuSource};
use crate::memory::{Allocation, AllocatorConfig, BlockHandle, CachingAllocator};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

struct EngineInner {
    gpu: Gpu,
    allocator: Mutex<CachingAllocator<WgpuSource>>,
    /// Frees that found the allocator locked (a guard held while a tensor is
    /// dropped, on this thread or another): applied at the next access, so
    /// dropping a tensor never deadlocks.
    deferred_frees: Mutex<Vec<BlockHandle>>,
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
                deferred_frees: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.inner.gpu
    }

    /// The allocator, for statistics, snapshots and `empty_cache`. Do not
    /// hold the guard longer than needed: tensors dropped meanwhile have their
    /// frees deferred until the next call.
    pub fn allocator(&self) -> MutexGuard<'_, CachingAllocator<WgpuSource>> {
        let mut a = lock(&self.inner.allocator);
        self.apply_deferred(&mut a);
        a
    }

    fn apply_deferred(&self, a: &mut CachingAllocator<WgpuSource>) {
        let pending = std::mem::take(&mut *lock(&self.inner.deferred_frees));
        for h in pending {
            // Handles come from live storages; a failure cannot happen and
            // would have nothing to report to.
            let _ = a.free(h);
        }
    }

    /// Returns a block, now if the allocator is free, else at its next use.
    fn release(&self, handle: BlockHandle) {
        match self.inner.allocator.try_lock() {
            Ok(mut a) => {
                let _ = a.free(handle);
                self.apply_deferred(&mut a);
            }
            Err(TryLockError::Poisoned(p)) => {
                let _ = p.into_inner().free(handle);
            }
            Err(TryLockError::WouldBlock) => lock(&self.inner.deferred_frees).push(handle),
        }
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
        self.engine.release(self.allocation.handle);
    }
}
