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
//! output, temporary, workspace, autocast_cache, untagged) are optional. Allocators that plan
//! by lifetime (`vramlab`) use the category; the others ignore it. Other
//! fields are ignored so traces can carry more (times) without breaking
//! older readers; [`IgnoredFields`] lists them so a replay can say so.

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

/// Fields the format reads, by op.
fn read_by(op: &str) -> &'static [&'static str] {
    match op {
        "alloc" => &["op", "id", "size", "label", "category"],
        "free" => &["op", "id"],
        _ => &["op"],
    }
}

/// Fields `vramlab_torch`'s recorder writes for people, not for a replay.
const RECORDER: [&str; 5] = ["phase", "step", "where", "frames", "role"];

/// A field a trace carries that no replay reads: its name, the op it came
/// with, the first line it is on and how many lines carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IgnoredField {
    pub name: String,
    pub op: String,
    pub first_line: usize,
    pub lines: usize,
}

/// Every field of a trace's events that its op does not read (the
/// recorder's own ones aside), in order of first appearance: a misspelt
/// `categroy` or a `stream` would otherwise change the replay in silence.
/// Fed line by line by the pass that reads the events.
#[derive(Debug, Clone, Default)]
pub struct IgnoredFields(pub Vec<IgnoredField>);

impl IgnoredFields {
    /// Notes the fields of `text` (line `line`, an event of `op` that
    /// parsed) that `op` does not read.
    pub fn see(&mut self, line: usize, text: &str, op: &str) {
        type Keys<'a> = std::collections::HashMap<std::borrow::Cow<'a, str>, serde::de::IgnoredAny>;
        let Ok(keys) = serde_json::from_str::<Keys>(text) else {
            return;
        };
        let read = read_by(op);
        let mut names: Vec<&str> = keys
            .keys()
            .map(|k| k.as_ref())
            .filter(|k| !read.contains(k) && !RECORDER.contains(k))
            .collect();
        names.sort_unstable();
        for name in names {
            match self.0.iter_mut().find(|f| f.name == name && f.op == op) {
                Some(f) => f.lines += 1,
                None => self.0.push(IgnoredField {
                    name: name.to_string(),
                    op: op.to_string(),
                    first_line: line,
                    lines: 1,
                }),
            }
        }
    }
}

/// The note a replay prints for `fields`, if any.
pub fn ignored_note(fields: &[IgnoredField]) -> Option<String> {
    if fields.is_empty() {
        return None;
    }
    const SHOWN: usize = 8;
    let mut list: Vec<String> = fields
        .iter()
        .take(SHOWN)
        .map(|f| {
            let on = if f.lines == 1 {
                format!("line {}", f.first_line)
            } else {
                format!("{} lines from line {}", f.lines, f.first_line)
            };
            format!("`{}` on {} ({on})", f.name, f.op)
        })
        .collect();
    if fields.len() > SHOWN {
        list.push(format!("{} more", fields.len() - SHOWN));
    }
    let stream = if fields.iter().any(|f| f.name == "stream") {
        "; every event is replayed on one stream's pool (PyTorch keeps a pool per stream)"
    } else {
        ""
    };
    Some(format!(
        "ignored fields the trace format does not read: {}{stream}. It reads op, id, size, label and category on alloc, op and id on free, op alone on empty_cache and reset_peak (other fields are for people, as the recorder's {} are)",
        list.join(", "),
        RECORDER.join(", ")
    ))
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
    fn fields_no_replay_reads_are_listed_once_each() {
        let text = [
            r#"{"op":"alloc","id":1,"size":10,"categroy":"parameter"}"#,
            r#"{"op":"alloc","id":2,"size":10,"stream":7,"phase":"forward"}"#,
            r#"{"op":"free","id":2,"stream":7}"#,
            r#"{"op":"free","id":1,"where":"x.py:3","size":10}"#,
        ];
        let mut seen = IgnoredFields::default();
        for (i, t) in text.iter().enumerate() {
            let op = TraceEvent::parse_line(t).unwrap().op_name();
            seen.see(i + 1, t, op);
        }
        let names: Vec<(&str, &str, usize, usize)> = seen
            .0
            .iter()
            .map(|f| (f.name.as_str(), f.op.as_str(), f.first_line, f.lines))
            .collect();
        assert_eq!(
            names,
            [
                ("categroy", "alloc", 1, 1),
                ("stream", "alloc", 2, 1),
                ("stream", "free", 3, 1),
                ("size", "free", 4, 1)
            ]
        );
        let note = ignored_note(&seen.0).unwrap();
        assert!(note.contains("`categroy` on alloc (line 1)"), "{note}");
        assert!(note.contains("`stream` on free (line 3)"), "{note}");
        assert!(note.contains("one stream's pool"), "{note}");
        let mut none = IgnoredFields::default();
        none.see(1, r#"{"op":"empty_cache"}"#, "empty_cache");
        assert_eq!(ignored_note(&none.0), None);
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
