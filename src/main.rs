//! The `vramlab` command. Errors end here: printed as one clear message, exit
//! code 1 (2 for bad flags, from clap).

use clap::Parser;

fn main() {
    restore_sigpipe();
    let cli = vramlab::cli::Cli::parse();
    if let Err(e) = vramlab::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
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
