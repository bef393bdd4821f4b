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
    /// The highest sum of live requested bytes: the lower bound any allocator
    /// needs.
    pub peak_live_requested_bytes: u64,
    /// Set when the replay stopped before the end of the trace.
    pub error: Option<ReplayError>,
}

enum Live {
    Block(BlockHandle, u64),
    /// A zero-byte tensor: PyTorch allocates nothing for it.
    Empty,
    /// Its allocation ran out of memory; a later free of it is a no-op.
    Failed,
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
                    match alloc.malloc_tagged(size, &label, category.unwrap_or_default(), None) {
                        Ok(a) => {
                            live.insert(id, Live::Block(a.handle, size));
                            live_requested += size;
                            out.peak_live_requested_bytes =
                                out.peak_live_requested_bytes.max(live_requested);
                            Ok(())
                        }
                        Err(e) if e.is_oom() => {
                            live.insert(id, Live::Failed);
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
                Some(Live::Empty) | Some(Live::Failed) => Ok(()),
                None => Err(LabError::IdNotLive { id }),
            },
            TraceEvent::EmptyCache => {
                alloc.empty_cache();
                Ok(())
            }
            TraceEvent::ResetPeak => {
                alloc.reset_peak_memory_stats();
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
