//! Bind groups made once and reused.
//!
//! A kernel's tensors are bound at the same offsets of the same buffers
//! step after step, since the caching allocator hands the same blocks back,
//! so their bind group (group 0: storage only) is cached under those
//! windows and shared by every kernel with as many storage bindings. A
//! dispatch's uniforms (its parameters and window table) sit at a new
//! offset of a uniform arena every time, so they are group 1, bound with
//! dynamic offsets: one bind group per arena and uniform sizes, kept with
//! the arena (see `gpu.rs`).
//!
//! A cached group holds its buffers alive, so a segment the allocator
//! releases is forgotten here at once ([`BindGroupCache::forget`]); the
//! driver then frees it as before. Past [`MAX_GROUPS`] distinct windows
//! the cache starts over.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Cached storage bind groups at most: a step of a zoo model binds a few
/// hundred distinct windows.
const MAX_GROUPS: usize = 4096;

/// Turns the cache off (`0`), to compare: every dispatch then creates its
/// storage bind group, as before the cache.
pub const BIND_GROUP_CACHE_VAR: &str = "VRAMLAB_BIND_GROUP_CACHE";

/// One storage window as bound: buffer, byte offset, byte size.
pub type Bound = (wgpu::Buffer, u64, u64);

/// A poisoned lock still guards whole maps: keep going.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct BindGroupCache {
    device: wgpu::Device,
    enabled: bool,
    inner: Mutex<Inner>,
    created: AtomicU64,
    reused: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// Group 0 with n read-write storage buffers, by n.
    storage_layouts: HashMap<usize, wgpu::BindGroupLayout>,
    /// Group 1 with n dynamic-offset uniforms, by n.
    uniform_layouts: HashMap<usize, wgpu::BindGroupLayout>,
    groups: HashMap<Vec<Bound>, wgpu::BindGroup>,
}

impl BindGroupCache {
    pub fn new(device: wgpu::Device, enabled: bool) -> Self {
        BindGroupCache {
            device,
            enabled,
            inner: Mutex::new(Inner::default()),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        }
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The pipeline layout of a kernel with `storage` storage bindings in
    /// group 0 and `uniforms` uniforms in group 1 (none: no group 1).
    pub fn pipeline_layout(&self, storage: usize, uniforms: usize) -> wgpu::PipelineLayout {
        let s = self.storage_layout(storage);
        let u = (uniforms > 0).then(|| self.uniform_layout(uniforms));
        let mut groups: Vec<Option<&wgpu::BindGroupLayout>> = vec![Some(&s)];
        groups.extend(u.as_ref().map(Some));
        self.device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("vramlab"),
                bind_group_layouts: &groups,
                immediate_size: 0,
            })
    }

    fn storage_layout(&self, n: usize) -> wgpu::BindGroupLayout {
        let mut inner = lock(&self.inner);
        let device = &self.device;
        inner
            .storage_layouts
            .entry(n)
            .or_insert_with(|| {
                layout(
                    device,
                    n,
                    wgpu::BufferBindingType::Storage { read_only: false },
                    false,
                )
            })
            .clone()
    }

    pub fn uniform_layout(&self, n: usize) -> wgpu::BindGroupLayout {
        let mut inner = lock(&self.inner);
        let device = &self.device;
        inner
            .uniform_layouts
            .entry(n)
            .or_insert_with(|| layout(device, n, wgpu::BufferBindingType::Uniform, true))
            .clone()
    }

    /// The group-0 bind group of `bound`, in binding order: the cached
    /// one, or a new one (cached unless the cache is off).
    pub fn storage_group(&self, bound: Vec<Bound>) -> wgpu::BindGroup {
        if self.enabled {
            if let Some(g) = lock(&self.inner).groups.get(&bound) {
                self.reused.fetch_add(1, Ordering::Relaxed);
                return g.clone();
            }
        }
        let layout = self.storage_layout(bound.len());
        let entries: Vec<wgpu::BindGroupEntry> = bound
            .iter()
            .enumerate()
            .map(|(i, (buffer, offset, size))| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: *offset,
                    size: wgpu::BufferSize::new(*size),
                }),
            })
            .collect();
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("tensors"),
            layout: &layout,
            entries: &entries,
        });
        self.created.fetch_add(1, Ordering::Relaxed);
        if self.enabled {
            let mut inner = lock(&self.inner);
            if inner.groups.len() >= MAX_GROUPS {
                inner.groups.clear();
            }
            inner.groups.insert(bound, group.clone());
        }
        group
    }

    /// Drops every cached group that binds one of `buffers` (a segment the
    /// allocator released), so that its memory goes back to the driver.
    pub fn forget(&self, buffers: &[wgpu::Buffer]) {
        // A buffer hashes and compares by its identity, which never changes.
        #[allow(clippy::mutable_key_type)]
        let gone: HashSet<&wgpu::Buffer> = buffers.iter().collect();
        lock(&self.inner)
            .groups
            .retain(|bound, _| !bound.iter().any(|(b, _, _)| gone.contains(b)));
    }

    /// Storage bind groups created and reused so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.created.load(Ordering::Relaxed),
            self.reused.load(Ordering::Relaxed),
        )
    }

    /// Storage bind groups held now.
    pub fn held(&self) -> usize {
        lock(&self.inner).groups.len()
    }
}

fn layout(
    device: &wgpu::Device,
    n: usize,
    ty: wgpu::BufferBindingType,
    dynamic: bool,
) -> wgpu::BindGroupLayout {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..n)
        .map(|i| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: dynamic,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("vramlab"),
        entries: &entries,
    })
}

/// A kernel's composed WGSL with its uniforms moved to group 1 (numbered
/// from 0 in their binding order), and how many storage bindings and
/// uniforms it has. Every storage binding is read-write (tensors share
/// buffers, and wgpu refuses a read-only and a read-write binding of one
/// buffer in one dispatch), so the counts are the layout.
pub fn split_groups(wgsl: &str) -> (String, usize, usize) {
    let binding = |line: &str| -> Option<u32> {
        let rest = line.trim_start().strip_prefix("@group(0) @binding(")?;
        rest[..rest.find(')')?].parse().ok()
    };
    let mut uniforms: Vec<u32> = wgsl
        .lines()
        .filter(|l| l.contains("var<uniform>"))
        .filter_map(binding)
        .collect();
    uniforms.sort_unstable();
    let storage = wgsl
        .lines()
        .filter(|l| l.contains("var<storage") && binding(l).is_some())
        .count();
    let mut out = String::with_capacity(wgsl.len());
    for line in wgsl.lines() {
        let moved = line
            .trim_start()
            .strip_prefix("@group(0) @binding(")
            .filter(|_| line.contains("var<uniform>"))
            .and_then(|rest| {
                let close = rest.find(')')?;
                let b: u32 = rest[..close].parse().ok()?;
                let j = uniforms.iter().position(|&u| u == b)?;
                Some(format!("@group(1) @binding({j}){}", &rest[close + 1..]))
            });
        out.push_str(moved.as_deref().unwrap_or(line));
        out.push('\n');
    }
    (out, storage, uniforms.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_move_to_group_one_in_binding_order() {
        let wgsl = "\
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
  @group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> win_: array<vec4<u32>, 1>;
@group(0) @binding(2) var<uniform> p: Params;
fn main() {}";
        let (out, storage, uniforms) = split_groups(wgsl);
        assert_eq!((storage, uniforms), (2, 2));
        assert!(
            out.contains("@group(1) @binding(0) var<uniform> p: Params;"),
            "{out}"
        );
        assert!(out.contains("@group(1) @binding(1) var<uniform> win_: array<vec4<u32>, 1>;"));
        assert!(out.contains("@group(0) @binding(1) var<storage, read_write> y"));
        assert!(!out.contains("@group(0) @binding(2)"));
        assert!(out.contains("fn main() {}"));
    }
}
