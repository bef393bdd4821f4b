//! Allocator strategies behind one trait, so the same allocation trace can be
//! run through each and compared: peak reserved memory, fragmentation
//! against the lower bound (the peak of live requested bytes), device
//! allocations, out-of-memory at a capacity, cost per operation.
//!
//! Every online strategy draws device memory from a [`SegmentSource`]
//! (simulated here; `WgpuSource` on a GPU), so "reserved" is what the device
//! actually handed out. `planner` is offline: it sees the whole trace first.
//! `vramlab` (granules.rs) is `expandable`'s decisions over physical memory
//! in 2 MiB granules mapped only under live blocks.

pub mod buckets;
pub mod buddy;
pub mod granules;
pub mod nocache;
pub mod planner;
pub mod pytorch;
pub mod sliced;
pub mod vramlab;

use crate::memory::source::SegmentSource;
pub use crate::memory::tag::Category;
use crate::memory::SimulatedSource;

/// A block handed out by a strategy.
pub type Handle = u64;

/// A `HashMap` keyed by integers (the allocator's hasher).
pub(crate) use crate::memory::id_hash::IdMap;

/// The device (or the capacity) said no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oom;

/// An online allocator.
pub trait Strategy {
    fn name(&self) -> &'static str;
    /// `category`: what the block will hold, where known — a hint about its
    /// lifetime that only lifetime-aware strategies use.
    fn malloc(&mut self, size: u64, category: Category) -> Result<Handle, Oom>;
    fn free(&mut self, handle: Handle);
    /// Returns cached memory to the device, where the strategy caches.
    fn empty_cache(&mut self) {}
    /// Bytes in blocks handed out (after the strategy's rounding).
    fn allocated(&self) -> u64;
    /// What the device has handed out: bytes held, segments obtained and
    /// returned.
    fn device(&self) -> DeviceCounts;
    /// Bytes held from the device.
    fn reserved(&self) -> u64 {
        self.device().reserved
    }
    fn device_allocs(&self) -> u64 {
        self.device().allocs
    }
    fn device_frees(&self) -> u64 {
        self.device().frees
    }
    /// Pages mapped and unmapped one by one, where the strategy remaps
    /// physical memory as it goes (`vramlab`); `None` elsewhere.
    fn mappings(&self) -> Option<Mappings> {
        None
    }
}

/// Granules mapped and unmapped (each a cuMemMap / cuMemUnmap on CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Mappings {
    pub maps: u64,
    pub unmaps: u64,
}

/// A strategy's device-side counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCounts {
    pub reserved: u64,
    pub allocs: u64,
    pub frees: u64,
}

/// The strategies `replay --allocators` and `bench-alloc` know.
pub const NAMES: [&str; 8] = [
    "pytorch",
    "expandable",
    "nocache",
    "buckets",
    "sliced",
    "buddy",
    "planner",
    "vramlab",
];

/// Rounds up to a multiple of `a` (a power of two).
pub(crate) fn align(size: u64, a: u64) -> u64 {
    size.div_ceil(a) * a
}

/// A segment source wrapper that counts device calls and bytes held.
pub(crate) struct Device<S: SegmentSource> {
    pub source: S,
    next: u64,
    pub reserved: u64,
    pub allocs: u64,
    pub frees: u64,
}

impl<S: SegmentSource> Device<S> {
    pub fn new(source: S) -> Self {
        Device {
            source,
            next: 0,
            reserved: 0,
            allocs: 0,
            frees: 0,
        }
    }

    /// A new segment's id, or Oom.
    pub fn alloc(&mut self, size: u64) -> Result<u64, Oom> {
        let id = self.next;
        self.source
            .allocate(crate::memory::SegmentId(id), size)
            .map_err(|_| Oom)?;
        self.next += 1;
        self.reserved += size;
        self.allocs += 1;
        Ok(id)
    }

    pub fn counts(&self) -> DeviceCounts {
        DeviceCounts {
            reserved: self.reserved,
            allocs: self.allocs,
            frees: self.frees,
        }
    }

    pub fn release(&mut self, id: u64, size: u64) {
        self.source.release(crate::memory::SegmentId(id), size);
        self.reserved -= size;
        self.frees += 1;
    }
}

/// The online strategy called `name` over a simulated device of `capacity`
/// bytes (unlimited when `None`); `None` for `planner` (offline) or an
/// unknown name.
pub fn online(name: &str, capacity: Option<u64>) -> Option<Box<dyn Strategy>> {
    let src = match capacity {
        Some(c) => SimulatedSource::new(c),
        None => SimulatedSource::unlimited(),
    };
    online_on(name, src)
}

/// The online strategy called `name` under `config` (`--alloc-conf`):
/// `pytorch` runs with it as given, `expandable` and `vramlab` with
/// expandable segments on; the rest have no options to take.
pub fn online_configured(
    name: &str,
    capacity: Option<u64>,
    config: &crate::memory::AllocatorConfig,
) -> Option<Box<dyn Strategy>> {
    let src = match capacity {
        Some(c) => SimulatedSource::new(c),
        None => SimulatedSource::unlimited(),
    };
    let config = crate::memory::AllocatorConfig {
        memory_limit: None,
        ..config.clone()
    };
    Some(match name {
        "pytorch" => Box::new(pytorch::Pytorch::new(src, config, "pytorch")),
        "vramlab" => Box::new(granules::Vramlab::new(src, config)),
        "expandable" => Box::new(pytorch::Pytorch::new(
            src,
            crate::memory::AllocatorConfig {
                expandable_segments: true,
                ..config
            },
            "expandable",
        )),
        _ => return online_on(name, src),
    })
}

/// The online strategy called `name` over any segment source — a
/// `WgpuSource` makes every segment a real GPU buffer.
pub fn online_on<S: SegmentSource + 'static>(name: &str, src: S) -> Option<Box<dyn Strategy>> {
    Some(match name {
        "pytorch" => Box::new(pytorch::Pytorch::new(src, Default::default(), "pytorch")),
        // Expandable segments over 2 MiB granules remapped as blocks come
        // and go (granules.rs); like `expandable`, it needs page mapping.
        "vramlab" => Box::new(granules::Vramlab::new(src, Default::default())),
        // PyTorch's expandable_segments:True (memory/expandable.rs).
        "expandable" => Box::new(pytorch::Pytorch::new(
            src,
            crate::memory::AllocatorConfig {
                expandable_segments: true,
                ..Default::default()
            },
            "expandable",
        )),
        "nocache" => Box::new(nocache::NoCache::new(src)),
        "buckets" => Box::new(buckets::Buckets::new(src)),
        "sliced" => Box::new(sliced::Sliced::new(src)),
        "buddy" => Box::new(buddy::Buddy::new(src)),
        _ => return None,
    })
}
