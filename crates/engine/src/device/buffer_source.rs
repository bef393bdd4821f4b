//! The segment source behind a real device: each allocator segment is
//! memory in wgpu buffers, one buffer where the segment fits in one
//! (`max_buffer_size`), else consecutive buffers (see `SegmentBuffers`).
//! The allocator above sees one contiguous segment either way, so its
//! sizes, rounding and statistics are PyTorch's on every adapter.

use super::bind_groups::BindGroupCache;
use super::gpu::Gpu;
use super::segment_buffers::SegmentBuffers;
use crate::memory::{SegmentId, SegmentSource, SourceError};
use std::collections::HashMap;
use std::sync::Arc;

pub struct WgpuSource {
    device: wgpu::Device,
    /// Told of every released segment, so that no cached bind group keeps
    /// its memory.
    bind_groups: Option<Arc<BindGroupCache>>,
    segments: HashMap<SegmentId, SegmentBuffers>,
    piece: u64,
    capacity: Option<u64>,
    name: String,
    used: u64,
}

impl WgpuSource {
    /// Segments in buffers of at most `piece` bytes (a multiple of the
    /// storage offset alignment). `capacity`: the device's memory, where it
    /// is known (a CPU adapter's is the host's); wgpu does not report a
    /// GPU's, so there the driver's out-of-memory error is the limit.
    /// The source of `gpu`'s segments as its engine has it: buffers of the
    /// device's piece, its memory as the limit (past a CPU adapter's, the
    /// host's, out of memory rather than swapping), its bind groups told of
    /// every release.
    pub fn of(gpu: &Gpu) -> Self {
        WgpuSource::new(
            gpu.device.clone(),
            gpu.buffer_piece,
            gpu.device_memory(),
            &gpu.info.name,
            Some(gpu.bind_groups()),
        )
    }

    pub fn new(
        device: wgpu::Device,
        piece: u64,
        capacity: Option<u64>,
        adapter_name: &str,
        bind_groups: Option<Arc<BindGroupCache>>,
    ) -> Self {
        WgpuSource {
            device,
            bind_groups,
            segments: HashMap::new(),
            piece,
            capacity,
            name: adapter_name.to_string(),
            used: 0,
        }
    }

    /// The buffers behind a segment.
    pub fn buffers(&self, id: SegmentId) -> Option<&SegmentBuffers> {
        self.segments.get(&id)
    }

    /// Bytes held in buffers right now.
    pub fn used(&self) -> u64 {
        self.used
    }

    fn create(&self, id: SegmentId, part: usize, size: u64) -> Result<wgpu::Buffer, SourceError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&format!("segment {} part {part}", id.0)),
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
        Ok(buffer)
    }
}

impl SegmentSource for WgpuSource {
    fn allocate(&mut self, id: SegmentId, size: u64) -> Result<(), SourceError> {
        if self
            .capacity
            .is_some_and(|c| self.used.saturating_add(size) > c)
        {
            return Err(SourceError::OutOfMemory);
        }
        // Buffers made before a later one fails are dropped with the Vec.
        let mut buffers = Vec::with_capacity(size.div_ceil(self.piece) as usize);
        let mut at = 0;
        while at < size {
            let part = self.piece.min(size - at);
            buffers.push(self.create(id, buffers.len(), part)?);
            at += part;
        }
        self.segments
            .insert(id, SegmentBuffers::new(buffers, self.piece));
        self.used += size;
        Ok(())
    }

    fn release(&mut self, id: SegmentId, size: u64) {
        // Dropping (not destroying) lets wgpu keep the buffers alive until
        // submitted work that uses them has finished.
        if let Some(buffers) = self.segments.remove(&id) {
            if let Some(cache) = &self.bind_groups {
                cache.forget(buffers.all());
            }
            self.used -= size;
        }
    }

    fn total_capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn free_capacity(&self) -> Option<u64> {
        self.capacity.map(|c| c.saturating_sub(self.used))
    }

    fn max_segment_size(&self) -> u64 {
        // Any size: a segment past one buffer is several.
        u64::MAX
    }

    fn describe(&self) -> String {
        format!("wgpu buffers on {}", self.name)
    }
}
