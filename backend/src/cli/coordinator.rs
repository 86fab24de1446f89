//! `moe-studio coordinator --port PORT`: the meeting point of a
//! multi-process `train --nodes N` run (shared/src/train/parallel.rs,
//! `serve_coordinator`). The ranks connect to it (`--coordinator
//! HOST:PORT`, a websocket on Burn's transport, `burn-communication`);
//! once all N have joined, every all-reduce is the sum of the ranks'
//! vectors in rank order, sent back to each rank, so the coordinator
//! carries each step's gradients once in each direction per rank. It
//! serves one run at a time, then the next; a rank that leaves mid-run ends
//! the run on the others with an error naming it. It serves until Ctrl-C /
//! SIGTERM.

use anyhow::Context;

/// Arguments of `coordinator`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// TCP port to listen on (all interfaces); the ranks pass `--coordinator HOST:PORT`.
    #[arg(long, default_value_t = 29500)]
    pub port: u16,
}

/// Serves until interrupted.
///
/// # Errors
/// The port cannot be bound (in use, or privileged).
pub fn run(a: Args) -> anyhow::Result<()> {
    // Check the port first for a clear error (Burn's server reports a bind
    // failure only as its own error type).
    drop(
        std::net::TcpListener::bind(("0.0.0.0", a.port))
            .with_context(|| format!("coordinator: cannot listen on port {}", a.port))?,
    );
    eprintln!(
        "coordinator listening on 0.0.0.0:{} (ranks: train ... --nodes N --node-rank R --coordinator HOST:{}); \
         Ctrl-C stops it",
        a.port, a.port
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(moe_shared::train::parallel::serve_coordinator(
        a.port,
        burn_communication::util::os_shutdown_signal(),
    ))?;
    Ok(())
}
