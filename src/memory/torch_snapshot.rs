//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()`) as
//! workloads: the `device_traces` history — `alloc` (address, requested
//! size), `free_requested` / `free_completed`, `segment_alloc` /
//! `segment_free` — becomes an allocation trace, and the segment events the
//! snapshot recorded are kept to compare with what the replay does.

use super::caching::round_size;
use super::config::AllocatorConfig;
use super::pickle::{unpickle, PyValue};
use super::workload::{Op, Workload};
use std::collections::HashMap;

pub struct TorchSnapshot {
    pub device: usize,
    pub workload: Workload,
    /// Sizes of the segments PyTorch obtained (`segment_alloc`), in order.
    pub segment_allocs: Vec<u64>,
    pub segment_frees: Vec<u64>,
    /// Peak of allocated bytes implied by the history (requests rounded as
    /// PyTorch rounds them, default settings).
    pub peak_allocated: u64,
}

/// Whether `bytes` look like a pickle (protocol 2+ starts with 0x80).
pub fn is_pickle(bytes: &[u8]) -> bool {
    bytes.first() == Some(&0x80)
}

pub fn read(bytes: &[u8], name: &str) -> Result<TorchSnapshot, String> {
    let root = unpickle(bytes).map_err(|e| format!("{name}: not a readable pickle: {e}"))?;
    let traces = root
        .get("device_traces")
        .and_then(PyValue::as_list)
        .ok_or_else(|| {
            format!("{name}: no device_traces; is it a torch.cuda.memory._dump_snapshot() pickle?")
        })?;
    let (device, trace) = traces
        .iter()
        .enumerate()
        .filter_map(|(d, t)| t.as_list().map(|t| (d, t)))
        .max_by_key(|(_, t)| t.len())
        .filter(|(_, t)| !t.is_empty())
        .ok_or_else(|| {
            format!("{name}: the snapshot has no allocation history; call torch.cuda.memory._record_memory_history() before the code you snapshot")
        })?;
    let action = |e: &PyValue| {
        e.get("action")
            .and_then(PyValue::as_str)
            .unwrap_or("")
            .to_string()
    };
    let has_completed = trace.iter().any(|e| action(e) == "free_completed");
    let free_action = if has_completed {
        "free_completed"
    } else {
        "free_requested"
    };
    let mut ids: HashMap<i64, u64> = HashMap::new();
    let (mut ops, mut seg_a, mut seg_f) = (Vec::new(), Vec::new(), Vec::new());
    let (mut live, mut peak, mut next) = (0u64, 0u64, 0u64);
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let config = AllocatorConfig::default();
    for (i, e) in trace.iter().enumerate() {
        let act = action(e);
        let addr = e.get("addr").and_then(PyValue::as_i64).unwrap_or(0);
        let size = e.get("size").and_then(PyValue::as_i64).unwrap_or(0).max(0) as u64;
        match act.as_str() {
            "alloc" => {
                next += 1;
                ids.insert(addr, next);
                ops.push(Op::Alloc {
                    id: next,
                    size,
                    category: Default::default(),
                });
                let r = round_size(size.max(1), &config);
                sizes.insert(next, r);
                live += r;
                peak = peak.max(live);
            }
            a if a == free_action => {
                let id = ids.remove(&addr).ok_or_else(|| {
                    format!(
                        "{name}: trace entry {i} frees address 0x{addr:x}, which is not allocated"
                    )
                })?;
                live -= sizes.remove(&id).unwrap_or(0);
                ops.push(Op::Free { id });
            }
            "segment_alloc" => seg_a.push(size),
            "segment_free" => seg_f.push(size),
            _ => {}
        }
    }
    Ok(TorchSnapshot {
        device,
        workload: Workload {
            name: name.to_string(),
            ops,
        },
        segment_allocs: seg_a,
        segment_frees: seg_f,
        peak_allocated: peak,
    })
}
