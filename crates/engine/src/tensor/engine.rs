//! The engine: one GPU — or a simulated device — and the caching allocator
//! that owns all of its tensor memory. Cloning an engine is cheap; tensors
//! keep theirs alive.
//!
//! A simulated engine runs the same model code with the same allocator over
//! a [`SimulatedSource`]: every allocation and free happens, in the same
//! order and sizes, but no kernel runs and no buffer exists. That is how
//! `estimate` predicts a step's memory without touching a GPU, exactly.
//!
//! Every allocation is tagged with the category and op of the innermost open
//! [`Engine::scope`] (or an explicit category), so snapshots and event logs
//! can attribute each byte.

use super::error::TensorError;
use super::instruments::Instruments;
pub use super::instruments::SavedTensor;
use crate::device::gpu::lock;
use crate::device::{
    AdapterOptions, BufferSlice, DeviceError, EngineSource, Flat, Gpu, Kernel, Part,
    SegmentBuffers, WgpuSource, Workgroups,
};
use crate::memory::mib;
use crate::memory::{
    Allocation, AllocatorConfig, BlockHandle, CachingAllocator, Category, SimulatedSource,
};
use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// The largest binding a simulated device allows (that of a typical
/// desktop GPU; limits never change allocation sizes, only what fits).
const SIMULATED_MAX_BINDING: u64 = 2 << 30;

struct EngineInner {
    gpu: Option<Gpu>,
    allocator: Mutex<CachingAllocator<EngineSource>>,
    /// Frees that found the allocator locked (a guard held while a tensor is
    /// dropped, on this thread or another): applied at the next access, so
    /// dropping a tensor never deadlocks.
    deferred_frees: Mutex<Vec<BlockHandle>>,
    /// Scopes, op numbers, layer outputs, saved tensors, extension slots.
    instruments: Instruments,
}

/// A GPU (or a simulated one) plus its allocator.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

/// Memory at three levels: see [`Engine::three_levels`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ThreeLevels {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// `None`: not reported by this backend (Metal, GL, simulated).
    pub driver: Option<crate::device::info::DriverAllocator>,
}

impl std::fmt::Display for ThreeLevels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tensors (allocated) {:.2} MiB | vramlab allocator (reserved) {:.2} MiB | driver allocator ",
            mib(self.allocated_bytes),
            mib(self.reserved_bytes)
        )?;
        match &self.driver {
            Some(d) => write!(
                f,
                "{:.2} MiB allocated, {:.2} MiB reserved",
                mib(d.total_allocated_bytes),
                mib(d.total_reserved_bytes)
            ),
            None => write!(f, "not reported by this backend"),
        }
    }
}

/// Closes a scope when dropped.
pub struct ScopeGuard {
    engine: Engine,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        self.engine.inner.instruments.pop_scope();
    }
}

impl Engine {
    /// Opens the adapter `options` choose, with an allocator configured by
    /// `config`.
    pub fn new(options: &AdapterOptions, config: AllocatorConfig) -> Result<Engine, DeviceError> {
        let gpu = Gpu::new(options)?;
        let source = WgpuSource::of(&gpu);
        Ok(Self::with(Some(gpu), EngineSource::Wgpu(source), config))
    }

    /// A device that only counts bytes: `capacity` bytes, or unlimited.
    pub fn simulated(config: AllocatorConfig, capacity: Option<u64>) -> Engine {
        let source = match capacity {
            Some(c) => SimulatedSource::new(c),
            None => SimulatedSource::unlimited(),
        };
        Self::with(None, EngineSource::Simulated(source), config)
    }

    fn with(gpu: Option<Gpu>, source: EngineSource, config: AllocatorConfig) -> Engine {
        Engine {
            inner: Arc::new(EngineInner {
                gpu,
                allocator: Mutex::new(CachingAllocator::new(source, config)),
                deferred_frees: Mutex::new(Vec::new()),
                instruments: Instruments::default(),
            }),
        }
    }

    /// The GPU, or `None` on a simulated device.
    pub fn gpu(&self) -> Option<&Gpu> {
        self.inner.gpu.as_ref()
    }

    pub fn is_simulated(&self) -> bool {
        self.inner.gpu.is_none()
    }

    /// The adapter's name ("simulated" without a GPU).
    pub fn device_name(&self) -> String {
        self.gpu()
            .map(|g| g.info.name.clone())
            .unwrap_or_else(|| "simulated device".into())
    }

    /// The backend ("vulkan", "metal", …; "none" when simulated).
    pub fn backend_name(&self) -> &'static str {
        self.gpu()
            .map(|g| g.info.backend.to_str())
            .unwrap_or("none")
    }

    /// Whether the adapter is a CPU (llvmpipe, WARP, SwiftShader): kernels
    /// then take tile shapes that suit caches rather than on-chip memory.
    /// A simulated device answers false; it runs no kernel.
    pub fn is_cpu_adapter(&self) -> bool {
        self.gpu()
            .is_some_and(|g| g.info.device_type == wgpu::DeviceType::Cpu)
    }

    /// Whether kernels can be timed on the GPU itself (TIMESTAMP_QUERY);
    /// without it, timing syncs after every kernel.
    pub fn has_timestamp_queries(&self) -> bool {
        self.gpu()
            .is_some_and(|g| g.features.contains(wgpu::Features::TIMESTAMP_QUERY))
    }

    /// The subgroup size when the adapter has subgroups of one fixed size
    /// (lavapipe: 8, its SIMD width), else `None`.
    pub fn fixed_subgroup_size(&self) -> Option<u32> {
        let g = self.gpu()?;
        (g.features.contains(wgpu::Features::SUBGROUP)
            && g.info.subgroup_min_size == g.info.subgroup_max_size)
            .then_some(g.info.subgroup_min_size)
    }

    /// The subgroup size the tensor-core kernel runs on, where the device
    /// enabled f16 cooperative matrices and its subgroups have one size.
    pub fn tensor_core_lanes(&self) -> Option<u32> {
        let g = self.gpu()?;
        if !g
            .features
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            return None;
        }
        self.fixed_subgroup_size()
    }

    /// The side (16 or 8) of the f16→f32 cooperative matrices the
    /// tensor-core kernel uses, where [`Engine::tensor_core_lanes`] is some.
    pub fn tensor_core_size(&self) -> Option<u32> {
        self.tensor_core_lanes()?;
        self.gpu()?.coop_size
    }

    /// Whether kernels can compute on f16 storage (WGSL `enable f16`).
    pub fn has_shader_f16(&self) -> bool {
        self.gpu()
            .is_some_and(|g| g.features.contains(wgpu::Features::SHADER_F16))
    }

    /// Starts timing every kernel dispatch (see [`crate::device::timing`]);
    /// `None` on a simulated device.
    pub fn start_timing(&self) -> Option<crate::device::TimingSource> {
        self.gpu().map(|g| g.start_timing(false))
    }

    /// Stops timing (nothing on a simulated device).
    pub fn stop_timing(&self) -> Result<(), DeviceError> {
        match self.gpu() {
            Some(g) => g.stop_timing(),
            None => Ok(()),
        }
    }

    /// Starts timing with the host clock and a sync per kernel, the
    /// fallback for adapters without timestamp queries, even where the
    /// adapter has them.
    pub fn start_wall_clock_timing(&self) -> Option<crate::device::TimingSource> {
        self.gpu().map(|g| g.start_timing(true))
    }

    /// Marks a training phase, for the allocator's event log and the
    /// kernel timer both.
    pub fn mark_phase(&self, phase: &str) {
        self.allocator().mark_phase(phase);
        if let Some(g) = self.gpu() {
            g.set_timing_phase(phase);
        }
    }

    /// Every dispatch timed since the last call (waits for the GPU); `None`
    /// when timing is off or the device is simulated.
    pub fn take_dispatch_times(
        &self,
    ) -> Result<
        Option<(
            crate::device::TimingSource,
            Vec<crate::device::DispatchTime>,
        )>,
        DeviceError,
    > {
        match self.gpu() {
            Some(g) => g.take_times(),
            None => Ok(None),
        }
    }

    /// Attaches `value` as this engine's slot of type `T` (`None` empties it).
    pub fn set_extension<T: Any + Send>(&self, value: Option<T>) {
        self.inner.instruments.set_extension(value)
    }

    /// Runs `f` on the slot of type `T`, if one is attached.
    pub fn with_extension<T: Any + Send, R>(&self, f: impl FnOnce(Option<&mut T>) -> R) -> R {
        self.inner.instruments.with_extension(f)
    }

    /// What this engine notes about its work (scopes, op numbers, layer
    /// outputs, saved tensors, extension slots).
    pub fn instruments(&self) -> &Instruments {
        &self.inner.instruments
    }

    /// The largest buffer binding (`max_storage_buffer_binding_size`).
    pub fn max_binding(&self) -> u64 {
        self.gpu()
            .map(|g| g.limits.max_storage_buffer_binding_size)
            .unwrap_or(SIMULATED_MAX_BINDING)
    }

    /// The three levels of memory, one line: tensors (allocated), vramlab's
    /// allocator (reserved), and the driver's allocator under it (wgpu's
    /// report; Vulkan and DX12 only).
    pub fn three_levels(&self) -> ThreeLevels {
        let (allocated, reserved) = {
            let a = self.allocator();
            (a.memory_allocated(), a.memory_reserved())
        };
        ThreeLevels {
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            driver: self
                .gpu()
                .and_then(crate::device::info::DriverAllocator::of),
        }
    }

    /// Records a kernel dispatch (nothing on a simulated device).
    pub fn dispatch(
        &self,
        kernel: &Kernel,
        bindings: &[&BufferSlice],
        params: &[u8],
        workgroups: Workgroups,
    ) -> Result<(), DeviceError> {
        match self.gpu() {
            Some(g) => g.dispatch_as(kernel, bindings, params, workgroups, || {
                self.current_scope().1
            }),
            None => Ok(()),
        }
    }

    /// Records a flat kernel, split into element ranges where its windows
    /// exceed the binding budget (see `device::flat`; nothing on a
    /// simulated device).
    pub fn dispatch_flat(
        &self,
        kernel: &Kernel,
        bindings: &[(&BufferSlice, Part)],
        params: &[u8],
        shape: Flat,
    ) -> Result<(), DeviceError> {
        match self.gpu() {
            Some(g) => g.dispatch_flat(kernel, bindings, params, shape, || self.current_scope().1),
            None => Ok(()),
        }
    }

    /// Records an upload (nothing on a simulated device).
    pub fn upload(&self, dst: &BufferSlice, bytes: &[u8]) -> Result<(), DeviceError> {
        match self.gpu() {
            Some(g) => g.upload(dst, bytes),
            None => Ok(()),
        }
    }

    /// Reads bytes back (zeros on a simulated device).
    pub fn download(&self, src: &BufferSlice, len: u64) -> Result<Vec<u8>, DeviceError> {
        match self.gpu() {
            Some(g) => g.download(src, len),
            None => Ok(vec![0; len as usize]),
        }
    }

    /// Reads several small ranges back with one wait where the device can
    /// (zeros on a simulated device).
    pub fn download_many(
        &self,
        reads: &[(&BufferSlice, u64)],
    ) -> Result<Vec<Vec<u8>>, DeviceError> {
        match self.gpu() {
            Some(g) => g.download_many(reads),
            None => Ok(reads
                .iter()
                .map(|(_, len)| vec![0; *len as usize])
                .collect()),
        }
    }

    /// Waits for all recorded work.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        match self.gpu() {
            Some(g) => g.synchronize(),
            None => Ok(()),
        }
    }

    /// Tags allocations made until the guard drops with `category` and `op`.
    pub fn scope(&self, category: Category, op: &str) -> ScopeGuard {
        self.inner.instruments.push_scope(category, op);
        ScopeGuard {
            engine: self.clone(),
        }
    }

    /// Like `scope`, keeping the current category.
    pub fn op_scope(&self, op: &str) -> ScopeGuard {
        let category = self.current_scope().0;
        self.scope(category, op)
    }

    /// `name` numbered by its occurrences since `reset_op_numbers` ("relu1").
    pub fn numbered(&self, name: &str) -> String {
        self.inner.instruments.numbered(name)
    }

    /// Starts numbering ops afresh (at the start of a forward).
    pub fn reset_op_numbers(&self) {
        self.inner.instruments.reset_op_numbers();
    }

    /// Notes a layer's output shape (kept only while recording).
    pub fn note_layer_output(&self, layer: &Arc<str>, shape: &[usize]) {
        if self.allocator().is_recording() {
            self.inner.instruments.note_layer_output(layer, shape);
        }
    }

    /// Starts logging every tensor an op saves for backward: what PyTorch's
    /// `torch.autograd.graph.saved_tensors_hooks` pack hook sees.
    pub fn start_saved_log(&self) {
        self.inner.instruments.start_saved_log();
    }

    /// The saved tensors logged since [`Engine::start_saved_log`] (in the
    /// order saved; a storage saved twice appears twice), and stops logging.
    pub fn take_saved_log(&self) -> Vec<SavedTensor> {
        self.inner.instruments.take_saved_log()
    }

    /// Logs a saved tensor when the log is on; `t` is only built then, so
    /// an ordinary training step pays one lock and no allocation.
    pub(crate) fn log_saved(&self, t: impl FnOnce() -> SavedTensor) {
        self.inner.instruments.log_saved(t)
    }

    /// The noted layer outputs, emptying the list.
    pub fn take_layer_outputs(&self) -> Vec<(Arc<str>, Vec<usize>)> {
        self.inner.instruments.take_layer_outputs()
    }

    /// The innermost scope (Untagged, "" outside any).
    pub fn current_scope(&self) -> (Category, Arc<str>) {
        self.inner.instruments.current_scope()
    }

    /// The allocator, for statistics, snapshots and `empty_cache`. Do not
    /// hold the guard longer than needed: tensors dropped meanwhile have their
    /// frees deferred until the next call.
    pub fn allocator(&self) -> MutexGuard<'_, CachingAllocator<EngineSource>> {
        let mut a = lock(&self.inner.allocator);
        self.apply_deferred(&mut a);
        a
    }

    fn apply_deferred(&self, a: &mut CachingAllocator<EngineSource>) {
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

    /// Takes `bytes` from the allocator for a tensor called `label`, of
    /// `category` (default: the current scope's).
    pub(crate) fn allocate(
        &self,
        bytes: u64,
        label: &str,
        category: Option<Category>,
    ) -> Result<Storage, TensorError> {
        // No binding limit here: a tensor larger than one binding is bound
        // in windows (device::windows); only the allocator refuses a size.
        let (scope_category, op) = self.current_scope();
        let category = category.unwrap_or(scope_category);
        let op = (!op.is_empty()).then_some(op);
        let mut alloc = self.allocator();
        let a = alloc.malloc_tagged(bytes, label, category, op)?;
        let buffer = alloc.source().buffers(a.segment).cloned();
        if buffer.is_none() && !self.is_simulated() {
            return Err(DeviceError::NoSegmentBuffer {
                segment: a.segment.0,
            }
            .into());
        }
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
    buffer: Option<SegmentBuffers>,
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

    /// Re-categorises this block (see [`CachingAllocator::retag`]).
    pub fn retag(&self, category: Category) {
        self.engine
            .allocator()
            .retag(self.allocation.handle, category);
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.engine.release(self.allocation.handle);
    }
}
