//! Runs a trace through an allocator, event by event. Problems in the trace (a
//! malformed line, a free of an unknown id, a double free) stop the replay with
//! an error naming the line, but everything replayed up to there stays in the
//! outcome, so the caller can still print the statistics it reached.

use super::error::LabError;
use super::trace::TraceEvent;
use crate::memory::caching::{BlockHandle, CachingAllocator};
use crate::memory::source::SegmentSource;
use serde::Serialize;
use std::collections::HashMap;
use std::io::BufRead;

/// An allocation in the trace that ran out of memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomEvent {
    /// 0-based index among the trace's events.
    pub event: usize,
    /// 1-based line number in the file.
    pub line: usize,
    pub id: u64,
    pub size: u64,
}

/// Allocated and reserved bytes after one event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelinePoint {
    pub event: usize,
    pub line: usize,
    pub op: &'static str,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

/// Where and why a replay stopped early.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayOutcome {
    /// Events applied.
    pub events: usize,
    pub ooms: Vec<OomEvent>,
    /// Filled when a timeline was asked for.
    pub timeline: Vec<TimelinePoint>,
    /// The highest sum of live requested bytes since the last `reset_peak`
    /// (as the allocator's peaks), refused ones counted until their free:
    /// the lower bound any allocator needs to serve the whole trace, as
    /// `--allocators` counts it.
    pub peak_live_requested_bytes: u64,
    /// Set when the replay stopped before the end of the trace.
    pub error: Option<ReplayError>,
    /// Fields of the events that the format does not read.
    #[serde(skip)]
    pub ignored: super::trace::IgnoredFields,
}

enum Live {
    Block(BlockHandle, u64),
    /// A zero-byte tensor: PyTorch allocates nothing for it.
    Empty,
    /// Its allocation ran out of memory; a later free of it frees
    /// nothing but its share of the trace's demand.
    Failed(u64),
}

/// Replays a JSON Lines trace from `reader` through `alloc`.
pub fn replay<S: SegmentSource, R: BufRead>(
    alloc: &mut CachingAllocator<S>,
    reader: R,
    record_timeline: bool,
) -> ReplayOutcome {
    let mut out = ReplayOutcome::default();
    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut live_requested = 0u64;
    for item in super::trace::lines(reader) {
        let (line_no, text) = match item {
            Ok(x) => x,
            Err((line, e)) => {
                out.error = Some(ReplayError {
                    line,
                    message: e.to_string(),
                });
                break;
            }
        };
        let event = match TraceEvent::parse_line(&text) {
            Ok(e) => e,
            Err(e) => {
                out.error = Some(ReplayError {
                    line: line_no,
                    message: e.to_string(),
                });
                break;
            }
        };
        let op = event.op_name();
        out.ignored.see(line_no, &text, op);
        let result: Result<(), LabError> = match event {
            TraceEvent::Alloc {
                id,
                size,
                label,
                category,
            } => {
                if matches!(live.get(&id), Some(Live::Block(..)) | Some(Live::Empty)) {
                    Err(LabError::IdStillLive { id })
                } else if size == 0 {
                    live.insert(id, Live::Empty);
                    Ok(())
                } else {
                    let label = label.unwrap_or_else(|| format!("id {id}"));
                    let granted =
                        alloc.malloc_tagged(size, &label, category.unwrap_or_default(), None);
                    if granted.as_ref().map_or_else(|e| e.is_oom(), |_| true) {
                        live_requested += size;
                        out.peak_live_requested_bytes =
                            out.peak_live_requested_bytes.max(live_requested);
                    }
                    match granted {
                        Ok(a) => {
                            live.insert(id, Live::Block(a.handle, size));
                            Ok(())
                        }
                        Err(e) if e.is_oom() => {
                            live.insert(id, Live::Failed(size));
                            out.ooms.push(OomEvent {
                                event: out.events,
                                line: line_no,
                                id,
                                size,
                            });
                            Ok(())
                        }
                        Err(e) => Err(e.into()),
                    }
                }
            }
            TraceEvent::Free { id } => match live.remove(&id) {
                Some(Live::Block(handle, size)) => {
                    live_requested -= size;
                    alloc.free(handle).map_err(LabError::from)
                }
                Some(Live::Failed(size)) => {
                    live_requested -= size;
                    Ok(())
                }
                Some(Live::Empty) => Ok(()),
                None => Err(LabError::IdNotLive { id }),
            },
            TraceEvent::EmptyCache => {
                alloc.empty_cache();
                Ok(())
            }
            TraceEvent::ResetPeak => {
                alloc.reset_peak_memory_stats();
                // The lower bound restarts with the allocator's peaks, or
                // peak reserved / it (a lower bound, so at least 1) drops below 1.
                out.peak_live_requested_bytes = live_requested;
                Ok(())
            }
        };
        if let Err(e) = result {
            out.error = Some(ReplayError {
                line: line_no,
                message: e.to_string(),
            });
            break;
        }
        if record_timeline {
            out.timeline.push(TimelinePoint {
                event: out.events,
                line: line_no,
                op,
                allocated_bytes: alloc.memory_allocated(),
                reserved_bytes: alloc.memory_reserved(),
            });
        }
        out.events += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{AllocatorConfig, SimulatedSource};

    /// `reset_peak` reset the allocator's peaks but not the live-requested
    /// one, so 30 MiB freed before it stayed the "lower bound" of a 2 MiB
    /// reserved peak (fragmentation 0.067).
    #[test]
    fn reset_peak_restarts_the_live_requested_peak() {
        let trace = concat!(
            r#"{"op":"alloc","id":1,"size":31457280}"#,
            "\n",
            r#"{"op":"alloc","id":3,"size":4096}"#,
            "\n",
            r#"{"op":"free","id":1}"#,
            "\n",
            r#"{"op":"empty_cache"}"#,
            "\n",
            r#"{"op":"reset_peak"}"#,
            "\n",
            r#"{"op":"alloc","id":2,"size":1000}"#,
            "\n",
        );
        let mut alloc =
            CachingAllocator::new(SimulatedSource::unlimited(), AllocatorConfig::default());
        let out = replay(&mut alloc, trace.as_bytes(), false);
        assert!(out.error.is_none(), "{:?}", out.error);
        // Live at the reset (4096) plus what came after.
        assert_eq!(out.peak_live_requested_bytes, 4096 + 1000);
        assert!(alloc.max_memory_reserved() >= out.peak_live_requested_bytes);
    }
}
