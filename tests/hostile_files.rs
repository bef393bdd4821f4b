//! Outputs are written whole or not at all (src/io/atomic.rs): a writer
//! killed mid-write leaves the previous file intact (and the next write
//! removes its temporary), and a link planted at
//! the output is replaced, not written through. Standard output is a file
//! too: a reader that goes away (`| head`) ends the command quietly.

mod common;
use common::files::{temporaries, write_trace};
use std::process::Command;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramlab"))
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
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let good = std::fs::read(&out).unwrap();
    assert!(
        good.len() > 4 * 65536,
        "{} bytes: too few chunks",
        good.len()
    );
    // Again, slowly (a pause after each 64 KiB), and killed once the
    // temporary file exists and holds part of the data.
    let mut child = bin()
        .args(["replay", trace.to_str().unwrap(), "--export-snapshot"])
        .arg(&out)
        .env("VRAMLAB_TEST_SLOW_WRITE_MS", "300")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        let tmps = temporaries(&dir);
        let partial = tmps
            .iter()
            .any(|t| std::fs::metadata(dir.join(t)).is_ok_and(|m| m.len() > 0));
        if partial {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writer never started its temporary file"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the writer finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
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
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "closing the pipe made the command panic: {stderr}"
    );
    assert!(
        !out.status.success(),
        "the command cannot have printed all its rows"
    );
}
