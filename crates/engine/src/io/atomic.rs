//! Every file vramlab writes is written whole or not at all: the bytes go
//! to a new temporary file beside the target, are synced, and the temporary
//! is renamed over the target. A crash, a kill or a full disk mid-write
//! leaves the previous file intact. An interrupt (Ctrl-C, SIGTERM, SIGHUP)
//! removes the temporary before the process ends; one left by a killed
//! process (SIGKILL, a power cut) is removed by the next write of the same
//! target.
//!
//! The temporary's name is unique (process id, time, attempt) and it is
//! opened with `create_new` (O_CREAT | O_EXCL), which fails on any existing
//! path, symlinks included — so two writers never share a temporary, and a
//! link planted where the temporary would go is never followed. The rename
//! replaces a link at the target itself rather than writing through it.
//!
//! Only regular files (and new paths) are replaced that way. A character
//! device or a FIFO (`/dev/null`, a named pipe), and a link under `/dev` or
//! `/proc` (`/dev/stdout`), is written in place: renaming over it would
//! replace the device node with a regular file. Block devices (disks),
//! sockets and directories are refused.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Set only by the crash test (tests/hostile_files.rs): milliseconds to
/// pause after each 64 KiB written, so the test can kill a writer mid-write.
const SLOW_WRITE_ENV: &str = "VRAMLAB_TEST_SLOW_WRITE_MS";

/// Writes `bytes` to `path`: atomically where `path` is a regular file or
/// new, in place where it is a device or a FIFO (see the module's rules).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let keep = match target_of(path)? {
        Target::InPlace => return write_in_place(path, bytes),
        Target::Replace { keep } => keep,
    };
    remove_dead_temporaries(path);
    let (tmp, mut file) = create_temp(path)?;
    let _pending = super::interrupt::register(&tmp);
    // The replacement keeps the permissions of the file it replaces (a
    // private 0600 file must not become world-readable).
    if let Some(p) = keep {
        let _ = file.set_permissions(p);
    }
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

/// Whether [`write_atomic`] can write `path`, found before any work: a
/// target written in place is opened for writing (not truncated; a FIFO
/// is left to the write, as opening it waits for a reader), and one that
/// is replaced gets a temporary made and removed in its directory, as the
/// write makes it.
pub fn check_writable(path: &Path) -> io::Result<()> {
    match target_of(path)? {
        Target::InPlace => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::FileTypeExt;
                if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo()) {
                    return Ok(());
                }
            }
            OpenOptions::new().write(true).open(path).map(drop)
        }
        Target::Replace { .. } => {
            let (tmp, file) = create_temp(path)?;
            let _pending = super::interrupt::register(&tmp);
            drop(file);
            std::fs::remove_file(&tmp)
        }
    }
}

/// How a target is written.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// A temporary renamed over it (regular files, links, new paths),
    /// given the permissions of the regular file it replaces.
    Replace { keep: Option<std::fs::Permissions> },
    /// Opened and written as it is (devices, FIFOs, `/dev/stdout`).
    InPlace,
}

fn refuse(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is {what}; vramlab writes its output to a regular file (or a character device or FIFO); name a file instead",
            path.display()
        ),
    )
}

fn target_of(path: &Path) -> io::Result<Target> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        // A new file; any other trouble is reported by creating it.
        Err(_) => return Ok(Target::Replace { keep: None }),
    };
    let system = {
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        abs.starts_with("/dev") || abs.starts_with("/proc")
    };
    let ft = meta.file_type();
    // A link outside /dev and /proc is replaced, never followed (a planted
    // link must not redirect the write); under them (/dev/stdout) it is the
    // way to a stream and is followed.
    if ft.is_file() {
        return Ok(Target::Replace {
            keep: Some(meta.permissions()),
        });
    }
    if ft.is_symlink() && !system {
        return Ok(Target::Replace { keep: None });
    }
    let followed = if ft.is_symlink() {
        match std::fs::metadata(path) {
            Ok(m) => m.file_type(),
            Err(_) => return Ok(Target::InPlace),
        }
    } else {
        ft
    };
    if followed.is_dir() {
        return Err(refuse(path, "a directory"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if followed.is_block_device() {
            return Err(refuse(path, "a block device (a disk)"));
        }
        if followed.is_socket() {
            return Err(refuse(path, "a socket"));
        }
    }
    Ok(Target::InPlace)
}

/// The process's own stream a path names (`/dev/stdout`, `/dev/fd/1`,
/// `/proc/self/fd/1`; 2 for stderr).
fn own_stream(path: &Path) -> Option<u8> {
    match path.to_str()? {
        "/dev/stdout" | "/dev/fd/1" | "/proc/self/fd/1" => Some(1),
        "/dev/stderr" | "/dev/fd/2" | "/proc/self/fd/2" => Some(2),
        _ => None,
    }
}

/// Writes through `path` as it is: devices and FIFOs take the bytes as a
/// stream; the process's own stdout or stderr is written through its
/// descriptor (a second open of a redirected file would start at offset 0,
/// over what was printed, or wipe an appended log); another regular file
/// reached under /dev or /proc is truncated first.
fn write_in_place(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(fd) = own_stream(path) {
        let mut stream: Box<dyn Write> = if fd == 1 {
            Box::new(io::stdout().lock())
        } else {
            Box::new(io::stderr().lock())
        };
        stream.write_all(bytes)?;
        return stream.flush();
    }
    let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(regular)
        .open(path)?;
    write_slowly_if_asked(&mut f, bytes)?;
    f.flush()
}

/// Temporaries of `path` (`.NAME.PID.TIME.N.tmp`) whose writer no longer
/// runs: a process killed mid-write (SIGKILL cannot be caught) left them.
fn remove_dead_temporaries(path: &Path) {
    let (Some(name), Ok(entries)) = (path.file_name(), std::fs::read_dir(dir_of(path))) else {
        return;
    };
    let prefix = temp_prefix(name);
    for e in entries.flatten() {
        let file = e.file_name();
        let file = file.to_string_lossy();
        let Some(rest) = file
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".tmp"))
        else {
            continue;
        };
        let parts: Vec<&str> = rest.split('.').collect();
        let [pid, time, attempt] = parts[..] else {
            continue;
        };
        if time.parse::<u128>().is_err() || attempt.parse::<u32>().is_err() {
            continue;
        }
        if let Ok(pid) = pid.parse::<u32>() {
            if pid != std::process::id() && !process_runs(pid) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Whether process `pid` exists (signal 0 checks without sending).
#[cfg(unix)]
fn process_runs(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks the pid.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(not(unix))]
fn process_runs(_pid: u32) -> bool {
    true
}

fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
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

/// How every temporary of a target named `name` begins; the rest is
/// `PID.TIME.ATTEMPT.tmp` (see `create_temp`, which `remove_dead_temporaries`
/// parses).
fn temp_prefix(name: &std::ffi::OsStr) -> String {
    format!(".{}.", name.to_string_lossy())
}

/// A new, exclusively created temporary file in `path`'s directory.
fn create_temp(path: &Path) -> io::Result<(PathBuf, File)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names a directory, not a file", path.display()),
        )
    })?;
    let dir = dir_of(path);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut last = None;
    for attempt in 0..64u32 {
        let tmp = dir.join(format!(
            "{}{}.{nanos}.{attempt}.tmp",
            temp_prefix(name),
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
    fn checking_writes_nothing_and_follows_no_link() {
        let dir = std::env::temp_dir().join(format!("vramlab-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        check_writable(&dir.join("new.txt")).unwrap();
        assert!(check_writable(&dir).is_err(), "a directory");
        #[cfg(unix)]
        {
            let link = dir.join("link.txt");
            std::os::unix::fs::symlink(dir.join("target.txt"), &link).unwrap();
            check_writable(&link).unwrap();
            assert!(!dir.join("target.txt").exists());
            std::fs::remove_file(&link).unwrap();
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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

    #[cfg(unix)]
    #[test]
    fn a_replaced_file_keeps_its_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("vramlab-atomic-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("private.json");
        std::fs::write(&p, b"old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, b"new").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_dead_writers_temporary_is_removed_by_the_next_write() {
        let dir = std::env::temp_dir().join(format!("vramlab-atomic-dead-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.v1.json");
        // Past any pid_max: no such process.
        let dead = dir.join(".out.v1.json.999999999.123.0.tmp");
        // Ours and another target's are left alone.
        let ours = dir.join(format!(".out.v1.json.{}.5.0.tmp", std::process::id()));
        let other = dir.join(".other.json.999999999.123.0.tmp");
        for f in [&dead, &ours, &other] {
            std::fs::write(f, b"partial").unwrap();
        }
        write_atomic(&p, b"whole").unwrap();
        assert!(!dead.exists());
        assert!(ours.exists() && other.exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"whole");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
