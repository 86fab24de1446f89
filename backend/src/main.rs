//! `moe-studio`: the command-line interface to every method of the studio
//! (and, later, the axum server behind the web app).

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
