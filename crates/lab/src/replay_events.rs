//! A snapshot's replay as the allocator's own event log (every block and
//! segment, labelled with the code that allocated it), for pages that draw
//! memory over time: `vramlab doctor --out` renders it as memory_viz's
//! active-memory timeline and segment view.

use crate::error::LabError;
use crate::memory::{AllocatorConfig, MemEvent};
use crate::torch_snapshot::{apply_op, start_replay, Started, TorchSnapshot};
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
        let label = match *op {
            Op::Alloc { id, .. } => snap.origins.get(&id).and_then(|o| o.describe()),
            _ => None,
        };
        apply_op(&mut a, &mut handles, op, label.as_deref().unwrap_or(""));
    }
    Ok(a.take_events())
}
