//! Device-level failures as values with a message that says what to do.

use super::compose::ComposeError;

/// What can go wrong talking to the GPU.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("no GPU adapter found (searched {searched}). {hint}")]
    NoAdapter {
        /// The backends searched (`all backends`, `WGPU_BACKEND=vulkan`).
        searched: String,
        hint: &'static str,
    },
    #[error("no adapter matches --adapter {wanted:?}; adapters found: {}", .found.join(", "))]
    NoMatchingAdapter { wanted: String, found: Vec<String> },
    #[error("the adapter {adapter:?} refused to create a device: {source}")]
    RequestDevice {
        adapter: String,
        #[source]
        source: wgpu::RequestDeviceError,
    },
    #[error("dispatch of {kernel} binds tensors of {sizes:?} bytes in {needed} windows (at most {window} bytes each, none across the {piece}-byte buffers memory is made of), but this device binds at most {limit} storage buffers per kernel (max_storage_buffers_per_shader_stage); {fix}")]
    TooManyWindows {
        kernel: String,
        sizes: Vec<u64>,
        needed: u32,
        limit: u32,
        window: u64,
        piece: u64,
        /// What makes the windows fewer: the flags that shrank them, or
        /// smaller tensors.
        fix: String,
    },
    #[error("dispatch of {kernel} needs a grid of {groups} workgroups, more than this device can launch; split the work")]
    GridTooLarge { kernel: String, groups: u64 },
    /// A kernel's template that does not compose: a bug in the kernel.
    #[error("kernel {kernel}: {source}")]
    Shader {
        kernel: String,
        #[source]
        source: ComposeError,
    },
    #[error("waiting for the GPU failed: {0}")]
    Poll(#[source] wgpu::PollError),
    #[error("reading results back from the GPU failed: the buffer could not be mapped")]
    MapFailed(#[source] wgpu::BufferAsyncError),
    #[error("reading results back from the GPU failed: the mapping callback was dropped")]
    MapLost(#[source] std::sync::mpsc::RecvError),
    #[error("reading results back from the GPU failed: {0}")]
    MappedRange(#[source] wgpu::MapRangeError),
    /// Errors wgpu reported through its uncaptured-error callback since the
    /// last synchronisation, in its own words (its error values are not
    /// `Sync`, so their text is what is kept).
    #[error("the GPU reported an error: {}", .0.join("; "))]
    Wgpu(Vec<String>),
    #[error("a tensor of a simulated device was bound to a real GPU")]
    SimulatedTensor,
    #[error("segment {segment} has no buffer")]
    NoSegmentBuffer { segment: u64 },
    #[error("{var}={value:?}: expected {expected}")]
    Env {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("WGPU_BACKEND={0:?} names no backend wgpu knows; use vulkan, metal, dx12 or gl (comma-separated for several), or unset it")]
    UnknownBackend(String),
}

/// The install hint shown when no adapter exists, per platform.
pub fn install_hint() -> &'static str {
    if cfg!(target_os = "linux") {
        "Install a Vulkan driver; with no GPU, Mesa's software driver works: `sudo apt-get install mesa-vulkan-drivers` (Debian/Ubuntu) or `sudo dnf install mesa-vulkan-drivers` (Fedora). `vulkaninfo --summary` (package vulkan-tools) then lists llvmpipe."
    } else if cfg!(target_os = "macos") {
        "Metal should always be present on macOS; check that you are not running inside a VM without GPU access."
    } else if cfg!(target_os = "windows") {
        "Install or update your GPU vendor's driver (DX12 or Vulkan); with no GPU, the WARP software adapter comes with Windows' Graphics Tools."
    } else {
        "Install a Vulkan, Metal, DX12 or OpenGL driver for this machine."
    }
}
