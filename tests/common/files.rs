//! Helpers for the tests of files vramlab writes: a trace to replay, the
//! temporaries an atomic write leaves, device nodes safe to write to.

use std::path::{Path, PathBuf};

/// A JSON Lines trace of `n` allocations (a third freed) whose exported
/// snapshot takes many 64 KiB chunks to write.
pub fn write_trace(path: &Path, n: usize) {
    let mut s = String::new();
    for i in 0..n {
        s += &format!(
            "{{\"op\":\"alloc\",\"id\":{i},\"size\":{},\"label\":\"tensor number {i}\"}}\n",
            1000 + i * 37 % 5000
        );
        if i % 3 == 0 {
            s += &format!("{{\"op\":\"free\",\"id\":{i}}}\n");
        }
    }
    std::fs::write(path, s).unwrap();
}

/// The `.tmp` files in `dir` (an atomic write's temporaries).
pub fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

/// A character device to write to: as root, a node of its own in `dir`, so
/// that a writer that wrongly replaced it (the fault tested) could not
/// replace the system's /dev/null (run as root against the old writer,
/// this test once did); otherwise the system's, which a non-root rename
/// cannot replace.
#[cfg(unix)]
pub fn char_device(dir: &Path, name: &str, minor: u32) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let p = dir.join(name);
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mem 1:minor is null (3) or full (7).
        let made =
            unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, minor)) };
        let e = std::io::Error::last_os_error();
        assert_eq!(made, 0, "mknod {}: {e}", p.display());
        p
    } else {
        PathBuf::from(format!("/dev/{name}"))
    }
}

/// A named pipe `dir/name` and a thread reading it whole; join the thread
/// for what was written to it.
#[cfg(unix)]
pub fn fifo_with_reader(dir: &Path, name: &str) -> (PathBuf, std::thread::JoinHandle<Vec<u8>>) {
    let fifo = dir.join(name);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    (fifo, reader)
}

/// `vramlab ARGS` started with a pause after each 64 KiB it writes, once
/// its temporary file exists and holds part of the data: a writer caught
/// mid-write, to be killed or interrupted. The pause is long (3 s, cut
/// short by the signal) so that a loaded machine, whose test thread may
/// wait hundreds of milliseconds for a core, still signals the writer
/// before it finishes.
pub fn writer_caught_mid_write(args: &[&str], dir: &Path) -> std::process::Child {
    use std::time::{Duration, Instant};
    let mut command = super::cli::command(std::iter::empty::<&str>());
    // The writer starts with the signals' default actions, as from a
    // terminal: a shell that ran these tests in the background (`cmd &`,
    // no job control) passed SIGINT on ignored, and vramlab rightly
    // leaves an ignored signal ignored, so it wrote on and exited 0.
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe calls, between fork and exec.
        unsafe {
            command.pre_exec(|| {
                for sig in [libc::SIGINT, libc::SIGTERM] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
    }
    let mut child = command
        .args(args)
        .env("VRAMLAB_TEST_SLOW_WRITE_MS", "3000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !temporaries(dir)
        .iter()
        .any(|t| std::fs::metadata(dir.join(t)).is_ok_and(|m| m.len() > 0))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writer never started its temporary file"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the writer finished before it could be stopped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `tests/fixtures/snapshots/multi_device.pickle` with device 0's last trace
/// entry (a free) dropped, written to `dir`: device 0 then has 2 operations
/// and device 1 (alloc, free, and its out-of-memory entry's probe) 3, so
/// the devices' histories differ in length.
pub fn uneven_devices(dir: &Path) -> PathBuf {
    use vramlab::lab::pickle::{pickle, unpickle, PyValue};
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/snapshots/multi_device.pickle"
    );
    let root = unpickle(&std::fs::read(fixture).unwrap()).unwrap();
    let items: Vec<(PyValue, PyValue)> = root
        .as_dict()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            if k.as_str() != Some("device_traces") {
                return (k.clone(), v.clone());
            }
            let mut traces = v.as_list().unwrap().to_vec();
            let mut first = traces[0].as_list().unwrap().to_vec();
            first.pop();
            traces[0] = PyValue::list(first);
            (k.clone(), PyValue::list(traces))
        })
        .collect();
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("uneven_devices.pickle");
    std::fs::write(&path, pickle(&PyValue::dict(items))).unwrap();
    path
}
