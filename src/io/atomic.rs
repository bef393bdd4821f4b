//! Every file vramlab writes is written whole or not at all: the bytes go
//! to a new temporary file beside the target, are synced, and the temporary
//! is renamed over the target. A crash, a kill or a full disk mid-write
//! leaves the previous file intact (and at worst a `.NAME.*.tmp` beside it).
//!
//! The temporary's name is unique (process id, time, attempt) and it is
//! opened with `create_new` (O_CREAT | O_EXCL), which fails on any existing
//! path, symlinks included — so two writers never share a temporary, and a
//! link planted where the temporary would go is never followed. The rename
//! replaces a link at the target itself rather than writing through it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Set only by the crash test (tests/hostile_files.rs): milliseconds to
/// pause after each 64 KiB written, so the test can kill a writer mid-write.
const SLOW_WRITE_ENV: &str = "VRAMLAB_TEST_SLOW_WRITE_MS";

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (tmp, mut file) = create_temp(path)?;
    let result = write_slowly_if_asked(&mut file, bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            drop(file);
            std::fs::rename(&tmp, path)
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn write_slowly_if_asked(file: &mut File, bytes: &[u8]) -> io::Result<()> {
    let pause = std::env::var(SLOW_WRITE_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    match pause {
        None => file.write_all(bytes),
        Some(ms) => {
            for chunk in bytes.chunks(64 << 10) {
                file.write_all(chunk)?;
                file.flush()?;
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            Ok(())
        }
    }
}

/// A new, exclusively created temporary file in `path`'s directory.
fn create_temp(path: &Path) -> io::Result<(PathBuf, File)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names a directory, not a file", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut last = None;
    for attempt in 0..64u32 {
        let tmp = dir.join(format!(
            ".{}.{}.{nanos}.{attempt}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no temporary file name was free")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("vramlab-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.txt");
        write_atomic(&p, b"first").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "only the target remains");
        assert!(write_atomic(&dir.join("missing/x"), b"y").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_link_at_the_target_is_replaced_not_followed() {
        let dir = std::env::temp_dir().join(format!("vramlab-atomic-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let p = dir.join("out");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(!std::fs::symlink_metadata(&p)
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
