//! `trace.json` in the Chrome trace event format (Perfetto and
//! chrome://tracing open it): counter tracks for allocated and reserved
//! memory and one per category, an instant event per allocation, free, OOM
//! and segment change with its tensor, op and size, and phases as slices.
//! Events are in time order.

use super::series::Series;
use crate::memory::{EventKind, MemEvent, CATEGORIES};
use serde_json::{json, Value};

pub fn render(events: &[MemEvent], series: &Series) -> Value {
    let mut out = Vec::with_capacity(events.len() * 3);
    out.push(json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "vramlab"}}));
    let mut open_phase: Option<(String, f64)> = None;
    for (i, e) in events.iter().enumerate() {
        let ts = e.t_us;
        let mut counters = serde_json::Map::new();
        counters.insert("allocated".into(), json!(e.allocated));
        counters.insert("reserved".into(), json!(e.reserved));
        out.push(json!({"name": "memory", "ph": "C", "ts": ts, "pid": 1, "args": counters}));
        let cats: serde_json::Map<String, Value> = CATEGORIES
            .iter()
            .map(|c| {
                (
                    c.name().to_string(),
                    json!(series.by_category[i][c.index()]),
                )
            })
            .collect();
        out.push(json!({"name": "by category", "ph": "C", "ts": ts, "pid": 1, "args": cats}));
        match e.kind {
            EventKind::Phase => {
                if let Some((name, start)) = open_phase.take() {
                    out.push(json!({"name": name, "ph": "X", "ts": start, "dur": ts - start, "pid": 1, "tid": 1}));
                }
                open_phase = Some((e.op.to_string(), ts));
            }
            kind => out.push(json!({
                "name": format!("{kind:?} {}", e.label),
                "ph": "i", "s": "t", "ts": ts, "pid": 1, "tid": 2,
                "args": {"size": e.size, "requested": e.requested, "category": e.category,
                         "op": &*e.op, "address": format!("0x{:x}", e.address), "segment": e.segment}
            })),
        }
    }
    if let (Some((name, start)), Some(last)) = (open_phase, events.last()) {
        out.push(json!({"name": name, "ph": "X", "ts": start, "dur": last.t_us - start, "pid": 1, "tid": 1}));
    }
    // Time order (slices were emitted at their end): stable sort by ts.
    out.sort_by(|a, b| {
        let t = |v: &Value| v.get("ts").and_then(Value::as_f64).unwrap_or(-1.0);
        t(a).total_cmp(&t(b))
    });
    json!({"traceEvents": out, "displayTimeUnit": "ms"})
}
