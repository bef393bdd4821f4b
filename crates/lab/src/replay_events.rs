//! A snapshot's replay as the allocator's own event log (every block and
//! segment, labelled with the code that allocated it), for pages that draw
//! memory over time: `vramlab doctor --out` renders it as memory_viz's
//! active-memory timeline and segment view.

use crate::error::LabError;
use crate::memory::{AllocatorConfig, MemEvent};
use crate::torch_snapshot::{start_replay, Started, TorchSnapshot};
use crate::workload::Op;

/// The events of replaying `snap` under `config` from its recorded start;
/// each allocation labelled with its module and the user's frame where the
/// recording names them. Refused allocations show as out-of-memory events.
pub fn replay_events(
    snap: &TorchSnapshot,
    config: AllocatorConfig,
    capacity: Option<u64>,
) -> Result<Vec<MemEvent>, LabError> {
    let Started {
        allocator: mut a,
        mut handles,
        ..
    } = start_replay(snap, config, capacity, true)?;
    for op in &snap.workload.ops {
        match *op {
            Op::Alloc { id, size, category } => {
                let label =
                    snap.origins
                        .get(&id)
                        .map_or(String::new(), |o| match (&o.module, &o.frame) {
                            (Some(m), Some(f)) => format!("{m} at {f}"),
                            (Some(m), None) => m.to_string(),
                            (None, Some(f)) => f.to_string(),
                            (None, None) => String::new(),
                        });
                if let Ok(x) = a.malloc_tagged(size.max(1), &label, category, None) {
                    handles.insert(id, x.handle);
                }
            }
            Op::Free { id } => {
                if let Some(h) = handles.remove(&id) {
                    let _ = a.free(h);
                }
            }
            Op::EmptyCache => a.empty_cache(),
        }
    }
    Ok(a.take_events())
}
