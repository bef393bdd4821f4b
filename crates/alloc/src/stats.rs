//! Allocator statistics with PyTorch's names and shapes (`DeviceStats` in
//! CUDACachingAllocator.h), so numbers from vramlab and from
//! `torch.cuda.memory_stats()` can be compared key by key.

use serde::Serialize;
use std::collections::BTreeMap;

/// One counter: its current value, its peak since the last reset, and the
/// running totals of increases and decreases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    // Currents stay below 2^62 (`MAX_BYTES`: every source refuses more),
    // so they need no overflow checks, which the replay loop paid for on
    // every statistic; the accumulated counters grow for the whole run, so
    // they saturate rather than wrap.
    #[inline]
    pub fn increase(&mut self, amount: i64) {
        self.current = self.current.wrapping_add(amount);
        self.peak = self.peak.max(self.current);
        self.allocated = self.allocated.saturating_add(amount);
    }

    #[inline]
    pub fn decrease(&mut self, amount: i64) {
        self.current = self.current.wrapping_sub(amount);
        self.freed = self.freed.saturating_add(amount);
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pool a statistic is about. The order is PyTorch's `StatType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum StatType {
    Aggregate = 0,
    SmallPool = 1,
    LargePool = 2,
}

impl StatType {
    pub const ALL: [StatType; 3] = [
        StatType::Aggregate,
        StatType::SmallPool,
        StatType::LargePool,
    ];

    /// The name used in flat keys: `all`, `small_pool`, `large_pool`.
    pub fn key(self) -> &'static str {
        match self {
            StatType::Aggregate => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// A statistic kept for all pools and for each pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// Changes the aggregate and the given pool together, as PyTorch's
    /// `for_each_selected_stat_type` does.
    #[inline]
    pub fn increase(&mut self, pool: StatType, amount: i64) {
        self.0[0].increase(amount);
        self.0[pool as usize].increase(amount);
    }

    #[inline]
    pub fn decrease(&mut self, pool: StatType, amount: i64) {
        self.0[0].decrease(amount);
        self.0[pool as usize].decrease(amount);
    }

    #[inline]
    pub fn get(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }

    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f);
    }
}

/// Every statistic the allocator keeps; field names are PyTorch's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeviceStats {
    /// Blocks handed out and not yet freed.
    pub allocation: StatArray,
    /// Segments obtained from the device.
    pub segment: StatArray,
    /// Blocks in use (allocated, or freed but still awaited by the device).
    pub active: StatArray,
    /// Free blocks that cannot be released because their segment is split.
    pub inactive_split: StatArray,
    /// Bytes in allocated blocks (after rounding).
    pub allocated_bytes: StatArray,
    /// Bytes in segments held from the device.
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    /// Bytes asked for, before rounding.
    pub requested_bytes: StatArray,
    /// Failed device allocations that led to a cache flush and retry.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors returned.
    pub num_ooms: i64,
    /// Always 0: one in-order queue means no cross-stream events to wait for.
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    /// The configured `max_split_size` (reported like PyTorch, as a size).
    pub max_split_size: i64,
}

impl DeviceStats {
    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// The named arrays in PyTorch's key order.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ]
    }

    /// `reset_peak_memory_stats`: every peak becomes the current value.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats`: totals and event counters go to zero.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The flat dictionary `torch.cuda.memory_stats()` returns, keys sorted:
    /// `allocated_bytes.all.current`, ..., `num_ooms`, `max_split_size`.
    pub fn flat(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for (name, arr) in self.arrays() {
            for t in StatType::ALL {
                let s = arr.get(t);
                for (m, v) in [
                    ("current", s.current),
                    ("peak", s.peak),
                    ("allocated", s.allocated),
                    ("freed", s.freed),
                ] {
                    out.insert(format!("{name}.{}.{m}", t.key()), v);
                }
            }
        }
        for (name, s) in [
            ("oversize_allocations", &self.oversize_allocations),
            ("oversize_segments", &self.oversize_segments),
        ] {
            out.insert(format!("{name}.current"), s.current);
            out.insert(format!("{name}.peak"), s.peak);
            out.insert(format!("{name}.allocated"), s.allocated);
            out.insert(format!("{name}.freed"), s.freed);
        }
        out.insert("num_alloc_retries".into(), self.num_alloc_retries);
        out.insert("num_ooms".into(), self.num_ooms);
        out.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        out.insert("num_device_alloc".into(), self.num_device_alloc);
        out.insert("num_device_free".into(), self.num_device_free);
        out.insert("max_split_size".into(), self.max_split_size);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = Stat::default();
        s.increase(10);
        s.decrease(4);
        s.increase(1);
        assert_eq!(
            s,
            Stat {
                current: 7,
                peak: 10,
                allocated: 11,
                freed: 4
            }
        );
        s.reset_peak();
        assert_eq!(s.peak, 7);
    }

    #[test]
    fn flat_keys_follow_pytorch() {
        let mut d = DeviceStats::default();
        d.allocated_bytes.increase(StatType::SmallPool, 512);
        let f = d.flat();
        assert_eq!(f["allocated_bytes.all.current"], 512);
        assert_eq!(f["allocated_bytes.small_pool.current"], 512);
        assert_eq!(f["allocated_bytes.large_pool.current"], 0);
        assert!(f.contains_key("num_device_alloc"));
        assert!(f.contains_key("requested_bytes.large_pool.freed"));
        assert_eq!(f.len(), 9 * 3 * 4 + 8 + 6);
    }
}
