//! Device-level failures as values with a message that says what to do.

/// What can go wrong talking to the GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("no GPU adapter found{tried}. {hint}")]
    NoAdapter { tried: String, hint: String },
    #[error("no adapter matches --adapter {wanted:?}; adapters found: {found}")]
    NoMatchingAdapter { wanted: String, found: String },
    #[error("the adapter {adapter:?} refused to create a device: {reason}")]
    RequestDevice { adapter: String, reason: String },
    #[error("dispatch of {kernel} binds tensors of {sizes:?} bytes in {needed} windows (at most {window} bytes each, none across the {piece}-byte buffers memory is made of), but this device binds at most {limit} storage buffers per kernel (max_storage_buffers_per_shader_stage); use smaller tensors (a smaller batch)")]
    TooManyWindows {
        kernel: String,
        sizes: Vec<u64>,
        needed: u32,
        limit: u32,
        window: u64,
        piece: u64,
    },
    #[error("dispatch of {kernel} needs a grid of {groups} workgroups, more than this device can launch; split the work")]
    GridTooLarge { kernel: String, groups: u64 },
    #[error("reading results back from the GPU failed: {0}")]
    Readback(String),
    #[error("the GPU reported an error: {0}")]
    Wgpu(String),
    #[error("WGPU_BACKEND={0:?} names no backend wgpu knows; use vulkan, metal, dx12 or gl (comma-separated for several), or unset it")]
    UnknownBackend(String),
}

/// The install hint shown when no adapter exists, per platform.
pub fn install_hint() -> String {
    if cfg!(target_os = "linux") {
        "Install a Vulkan driver; with no GPU, Mesa's software driver works: `sudo apt-get install mesa-vulkan-drivers` (Debian/Ubuntu) or `sudo dnf install mesa-vulkan-drivers` (Fedora). `vulkaninfo --summary` (package vulkan-tools) then lists llvmpipe.".to_string()
    } else if cfg!(target_os = "macos") {
        "Metal should always be present on macOS; check that you are not running inside a VM without GPU access.".to_string()
    } else if cfg!(target_os = "windows") {
        "Install or update your GPU vendor's driver (DX12 or Vulkan); with no GPU, the WARP software adapter comes with Windows' Graphics Tools.".to_string()
    } else {
        "Install a Vulkan, Metal, DX12 or OpenGL driver for this machine.".to_string()
    }
}
