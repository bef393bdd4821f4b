//! Running the vramlab binary from a test: one way to start it and read what
//! it printed, so each test states only its command and what must hold.

use std::ffi::OsStr;
use std::process::{Command, Output};

/// Runs the vramlab binary with `args` from the repository root.
pub fn vramlab<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    command(args).output().expect("the vramlab binary runs")
}

/// The binary with `args`, to add environment or input before running it.
pub fn command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(env!("CARGO_BIN_EXE_vramlab"));
    c.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// What a finished command printed on stdout.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a finished command printed on stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The stdout of a command that must succeed; fails the test with its
/// stderr otherwise.
pub fn succeeds<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args = owned(args);
    let o = vramlab(&args);
    assert!(
        o.status.success(),
        "{args:?}: {:?}\n{}",
        o.status,
        stderr(&o)
    );
    stdout(&o)
}

/// The stderr of a command that must fail cleanly: exit code 1 or 2, an
/// `error` line and no panic.
pub fn fails_cleanly<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args = owned(args);
    let o = vramlab(&args);
    let err = stderr(&o);
    assert!(
        matches!(o.status.code(), Some(1 | 2))
            && err.contains("error")
            && !err.contains("panicked"),
        "{args:?}: {:?}\n{err}",
        o.status
    );
    err
}

/// Runs the vramlab binary with `args` and parses the JSON it prints; fails
/// the test with the command's stderr if it does not succeed.
pub fn vramlab_json<I, S>(args: I) -> serde_json::Value
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args = owned(args);
    let o = vramlab(&args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    json_of(o)
}

/// The arguments as owned strings, to name them when a test fails.
fn owned<I, S>(args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    args.into_iter().map(|a| a.as_ref().to_owned()).collect()
}

/// The JSON a finished vramlab command printed; fails the test with its
/// stderr if it did not succeed.
pub fn json_of(out: Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("vramlab printed JSON")
}
