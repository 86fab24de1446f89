//! `moe-studio coordinator --port PORT`: the meeting point of a
//! multi-process `train --nodes N` run, Burn's global collective
//! orchestrator (`burn_collective::start_global_orchestrator`, websocket).
//! The ranks register with it (`--coordinator HOST:PORT`), learn each
//! other's tensor data-service addresses, then all-reduce peer to peer; the
//! coordinator carries no tensors. Start it before the ranks, once per run
//! (Burn's orchestrator keeps the node count of its first run); it serves
//! until Ctrl-C / SIGTERM.
//!
//! Refused with Burn 0.21 (`moe_shared::train::parallel::GLOBAL_COLLECTIVE_REFUSAL`:
//! Burn's cross-process all-reduce hangs at its second call), like
//! `train --nodes`; it runs again once that constant's guard is lifted.

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
/// Burn's global collective is unusable (Burn 0.21, the reason named); the
/// port cannot be bound (in use, or privileged).
pub fn run(a: Args) -> anyhow::Result<()> {
    if !moe_shared::train::parallel::GLOBAL_COLLECTIVE_USABLE {
        anyhow::bail!("coordinator: {}", moe_shared::train::parallel::GLOBAL_COLLECTIVE_REFUSAL);
    }
    // Burn logs a bind failure and returns; check first for a clear error.
    std::net::TcpListener::bind(("0.0.0.0", a.port))
        .with_context(|| format!("coordinator: cannot listen on port {}", a.port))?;
    eprintln!(
        "coordinator listening on 0.0.0.0:{} (ranks: train ... --nodes N --node-rank R --coordinator HOST:{}); \
         Ctrl-C stops it",
        a.port, a.port
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(burn_collective::start_global_orchestrator(a.port));
    Ok(())
}
