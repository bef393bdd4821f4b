//! Reading an event log: the peak of allocated and reserved memory, the
//! bytes per category live at the peak, the live set at each phase boundary,
//! and per layer what its forward added and what backward released (the
//! documents' forward-hook measurement, done from the allocator's own log).

use crate::memory::{Category, EventKind, LiveBlocks, MemEvent, CATEGORIES};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PhaseRow {
    /// "setup", "forward", "backward", "optimizer", or "end". "setup" (the
    /// model built, loaded or converted before the first step) is listed
    /// only when it peaked above what the first step starts with, as
    /// `model.half()` does while both copies of the weights are alive.
    pub phase: String,
    /// Allocated bytes when the phase begins (for "end": after the step).
    pub allocated_at_start: u64,
    /// The highest allocated total inside the phase.
    pub peak_allocated: u64,
    /// Live bytes per category when the phase begins.
    pub by_category_at_start: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LayerRow {
    pub layer: String,
    pub output_shape: Vec<usize>,
    /// Block bytes the layer's forward left allocated (saved or output).
    pub forward_added: i64,
    /// Of those, bytes saved for backward when the forward finished.
    pub activation_bytes: u64,
    /// Block bytes of the layer's forward allocations freed during backward.
    pub backward_released: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Analysis {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Bytes per category live at the moment allocated memory peaked.
    pub by_category: BTreeMap<&'static str, u64>,
    pub phases: Vec<PhaseRow>,
    pub layers: Vec<LayerRow>,
    /// Allocated after the step (what stays: parameters, grads, state,
    /// batch, and the logits and loss the loop's names still hold).
    pub allocated_after_bytes: u64,
    pub reserved_after_bytes: u64,
    pub device_allocs: u64,
}

fn named(totals: &[u64; crate::memory::tag::N_CATEGORIES]) -> BTreeMap<&'static str, u64> {
    CATEGORIES
        .iter()
        .map(|c| (c.name(), totals[c.index()]))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// The layer an op belongs to ("conv1.forward" → "conv1").
fn layer_of(op: &str) -> Option<&str> {
    op.strip_suffix(".forward")
}

pub fn analyze(events: &[MemEvent], layer_outputs: &[(Arc<str>, Vec<usize>)]) -> Analysis {
    let mut live = LiveBlocks::default();
    let mut peak = 0u64;
    let mut peak_reserved = 0u64;
    let mut at_peak = [0u64; crate::memory::tag::N_CATEGORIES];
    let mut phases: Vec<PhaseRow> = Vec::new();
    let mut phase = String::new();
    let mut added: BTreeMap<String, i64> = BTreeMap::new();
    let mut released: BTreeMap<String, u64> = BTreeMap::new();
    let mut activation_at_backward: BTreeMap<String, u64> = BTreeMap::new();
    let mut device_allocs = 0;
    let (mut last_alloc, mut last_res) = (0, 0);
    for e in events {
        if phases.is_empty() && e.kind == EventKind::Alloc {
            phases.push(PhaseRow {
                phase: "setup".into(),
                allocated_at_start: last_alloc,
                peak_allocated: last_alloc,
                by_category_at_start: named(&live.by_category),
            });
        }
        peak_reserved = peak_reserved.max(e.reserved);
        (last_alloc, last_res) = (e.allocated, e.reserved);
        let freed = live.apply(e);
        match e.kind {
            EventKind::Alloc => {
                if phase == "forward" {
                    if let Some(l) = layer_of(&e.op) {
                        *added.entry(l.to_string()).or_default() += e.size as i64;
                    }
                }
                if e.allocated > peak {
                    peak = e.allocated;
                    at_peak = live.by_category;
                }
                if let Some(p) = phases.last_mut() {
                    p.peak_allocated = p.peak_allocated.max(e.allocated);
                }
            }
            EventKind::Free => {
                if let Some(b) = freed {
                    if let Some(l) = layer_of(&b.op) {
                        match phase.as_str() {
                            "forward" => *added.entry(l.to_string()).or_default() -= b.size as i64,
                            "backward" => *released.entry(l.to_string()).or_default() += b.size,
                            _ => {}
                        }
                    }
                }
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => device_allocs += 1,
            EventKind::Phase => {
                phase = e.op.to_string();
                if phase == "forward" {
                    // Per-layer figures describe the last step.
                    added.clear();
                    released.clear();
                    activation_at_backward.clear();
                }
                if phase == "backward" {
                    for b in live.iter().filter(|b| b.category == Category::Activation) {
                        if let Some(l) = layer_of(&b.op) {
                            *activation_at_backward.entry(l.to_string()).or_default() += b.size;
                        }
                    }
                }
                phases.push(PhaseRow {
                    phase: phase.clone(),
                    allocated_at_start: e.allocated,
                    peak_allocated: e.allocated,
                    by_category_at_start: named(&live.by_category),
                });
            }
            EventKind::SegmentFree
            | EventKind::SegmentUnmap
            | EventKind::Oom
            | EventKind::Retag => {}
        }
    }
    // A setup that only built what the step starts with says nothing the
    // first phase's "at start" does not; with no step after it, it is not
    // a setup.
    let keep_setup = match &phases[..] {
        [setup, next, ..] => setup.peak_allocated > next.allocated_at_start,
        _ => false,
    };
    if phases.first().is_some_and(|p| p.phase == "setup") && !keep_setup {
        phases.remove(0);
    }
    phases.push(PhaseRow {
        phase: "end".into(),
        allocated_at_start: last_alloc,
        peak_allocated: last_alloc,
        by_category_at_start: named(&live.by_category),
    });
    let mut seen = std::collections::HashSet::new();
    let layers = layer_outputs
        .iter()
        .filter(|(name, _)| seen.insert(name.clone()))
        .map(|(name, shape)| LayerRow {
            layer: name.to_string(),
            output_shape: shape.clone(),
            forward_added: added.get(&**name).copied().unwrap_or(0),
            activation_bytes: activation_at_backward.get(&**name).copied().unwrap_or(0),
            backward_released: released.get(&**name).copied().unwrap_or(0),
        })
        .collect();
    Analysis {
        peak_allocated_bytes: peak,
        peak_reserved_bytes: peak_reserved,
        by_category: named(&at_peak),
        phases,
        layers,
        allocated_after_bytes: last_alloc,
        reserved_after_bytes: last_res,
        device_allocs,
    }
}
