//! The names the allocator hands out and the hook reads: a block's handle
//! and its pool. Kept apart from the allocator so the placement hook's
//! interface (placement.rs) depends on these alone.

use super::stats::StatType;

/// The two pools. Blocks never move between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Small,
    Large,
}

impl PoolKind {
    pub fn stat_type(self) -> StatType {
        match self {
            PoolKind::Small => StatType::SmallPool,
            PoolKind::Large => StatType::LargePool,
        }
    }
}

/// Names one allocated block. The generation makes a stale handle (a double
/// free) detectable instead of freeing whatever reused the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHandle {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl BlockHandle {
    pub(crate) fn new(index: usize, generation: u32) -> BlockHandle {
        BlockHandle {
            index: index as u32,
            generation,
        }
    }
}
