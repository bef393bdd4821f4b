//! The segment source that makes the allocator real: each segment is one
//! wgpu storage buffer. Creation runs inside an out-of-memory error scope so a
//! device that is full gives the allocator `SourceError::OutOfMemory` (and the
//! allocator frees its cache and retries) instead of a wgpu panic.

use crate::memory::{SegmentId, SegmentSource, SourceError};
use std::collections::HashMap;

/// Segments as wgpu buffers.
pub struct WgpuSource {
    device: wgpu::Device,
    buffers: HashMap<SegmentId, wgpu::Buffer>,
    max_buffer_size: u64,
    name: String,
    used: u64,
}

impl WgpuSource {
    pub fn new(device: wgpu::Device, limits: &wgpu::Limits, adapter_name: &str) -> Self {
        WgpuSource {
            device,
            buffers: HashMap::new(),
            max_buffer_size: limits.max_buffer_size,
            name: adapter_name.to_string(),
            used: 0,
        }
    }

    /// The buffer behind a segment.
    pub fn buffer(&self, id: SegmentId) -> Option<&wgpu::Buffer> {
        self.buffers.get(&id)
    }

    /// Bytes held in buffers right now.
    pub fn used(&self) -> u64 {
        self.used
    }
}

impl SegmentSource for WgpuSource {
    fn allocate(&mut self, id: SegmentId, size: u64) -> Result<(), SourceError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&format!("segment {}", id.0)),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let validation_err = pollster::block_on(validation.pop());
        let oom_err = pollster::block_on(oom.pop());
        if oom_err.is_some() {
            return Err(SourceError::OutOfMemory);
        }
        if let Some(e) = validation_err {
            return Err(SourceError::Other(e.to_string()));
        }
        self.buffers.insert(id, buffer);
        self.used += size;
        Ok(())
    }

    fn release(&mut self, id: SegmentId, size: u64) {
        // Dropping (not destroying) lets wgpu keep the buffer alive until
        // submitted work that uses it has finished.
        if self.buffers.remove(&id).is_some() {
            self.used -= size;
        }
    }

    fn total_capacity(&self) -> Option<u64> {
        None
    }

    fn free_capacity(&self) -> Option<u64> {
        None
    }

    fn max_segment_size(&self) -> u64 {
        self.max_buffer_size
    }

    fn describe(&self) -> String {
        format!("wgpu buffers on {}", self.name)
    }
}
