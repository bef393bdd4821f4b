//! The wgpu device, its queue and the one ordered command stream everything
//! goes through.
//!
//! Why one open encoder: the caching allocator hands a freed block to the next
//! tensor at once, while commands that still read the old tensor may not have
//! run yet. That is safe only if the new tensor's data reaches the block
//! *after* those commands, in the same ordered stream. So uploads are recorded
//! as buffer-to-buffer copies into the open encoder (never a
//! `queue.write_buffer`, which would jump ahead of unsubmitted work), and the
//! encoder is submitted in order.
//!
//! Why every storage binding is `read_write` in the shaders: many tensors share
//! one segment buffer, and wgpu tracks usage per buffer, not per range. A
//! read-only binding of one tensor next to a read-write binding of another in
//! the same buffer is a usage conflict; the same exclusive usage twice is not.
//! Bound ranges never overlap, so nothing aliases.

use super::adapter::{backends_for, choose, AdapterOptions, AdapterSummary};
use super::bind_groups::{split_groups, BindGroupCache, BIND_GROUP_CACHE_VAR};
use super::compose::{compose, Defs, Elem};
use super::error::DeviceError;
use super::flat::{ranges, Flat, Part};
use super::grid::{grid_for, Workgroups};
use super::segment_buffers::SegmentBuffers;
use super::settings::{number_setting, word_setting};
use super::timing::{DispatchTime, Timer, TimingSource};
use super::windows::{pad, split, table_bytes, Window};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use wgpu::util::DeviceExt;

mod precompile;

/// A compute kernel: a WGSL template (see [`super::compose`]), the
/// definitions it is composed with, and an entry point; compiled once per
/// device and variant.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// Unique per variant; the pipeline cache key.
    pub name: Cow<'static, str>,
    pub source: &'static str,
    pub entry: &'static str,
    /// `None`: the f32 defaults.
    pub defs: Option<Arc<Defs>>,
    /// Compiled without naga's runtime bounds checks ([`Kernel::trusted`]).
    pub trusted: bool,
}

impl Kernel {
    /// A kernel with one variant (f32).
    pub const fn fixed(name: &'static str, source: &'static str, entry: &'static str) -> Kernel {
        Kernel {
            name: Cow::Borrowed(name),
            source,
            entry,
            defs: None,
            trusted: false,
        }
    }

    /// A variant of a kernel family: `name` must identify `defs`.
    pub fn variant(name: String, source: &'static str, entry: &'static str, defs: Defs) -> Kernel {
        Kernel {
            name: Cow::Owned(name),
            source,
            entry,
            defs: Some(Arc::new(defs)),
            trusted: false,
        }
    }

    /// This kernel compiled without naga's runtime bounds checks (the
    /// clamps on every storage and workgroup index). Only for kernels whose
    /// own arithmetic keeps every access in bounds: each global index is
    /// clamped or guarded by the product's sizes, and each workgroup index
    /// is formed from constants and local ids below their bounds. Windowed
    /// variants stay checked.
    pub fn trusted(self) -> Kernel {
        Kernel {
            trusted: true,
            ..self
        }
    }

    /// This kernel with storage binding `i` split into `counts[i]` windows
    /// (see [`super::windows`]); a variant of its own.
    pub fn windowed(&self, counts: &[u32]) -> Kernel {
        let list = counts
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        Kernel {
            name: Cow::Owned(format!("{}{{windows {list}}}", self.name)),
            source: self.source,
            entry: self.entry,
            defs: Some(Arc::new(self.defs().with("WINDOWS", list))),
            trusted: false,
        }
    }

    /// The definitions this kernel composes with (the f32 defaults when
    /// it has none).
    fn defs(&self) -> Defs {
        match &self.defs {
            Some(d) => d.as_ref().clone(),
            None => Defs::elem(Elem::F32),
        }
    }

    /// The WGSL this kernel compiles from (native f16).
    pub fn wgsl(&self) -> Result<String, DeviceError> {
        self.wgsl_for(true)
    }

    /// The WGSL for a device with or without native f16. Without it, f16
    /// arrays become `u32` words of two halves (unpack2x16float /
    /// pack2x16float), and every kernel already writes whole words.
    pub fn wgsl_for(&self, native_f16: bool) -> Result<String, DeviceError> {
        let mut defs = self.defs();
        if !native_f16 {
            defs = defs.without_native_f16();
        }
        compose(self.source, &defs).map_err(|source| DeviceError::Shader {
            kernel: self.name.to_string(),
            source,
        })
    }
}

/// A range of a segment bound to a kernel: a tensor's block. A tensor on a
/// simulated device has no buffers.
#[derive(Debug, Clone)]
pub struct BufferSlice {
    pub buffer: Option<SegmentBuffers>,
    /// Byte offset in the segment.
    pub offset: u64,
    pub size: u64,
}

impl BufferSlice {
    fn real(&self) -> Result<&SegmentBuffers, DeviceError> {
        self.buffer.as_ref().ok_or(DeviceError::SimulatedTensor)
    }
}

/// Commands recorded but not yet submitted.
struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    /// The compute pass untimed dispatches share until another command (a
    /// copy, a timed dispatch, the submit) ends it: one pass per run of
    /// dispatches, not one each.
    pass: Option<wgpu::ComputePass<'static>>,
    /// The uniforms (kernel parameters, window tables) of the dispatches
    /// recorded since the last submit, written once at the submit.
    arena: Option<Arena>,
    commands: usize,
    /// Submit once this many commands are pending: `first_submit` after a
    /// wait (the GPU is idle, so it starts early), doubling up to
    /// [`MAX_PENDING_COMMANDS`] while the GPU has work queued.
    submit_at: usize,
    /// Arenas submitted since the last wait, and arenas free to reuse
    /// (their submits finished at a wait).
    in_flight: Vec<ArenaBuffer>,
    spare: Vec<ArenaBuffer>,
}

/// One buffer of uniforms per submit instead of one buffer per dispatch:
/// each dispatch's bytes at their own aligned offset, staged on the host
/// and written with `queue.write_buffer`, which wgpu orders before the
/// submit's commands. An arena is rewritten only after a wait has seen
/// its submit finish, so every dispatch reads what it was given.
struct Arena {
    buffer: ArenaBuffer,
    bytes: Vec<u8>,
}

/// An arena's buffer and its group-1 bind groups (one per list of uniform
/// sizes, bound with dynamic offsets), made once and kept while it lives.
struct ArenaBuffer {
    buffer: wgpu::Buffer,
    groups: HashMap<Vec<u64>, wgpu::BindGroup>,
}

impl ArenaBuffer {
    fn group(&mut self, cache: &BindGroupCache, sizes: &[u64]) -> wgpu::BindGroup {
        if let Some(g) = self.groups.get(sizes) {
            return g.clone();
        }
        let layout = cache.uniform_layout(sizes.len());
        let entries: Vec<wgpu::BindGroupEntry> = sizes
            .iter()
            .enumerate()
            .map(|(j, &size)| wgpu::BindGroupEntry {
                binding: j as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &self.buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(size),
                }),
            })
            .collect();
        let group = cache
            .device()
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("uniforms"),
                layout: &layout,
                entries: &entries,
            });
        self.groups.insert(sizes.to_vec(), group.clone());
        group
    }
}

/// An arena's size: 256 dispatches of a 256-byte-aligned uniform and a
/// window table each.
const ARENA_BYTES: u64 = 128 << 10;

/// Submit after this many recorded commands, so the GPU starts on work
/// while the host records more.
const MAX_PENDING_COMMANDS: usize = 256;

/// The first submit after a wait comes after this many commands
/// ([`SUBMIT_FIRST_VAR`]): a step's first kernels start on an idle GPU
/// while the host records the rest, instead of after all of them.
const DEFAULT_SUBMIT_FIRST: usize = 8;

/// Commands before the first submit after a wait (then twice as many each
/// submit, up to 256); `0` submits only every 256 commands and at waits.
pub const SUBMIT_FIRST_VAR: &str = "VRAMLAB_SUBMIT_FIRST";

/// Spare arenas kept for reuse; a step submits a handful.
const MAX_SPARE_ARENAS: usize = 8;

fn submit_first_from_env() -> Result<usize, DeviceError> {
    match number_setting(SUBMIT_FIRST_VAR, DEFAULT_SUBMIT_FIRST, 0) {
        Ok(0) => Ok(MAX_PENDING_COMMANDS),
        Ok(n) => Ok(n.min(MAX_PENDING_COMMANDS)),
        Err(value) => Err(DeviceError::Env {
            var: SUBMIT_FIRST_VAR,
            value,
            expected: "a number of commands (0: submit every 256 commands only)",
        }),
    }
}

/// `on`: list ops take many tensors a dispatch; `off`: one each; `auto`
/// (the default): on except on CPU adapters, which run every side of a
/// divergent branch masked, so a list kernel there costs as much as all
/// of its tensors' kernels at once (an mlp's Adam step on lavapipe: 7.8 ms
/// in 18 dispatches, 33 ms in one).
pub const LIST_OPS_VAR: &str = "VRAMLAB_LIST_OPS";

fn list_ops_from_env(cpu: bool) -> Result<bool, DeviceError> {
    let words = [("auto", !cpu), ("on", true), ("off", false)];
    word_setting(LIST_OPS_VAR, &words, !cpu).map_err(|value| DeviceError::Env {
        var: LIST_OPS_VAR,
        value,
        expected: "auto (lists except on CPU adapters, the default), on or off",
    })
}

fn bind_group_cache_from_env() -> Result<bool, DeviceError> {
    let words = [("0", false), ("1", true)];
    word_setting(BIND_GROUP_CACHE_VAR, &words, true).map_err(|value| DeviceError::Env {
        var: BIND_GROUP_CACHE_VAR,
        value,
        expected: "1 (reuse tensors' bind groups, the default) or 0 (create one per dispatch)",
    })
}

/// Reads of at most this many bytes (a loss, GradScaler's `found_inf`)
/// go through one mappable buffer kept for them, not a new one each: a
/// step reads one or two such values, each a wait the GPU idles through.
const SMALL_READBACK: u64 = 4096;

/// `1` (the default): small reads reuse one mappable buffer; `0`: a new
/// buffer for every read, as before (to measure the difference).
pub const READBACK_REUSE_VAR: &str = "VRAMLAB_READBACK_REUSE";

fn readback_reuse_from_env() -> Result<bool, DeviceError> {
    let words = [("0", false), ("1", true)];
    word_setting(READBACK_REUSE_VAR, &words, true).map_err(|value| DeviceError::Env {
        var: READBACK_REUSE_VAR,
        value,
        expected: "1 (small reads reuse one buffer, the default) or 0 (a new buffer each read)",
    })
}

/// One GPU: device, queue, limits, compiled pipelines, the open encoder.
pub struct Gpu {
    /// What the adapter was opened with (the tuner opens a second device
    /// of the same adapter with them).
    pub options: AdapterOptions,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// The largest window a tensor is bound in: the binding limit rounded
    /// to the offset alignment, or smaller where a test asks for it.
    pub binding_window: u64,
    /// The most bytes one buffer of a segment holds: `max_buffer_size`
    /// aligned, or smaller where a test asks for it (see SegmentBuffers).
    pub buffer_piece: u64,
    pub adapter_features: wgpu::Features,
    pub features: wgpu::Features,
    /// The cooperative-matrix (tensor-core) shapes the adapter offers, as
    /// `M×N×K A→C` (`8×8×8 f16→f32`); empty where it offers none.
    pub cooperative_matrices: Vec<String>,
    /// The side of the f16→f32 cooperative matrices the tensor-core kernel
    /// uses (16 or 8), where the device enabled them.
    pub coop_size: Option<u32>,
    /// Why this adapter was chosen, in words.
    pub choice_reason: String,
    /// Every adapter that was found, for `info`.
    pub adapters: Vec<AdapterSummary>,
    /// Each kernel variant's pipeline and its uniform count.
    pipelines: Mutex<HashMap<String, (wgpu::ComputePipeline, usize)>>,
    /// Where dispatches go while [`Gpu::kernels_of`] collects them.
    collecting: Mutex<Option<Vec<Kernel>>>,
    collect_on: AtomicBool,
    /// Storage bind groups made once (and the layouts every pipeline uses).
    bind_groups: Arc<BindGroupCache>,
    /// Dispatches that bound some tensor in more than one window.
    windowed: AtomicU64,
    /// Times the host waited for the device (reads back and synchronizes).
    waits: AtomicU64,
    pending: Mutex<Pending>,
    /// Commands before the first submit after a wait: `configured_submit`,
    /// or [`MAX_PENDING_COMMANDS`] while [`Gpu::hold_submits`] holds them.
    first_submit: AtomicUsize,
    configured_submit: usize,
    /// Whether list ops (optimizers' foreach, GradScaler's unscale) take
    /// many tensors a dispatch ([`LIST_OPS_VAR`]).
    list_ops: AtomicBool,
    timer: Mutex<Option<Timer>>,
    /// The mappable buffer of small reads, while no read holds it; `None`
    /// in the field's place where [`READBACK_REUSE_VAR`] is `0`.
    small_readback: Option<Mutex<Option<wgpu::Buffer>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps half-updated in a way that
    // matters more than losing the whole run; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Features vramlab uses when the adapter has them.
/// The cooperative-matrix shapes vramlab's tensor-core kernel runs on, as
/// [`Gpu::cooperative_matrices`] names them, the preferred first: 16×16
/// (NVIDIA's tensor cores) does four times the work of an 8×8 (lavapipe)
/// per load.
pub const COOP_F16_F32: [(&str, u32); 2] = [("16×16×16 f16→f32", 16), ("8×8×8 f16→f32", 8)];

pub fn wanted_features() -> wgpu::Features {
    wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SUBGROUP
}

impl Gpu {
    /// Finds an adapter and opens a device with every limit it offers.
    pub fn new(options: &AdapterOptions) -> Result<Gpu, DeviceError> {
        pollster::block_on(Self::new_async(options))
    }

    async fn new_async(options: &AdapterOptions) -> Result<Gpu, DeviceError> {
        let (backends, mut searched) = backends_for(options)?;
        // GL is the fallback: probing it (through EGL) is slow and noisy, so it
        // is searched only when asked for or when nothing else was found.
        let primary = if backends == wgpu::Backends::all() {
            wgpu::Backends::PRIMARY
        } else {
            backends
        };
        let mut adapters = Self::enumerate(primary).await;
        if adapters.is_empty() && primary != backends {
            adapters = Self::enumerate(backends).await;
            searched = format!("{searched} (no Vulkan/Metal/DX12 adapter, so GL was searched too)");
        } else if primary != backends {
            searched = format!(
                "{searched} (Vulkan/Metal/DX12 first; GL not probed, use --backend gl for it)"
            );
        }
        let summaries: Vec<AdapterSummary> = adapters
            .iter()
            .map(|a| AdapterSummary::from_info(&a.get_info()))
            .collect();
        let (adapter, choice_reason) = choose(adapters, options, &searched)?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let adapter_features = adapter.features();
        let cooperative_matrices =
            if adapter_features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                let name = |t: wgpu::CooperativeScalarType| format!("{t:?}").to_lowercase();
                adapter
                    .cooperative_matrix_properties()
                    .iter()
                    .map(|c| {
                        format!(
                            "{}×{}×{} {}→{}",
                            c.m_size,
                            c.n_size,
                            c.k_size,
                            name(c.ab_type),
                            name(c.cr_type)
                        )
                    })
                    .collect()
            } else {
                Vec::new()
            };
        let mut features = adapter_features & wanted_features();
        if options.without_shader_f16 {
            features.remove(wgpu::Features::SHADER_F16);
        }
        // Tensor cores where the adapter multiplies 16×16×16 or 8×8×8 f16 into f32 and
        // f16 is native: wgpu calls the feature experimental, so the device
        // must be asked for it with the experimental token.
        let coop_size = COOP_F16_F32
            .iter()
            .find(|(name, _)| cooperative_matrices.iter().any(|c| c == name))
            .map(|&(_, size)| size)
            .filter(|_| {
                !options.without_cooperative_matrix && features.contains(wgpu::Features::SHADER_F16)
            });
        let coop = coop_size.is_some();
        if coop {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("vramlab"),
                required_features: features,
                required_limits: limits.clone(),
                // SAFETY: wgpu asks callers of experimental features to accept
                // that its implementation may still have bugs; vramlab only
                // uses the f16→f32 cooperative-matrix ops its kernel is
                // tested with (tests/matmul_coop.rs: 8×8 under Mesa 26 in CI,
                // 16×16 on an NVIDIA H200, docs/tensor_cores.md).
                experimental_features: if coop {
                    unsafe { wgpu::ExperimentalFeatures::enabled() }
                } else {
                    wgpu::ExperimentalFeatures::disabled()
                },
                ..Default::default()
            })
            .await
            .map_err(|source| DeviceError::RequestDevice {
                adapter: info.name.clone(),
                source,
            })?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        // Never let wgpu panic on an error we did not scope: record it and
        // report it at the next synchronisation point.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string());
        }));
        let window_limit = options
            .binding_limit
            .map_or(limits.max_storage_buffer_binding_size, |l| {
                l.min(limits.max_storage_buffer_binding_size)
            });
        let alignment = limits.min_storage_buffer_offset_alignment as u64;
        let binding_window = super::windows::window_size(window_limit, alignment);
        let buffer_piece = super::windows::window_size(
            options
                .buffer_limit
                .map_or(limits.max_buffer_size, |l| l.min(limits.max_buffer_size)),
            alignment,
        );
        let first_submit = submit_first_from_env()?;
        let small_readback = readback_reuse_from_env()?.then(Mutex::default);
        let list_ops = list_ops_from_env(info.device_type == wgpu::DeviceType::Cpu)?;
        let bind_groups = Arc::new(BindGroupCache::new(
            device.clone(),
            bind_group_cache_from_env()?,
        ));
        Ok(Gpu {
            options: options.clone(),
            device,
            queue,
            info,
            limits,
            binding_window,
            buffer_piece,
            adapter_features,
            features,
            cooperative_matrices,
            coop_size,
            choice_reason,
            adapters: summaries,
            pipelines: Mutex::default(),
            collecting: Mutex::new(None),
            collect_on: AtomicBool::new(false),
            bind_groups,
            windowed: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            timer: Mutex::new(None),
            pending: Mutex::new(Pending {
                encoder: None,
                pass: None,
                arena: None,
                commands: 0,
                submit_at: first_submit,
                in_flight: Vec::new(),
                spare: Vec::new(),
            }),
            first_submit: AtomicUsize::new(first_submit),
            configured_submit: first_submit,
            list_ops: AtomicBool::new(list_ops),
            small_readback,
            errors,
        })
    }

    async fn enumerate(backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        desc.flags = wgpu::InstanceFlags::empty().with_env();
        let instance = wgpu::Instance::new(desc);
        instance.enumerate_adapters(backends).await
    }

    /// The adapter in `info`'s words.
    pub fn summary(&self) -> AdapterSummary {
        AdapterSummary::from_info(&self.info)
    }

    /// wgpu's own allocator report (Vulkan, DX12), or `None` where the backend
    /// does not give one (Metal, GL).
    pub fn allocator_report(&self) -> Option<wgpu::AllocatorReport> {
        self.device.generate_allocator_report()
    }

    fn take_errors(&self) -> Result<(), DeviceError> {
        let mut errs = lock(&self.errors);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(DeviceError::Wgpu(std::mem::take(&mut *errs)))
        }
    }

    /// The kernel's pipeline and how many uniforms it binds, compiled once:
    /// tensors in group 0, uniforms in group 1 (see [`super::bind_groups`]).
    fn pipeline(&self, kernel: &Kernel) -> Result<(wgpu::ComputePipeline, usize), DeviceError> {
        if let Some(p) = lock(&self.pipelines).get(kernel.name.as_ref()) {
            return Ok(p.clone());
        }
        // Compiled outside the lock, so other threads compile beside it.
        let built = self.compile(kernel)?;
        Ok(lock(&self.pipelines)
            .entry(kernel.name.to_string())
            .or_insert(built)
            .clone())
    }

    fn compile(&self, kernel: &Kernel) -> Result<(wgpu::ComputePipeline, usize), DeviceError> {
        let composed = kernel.wgsl_for(self.features.contains(wgpu::Features::SHADER_F16))?;
        let (wgsl, storage, uniforms) = split_groups(&composed);
        let layout = self.bind_groups.pipeline_layout(storage, uniforms);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&kernel.name),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        };
        let module = if kernel.trusted && !self.options.checked_kernels {
            // SAFETY: a trusted kernel keeps every access in bounds by its
            // own index arithmetic (see `Kernel::trusted`); its tests run
            // it on odd sizes, edges, offsets and batches against f64.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        } else {
            self.device.create_shader_module(desc)
        };
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&kernel.name),
                layout: Some(&layout),
                module: &module,
                entry_point: Some(kernel.entry),
                compilation_options: Default::default(),
                cache: None,
            });
        Ok((pipeline, uniforms))
    }

    /// Starts timing every dispatch (see [`super::timing`]); says how.
    /// `prefer_wall_clock` asks for the host-clock fallback even where the
    /// adapter has timestamp queries (to compare the two, and to test it).
    /// A timer already running keeps its source.
    pub fn start_timing(&self, prefer_wall_clock: bool) -> TimingSource {
        self.flush();
        let mut t = lock(&self.timer);
        t.get_or_insert_with(|| {
            Timer::new(&self.device, &self.queue, self.features, prefer_wall_clock)
        })
        .source
    }

    /// Stops timing: later dispatches run untimed (the times not yet taken
    /// are dropped).
    pub fn stop_timing(&self) -> Result<(), DeviceError> {
        self.synchronize()?;
        *lock(&self.timer) = None;
        Ok(())
    }

    /// Names the phase later dispatches belong to.
    pub fn set_timing_phase(&self, phase: &str) {
        if let Some(t) = lock(&self.timer).as_mut() {
            t.phase = Arc::from(phase);
        }
    }

    /// The times of every dispatch finished since the last call (waits for
    /// the GPU), or `None` when timing is off.
    pub fn take_times(&self) -> Result<Option<(TimingSource, Vec<DispatchTime>)>, DeviceError> {
        self.synchronize()?;
        let mut t = lock(&self.timer);
        Ok(t.as_mut().map(|t| (t.source, std::mem::take(&mut t.done))))
    }

    /// Resolves the timestamps written since the last read into the
    /// timer's resolve buffer, in the ordered stream after the passes that
    /// wrote them, and reads them back like any tensor.
    fn read_times(&self) -> Result<(), DeviceError> {
        let Some((query_set, resolve, n)) = lock(&self.timer).as_ref().and_then(Timer::to_read)
        else {
            return Ok(());
        };
        self.with_encoder(|enc| enc.resolve_query_set(&query_set, 0..n * 2, &resolve, 0));
        let bytes = n as u64 * 16;
        let raw = self.download(
            &BufferSlice {
                buffer: Some(SegmentBuffers::single(resolve)),
                offset: 0,
                size: bytes,
            },
            bytes,
        )?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&raw);
        if let Some(t) = lock(&self.timer).as_mut() {
            t.resolved(&ticks);
        }
        Ok(())
    }

    /// The device's memory where it is known: a CPU adapter's is the
    /// host's; wgpu reports no GPU's.
    pub fn device_memory(&self) -> Option<u64> {
        (self.info.device_type == wgpu::DeviceType::Cpu)
            .then(super::host_memory::total)
            .flatten()
    }

    /// Dispatches so far that bound a tensor in several windows.
    pub fn windowed_dispatches(&self) -> u64 {
        self.windowed.load(Ordering::Relaxed)
    }

    /// Times so far the host waited for the device: each read back (of
    /// any number of ranges at once) and each synchronize.
    pub fn host_waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Whether list ops take many tensors a dispatch ([`LIST_OPS_VAR`]).
    pub fn list_ops(&self) -> bool {
        self.list_ops.load(Ordering::Relaxed)
    }

    /// Turns list ops on or off for this device (tests run them on CPU
    /// adapters, where they are off by default).
    pub fn set_list_ops(&self, on: bool) {
        self.list_ops.store(on, Ordering::Relaxed);
    }

    /// The cache of tensors' bind groups, which the segment source tells
    /// when a segment's buffers go.
    pub fn bind_groups(&self) -> Arc<BindGroupCache> {
        self.bind_groups.clone()
    }

    /// Number of pipelines compiled so far (each kernel compiles once).
    pub fn pipelines_compiled(&self) -> usize {
        lock(&self.pipelines).len()
    }

    fn with_encoder(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = lock(&self.pending);
        // Any other command ends the shared pass first.
        p.pass = None;
        f(self.encoder(&mut p));
        self.recorded(&mut p);
    }

    /// Records into the shared compute pass, opening it if none is open.
    fn with_pass(&self, f: impl FnOnce(&mut wgpu::ComputePass<'static>)) {
        let mut p = lock(&self.pending);
        if p.pass.is_none() {
            let pass = self
                .encoder(&mut p)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("vramlab"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            p.pass = Some(pass);
        }
        if let Some(pass) = p.pass.as_mut() {
            f(pass);
        }
        self.recorded(&mut p);
    }

    /// The pending encoder, opened if none is.
    fn encoder<'p>(&self, p: &'p mut Pending) -> &'p mut wgpu::CommandEncoder {
        p.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("vramlab"),
                })
        })
    }

    /// Counts a recorded command; submits once enough are pending.
    fn recorded(&self, p: &mut Pending) {
        p.commands += 1;
        if p.commands >= p.submit_at.min(MAX_PENDING_COMMANDS) {
            Self::submit_locked(&self.queue, p);
            p.submit_at = (p.submit_at * 2).min(MAX_PENDING_COMMANDS);
        }
    }

    /// Each of `data` (padded to 16 bytes) at its own aligned offset of
    /// the pending arena, all in one arena, submitting first when it is
    /// full: the arena's bind group for these sizes and the offsets, in
    /// order. `small` (the timer is on, and submits every dispatch or few)
    /// starts a new arena at 4 KiB rather than 128 KiB.
    fn stage_uniforms(
        &self,
        p: &mut Pending,
        data: &[&[u8]],
        small: bool,
    ) -> (wgpu::BindGroup, Vec<u32>) {
        let align = (self.limits.min_uniform_buffer_offset_alignment as u64).max(16);
        let sizes: Vec<u64> = data
            .iter()
            .map(|d| (d.len() as u64).div_ceil(16).max(1) * 16)
            .collect();
        // Room for all of them whatever the padding between.
        let need: u64 = sizes.iter().map(|s| s.next_multiple_of(align)).sum();
        let full = p.arena.as_ref().is_some_and(|a| {
            (a.bytes.len() as u64).next_multiple_of(align) + need > a.buffer.buffer.size()
        });
        if full {
            // Submitting writes the full arena and drops it from `p`.
            Self::submit_locked(&self.queue, p);
        }
        if p.arena.is_none() {
            let want = if small { 4 << 10 } else { ARENA_BYTES }.max(need);
            let buffer = match p.spare.iter().position(|b| b.buffer.size() >= want) {
                Some(i) => p.spare.remove(i),
                None => ArenaBuffer {
                    buffer: self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("uniforms"),
                        size: want,
                        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    }),
                    groups: HashMap::new(),
                },
            };
            p.arena = Some(Arena {
                buffer,
                bytes: Vec::new(),
            });
        }
        let a = p.arena.as_mut().expect("an arena was just set");
        let mut offsets = Vec::with_capacity(data.len());
        for (d, &size) in data.iter().zip(&sizes) {
            let offset = (a.bytes.len() as u64).next_multiple_of(align);
            a.bytes.resize(offset as usize, 0);
            a.bytes.extend_from_slice(d);
            a.bytes.resize((offset + size) as usize, 0);
            offsets.push(offset as u32);
        }
        (a.buffer.group(&self.bind_groups, &sizes), offsets)
    }

    fn submit_locked(queue: &wgpu::Queue, p: &mut Pending) {
        p.pass = None;
        if let Some(a) = p.arena.take() {
            if !a.bytes.is_empty() {
                queue.write_buffer(&a.buffer.buffer, 0, &a.bytes);
            }
            p.in_flight.push(a.buffer);
        }
        if let Some(enc) = p.encoder.take() {
            queue.submit(Some(enc.finish()));
        }
        p.commands = 0;
    }

    /// Holds submits until [`MAX_PENDING_COMMANDS`] are pending or a wait
    /// (`true`), or restores the early first submit (`false`): to time the
    /// host's recording apart from its submits.
    pub fn hold_submits(&self, hold: bool) {
        let n = if hold {
            MAX_PENDING_COMMANDS
        } else {
            self.configured_submit
        };
        self.first_submit.store(n, Ordering::Relaxed);
        lock(&self.pending).submit_at = n;
    }

    /// Submits everything recorded so far.
    pub fn flush(&self) {
        let mut p = lock(&self.pending);
        Self::submit_locked(&self.queue, &mut p);
    }

    /// Submits and waits until the GPU has finished all of it.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.wait(true)
    }

    /// [`Gpu::synchronize`]; with `recycle` the arenas submitted before the
    /// wait may be rewritten after it. Without, they are left alone: a
    /// dispatch whose uniforms were staged before the wait is recorded
    /// after it.
    fn wait(&self, recycle: bool) -> Result<(), DeviceError> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let submitted = self.flush_taking_arenas();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(DeviceError::Poll)?;
        if recycle {
            self.recycle(submitted);
        }
        self.take_errors()?;
        self.read_times()
    }

    /// Submits what is pending; returns the arenas submitted since the
    /// last recycling, to recycle once a wait has seen them finish.
    fn flush_taking_arenas(&self) -> Vec<ArenaBuffer> {
        let mut p = lock(&self.pending);
        Self::submit_locked(&self.queue, &mut p);
        std::mem::take(&mut p.in_flight)
    }

    /// After a wait that saw `arenas`' submits finish: they may be
    /// rewritten, and the idle GPU wants work soon.
    fn recycle(&self, arenas: Vec<ArenaBuffer>) {
        let mut p = lock(&self.pending);
        p.spare.extend(arenas);
        p.spare.truncate(MAX_SPARE_ARENAS);
        p.submit_at = self.first_submit.load(Ordering::Relaxed);
    }

    /// Whether one dispatch may bind all of `bindings`: their windows
    /// together within `max_storage_buffers_per_shader_stage`.
    pub fn fits_one_dispatch(&self, bindings: &[&BufferSlice]) -> bool {
        let needed: usize = bindings.iter().map(|b| self.windows_of(b).len()).sum();
        needed <= self.limits.max_storage_buffers_per_shader_stage as usize
    }

    /// The unit every binding offset is a multiple of: the device's offset
    /// alignment and a whole `vec4`.
    pub fn offset_unit(&self) -> u64 {
        super::windows::window_size(1, self.limits.min_storage_buffer_offset_alignment as u64)
    }

    /// Where `--binding-window` or `--buffer-limit` was not taken as
    /// given (capped at the adapter's limit, rounded to a whole number of
    /// units of the offset alignment and 16 bytes, at least one), one line
    /// each saying so.
    pub fn option_notes(&self) -> Vec<String> {
        let unit = self.offset_unit();
        let note = |flag: &str, asked: Option<u64>, limit_name: &str, limit: u64, got: u64| {
            let asked = asked.filter(|&a| a != got)?;
            let size = crate::memory::format_size;
            let why = if asked > limit {
                format!("the adapter's {limit_name} is {}", size(limit))
            } else {
                format!("a whole multiple of {unit} bytes, the adapter's offset alignment and 16, at least one")
            };
            Some(format!(
                "{flag} {}: used {} ({why})",
                size(asked),
                size(got)
            ))
        };
        [
            note(
                "--binding-window",
                self.options.binding_limit,
                "max_storage_buffer_binding_size",
                self.limits.max_storage_buffer_binding_size,
                self.binding_window,
            ),
            note(
                "--buffer-limit",
                self.options.buffer_limit,
                "max_buffer_size",
                self.limits.max_buffer_size,
                self.buffer_piece,
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Whether `b` binds as one window (a kernel may then name its array).
    pub fn binds_whole(&self, b: &BufferSlice) -> bool {
        self.windows_of(b).len() == 1
    }

    /// The windows `b` is bound in.
    fn windows_of(&self, b: &BufferSlice) -> Vec<Window> {
        let piece = b.buffer.as_ref().map_or(u64::MAX, SegmentBuffers::piece);
        split(b.offset, b.size, self.binding_window, piece)
    }

    /// Records a flat kernel (see [`super::flat`]): one dispatch when its
    /// windows fit the binding budget, else one per element range, each
    /// binding its own part of every `Part::Elements` binding and the
    /// params' leading `u32` (the element count) set to the range's.
    pub fn dispatch_flat(
        &self,
        kernel: &Kernel,
        bindings: &[(&BufferSlice, Part)],
        params: &[u8],
        shape: Flat,
        op: impl FnOnce() -> Arc<str>,
    ) -> Result<(), DeviceError> {
        let groups = |elements: u64| {
            Workgroups::Linear(
                elements
                    .div_ceil(shape.per_invocation.max(1))
                    .div_ceil(shape.workgroup.max(1)),
            )
        };
        let slices: Vec<&BufferSlice> = bindings.iter().map(|(b, _)| *b).collect();
        let limit = self.limits.max_storage_buffers_per_shader_stage as u64;
        let (mut whole, mut split_windows, mut split_parts) = (0, 0, 0);
        for (b, p) in bindings {
            let n = self.windows_of(b).len() as u64;
            if *p == Part::Whole {
                whole += n;
            } else {
                split_windows += n;
                split_parts += 1;
            }
        }
        let fits = whole + split_windows <= limit;
        if fits || split_parts == 0 || whole + split_parts > limit || params.len() < 4 {
            // One dispatch: it fits, or no split can help (dispatch_as
            // then names what does not fit).
            return self.dispatch_as(kernel, &slices, params, groups(shape.elements), op);
        }
        let each = (limit - whole) / split_parts;
        let parts: Vec<Part> = bindings.iter().map(|(_, p)| *p).collect();
        let name = op();
        // A buffer holds at least one window of this size, and a window
        // never crosses a buffer.
        let window = self.binding_window.min(self.buffer_piece);
        for r in ranges(shape, &parts, window, self.offset_unit(), each) {
            let sub: Vec<BufferSlice> = bindings
                .iter()
                .map(|(b, p)| match *p {
                    Part::Whole => (*b).clone(),
                    Part::Elements(bytes) => {
                        let skip = (r.first * bytes).min(b.size);
                        let want = (r.count * bytes).div_ceil(4) * 4;
                        BufferSlice {
                            buffer: b.buffer.clone(),
                            offset: b.offset + skip,
                            size: want.min(b.size - skip),
                        }
                    }
                })
                .collect();
            let refs: Vec<&BufferSlice> = sub.iter().collect();
            let mut p = params.to_vec();
            p[..4].copy_from_slice(&(r.count as u32).to_le_bytes());
            self.dispatch_as(kernel, &refs, &p, groups(r.count), || name.clone())?;
        }
        Ok(())
    }

    /// Records one dispatch of `kernel`: storage bindings 0..n in order in
    /// group 0, then `params` (if not empty) as a uniform in group 1 at a
    /// dynamic offset (see [`super::bind_groups`]).
    pub fn dispatch(
        &self,
        kernel: &Kernel,
        bindings: &[&BufferSlice],
        params: &[u8],
        workgroups: Workgroups,
    ) -> Result<(), DeviceError> {
        self.dispatch_as(kernel, bindings, params, workgroups, || Arc::from(""))
    }

    /// [`Gpu::dispatch`], attributing the dispatch's time (when timing is
    /// on) to the op `op()` names.
    pub fn dispatch_as(
        &self,
        kernel: &Kernel,
        bindings: &[&BufferSlice],
        params: &[u8],
        workgroups: Workgroups,
        op: impl FnOnce() -> Arc<str>,
    ) -> Result<(), DeviceError> {
        let max_dim = self.limits.max_compute_workgroups_per_dimension;
        let grid = match workgroups {
            Workgroups::Linear(n) => grid_for(n, max_dim).ok_or(DeviceError::GridTooLarge {
                kernel: kernel.name.to_string(),
                groups: n,
            })?,
            Workgroups::Grid(g) => {
                if g.iter().any(|&d| d > max_dim) {
                    return Err(DeviceError::GridTooLarge {
                        kernel: kernel.name.to_string(),
                        groups: g.iter().map(|&d| d as u64).product(),
                    });
                }
                g
            }
        };
        if grid.contains(&0) {
            return Ok(());
        }
        // Each tensor in the windows the binding limit allows; a kernel
        // with any tensor in several windows is a variant of its own.
        let mut windows: Vec<Vec<Window>> = bindings.iter().map(|b| self.windows_of(b)).collect();
        let limit = self.limits.max_storage_buffers_per_shader_stage;
        pad(&mut windows, limit);
        let counts: Vec<u32> = windows.iter().map(|w| w.len() as u32).collect();
        let windowed = counts.iter().any(|&c| c > 1);
        let variant;
        let kernel = if windowed {
            let needed: u32 = counts.iter().sum();
            if needed > limit {
                // Windows cut small by a flag are the flag's doing.
                let shrunk: Vec<&str> = [
                    ("--binding-window", self.options.binding_limit),
                    ("--buffer-limit", self.options.buffer_limit),
                ]
                .into_iter()
                .filter(|(_, l)| l.is_some())
                .map(|(flag, _)| flag)
                .collect();
                let fix = match shrunk.as_slice() {
                    [] => "use smaller tensors (a smaller batch)".to_string(),
                    flags => format!("raise {} (or leave it out)", flags.join(" and ")),
                };
                return Err(DeviceError::TooManyWindows {
                    kernel: kernel.name.to_string(),
                    sizes: bindings.iter().map(|b| b.size).collect(),
                    needed,
                    limit,
                    window: self.binding_window,
                    piece: self.buffer_piece,
                    fix,
                });
            }
            variant = kernel.windowed(&counts);
            &variant
        } else {
            kernel
        };
        if self.collect_on.load(Ordering::Relaxed) {
            if let Some(kernels) = lock(&self.collecting).as_mut() {
                kernels.push(kernel.clone());
                return Ok(());
            }
        }
        if windowed {
            self.windowed.fetch_add(1, Ordering::Relaxed);
        }
        let (pipeline, uniforms) = self.pipeline(kernel)?;
        // The timer's wait comes before this dispatch's uniforms are
        // staged: a wait lets the arenas it saw submitted be rewritten.
        if lock(&self.timer).as_ref().is_some_and(Timer::wants_wait) {
            self.synchronize()?;
        }
        let small = lock(&self.timer).is_some();
        let table = windowed.then(|| table_bytes(&windows));
        let mut data: Vec<&[u8]> = Vec::with_capacity(2);
        if !params.is_empty() {
            data.push(params);
        }
        data.extend(table.as_deref());
        if data.len() != uniforms {
            return Err(DeviceError::Wgpu(vec![format!(
                "kernel {} binds {uniforms} uniforms but its dispatch gave {}",
                kernel.name,
                data.len()
            )]));
        }
        let uniform_group =
            (!data.is_empty()).then(|| self.stage_uniforms(&mut lock(&self.pending), &data, small));
        let mut bound = Vec::with_capacity(windows.iter().map(Vec::len).sum());
        for (b, ws) in bindings.iter().zip(&windows) {
            let buffers = b.real()?;
            for w in ws {
                bound.push((buffers.buffer(w.buffer).clone(), w.offset, w.size));
            }
        }
        let bind_group = self.bind_groups.storage_group(bound);
        // Timing: a query pair for this pass, reading the set back first
        // when it is full; or, without timestamps, this dispatch alone
        // between two waits.
        let mut timer = lock(&self.timer);
        let pair = match timer.as_mut() {
            None => None,
            Some(t) if t.stamps.is_some() => {
                let op = op();
                match t.next_pair(&kernel.name, op.clone()) {
                    Some(i) => Some(i),
                    None => {
                        // Only where another thread filled the set since
                        // the wait above: this dispatch's uniforms are
                        // staged, so their arena is not recycled.
                        drop(timer);
                        self.wait(false)?;
                        timer = lock(&self.timer);
                        timer.as_mut().and_then(|t| t.next_pair(&kernel.name, op))
                    }
                }
            }
            Some(t) => {
                // Waited for above, before the uniforms were staged.
                t.start_wall(&kernel.name, op());
                None
            }
        };
        let query_set = timer
            .as_ref()
            .and_then(|t| t.stamps.as_ref())
            .map(|s| s.query_set.clone());
        let wall = timer.as_ref().is_some_and(|t| t.wall.is_some());
        let timed = timer.is_some();
        drop(timer);
        if !timed {
            self.with_pass(|pass| {
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                if let Some((group, offsets)) = &uniform_group {
                    pass.set_bind_group(1, group, offsets);
                }
                pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            });
            return Ok(());
        }
        self.with_encoder(|enc| {
            let writes = match (&query_set, pair) {
                (Some(qs), Some(i)) => Some(wgpu::ComputePassTimestampWrites {
                    query_set: qs,
                    beginning_of_pass_write_index: Some(2 * i),
                    end_of_pass_write_index: Some(2 * i + 1),
                }),
                _ => None,
            };
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(&kernel.name),
                timestamp_writes: writes,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            if let Some((group, offsets)) = &uniform_group {
                pass.set_bind_group(1, group, offsets);
            }
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        });
        if wall {
            self.synchronize()?;
            if let Some(t) = lock(&self.timer).as_mut() {
                t.finish_wall();
            }
        }
        Ok(())
    }

    /// Records a copy of `bytes` into `dst`, ordered after every command
    /// recorded before it (see the module docs for why this matters): one
    /// copy per buffer of the segment the range touches.
    pub fn upload(&self, dst: &BufferSlice, bytes: &[u8]) -> Result<(), DeviceError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let target = dst.real()?;
        let len = (bytes.len() as u64).div_ceil(wgpu::COPY_BUFFER_ALIGNMENT)
            * wgpu::COPY_BUFFER_ALIGNMENT;
        for w in split(dst.offset, len, self.copy_limit(), target.piece()) {
            let from = w.start as usize;
            let to = ((w.start + w.size) as usize).min(bytes.len());
            // Copied only where the last piece needs padding to 4 bytes.
            let contents: Cow<[u8]> = if to - from == w.size as usize {
                Cow::Borrowed(&bytes[from..to])
            } else {
                let mut padded = bytes[from..to].to_vec();
                padded.resize(w.size as usize, 0);
                Cow::Owned(padded)
            };
            let staging = self
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("upload"),
                    contents: &contents,
                    usage: wgpu::BufferUsages::COPY_SRC,
                });
            self.with_encoder(|enc| {
                enc.copy_buffer_to_buffer(&staging, 0, target.buffer(w.buffer), w.offset, w.size);
            });
        }
        Ok(())
    }

    /// The most bytes one staging or readback buffer takes.
    fn copy_limit(&self) -> u64 {
        super::windows::window_size(
            self.limits.max_buffer_size,
            self.limits.min_storage_buffer_offset_alignment as u64,
        )
    }

    /// Copies `len` bytes of `src` back to the CPU, waiting for all recorded
    /// work first: one readback per buffer of the segment the range touches.
    pub fn download(&self, src: &BufferSlice, len: u64) -> Result<Vec<u8>, DeviceError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let source = src.real()?;
        let padded = len.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT;
        let mut bytes = Vec::new();
        for w in split(src.offset, padded, self.copy_limit(), source.piece()) {
            let part = self.read_back(source.buffer(w.buffer), w.offset, w.size)?;
            // One piece (the usual case) is returned as read, not copied.
            if bytes.is_empty() {
                bytes = part;
            } else {
                bytes.extend(part);
            }
        }
        bytes.truncate(len as usize);
        Ok(bytes)
    }

    /// Reads several small ranges back with one wait: copied side by side
    /// into the kept readback buffer and mapped once, where they fit in it
    /// (a step's loss and GradScaler's flag); else one read each.
    pub fn download_many(
        &self,
        reads: &[(&BufferSlice, u64)],
    ) -> Result<Vec<Vec<u8>>, DeviceError> {
        let mut copies = Vec::with_capacity(reads.len());
        let mut total = 0;
        for (src, len) in reads {
            let padded = len.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT;
            let source = src.real()?;
            let pieces = split(src.offset, padded, self.copy_limit(), source.piece());
            match pieces.as_slice() {
                [w] if *len > 0 => copies.push((source.buffer(w.buffer), w.offset, padded)),
                _ => break,
            }
            total += padded;
        }
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        if copies.len() < reads.len() || total > SMALL_READBACK {
            return reads
                .iter()
                .map(|(src, len)| self.download(src, *len))
                .collect();
        }
        let bytes = self.read_copies(&copies, total)?;
        let mut at = 0;
        Ok(reads
            .iter()
            .zip(&copies)
            .map(|((_, len), c)| {
                let part = bytes[at as usize..(at + len) as usize].to_vec();
                at += c.2;
                part
            })
            .collect())
    }

    fn read_back(
        &self,
        source: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>, DeviceError> {
        self.read_copies(&[(source, offset, size)], size)
    }

    /// Copies of `total` bytes in all, read side by side: through the kept
    /// buffer where they fit in it and no other read holds it; else through
    /// one made for them (kept afterwards where it is the kept one's size
    /// and reuse is on), dropped after it.
    fn read_copies(
        &self,
        copies: &[(&wgpu::Buffer, u64, u64)],
        total: u64,
    ) -> Result<Vec<u8>, DeviceError> {
        let small = self
            .small_readback
            .as_ref()
            .filter(|_| total <= SMALL_READBACK);
        let readback = small.and_then(|m| lock(m).take()).unwrap_or_else(|| {
            self.readback_buffer(if small.is_some() {
                SMALL_READBACK
            } else {
                total
            })
        });
        // A failed read leaves the buffer unmapped or in doubt: dropped.
        let bytes = self.read_into(copies, &readback)?;
        readback.unmap();
        if let Some(m) = small {
            *lock(m) = Some(readback);
        }
        Ok(bytes)
    }

    fn readback_buffer(&self, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Copies each `(source, offset, size)` into `readback`, side by side
    /// from its start, waits, and returns them (the buffer left mapped).
    fn read_into(
        &self,
        copies: &[(&wgpu::Buffer, u64, u64)],
        readback: &wgpu::Buffer,
    ) -> Result<Vec<u8>, DeviceError> {
        let mut size = 0;
        self.with_encoder(|enc| {
            for &(source, offset, len) in copies {
                enc.copy_buffer_to_buffer(source, offset, readback, size, len);
                size += len;
            }
        });
        self.waits.fetch_add(1, Ordering::Relaxed);
        let submitted = self.flush_taking_arenas();
        let (tx, rx) = std::sync::mpsc::channel();
        readback.map_async(wgpu::MapMode::Read, ..size, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(DeviceError::Poll)?;
        self.recycle(submitted);
        self.take_errors()?;
        rx.recv()
            .map_err(DeviceError::MapLost)?
            .map_err(DeviceError::MapFailed)?;
        let view = readback
            .get_mapped_range(..size)
            .map_err(DeviceError::MappedRange)?;
        Ok(view.to_vec())
    }
}
