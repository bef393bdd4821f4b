//! The allocator's state as far as its decisions go: every block's address,
//! size, requested bytes and whether it is allocated, with the counters that
//! place new segments. Two allocators with equal keys, given the same
//! requests and frees (by size, whatever the tensors' names), make the same
//! decisions: a replay that reaches a key it had one period earlier repeats
//! that period exactly (vramlab-parallel skips such repeats).

use crate::caching::CachingAllocator;
use crate::source::SegmentSource;

impl<S: SegmentSource> CachingAllocator<S> {
    /// The key, or `None` where the allocator keeps state beyond its blocks
    /// that decides what it does: a placement hook, the garbage
    /// collector's block ages, expandable segments' page maps.
    pub fn layout_key(&self) -> Option<Vec<u64>> {
        let c = self.config();
        if c.placement.is_some()
            || c.garbage_collection_threshold > 0.0
            || c.expandable_segments
            || self.expandable_count > 0
        {
            return None;
        }
        let mut blocks: Vec<[u64; 5]> = self
            .live_blocks()
            .map(|(_, b)| {
                [
                    b.address,
                    b.size,
                    if b.allocated { b.requested } else { 0 },
                    u64::from(b.allocated),
                    b.segment.0,
                ]
            })
            .collect();
        blocks.sort_unstable();
        let mut key = vec![self.next_segment_id, self.next_address, self.total_reserved];
        key.extend(blocks.iter().flatten());
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use crate::{AllocatorConfig, CachingAllocator, SimulatedSource};

    #[test]
    fn a_repeated_period_reaches_the_same_key_and_a_changed_one_does_not() {
        let mut a = CachingAllocator::new(SimulatedSource::unlimited(), AllocatorConfig::default());
        let keep = a.malloc(3 << 20, "keep").unwrap();
        let period = |a: &mut CachingAllocator<SimulatedSource>| {
            let x = a.malloc(5 << 20, "x").unwrap();
            let y = a.malloc(700, "y").unwrap();
            a.free(x.handle).unwrap();
            a.free(y.handle).unwrap();
        };
        period(&mut a);
        let first = a.layout_key().unwrap();
        period(&mut a);
        assert_eq!(a.layout_key().unwrap(), first);
        // A block still held changes it.
        let held = a.malloc(5 << 20, "x").unwrap();
        assert_ne!(a.layout_key().unwrap(), first);
        a.free(held.handle).unwrap();
        a.free(keep.handle).unwrap();
        // Expandable segments keep page maps the key does not hold.
        let config = AllocatorConfig {
            expandable_segments: true,
            ..Default::default()
        };
        let e = CachingAllocator::new(SimulatedSource::unlimited(), config);
        assert!(e.layout_key().is_none());
    }
}
