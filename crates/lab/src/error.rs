//! What can go wrong in the lab, as one enum. Each variant carries what
//! locates the fault (a file, a byte offset, a line, an index) and what was
//! expected, and its message says how to fix the input where it can.

use crate::buffer::{Interval, HEADER};
use crate::memory::{AllocError, PoolKind};
use std::path::PathBuf;

/// An example of each trace event, for parse errors.
const TRACE_EXAMPLES: &str = r#"{"op":"alloc","id":7,"size":1200}, {"op":"free","id":7}, {"op":"empty_cache"} or {"op":"reset_peak"}"#;

/// serde_json's message without its "at line 1": a trace line is one JSON
/// document, and the line in the file is said beside the error.
fn column_only(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&suffix) {
        Some(message) => format!("{message} at column {}", e.column()),
        None => text,
    }
}

/// Everything the lab refuses: malformed pickles, snapshots, traces and
/// interval files, invalid plans, unknown strategies and alloc-conf options.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The allocator's own error (an alloc-conf option, a failed free).
    #[error(transparent)]
    Alloc(#[from] AllocError),

    // ----- pickles (`at`: the opcode's byte offset) -----
    /// A length that runs past the end of the file.
    #[error(
        "byte {at}: {declared} bytes declared, {left} left in the file (truncated or corrupt)"
    )]
    PickleTruncated { at: usize, declared: u64, left: u64 },
    /// A FRAME longer than the rest of the file.
    #[error("byte {at}: a frame of {declared} bytes declared, {left} left in the file (truncated or corrupt)")]
    PickleFrameTruncated { at: usize, declared: u64, left: u64 },
    /// A structural fault: the stack, a MARK, a missing STOP, a text line.
    #[error("byte {at}: {problem}")]
    PickleMalformed { at: usize, problem: &'static str },
    #[error("byte {at}: pickle protocol {protocol} is newer than 5")]
    PickleProtocol { at: usize, protocol: u8 },
    /// A text argument that does not parse as what its opcode wants.
    #[error("byte {at}: {what} {text:?} is not {expected}")]
    PickleBadText {
        at: usize,
        what: &'static str,
        text: String,
        expected: &'static str,
    },
    #[error("byte {at}: an integer of {bytes} bytes does not fit in 64 bits")]
    PickleIntTooWide { at: usize, bytes: usize },
    #[error("byte {at}: memo entry {key} was never stored")]
    PickleMemoMissing { at: usize, key: u64 },
    /// Anything but plain data (classes, globals): never executed.
    #[error("byte {at}: unsupported pickle opcode 0x{opcode:02x} (only plain data is read: dicts, lists, tuples, strings, numbers; no classes or globals)")]
    PickleOpcode { at: usize, opcode: u8 },
    #[error("containers nested deeper than {max}")]
    PickleTooDeep { max: usize },
    #[error("a container that contains itself (not plain data)")]
    PickleCycle,

    // ----- PyTorch memory snapshots (`name`: the file) -----
    /// The reader's error is part of the message, not a source: a chain
    /// printed whole (`{:#}`) would say it twice.
    #[error("{name}: not a readable pickle: {why}")]
    NotAPickle { name: String, why: Box<LabError> },
    #[error("{name}: no device_traces; is it a torch.cuda.memory._dump_snapshot() pickle?")]
    NoDeviceTraces { name: String },
    #[error("{name}: the snapshot has no allocation history (it was taken without torch.cuda.memory._record_memory_history(), so there is nothing to replay); call that before the code you snapshot, or run `vramlab doctor {name}` for what its segments held")]
    NoHistory { name: String },
    /// A recorded allocator setting PyTorch would have refused.
    #[error("allocator_settings: {key} {value} is not {expected}, which PyTorch refuses; the snapshot is corrupt")]
    BadSetting {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A size field (`key`) at `at` (e.g. `segments[3].blocks[2]`).
    #[error("{at}: {key} is not an integer")]
    SizeNotInteger { at: String, key: &'static str },
    #[error("{at}: {key} {value} is negative; a size cannot be, so the snapshot is corrupt")]
    SizeNegative {
        at: String,
        key: &'static str,
        value: i64,
    },
    #[error("{at}: {key} {value} is more than 2^62 bytes (4 EiB), the most vramlab models; the snapshot is corrupt")]
    SizeTooLarge {
        at: String,
        key: &'static str,
        value: i64,
    },
    /// A snapshot's `segments` that no allocator could have held (blocks
    /// past their segment, overlapping segments), or a part of the wrong
    /// type.
    #[error("{at}: {what}; the snapshot is corrupt")]
    CorruptSegments { at: String, what: String },
    /// A trace entry that acts on a block or segment without a usable
    /// `addr` (absent, negative or not an integer).
    #[error("{at}: no addr that is a non-negative integer; the trace names blocks by address, so the snapshot is corrupt")]
    AddrMissing { at: String },
    /// An `alloc` at an address whose block the trace has not freed.
    #[error("{at}: alloc at 0x{addr:x}, where the trace's block allocated at entry {earlier} was never freed; the snapshot is corrupt (or entries are missing from its middle)")]
    AddrStillLive {
        at: String,
        addr: u64,
        earlier: usize,
    },
    /// A free of an address whose block an earlier entry freed, with no
    /// alloc there between.
    #[error("{at}: free at 0x{addr:x}, whose block entry {earlier} already freed (nothing was allocated there since); the snapshot is corrupt (or entries are missing from its middle)")]
    AddrFreedTwice {
        at: String,
        addr: u64,
        earlier: usize,
    },
    #[error("rebuilding the segment at 0x{address:x} ({size} bytes) recorded before the trace: {source}")]
    RebuildSegment {
        address: u64,
        size: u64,
        #[source]
        source: AllocError,
    },
    #[error("rebuilding the expandable {pool:?}-pool segment at 0x{base:x} recorded before the trace: {source}")]
    RebuildExpandable {
        pool: PoolKind,
        base: u64,
        #[source]
        source: AllocError,
    },

    // ----- JSON Lines traces (the line is given beside the error) -----
    #[error("cannot read the line: {0}")]
    LineUnreadable(#[source] std::io::Error),
    #[error("the line is longer than {max} bytes; a trace line is one small JSON object (is this a trace?)")]
    LineTooLong { max: usize },
    #[error("not UTF-8 text ({0}); is this a trace?")]
    LineNotUtf8(#[source] std::str::Utf8Error),
    #[error("{}; expected e.g. {TRACE_EXAMPLES}", column_only(.0))]
    BadEvent(#[source] serde_json::Error),
    #[error("size {size} is more than 2^62 bytes (4 EiB), the most vramlab models; the trace is probably corrupt")]
    EventSizeTooLarge { size: u64 },
    #[error("id {id} is allocated again while still live; free it first")]
    IdStillLive { id: u64 },
    #[error("free of id {id}, which is not live (never allocated, or already freed)")]
    IdNotLive { id: u64 },
    /// An error on line `line` (1-based) of a trace file.
    #[error("line {line}: {source}")]
    AtLine {
        line: usize,
        #[source]
        source: Box<LabError>,
    },
    /// An error of the trace's `event`-th event (0-based).
    #[error("event {event}: {source}")]
    AtEvent {
        event: usize,
        #[source]
        source: Box<LabError>,
    },

    // ----- files -----
    #[error("cannot open {}: {source}", .path.display())]
    OpenTrace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the file is empty (0 bytes): a trace has at least one event, and a snapshot is what torch.cuda.memory._dump_snapshot() writes", .path.display())]
    EmptyFile { path: PathBuf },
    #[error("{name}: not a PyTorch memory snapshot: it does not open with byte 0x80 as a pickle of protocol 2 or later (what torch.cuda.memory._dump_snapshot() writes) does, nor as an older pickle")]
    NotSnapshotBytes { name: String },
    /// A trace whose lines are all blank (or an interval file with a
    /// header and no buffers): nothing to replay, as an empty file.
    #[error("{}: no events: {what}", .path.display())]
    NoEvents { path: PathBuf, what: &'static str },
    #[error("{}: is a directory; give a file in it: a trace (JSON Lines), an interval file or a PyTorch memory snapshot pickle", .path.display())]
    IsDirectory { path: PathBuf },
    #[error("cannot read {}: {source}", .path.display())]
    ReadTrace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    // ----- interval files (`line`: 1-based) and interval lists (`index`) -----
    #[error("cannot read the interval file: {0} (is it UTF-8 text?)")]
    IntervalsUnreadable(#[source] std::io::Error),
    #[error("line 1: the file is empty; expected the header `{HEADER}` and one line per buffer")]
    IntervalsEmpty,
    #[error("line {line}: the header `{header}` has no `{column}` column; the first line must be the header `{HEADER}`")]
    NoColumn {
        line: usize,
        header: String,
        column: &'static str,
    },
    #[error("line {line}: the header `{header}` names `{column}` more than once; the header is `{HEADER}`")]
    ColumnTwice {
        line: usize,
        header: String,
        column: &'static str,
    },
    #[error("line {line}: {found} fields, but the header has {expected}; each line is `{HEADER}`")]
    FieldCount {
        line: usize,
        found: usize,
        expected: usize,
    },
    #[error("line {line}: `{column}` is `{value}`, not an integer; write it as a whole number without units")]
    NotInteger {
        line: usize,
        column: String,
        value: String,
    },
    /// An integer column past what an interval file holds (`i64`).
    #[error("line {line}: `{column}` is `{value}`, an integer out of range; the {bound} accepted is {limit}")]
    IntegerOutOfRange {
        line: usize,
        column: String,
        value: String,
        bound: &'static str,
        limit: i128,
    },
    #[error("line {line}: `size` is `{value}`, not a non-negative integer; write the size in bytes as a whole number")]
    BadSize { line: usize, value: String },
    #[error("line {line}: buffer {id} has upper {upper} <= lower {lower}; lifetimes are half open [lower, upper), so upper must be at least lower + 1")]
    EmptyLifetime {
        line: usize,
        id: i64,
        lower: i64,
        upper: i64,
    },
    #[error("line {line}: buffer {id} has size 0; drop zero-byte buffers (they need no memory) or give the size in bytes")]
    ZeroSize { line: usize, id: i64 },
    #[error("line {line}: id {id} was already used on line {first}; ids must be unique (renumber one of them)")]
    DuplicateId { line: usize, id: i64, first: usize },
    #[error("interval {index} (id {id}): upper {upper} <= lower {lower}; lifetimes are [lower, upper) with upper > lower")]
    IntervalEmptyLifetime {
        index: usize,
        id: i64,
        lower: i64,
        upper: i64,
    },
    #[error("interval {index} (id {id}): size 0")]
    IntervalZeroSize { index: usize, id: i64 },
    #[error("interval {index}: duplicate id {id}")]
    IntervalDuplicateId { index: usize, id: i64 },

    // ----- plans -----
    #[error("{offsets} offsets for {intervals} intervals; give one offset per interval")]
    OffsetCount { offsets: usize, intervals: usize },
    #[error("interval {index} (id {id}): offset {offset} + size {size} overflows")]
    OffsetOverflow {
        index: usize,
        id: i64,
        offset: u64,
        size: u64,
    },
    /// Two buffers live at once whose bytes overlap.
    #[error(
        "ids {} ([{}, {}) at [{}, {})) and {} ([{}, {}) at [{}, {})) are live together and overlap in memory",
        .a.id, .a.lower, .a.upper, .a_offset, .a_offset + .a.size,
        .b.id, .b.lower, .b.upper, .b_offset, .b_offset + .b.size
    )]
    Overlap {
        a: Interval,
        a_offset: u64,
        b: Interval,
        b_offset: u64,
    },

    // ----- strategies and options -----
    #[error("unknown allocator {name:?}; choose from {}", .known.join(", "))]
    UnknownAllocator {
        name: String,
        known: &'static [&'static str],
    },
    /// A vramlab option (`lookahead`, …) whose value is not a boolean.
    #[error("allocator config {input:?}: {key}:{value} must be True or False, capitalised as PyTorch spells them (a vramlab option)")]
    OptionValue {
        input: String,
        key: &'static str,
        value: String,
    },
    /// A key neither PyTorch nor vramlab has.
    #[error("allocator config {input:?}: unknown option {key:?}; known options: {}", .known.join(", "))]
    UnknownOption {
        input: String,
        key: String,
        known: Vec<String>,
    },
}

impl LabError {
    /// The message with the file's `name` in front, unless the error names
    /// the file already (a snapshot's entry errors say only where in it).
    pub fn in_file(&self, name: &str) -> String {
        match self {
            LabError::NotAPickle { .. }
            | LabError::NoDeviceTraces { .. }
            | LabError::NoHistory { .. }
            | LabError::OpenTrace { .. }
            | LabError::EmptyFile { .. }
            | LabError::NoEvents { .. }
            | LabError::NotSnapshotBytes { .. }
            | LabError::IsDirectory { .. }
            | LabError::ReadTrace { .. } => self.to_string(),
            _ => format!("{name}: {self}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_file_names_the_file_once() {
        let e = LabError::SizeNotInteger {
            at: "device_traces[0][0] (\"alloc\")".into(),
            key: "size",
        };
        assert_eq!(
            e.in_file("s.pickle"),
            "s.pickle: device_traces[0][0] (\"alloc\"): size is not an integer"
        );
        let e = LabError::NoHistory {
            name: "s.pickle".into(),
        };
        assert!(e.in_file("s.pickle").starts_with("s.pickle: the snapshot"));
    }
}
