//! What is live at a replay's peak, and where it ran out of memory: bytes
//! grouped by category, by the module that allocated them and by the
//! user's frame, and the largest blocks, so a prediction says which code
//! holds the memory, not only how much.

use crate::memory::tag::Category;
use crate::workload::Op;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Where an allocation came from: the module that ran it, the op whose
/// output it is (as the recording's `user_metadata` names it: an aten op,
/// or vramlab's tensor label) and the first frame of the user's own code
/// (not PyTorch's), as `file:line function`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Origin {
    pub module: Option<Arc<str>>,
    pub frame: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<Arc<str>>,
}

impl Origin {
    /// `MODULE (OP) at FILE:LINE FUNCTION`, any part left out that the
    /// recording does not say (the op bare without a module), or `None`
    /// where it says none.
    pub fn describe(&self) -> Option<String> {
        let op = |o: &Arc<str>| match self.module {
            Some(_) => format!("({o})"),
            None => o.to_string(),
        };
        let parts: Vec<String> = [
            self.module.as_deref().map(str::to_string),
            self.op.as_ref().map(op),
            self.frame.as_ref().map(|f| format!("at {f}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!parts.is_empty()).then(|| parts.join(" "))
    }
}

/// How many modules, frames and blocks a breakdown lists.
pub const TOP: usize = 8;

/// The allocated bytes at one moment, broken down.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveAt {
    /// Index of the trace operation after which this was taken.
    pub after_op: usize,
    pub allocated_bytes: u64,
    /// Blocks that existed before the recording began (no category known).
    pub before_recording_bytes: u64,
    /// Bytes per category, largest first (in JSON an object of category
    /// and bytes, as `profile` and `estimate` give it).
    #[serde(serialize_with = "as_object")]
    pub by_category: Vec<(String, u64)>,
    /// Bytes per module (the recorder's module path), largest first: all of
    /// them, so they sum to what the recording names a module for (text
    /// shows the first [`TOP`]).
    pub by_module: Vec<(String, u64)>,
    /// Bytes per user frame (`file:line function`), largest first: all.
    pub by_frame: Vec<(String, u64)>,
    /// The largest live blocks.
    pub largest: Vec<Block>,
}

/// Pairs of name and bytes as a JSON object.
fn as_object<S: serde::Serializer>(pairs: &[(String, u64)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(pairs.len()))?;
    for (k, v) in pairs {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// One live block of a breakdown.
#[derive(Debug, Clone, Serialize)]
pub struct Block {
    pub bytes: u64,
    pub category: Category,
    pub origin: Origin,
}

/// An allocation the replay could not place.
#[derive(Debug, Clone, Serialize)]
pub struct OomAt {
    /// Index of the trace operation.
    pub op: usize,
    pub requested_bytes: u64,
    pub category: Category,
    pub origin: Origin,
    /// Allocated and reserved bytes when it failed.
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

pub(crate) fn ranked(map: HashMap<String, u64>, top: usize) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = map.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(top);
    v
}

/// The trace allocations live after `ops[upto]`: those allocated (and not
/// refused: `failed`) and not yet freed, each of its block size in
/// `sizes`; `before` bytes of blocks from before the recording stay live
/// until the trace frees them (`pre_sizes`, by id).
pub fn live_at(
    ops: &[Op],
    upto: usize,
    failed: &HashSet<u64>,
    sizes: &HashMap<u64, u64>,
    pre_sizes: &HashMap<u64, u64>,
    before: u64,
    origins: &HashMap<u64, Origin>,
) -> LiveAt {
    let mut live: BTreeMap<u64, Category> = BTreeMap::new();
    let mut before = before;
    for op in ops.iter().take(upto.saturating_add(1)) {
        match *op {
            Op::Alloc { id, category, .. } if !failed.contains(&id) => {
                live.insert(id, category);
            }
            Op::Free { id } if live.remove(&id).is_none() => {
                before = before.saturating_sub(pre_sizes.get(&id).copied().unwrap_or(0));
            }
            _ => {}
        }
    }
    let (mut by_category, mut by_module, mut by_frame) =
        (HashMap::new(), HashMap::new(), HashMap::new());
    let mut blocks = Vec::new();
    let mut allocated = before;
    for (&id, &category) in &live {
        let bytes = sizes.get(&id).copied().unwrap_or(0);
        allocated += bytes;
        *by_category.entry(category.name().to_string()).or_insert(0) += bytes;
        let origin = origins.get(&id).cloned().unwrap_or_default();
        if let Some(m) = &origin.module {
            *by_module.entry(m.to_string()).or_insert(0) += bytes;
        }
        if let Some(f) = &origin.frame {
            *by_frame.entry(f.to_string()).or_insert(0) += bytes;
        }
        blocks.push(Block {
            bytes,
            category,
            origin,
        });
    }
    blocks.sort_by_key(|b| std::cmp::Reverse(b.bytes));
    blocks.truncate(TOP);
    LiveAt {
        after_op: upto,
        allocated_bytes: allocated,
        before_recording_bytes: before,
        by_category: ranked(by_category, usize::MAX),
        by_module: ranked(by_module, usize::MAX),
        by_frame: ranked(by_frame, usize::MAX),
        largest: blocks,
    }
}
