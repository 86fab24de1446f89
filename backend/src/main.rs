//! `moe-studio`: the command-line interface to every method of the studio
//! and the axum server behind the web app (`moe-studio serve`).

mod cli;
mod server;

use clap::Parser;

/// A job started by `serve` gets its stdin from a pipe held by the server:
/// when the pipe closes (the server exited, even by `kill -9`), the job
/// exits too, so that no orphan keeps writing into the job's directory.
fn exit_with_parent() {
    if std::env::var_os(server::EXIT_WITH_PARENT_ENV).is_none() {
        return;
    }
    std::thread::spawn(|| {
        use std::io::Read;
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    eprintln!("error: the server that started this job is gone; exiting");
                    std::process::exit(137);
                }
                Ok(_) => {}
            }
        }
    });
}

fn main() {
    exit_with_parent();
    let args = cli::Cli::parse();
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
