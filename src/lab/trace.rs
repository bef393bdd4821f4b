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

use crate::memory::tag::Category;
use serde::{Deserialize, Serialize};

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
    pub fn parse_line(line: &str) -> Result<TraceEvent, String> {
        serde_json::from_str(line).map_err(|e| {
            format!(
                "{e}; expected e.g. {{\"op\":\"alloc\",\"id\":7,\"size\":1200}}, {{\"op\":\"free\",\"id\":7}}, {{\"op\":\"empty_cache\"}} or {{\"op\":\"reset_peak\"}}"
            )
        })
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
    }
}
