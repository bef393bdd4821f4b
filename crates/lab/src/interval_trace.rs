//! Interval files as allocation traces, so every strategy replays the
//! field's benchmarks: each buffer allocated at its `lower` and freed at
//! its `upper`, frees first at one time (lifetimes are half open).

use crate::intervals::Interval;
use crate::trace::TraceEvent;

/// The trace of `intervals`: events in time order, at one time the frees
/// before the allocations, each kind in the order the buffers were given.
/// Trace ids are the buffers' positions in `intervals`.
pub fn to_trace(intervals: &[Interval]) -> Vec<TraceEvent> {
    // (time, 0 = free / 1 = alloc, position)
    let mut at: Vec<(i64, u8, usize)> = Vec::with_capacity(2 * intervals.len());
    for (i, b) in intervals.iter().enumerate() {
        at.push((b.lower, 1, i));
        at.push((b.upper, 0, i));
    }
    at.sort_unstable();
    at.into_iter()
        .map(|(_, kind, i)| match kind {
            0 => TraceEvent::Free { id: i as u64 },
            _ => TraceEvent::Alloc {
                id: i as u64,
                size: intervals[i].size,
                label: Some(format!("buffer {}", intervals[i].id)),
                category: None,
            },
        })
        .collect()
}

/// [`to_trace`] as vramlab's JSON Lines trace text.
pub fn to_json_lines(intervals: &[Interval]) -> String {
    let mut out = String::new();
    for e in to_trace(intervals) {
        out.push_str(&e.to_line());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_come_first_at_one_time_and_the_trace_round_trips() {
        let iv = |id, lower, upper, size| Interval {
            id,
            lower,
            upper,
            size,
        };
        let buffers = [iv(7, 0, 10, 64), iv(9, 10, 20, 32), iv(3, 5, 10, 16)];
        let trace = to_trace(&buffers);
        let ops: Vec<String> = trace.iter().map(|e| e.to_line()).collect();
        // At time 10 both frees (positions 0 and 2) precede the alloc of 1.
        let free0 = ops
            .iter()
            .position(|l| l == r#"{"op":"free","id":0}"#)
            .unwrap();
        let free2 = ops
            .iter()
            .position(|l| l == r#"{"op":"free","id":2}"#)
            .unwrap();
        let alloc1 = ops
            .iter()
            .position(|l| l.contains(r#""op":"alloc","id":1"#))
            .unwrap();
        assert!(free0 < alloc1 && free2 < alloc1, "{ops:?}");
        // Back to intervals: the same sizes and the same overlaps.
        let back = crate::intervals::from_trace(&trace).unwrap();
        assert_eq!(back.len(), 3);
        for i in 0..3 {
            for j in 0..3 {
                let p = |v: &[Interval], k: usize| {
                    let pos = v.iter().position(|b| b.size == buffers[k].size).unwrap();
                    v[pos]
                };
                assert_eq!(
                    buffers[i].overlaps_in_time(&buffers[j]),
                    p(&back, i).overlaps_in_time(&p(&back, j)),
                    "{i} {j}"
                );
            }
        }
    }
}
