//! Choosing an adapter: by `--backend`, `--adapter SUBSTRING`, or
//! `WGPU_BACKEND`, preferring real GPUs over software ones, and saying why.

use super::error::{install_hint, DeviceError};
use serde::Serialize;

/// Backends a user can ask for by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    Vulkan,
    Metal,
    Dx12,
    Gl,
}

impl BackendChoice {
    pub fn backends(self) -> wgpu::Backends {
        match self {
            BackendChoice::Vulkan => wgpu::Backends::VULKAN,
            BackendChoice::Metal => wgpu::Backends::METAL,
            BackendChoice::Dx12 => wgpu::Backends::DX12,
            BackendChoice::Gl => wgpu::Backends::GL,
        }
    }
}

/// How to pick the adapter.
#[derive(Debug, Clone, Default)]
pub struct AdapterOptions {
    /// Only this backend (overrides `WGPU_BACKEND`).
    pub backend: Option<BackendChoice>,
    /// Only adapters whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// Do not enable SHADER_F16 even where the adapter has it (f16 is then
    /// packed in words and computed in f32, as on adapters without it).
    pub without_shader_f16: bool,
    /// Bind tensors in windows of at most this many bytes instead of the
    /// adapter's `max_storage_buffer_binding_size`: for tests, so tensors
    /// of a few KiB span many windows.
    pub binding_limit: Option<u64>,
    /// Back segments with buffers of at most this many bytes instead of
    /// the adapter's `max_buffer_size`: for tests, so a segment spans many
    /// buffers and tensors cross from one into the next.
    pub buffer_limit: Option<u64>,
    /// Leave cooperative matrices (tensor cores) unused even where the
    /// adapter offers f16 ones: f16 products then run the plain kernels.
    pub without_cooperative_matrix: bool,
    /// Keep wgpu's runtime bounds checks in trusted kernels too
    /// ([`super::Kernel::trusted`]).
    pub checked_kernels: bool,
}

/// What `info` shows about one adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    pub device: u32,
}

impl AdapterSummary {
    pub fn from_info(info: &wgpu::AdapterInfo) -> Self {
        AdapterSummary {
            name: info.name.clone(),
            backend: info.backend.to_str().to_string(),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            vendor: info.vendor,
            device: info.device,
        }
    }
}

/// The backends to search: `--backend`, else `WGPU_BACKEND`, else all.
/// A `WGPU_BACKEND` that names nothing wgpu knows is an error, not "no
/// adapter found" with advice to install a driver.
pub fn backends_for(options: &AdapterOptions) -> Result<(wgpu::Backends, String), DeviceError> {
    if let Some(b) = options.backend {
        return Ok((b.backends(), format!("--backend {b:?}").to_lowercase()));
    }
    let value = std::env::var("WGPU_BACKEND").unwrap_or_default();
    Ok(match wgpu::Backends::from_env() {
        Some(b) if b.is_empty() => return Err(DeviceError::UnknownBackend(value)),
        Some(b) => (b, format!("WGPU_BACKEND={value}")),
        None => (wgpu::Backends::all(), "all backends".to_string()),
    })
}

fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

fn backend_rank(b: wgpu::Backend) -> u8 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    }
}

/// Where `--backend` names a backend this platform has no driver for at
/// all (Metal off macOS, DX12 off Windows), what to name instead: an
/// install hint would send the user after a driver that cannot exist.
fn backend_hint(backend: BackendChoice) -> Option<&'static str> {
    match backend {
        BackendChoice::Metal if !cfg!(target_os = "macos") => Some(
            "Metal exists on macOS (and iOS) only: leave --backend out, and vramlab searches the backends this machine has.",
        ),
        BackendChoice::Dx12 if !cfg!(target_os = "windows") => Some(
            "DX12 exists on Windows only: leave --backend out, and vramlab searches the backends this machine has.",
        ),
        _ => None,
    }
}

/// Picks the best adapter among `adapters` and explains the choice.
pub fn choose(
    adapters: Vec<wgpu::Adapter>,
    options: &AdapterOptions,
    searched: &str,
) -> Result<(wgpu::Adapter, String), DeviceError> {
    if adapters.is_empty() {
        return Err(DeviceError::NoAdapter {
            searched: searched.to_string(),
            hint: options
                .backend
                .and_then(backend_hint)
                .unwrap_or_else(install_hint),
        });
    }
    let names: Vec<String> = adapters
        .iter()
        .map(|a| {
            let i = a.get_info();
            format!("{} ({})", i.name, i.backend.to_str())
        })
        .collect();
    let mut candidates: Vec<wgpu::Adapter> = match &options.adapter {
        Some(wanted) => {
            let w = wanted.to_lowercase();
            adapters
                .into_iter()
                .filter(|a| a.get_info().name.to_lowercase().contains(&w))
                .collect()
        }
        None => adapters,
    };
    if candidates.is_empty() {
        return Err(DeviceError::NoMatchingAdapter {
            wanted: options.adapter.clone().unwrap_or_default(),
            found: names,
        });
    }
    let n = candidates.len();
    candidates.sort_by_key(|a| {
        let i = a.get_info();
        (type_rank(i.device_type), backend_rank(i.backend))
    });
    let best = candidates.swap_remove(0);
    let info = best.get_info();
    let mut reason = if n == 1 {
        format!("the only adapter found in {searched}")
    } else {
        format!(
            "best of {n} adapters in {searched}: {:?} ranks first (discrete > integrated > virtual > CPU; Vulkan/Metal/DX12 over GL)",
            info.device_type
        )
    };
    if let Some(w) = &options.adapter {
        reason.push_str(&format!(", matching --adapter {w:?}"));
    }
    Ok((best, reason))
}
