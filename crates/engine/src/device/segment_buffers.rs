//! A segment's memory on the device: the wgpu buffers behind one allocator
//! segment. The allocator's segment is one contiguous range of bytes, as in
//! PyTorch. A wgpu buffer has a size limit (`max_buffer_size`, 2 GiB on
//! lavapipe), so a larger segment is backed by consecutive buffers of
//! `piece` bytes each. Byte `b` of the segment is byte `b % piece` of
//! buffer `b / piece`. `windows::split` cuts every binding and copy at
//! those boundaries.

use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct SegmentBuffers {
    buffers: Arc<[wgpu::Buffer]>,
    piece: u64,
}

impl SegmentBuffers {
    /// Buffers of `piece` bytes each (the last may be shorter).
    pub fn new(buffers: Vec<wgpu::Buffer>, piece: u64) -> Self {
        SegmentBuffers {
            buffers: buffers.into(),
            piece,
        }
    }

    /// One buffer, any size.
    pub fn single(buffer: wgpu::Buffer) -> Self {
        SegmentBuffers {
            buffers: Arc::from(vec![buffer]),
            piece: u64::MAX,
        }
    }

    /// The buffer holding the segment's bytes from `i * piece`.
    pub fn buffer(&self, i: usize) -> &wgpu::Buffer {
        &self.buffers[i]
    }

    /// How many buffers back the segment.
    pub fn count(&self) -> usize {
        self.buffers.len()
    }

    /// Every buffer of the segment.
    pub fn all(&self) -> &[wgpu::Buffer] {
        &self.buffers
    }

    /// Bytes per buffer (every buffer but the last is this size).
    pub fn piece(&self) -> u64 {
        self.piece
    }
}
