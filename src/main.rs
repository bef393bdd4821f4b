//! The `vramlab` command. Errors end here: printed as one clear message, exit
//! code 1 (2 for bad flags, from clap); under `--json` also as JSON on stdout.

use std::ffi::OsString;

fn main() {
    restore_sigpipe();
    stdout_errors_exit_cleanly();
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = match vramlab::cli::Cli::try_parse_args(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and --version are not failures; a refused flag under
            // --json also answers on stdout, as a failed command does.
            if e.use_stderr() && asks_for_json(&argv) {
                println!(
                    "{}",
                    vramlab::cli::flag_error_json(&e.render().to_string(), e.exit_code())
                );
            }
            e.exit()
        }
    };
    let json = cli.command.json();
    if let Err(e) = vramlab::cli::run(cli) {
        eprintln!("error: {e:#}");
        if let Some(doc) = json.then(|| vramlab::cli::command_error_json(&e)).flatten() {
            println!("{doc}");
        }
        std::process::exit(1);
    }
}

/// `--json` among the arguments (or `--json=…`, which clap refuses: the
/// refusal still answers in JSON), before any `--` that ends the flags.
fn asks_for_json(argv: &[OsString]) -> bool {
    argv.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json" || a.to_string_lossy().starts_with("--json="))
}

/// Rust ignores SIGPIPE, so printing to a closed pipe (`vramlab estimate … |
/// head`) makes `println!` panic with "Broken pipe". A command-line tool
/// should instead end quietly when its reader goes away, as `cat` does.
#[cfg(unix)]
fn restore_sigpipe() {
    // SAFETY: called first thing in main, before any thread exists; setting a
    // signal's disposition to its default has no other precondition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn restore_sigpipe() {}

/// `println!` panics when stdout cannot be written (a full disk, `>
/// /dev/full`); hundreds of them print, so the hook turns that one panic
/// into the error it is: one line and exit 1. Other panics keep the
/// default report (they are bugs).
fn stdout_errors_exit_cleanly() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = text.strip_prefix("failed printing to stdout: ") {
            eprintln!("error: cannot write the output to stdout: {why}");
            std::process::exit(1);
        }
        default(info);
    }));
}
