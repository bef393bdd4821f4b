//! What `vramlab info` reports: adapters, the chosen one and why, the limits
//! that decide what fits, the features, and the driver's own allocator.

use super::adapter::AdapterSummary;
use super::gpu::Gpu;
use serde::Serialize;

/// The limits that matter for memory and kernels.
#[derive(Debug, Clone, Serialize)]
pub struct LimitsSummary {
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub min_storage_buffer_offset_alignment: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    /// The window a tensor past the binding limit is bound in (the limit,
    /// aligned; see device::windows).
    pub binding_window: u64,
    /// The bytes one buffer of a segment holds: a larger segment is backed
    /// by several (see SegmentBuffers).
    pub buffer_piece: u64,
    /// The device's memory, known for a CPU adapter (the host's); `null`
    /// on a GPU, whose memory wgpu does not report (its driver's
    /// out-of-memory error is then the limit).
    pub device_memory_bytes: Option<u64>,
    /// The largest tensor every op runs on: the device's memory, and no
    /// more than one kernel can bind (`largest_dispatch_bytes`). The flat
    /// kernels and products run in parts past that (`device::flat`,
    /// `ops::matmul::budget`), up to the memory.
    pub largest_tensor_bytes: u64,
    /// The most bytes one kernel's tensors can bind together: a window per
    /// storage binding the device allows.
    pub largest_dispatch_bytes: u64,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_workgroup_size_y: u32,
    pub max_compute_workgroup_size_z: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_workgroups_per_dimension: u32,
}

/// wgpu's allocator report, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct DriverAllocator {
    pub total_allocated_bytes: u64,
    pub total_reserved_bytes: u64,
    pub blocks: usize,
    pub allocations: usize,
}

impl DriverAllocator {
    pub fn of(gpu: &Gpu) -> Option<DriverAllocator> {
        gpu.allocator_report().map(|r| DriverAllocator {
            total_allocated_bytes: r.total_allocated_bytes,
            total_reserved_bytes: r.total_reserved_bytes,
            blocks: r.blocks.len(),
            allocations: r.allocations.len(),
        })
    }
}

/// Everything `info` prints.
#[derive(Debug, Clone, Serialize)]
pub struct InfoReport {
    pub adapters: Vec<AdapterSummary>,
    pub adapter: AdapterSummary,
    pub choice_reason: String,
    pub limits: LimitsSummary,
    /// Where `--binding-window` or `--buffer-limit` was capped or rounded:
    /// what was used, and why (empty where they were taken as given).
    pub option_notes: Vec<String>,
    /// Every feature the adapter offers, in wgpu's names (lowercase).
    pub features: Vec<String>,
    /// The features vramlab enabled on its device.
    pub enabled_features: Vec<String>,
    /// Cooperative-matrix shapes (`8×8×8 f16→f32`) the adapter offers.
    pub cooperative_matrices: Vec<String>,
    /// Whether vramlab's device runs f16 products on them (16×16×16 or
    /// 8×8×8 f16→f32 offered, native f16, not `--no-tensor-cores`).
    pub tensor_cores_used: bool,
    /// `null` where the backend gives no report (Metal, GL).
    pub driver_allocator: Option<DriverAllocator>,
    pub driver_allocator_note: String,
}

fn feature_names(f: wgpu::Features) -> Vec<String> {
    f.iter_names()
        .map(|(name, _)| name.to_lowercase().replace('_', "-"))
        .collect()
}

impl InfoReport {
    pub fn from_gpu(gpu: &Gpu) -> Self {
        let l = &gpu.limits;
        let report = gpu.allocator_report();
        let driver_allocator_note = match &report {
            Some(_) => "wgpu's own allocator (gpu-allocator) under vramlab's segments".to_string(),
            None => format!(
                "not reported by this backend ({})",
                gpu.info.backend.to_str()
            ),
        };
        let memory = gpu.device_memory();
        // Windows are cut at each buffer's end (--buffer-limit shrinks the
        // buffers), so a kernel's windows hold about a buffer's bytes over
        // the windows it takes each: 2 GiB − 32 B in 16 of 128 MiB.
        let piece = gpu.buffer_piece.max(1);
        let per_piece = piece.div_ceil(gpu.binding_window.max(1));
        let dispatch = piece / per_piece * l.max_storage_buffers_per_shader_stage as u64;
        InfoReport {
            adapters: gpu.adapters.clone(),
            adapter: gpu.summary(),
            choice_reason: gpu.choice_reason.clone(),
            limits: LimitsSummary {
                max_buffer_size: l.max_buffer_size,
                max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
                min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
                max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
                binding_window: gpu.binding_window,
                buffer_piece: gpu.buffer_piece,
                device_memory_bytes: memory,
                largest_tensor_bytes: memory.unwrap_or(u64::MAX).min(dispatch),
                largest_dispatch_bytes: dispatch,
                max_compute_workgroup_size_x: l.max_compute_workgroup_size_x,
                max_compute_workgroup_size_y: l.max_compute_workgroup_size_y,
                max_compute_workgroup_size_z: l.max_compute_workgroup_size_z,
                max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
                max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
                max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            },
            option_notes: gpu.option_notes(),
            features: feature_names(gpu.adapter_features),
            enabled_features: feature_names(gpu.features),
            cooperative_matrices: gpu.cooperative_matrices.clone(),
            tensor_cores_used: gpu
                .features
                .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            driver_allocator: report.map(|r| DriverAllocator {
                total_allocated_bytes: r.total_allocated_bytes,
                total_reserved_bytes: r.total_reserved_bytes,
                blocks: r.blocks.len(),
                allocations: r.allocations.len(),
            }),
            driver_allocator_note,
        }
    }
}
