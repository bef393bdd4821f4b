//! Outputs are written whole or not at all (crates/engine/src/io/atomic.rs): a writer
//! killed mid-write leaves the previous file intact (and the next write
//! removes its temporary), and a link planted at
//! the output is replaced, not written through. Standard output is a file
//! too: a reader that goes away (`| head`) ends the command quietly.

use crate::common;
use crate::common::cli::stderr;
use common::files::{temporaries, write_trace, writer_caught_mid_write};
use std::process::Command;

fn bin() -> Command {
    common::cli::command(std::iter::empty::<&str>())
}

#[test]
fn a_writer_killed_mid_write_leaves_the_previous_file_intact() {
    let dir = std::env::temp_dir().join(format!("vramlab-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.jsonl");
    write_trace(&trace, 6000);
    let out = dir.join("snap.pickle");
    // The good file first.
    let ok = bin()
        .args(["replay", trace.to_str().unwrap(), "--export-snapshot"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", stderr(&ok));
    let good = std::fs::read(&out).unwrap();
    assert!(
        good.len() > 4 * 65536,
        "{} bytes: too few chunks",
        good.len()
    );
    // Again, slowly (a pause after each 64 KiB), and killed once the
    // temporary file exists and holds part of the data.
    let args = [
        "replay",
        trace.to_str().unwrap(),
        "--export-snapshot",
        out.to_str().unwrap(),
    ];
    let mut child = writer_caught_mid_write(&args, &dir);
    child.kill().unwrap();
    child.wait().unwrap();
    // The kill came mid-write: a partial temporary is left beside it.
    assert!(!temporaries(&dir).is_empty());
    assert_eq!(
        std::fs::read(&out).unwrap(),
        good,
        "the previous file must be intact"
    );
    // A later run still writes, and removes what the killed writer left
    // (SIGKILL cannot be caught; its process is gone, so its temporary is
    // nobody's).
    let again = bin()
        .args(["replay", trace.to_str().unwrap(), "--export-snapshot"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(again.status.success());
    assert!(vramlab::lab::pickle::unpickle(&std::fs::read(&out).unwrap()).is_ok());
    assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn a_link_planted_at_the_output_is_not_followed() {
    let dir = std::env::temp_dir().join(format!("vramlab-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.jsonl");
    write_trace(&trace, 10);
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let out = dir.join("snap.pickle");
    std::os::unix::fs::symlink(&victim, &out).unwrap();
    let r = bin()
        .args(["replay", trace.to_str().unwrap(), "--export-snapshot"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(!std::fs::symlink_metadata(&out)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(temporaries(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::io::{BufRead, BufReader};
    // A 175B estimate prints thousands of rows: far more than a pipe holds,
    // so the command is still writing when the reader closes its end.
    let mut child = bin()
        .args([
            "estimate", "--model", "gpt", "--preset", "175b", "--batch", "8",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("vramlab estimate"), "{first}");
    let out = child.wait_with_output().unwrap();
    let stderr = stderr(&out);
    assert!(
        !stderr.contains("panicked"),
        "closing the pipe made the command panic: {stderr}"
    );
    assert!(
        !out.status.success(),
        "the command cannot have printed all its rows"
    );
}

/// The writer itself (`vramlab::io::write_atomic`): a character device or a
/// FIFO is written in place and stays what it was (renamed over, /dev/full
/// became a regular file); a full device's error is returned; a directory
/// is refused.
#[cfg(unix)]
#[test]
fn devices_and_fifos_are_written_in_place_not_replaced() {
    use common::files::{char_device, fifo_with_reader};
    use std::os::unix::fs::FileTypeExt;
    use std::path::Path;
    use vramlab::io::write_atomic;
    let is_char = |p: &Path| {
        std::fs::symlink_metadata(p)
            .unwrap()
            .file_type()
            .is_char_device()
    };
    let dir = std::env::temp_dir().join(format!("vramlab-atomic-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let null = char_device(&dir, "null", 3);
    write_atomic(&null, b"gone").unwrap();
    assert!(is_char(&null));
    // A full device reports its error and stays a device.
    let full = char_device(&dir, "full", 7);
    let e = write_atomic(&full, &[0u8; 1 << 16]).unwrap_err();
    assert!(is_char(&full), "{e}");

    let (fifo, reader) = fifo_with_reader(&dir, "pipe");
    write_atomic(&fifo, b"through the pipe").unwrap();
    assert_eq!(reader.join().unwrap(), b"through the pipe");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    let e = write_atomic(&dir, b"x").unwrap_err();
    assert!(e.to_string().contains("directory"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
