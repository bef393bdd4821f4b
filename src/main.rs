//! The `vramlab` command. Errors end here: printed as one clear message, exit
//! code 1 (2 for bad flags, from clap).

use clap::Parser;

fn main() {
    let cli = vramlab::cli::Cli::parse();
    if let Err(e) = vramlab::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
