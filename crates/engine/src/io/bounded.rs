//! An input file read whole without letting it take the host's memory: a
//! device or a pipe (`/dev/zero`) may never end, and a regular file larger
//! than the memory available would get the process killed rather than
//! refused.

use std::io::Read;
use std::path::Path;

/// The most read from a stream (a pipe, a device: anything but a regular
/// file, whose size is not known before it ends).
pub const STREAM_LIMIT: u64 = 1 << 30;

fn other(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

/// The whole of the regular file at `path` (refused where it is larger
/// than the host's available memory), or of a stream up to `stream_limit`
/// bytes (refused past it).
pub fn read_whole(path: &Path, stream_limit: u64) -> std::io::Result<Vec<u8>> {
    let (file, regular) = open(path)?;
    if regular {
        return read_regular(file);
    }
    let mut out = Vec::new();
    file.take(stream_limit.saturating_add(1))
        .read_to_end(&mut out)?;
    if out.len() as u64 > stream_limit {
        return Err(other(format!(
            "it is not a regular file (a pipe or a device) and gave more than {}; save the input to a file first",
            crate::memory::format_size(stream_limit)
        )));
    }
    Ok(out)
}

/// The file at `path` and whether it is a regular one.
pub fn open(path: &Path) -> std::io::Result<(std::fs::File, bool)> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(other("it is a directory".into()));
    }
    Ok((file, meta.is_file()))
}

/// A regular file read whole, once its size is known to fit the memory
/// available.
pub fn read_regular(mut file: std::fs::File) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len();
    fits_memory(len, || {
        format!("the file is {}", crate::memory::format_size(len))
    })?;
    let mut out = Vec::with_capacity(len as usize);
    file.read_to_end(&mut out)?;
    Ok(out)
}

/// Refuses to read `len` bytes whole where the host's available memory
/// holds fewer; `what` says what they are.
pub fn fits_memory(len: u64, what: impl FnOnce() -> String) -> std::io::Result<()> {
    match crate::device::host_memory::available() {
        Some(available) if len > available => Err(other(format!(
            "{} and the host has {} of memory available; it is read whole, so it cannot be read here",
            what(),
            crate::memory::format_size(available)
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_stops_at_its_limit_and_a_file_reads_whole() {
        let err = read_whole(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let dir = std::env::temp_dir().join(format!("vramlab-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::write(&p, vec![7u8; 3 << 20]).unwrap();
        assert_eq!(read_whole(&p, 1 << 20).unwrap().len(), 3 << 20);
        let err = read_whole(&dir, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
