//! The allocation trace format: JSON Lines, one event per line.
//!
//! ```text
//! {"op":"alloc","id":7,"size":1200,"label":"conv1.weight","category":"parameter"}
//! {"op":"free","id":7}
//! {"op":"empty_cache"}
//! {"op":"reset_peak"}
//! ```
//!
//! Ids name tensors within one trace; `label` and `category` (what the
//! block holds: parameter, gradient, optimizer_state, input, activation,
//! output, temporary, workspace, untagged) are optional. Allocators that plan
//! by lifetime (`vramlab`) use the category; the others ignore it. Unknown
//! extra fields are ignored so traces can carry more (times) without
//! breaking older readers.

use crate::error::LabError;
use crate::memory::constants::MAX_BYTES;
use crate::memory::tag::Category;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::{BufRead, Read};

/// Longest trace line read: an event is one small JSON object, so a longer
/// line (a file of zeros, a binary file) is an error, not a buffer that
/// grows until memory runs out.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// The numbered, non-empty lines of a trace, each at most
/// [`MAX_LINE_BYTES`]; an error (too long, not UTF-8, unreadable) names the
/// line and ends the iteration.
pub struct Lines<R> {
    reader: R,
    line: usize,
    buf: Vec<u8>,
    done: bool,
}

/// Reads `reader` as trace lines.
pub fn lines<R: BufRead>(reader: R) -> Lines<R> {
    Lines {
        reader,
        line: 0,
        buf: Vec::new(),
        done: false,
    }
}

impl<R: BufRead> Iterator for Lines<R> {
    /// (1-based line number, text) or (line number, what is wrong).
    type Item = Result<(usize, String), (usize, LabError)>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.buf.clear();
            self.line += 1;
            let limit = MAX_LINE_BYTES as u64 + 1;
            let n = match (&mut self.reader)
                .take(limit)
                .read_until(b'\n', &mut self.buf)
            {
                Ok(n) => n,
                Err(e) => {
                    self.done = true;
                    return Some(Err((self.line, LabError::LineUnreadable(e))));
                }
            };
            if n == 0 {
                return None;
            }
            if self.buf.last() == Some(&b'\n') {
                self.buf.pop();
            } else if self.buf.len() > MAX_LINE_BYTES {
                self.done = true;
                return Some(Err((
                    self.line,
                    LabError::LineTooLong {
                        max: MAX_LINE_BYTES,
                    },
                )));
            }
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
            // A UTF-8 byte order mark (Windows editors write one) is not text.
            if self.line == 1 && self.buf.starts_with(b"\xEF\xBB\xBF") {
                self.buf.drain(..3);
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t,
                Err(e) => {
                    self.done = true;
                    return Some(Err((self.line, LabError::LineNotUtf8(e))));
                }
            };
            if !text.trim().is_empty() {
                return Some(Ok((self.line, text.to_string())));
            }
        }
        None
    }
}

/// The checks every replay mode makes, in one place: an id is allocated
/// only while not live, freed only while live. Zero-byte allocations are
/// live too (PyTorch allocates nothing for them).
#[derive(Debug, Default)]
pub struct LiveIds {
    live: HashSet<u64>,
}

impl LiveIds {
    pub fn check(&mut self, event: &TraceEvent) -> Result<(), LabError> {
        match event {
            TraceEvent::Alloc { id, .. } => {
                if !self.live.insert(*id) {
                    return Err(LabError::IdStillLive { id: *id });
                }
            }
            TraceEvent::Free { id } => {
                if !self.live.remove(id) {
                    return Err(LabError::IdNotLive { id: *id });
                }
            }
            TraceEvent::EmptyCache | TraceEvent::ResetPeak => {}
        }
        Ok(())
    }
}

/// One trace event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TraceEvent {
    Alloc {
        id: u64,
        size: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        category: Option<Category>,
    },
    Free {
        id: u64,
    },
    EmptyCache,
    ResetPeak,
}

impl TraceEvent {
    /// Parses one line; the error says what was expected.
    pub fn parse_line(line: &str) -> Result<TraceEvent, LabError> {
        let e: TraceEvent = serde_json::from_str(line).map_err(LabError::BadEvent)?;
        if let TraceEvent::Alloc { size, .. } = e {
            if size > MAX_BYTES {
                return Err(LabError::EventSizeTooLarge { size });
            }
        }
        Ok(e)
    }

    /// The event as one JSON line (without the newline).
    pub fn to_line(&self) -> String {
        // Serializing these plain enums cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn op_name(&self) -> &'static str {
        match self {
            TraceEvent::Alloc { .. } => "alloc",
            TraceEvent::Free { .. } => "free",
            TraceEvent::EmptyCache => "empty_cache",
            TraceEvent::ResetPeak => "reset_peak",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace line is one JSON document: serde's "at line 1" was its own
    /// line 1, beside the file's line number ("line 4: ... at line 1
    /// column 22").
    #[test]
    fn a_bad_event_names_only_the_column() {
        let e = TraceEvent::parse_line(r#"{"op":"free" "id":1}"#).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("expected `,` or `}` at column 14;"),
            "{text}"
        );
        assert!(!text.contains("line"), "{text}");
    }

    #[test]
    fn round_trips() {
        for e in [
            TraceEvent::Alloc {
                id: 7,
                size: 1200,
                label: Some("x".into()),
                category: Some(Category::OptimizerState),
            },
            TraceEvent::Alloc {
                id: 8,
                size: 1,
                label: None,
                category: None,
            },
            TraceEvent::Free { id: 7 },
            TraceEvent::EmptyCache,
            TraceEvent::ResetPeak,
        ] {
            assert_eq!(TraceEvent::parse_line(&e.to_line()).unwrap(), e);
        }
        assert_eq!(
            TraceEvent::parse_line(r#"{"op":"alloc","id":7,"size":1200,"t":3.5}"#).unwrap(),
            TraceEvent::Alloc {
                id: 7,
                size: 1200,
                label: None,
                category: None,
            }
        );
    }

    #[test]
    fn a_byte_order_mark_and_crlf_are_not_text() {
        let text = b"\xEF\xBB\xBF{\"op\":\"empty_cache\"}\r\n{\"op\":\"reset_peak\"}\n";
        let got: Vec<_> = lines(&text[..]).map(|l| l.unwrap().1).collect();
        assert_eq!(got, [r#"{"op":"empty_cache"}"#, r#"{"op":"reset_peak"}"#]);
        for l in &got {
            assert!(TraceEvent::parse_line(l).is_ok(), "{l}");
        }
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            "",
            "{",
            r#"{"op":"alloc","id":7}"#,
            r#"{"op":"grow","id":7}"#,
            r#"{"op":"alloc","id":-1,"size":3}"#,
            r#"{"op":"alloc","id":1,"size":3,"category":"weights"}"#,
        ] {
            assert!(TraceEvent::parse_line(bad).is_err(), "{bad}");
        }
        let e = TraceEvent::parse_line("{").unwrap_err().to_string();
        assert!(e.contains(r#"expected e.g. {"op":"alloc","id":7"#), "{e}");
    }
}
