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

/// glibc's allocator serves every buffer above its mmap threshold (128 KiB,
/// raised only up to 32 MiB as buffers are freed) with a fresh `mmap`, and
/// returns heap tops above the trim threshold to the kernel. A forward pass
/// allocates and frees activation-sized buffers (1-100 MB) in every layer,
/// so each became page faults plus kernel page zeroing: 4-7 % of the CPU
/// samples of prefill and of a training step (docs/benchmarks.md, "Where
/// the time goes"). Keeping buffers up to 256 MiB in the heap and not
/// trimming below 1 GiB lets them be reused; peak memory is unchanged (a
/// freed buffer is reused rather than given back and asked for again).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() {
    tune_allocator();
    exit_with_parent();
    let args = cli::Cli::parse();
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
