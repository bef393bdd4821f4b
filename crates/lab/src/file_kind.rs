//! Which kind of trace file `replay` was given, decided from its bytes, not
//! its name: a pickle of protocol 2 or later opens with byte 0x80 (PyTorch's
//! `_dump_snapshot` writes protocol 2+); a protocol 0 or 1 pickle (a known
//! opening opcode and a final STOP) is read as a snapshot too, as `doctor`
//! reads it; a first line naming the columns `id,lower,upper,size` (among
//! others, if any) is an interval file; anything else is read as JSON Lines, and its errors say so.

use crate::error::LabError;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A pickle (any protocol): a PyTorch memory snapshot.
    Snapshot,
    /// vramlab's JSON Lines trace.
    JsonLines,
    /// An interval file (`id,lower,upper,size` CSV: MiniMalloc's and the
    /// offline-planning field's format).
    Intervals,
}

/// Said beside every error of a file read as JSON Lines.
pub const READ_AS_JSON_LINES: &str =
    "read as a JSON Lines trace, since the file does not open with byte 0x80 as a PyTorch snapshot pickle does";

/// Opcodes a protocol 0 or 1 pickle can open with (MARK, EMPTY_DICT,
/// EMPTY_LIST, EMPTY_TUPLE, GLOBAL, NONE, and the text and binary scalars).
/// None of them can open a JSON line, which opens with `{` or space.
const OLD_PICKLE_OPENERS: &[u8] = b"(}])cNILFSVdlKJMUTXGP";

/// The kind of the file at `path`.
pub fn sniff(path: &Path) -> Result<FileKind, LabError> {
    // A directory opens on Unix and fails only at the read, as "os error 21".
    if path.is_dir() {
        return Err(LabError::IsDirectory {
            path: path.to_path_buf(),
        });
    }
    let mut f = std::fs::File::open(path).map_err(|source| LabError::OpenTrace {
        path: path.to_path_buf(),
        source,
    })?;
    let mut first = [0u8; 1];
    let n = f.read(&mut first).map_err(|source| LabError::ReadTrace {
        path: path.to_path_buf(),
        source,
    })?;
    if n == 0 {
        return Err(LabError::EmptyFile {
            path: path.to_path_buf(),
        });
    }
    if first[0] == 0x80 {
        return Ok(FileKind::Snapshot);
    }
    if is_interval_header(&mut f) {
        return Ok(FileKind::Intervals);
    }
    // Every pickle ends with STOP ('.'); a JSON Lines file does not.
    let mut last = [0u8; 1];
    let ends_with_stop = f.seek(SeekFrom::End(-1)).is_ok()
        && f.read(&mut last).is_ok_and(|n| n == 1)
        && last[0] == b'.';
    if ends_with_stop && OLD_PICKLE_OPENERS.contains(&first[0]) {
        return Ok(FileKind::Snapshot);
    }
    Ok(FileKind::JsonLines)
}

/// Whether the file's first line is an interval header: the four columns
/// `id`, `lower`, `upper`, `size` in any order, among any others (which the
/// interval reader ignores: a header with an extra column was read as JSON
/// Lines and failed with a JSON error).
fn is_interval_header(f: &mut std::fs::File) -> bool {
    let mut head = [0u8; 256];
    let n = f
        .seek(SeekFrom::Start(0))
        .and_then(|_| f.read(&mut head))
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&head[..n]);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let Some(line) = text.lines().next() else {
        return false;
    };
    let cols: Vec<String> = line
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    ["id", "lower", "upper", "size"]
        .iter()
        .all(|name| cols.iter().any(|c| c == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(bytes: &[u8]) -> Result<FileKind, LabError> {
        let dir = std::env::temp_dir().join(format!("vramlab-kind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("f{}", bytes.len()));
        std::fs::write(&p, bytes).unwrap();
        let k = sniff(&p);
        std::fs::remove_file(&p).unwrap();
        k
    }

    #[test]
    fn decides_by_the_first_and_last_bytes() {
        assert_eq!(kind_of(b"\x80\x04N.").unwrap(), FileKind::Snapshot);
        // Empty: nothing to read as either, said as such.
        assert!(matches!(kind_of(b""), Err(LabError::EmptyFile { .. })));
        assert!(matches!(
            sniff(&std::env::temp_dir()),
            Err(LabError::IsDirectory { .. })
        ));
        assert_eq!(
            kind_of(b"id,lower,upper,size\n0,0,10,4096\n").ok(),
            Some(FileKind::Intervals)
        );
        assert_eq!(
            kind_of(b"\xef\xbb\xbfsize, upper,lower,ID\n").ok(),
            Some(FileKind::Intervals)
        );
        assert_eq!(
            kind_of(b"id,lower,upper,size,extra\n0,0,10,4096,x\n").ok(),
            Some(FileKind::Intervals)
        );
        assert_eq!(
            kind_of(b"{\"op\":\"empty_cache\"}\n").ok(),
            Some(FileKind::JsonLines)
        );
        // pickle.dumps({'a': 1}, protocol=0) and protocol=1: snapshots,
        // which the pickle reader reads as doctor does.
        for old in [
            &b"(dp0\nVa\np1\nI1\ns."[..],
            b"}q\x00X\x01\x00\x00\x00aq\x01K\x01s.",
        ] {
            assert_eq!(kind_of(old).ok(), Some(FileKind::Snapshot));
        }
        // Text that merely ends in a full stop is still JSON Lines (and its
        // parse error will say so).
        assert_eq!(kind_of(b"hello.").ok(), Some(FileKind::JsonLines));
    }
}
