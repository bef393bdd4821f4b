//! Buffer lifetimes as intervals: the offline memory-planning field's CSV
//! format (MiniMalloc's, among others), in and out.
//!
//! ```text
//! id,lower,upper,size
//! 0,0,10,4096
//! 1,10,20,4096
//! ```
//!
//! Lifetimes are half open, `[lower, upper)`: a buffer freed at time `t` and
//! one allocated at `t` do not overlap and may share memory. Sizes are in
//! bytes and positive; ids are arbitrary integers, unique within a file.
//! The columns may come in any order; the header names them. Other columns
//! (a name, a time of day) are ignored, so a file written for another tool
//! reads as it is.

use crate::error::LabError;
use crate::trace::{LiveIds, TraceEvent};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};

pub use crate::buffer::{Interval, HEADER};

/// Parses the CSV text; an error names the 1-based line and says how to fix it.
pub fn parse_csv(text: &str) -> Result<Vec<Interval>, LabError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty());
    let Some((header_line, header)) = lines.next() else {
        return Err(LabError::IntervalsEmpty);
    };
    let names: Vec<String> = header
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let column = |name: &'static str| -> Result<usize, LabError> {
        let found: Vec<usize> = (0..names.len()).filter(|&i| names[i] == name).collect();
        match found.as_slice() {
            [i] => Ok(*i),
            [] => Err(LabError::NoColumn {
                line: header_line,
                header: header.to_string(),
                column: name,
            }),
            _ => Err(LabError::ColumnTwice {
                line: header_line,
                header: header.to_string(),
                column: name,
            }),
        }
    };
    let (ci, cl, cu, cs) = (
        column("id")?,
        column("lower")?,
        column("upper")?,
        column("size")?,
    );
    let mut out = Vec::new();
    let mut seen: HashMap<i64, usize> = HashMap::new();
    for (n, line) in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != names.len() {
            return Err(LabError::FieldCount {
                line: n,
                found: fields.len(),
                expected: names.len(),
            });
        }
        let int = |col: usize| -> Result<i64, LabError> {
            fields[col].parse::<i64>().map_err(|e| {
                // A number too large for i64 is an integer all the same:
                // say it is out of range and what fits.
                let (bound, limit) = match e.kind() {
                    std::num::IntErrorKind::PosOverflow => ("largest", i64::MAX.into()),
                    std::num::IntErrorKind::NegOverflow => ("smallest", i64::MIN.into()),
                    _ => {
                        return LabError::NotInteger {
                            line: n,
                            column: names[col].clone(),
                            value: fields[col].to_string(),
                        }
                    }
                };
                LabError::IntegerOutOfRange {
                    line: n,
                    column: names[col].clone(),
                    value: fields[col].to_string(),
                    bound,
                    limit,
                }
            })
        };
        let id = int(ci)?;
        let lower = int(cl)?;
        let upper = int(cu)?;
        // Sizes past 2^62 (the most vramlab models) are refused here, by
        // this file's line, not by a line of the trace made from it.
        let max = crate::memory::constants::MAX_BYTES;
        let size = match fields[cs].parse::<u64>() {
            Ok(s) if s <= max => s,
            Err(e) if *e.kind() != std::num::IntErrorKind::PosOverflow => {
                return Err(LabError::BadSize {
                    line: n,
                    value: fields[cs].to_string(),
                })
            }
            _ => {
                return Err(LabError::IntegerOutOfRange {
                    line: n,
                    column: "size".into(),
                    value: fields[cs].to_string(),
                    bound: "largest",
                    limit: max.into(),
                })
            }
        };
        if upper <= lower {
            return Err(LabError::EmptyLifetime {
                line: n,
                id,
                lower,
                upper,
            });
        }
        if size == 0 {
            return Err(LabError::ZeroSize { line: n, id });
        }
        if let Some(first) = seen.insert(id, n) {
            return Err(LabError::DuplicateId { line: n, id, first });
        }
        out.push(Interval {
            id,
            lower,
            upper,
            size,
        });
    }
    Ok(out)
}

/// Reads and parses CSV from `reader` (see [`parse_csv`]).
pub fn read_csv<R: Read>(mut reader: R) -> Result<Vec<Interval>, LabError> {
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(LabError::IntervalsUnreadable)?;
    parse_csv(&text)
}

/// The intervals as CSV text: the header, then one line per buffer.
pub fn to_csv(intervals: &[Interval]) -> String {
    let mut s = String::with_capacity(24 * (intervals.len() + 1));
    s.push_str(HEADER);
    s.push('\n');
    for i in intervals {
        s.push_str(&format!("{},{},{},{}\n", i.id, i.lower, i.upper, i.size));
    }
    s
}

/// Writes the intervals as CSV to `writer` (see [`to_csv`]).
pub fn write_csv<W: Write>(mut writer: W, intervals: &[Interval]) -> std::io::Result<()> {
    writer.write_all(to_csv(intervals).as_bytes())
}

/// Checks what [`parse_csv`] checks (positive size, upper > lower, unique ids).
pub fn validate(intervals: &[Interval]) -> Result<(), LabError> {
    let mut ids = HashSet::new();
    for (k, i) in intervals.iter().enumerate() {
        if i.upper <= i.lower {
            return Err(LabError::IntervalEmptyLifetime {
                index: k,
                id: i.id,
                lower: i.lower,
                upper: i.upper,
            });
        }
        if i.size == 0 {
            return Err(LabError::IntervalZeroSize { index: k, id: i.id });
        }
        if !ids.insert(i.id) {
            return Err(LabError::IntervalDuplicateId { index: k, id: i.id });
        }
    }
    Ok(())
}

/// Converts a trace to intervals, time = event index: an alloc at event `a`
/// freed at event `f` lives `[a, f)`; one never freed lives to the trace's end.
/// The id is the alloc's event index (trace ids may be reused after a free);
/// zero-byte allocations are dropped.
pub fn from_trace(events: &[TraceEvent]) -> Result<Vec<Interval>, LabError> {
    let mut live = LiveIds::default();
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<Interval> = Vec::new();
    for (t, e) in events.iter().enumerate() {
        live.check(e).map_err(|m| LabError::AtEvent {
            event: t,
            source: Box::new(m),
        })?;
        match e {
            TraceEvent::Alloc { id, size, .. } => {
                if *size > 0 {
                    open.insert(*id, out.len());
                    out.push(Interval {
                        id: t as i64,
                        lower: t as i64,
                        upper: events.len() as i64,
                        size: *size,
                    });
                }
            }
            TraceEvent::Free { id } => {
                if let Some(k) = open.remove(id) {
                    out[k].upper = t as i64;
                }
            }
            TraceEvent::EmptyCache | TraceEvent::ResetPeak => {}
        }
    }
    Ok(out)
}

/// The peak over time of the sum of live sizes: a lower bound on any arena.
pub fn peak_live(intervals: &[Interval]) -> u64 {
    let mut ev: Vec<(i64, bool, u64)> = Vec::with_capacity(2 * intervals.len());
    for i in intervals {
        ev.push((i.lower, true, i.size));
        ev.push((i.upper, false, i.size));
    }
    // Frees (false) sort before allocations (true) at the same time.
    ev.sort_unstable();
    let (mut cur, mut peak) = (0u64, 0u64);
    for (_, alloc, size) in ev {
        if alloc {
            cur += size;
            peak = peak.max(cur);
        } else {
            cur -= size;
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reorders_columns() {
        let v = vec![
            Interval {
                id: -3,
                lower: 0,
                upper: 2,
                size: 5,
            },
            Interval {
                id: 9,
                lower: 2,
                upper: 4,
                size: 1,
            },
        ];
        assert_eq!(parse_csv(&to_csv(&v)).unwrap(), v);
        let other = "size,upper,lower,id\r\n5,2,0,-3\r\n\r\n1,4,2,9\r\n";
        assert_eq!(parse_csv(other).unwrap(), v);
        let extra = "id,name,lower,upper,size,t\n-3,a,0,2,5,x\n9,b,2,4,1,y\n";
        assert_eq!(parse_csv(extra).unwrap(), v);
        assert_eq!(peak_live(&v), 5);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, want) in [
            ("", "line 1"),
            ("0,0,1,1\n", "no `id` column"),
            ("id,lower,upper,size\n0,0,x,1\n", "line 2: `upper`"),
            (
                "id,lower,upper,size\n0,0,1,1\n1,3,3,1\n",
                "line 3: buffer 1 has upper 3 <= lower 3",
            ),
            (
                "id,lower,upper,size\n0,0,1,1\n0,1,2,1\n",
                "line 3: id 0 was already used on line 2",
            ),
            (
                "id,lower,upper,size\n0,0,1,0\n",
                "line 2: buffer 0 has size 0",
            ),
            ("id,lower,upper,size\n0,0,1\n", "line 2: 3 fields"),
            // Integers too large for the column are out of range, not "not
            // an integer", and the error says what fits.
            (
                "id,lower,upper,size\n0,0,18446744073709551615,5\n",
                "line 2: `upper` is `18446744073709551615`, an integer out of range; the largest accepted is 9223372036854775807",
            ),
            (
                "id,lower,upper,size\n0,-99999999999999999999,1,5\n",
                "the smallest accepted is -9223372036854775808",
            ),
            (
                "id,lower,upper,size\n0,0,1,18446744073709551616\n",
                "`size` is `18446744073709551616`, an integer out of range; the largest accepted is 4611686018427387904",
            ),
            (
                "id,lower,upper,size\n0,0,1,4611686018427387905\n",
                "the largest accepted is 4611686018427387904",
            ),
        ] {
            let e = parse_csv(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn traces_become_intervals() {
        let a = |id, size| TraceEvent::Alloc {
            id,
            size,
            label: None,
            category: None,
        };
        let ev = vec![
            a(1, 10),
            a(2, 0),
            TraceEvent::Free { id: 1 },
            a(1, 7),
            TraceEvent::EmptyCache,
        ];
        let v = from_trace(&ev).unwrap();
        assert_eq!(
            v,
            vec![
                Interval {
                    id: 0,
                    lower: 0,
                    upper: 2,
                    size: 10
                },
                Interval {
                    id: 3,
                    lower: 3,
                    upper: 5,
                    size: 7
                }
            ]
        );
        assert!(from_trace(&[TraceEvent::Free { id: 4 }]).is_err());
    }
}
