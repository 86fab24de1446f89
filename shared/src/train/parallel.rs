//! Data parallelism on Burn's collective engine (`burn-collective` 0.21):
//! `train --devices N` (N replicas as threads of one process, Burn's
//! *local* peers) and `train --nodes N --node-rank R --coordinator
//! HOST:PORT` (one process per node, Burn's *global* peers, which meet at
//! `moe-studio coordinator`, Burn's global orchestrator, and exchange
//! tensors peer to peer through `burn-communication`'s data service).
//!
//! Every collective call here is an all-reduce (sum): Burn 0.21 implements
//! `reduce` and `broadcast` only between the threads of one process, not
//! across nodes (ARCHITECTURE.md "Training"). Per optimizer step each
//! replica (docs/methods.md §1-2, the trainer in [`super::trainer`]):
//! 1. per micro-step, all-reduces its per-expert routing counts and its
//!    number of original-language rows before the losses, so that the
//!    load-balancing fractions `f_i` and the language prior's denominator
//!    are those of the whole global batch
//!    ([`super::losses::load_balancing_loss_dp`],
//!    [`super::losses::language_prior_loss_dp`]);
//! 2. accumulates its gradients over the micro-steps, then all-reduces them
//!    once (`GradientsParams::all_reduce`, Burn's own, in `ParamId` order;
//!    the losses are scaled by `1 / (grad_accum * world)`, so the sum is the
//!    mean); a parameter that got no gradient on some replica (an expert no
//!    token of its share chose) is sent as zeros, and dropped after the
//!    reduction when no replica had one, exactly as one replica with the
//!    whole batch would leave it;
//! 3. all-reduces its loss terms for the metrics.
//!
//! Every replica then clips and steps the same gradients with the same
//! AdamW state, so the replicas stay bit-identical without broadcasting
//! weights; at start (and after `--resume`) the ranks compare checksums of
//! the options, the weights and the data position with one all-reduce
//! ([`Fingerprint`]), since Burn has no cross-node broadcast.
//!
//! Burn keeps ONE local collective server per process and backend type, so
//! one [`Cluster`] exists at a time per process (a second waits).
//!
//! **The multi-process path is refused in Burn 0.21** ([`GLOBAL_COLLECTIVE_USABLE`]
//! is `false`): Burn's cross-process all-reduce hangs at its second call
//! (see [`GLOBAL_COLLECTIVE_REFUSAL`] for the line). [`NodeSpec::validate`]
//! refuses every node spec, so `train --nodes/--coordinator` and
//! `moe-studio coordinator` stop at once with that reason; the code of the
//! path stays, compiled, for the Burn release that fixes the barrier
//! (flip the constant; backend/tests/train_nodes_cli.rs then checks
//! 2 processes x batch 2 == 1 x batch 4 on loopback). Threads (`--devices N`)
//! use only Burn's local server and are not affected.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use burn::collective::{self as bc, AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::error::{Result, StudioError};

/// Whether Burn's cross-process (global) collective can carry a training
/// loop. `false` for burn-collective 0.21.0: see
/// [`GLOBAL_COLLECTIVE_REFUSAL`]. While `false`, [`NodeSpec::validate`]
/// refuses every node spec (so [`Cluster::join`] never reaches Burn's
/// global path) and `moe-studio coordinator` refuses to start.
pub const GLOBAL_COLLECTIVE_USABLE: bool = false;

/// Why multi-process training is refused (the error text of
/// [`NodeSpec::validate`] and `moe-studio coordinator`).
///
/// The cause, in burn-collective 0.21.0 (unchanged on Burn's main branch
/// when checked): every global all-reduce (tree, ring and centralized
/// alike: `src/global/node/tree.rs:93`, `centralized.rs:85`, `ring.rs`)
/// ends with the barrier `SyncService::sync` of `src/global/node/sync.rs`,
/// which adds this node to a shared list of synced peers (:52, and :96 for
/// each peer's message) and returns when the sorted list equals the node
/// ids (:71-77); the reset at :79 clears a *copy* of the list
/// (`lock().unwrap().to_vec()` at :71), never the list. After the first
/// all-reduce the list already holds every node, so at the second one it
/// holds duplicates, never equals the node ids again, and `sync` waits on
/// its `Notify` (:84) forever: all processes sit at 0% CPU. (A second,
/// intermittent hang: `notify_waiters` at :98 stores no permit, so a peer
/// message arriving between the check and `notified()` is lost.) Observed
/// here: `moe-studio train --nodes 2` on loopback passes the first
/// all-reduce (the rank fingerprint check) and hangs in the second.
pub const GLOBAL_COLLECTIVE_REFUSAL: &str = "multi-process training is disabled: Burn 0.21's cross-process \
     all-reduce hangs at its second call (burn-collective 0.21.0, src/global/node/sync.rs:71-79: the barrier after \
     every global all-reduce clears a copy of its synced-peer list, never the list, so every later barrier waits \
     forever). Use --devices N for several replicas in one process, or --engine torch --emit DIR for a \
     multi-node job (torchrun + FSDP)";

/// This process's place in a multi-process run (`--nodes`, `--node-rank`,
/// `--coordinator`, `--node-address`, `--join-timeout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Processes in the run (Burn's global peers), >= 1.
    pub nodes: usize,
    /// This process's rank in `0..nodes`; rank 0 writes checkpoints and
    /// metrics.
    pub rank: usize,
    /// `HOST:PORT` of the coordinator (`moe-studio coordinator --port PORT`).
    pub coordinator: String,
    /// `HOST:PORT` where the other ranks reach this rank's tensor data
    /// service (`None`: this machine's address on the route to the
    /// coordinator, port = coordinator port + 1 + rank).
    pub node_address: Option<String>,
    /// How long to wait for the coordinator to answer and for all ranks to
    /// join.
    pub timeout: Duration,
}

impl NodeSpec {
    /// Checks the rank against `nodes` and the addresses' form, then
    /// refuses while [`GLOBAL_COLLECTIVE_USABLE`] is `false`.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `--nodes`, `--node-rank`,
    /// `--coordinator` or `--node-address`; for a well-formed spec,
    /// [`StudioError::Config`] on `--nodes` with [`GLOBAL_COLLECTIVE_REFUSAL`]
    /// (Burn 0.21).
    pub fn validate(&self) -> Result<()> {
        if self.nodes == 0 {
            return Err(StudioError::config("--nodes", "must be at least 1"));
        }
        if self.rank >= self.nodes {
            return Err(StudioError::config(
                "--node-rank",
                format!("{} is out of range: --nodes {} has ranks 0..={}", self.rank, self.nodes, self.nodes - 1),
            ));
        }
        host_port(&self.coordinator, "--coordinator")?;
        if let Some(a) = &self.node_address {
            host_port(a, "--node-address")?;
        }
        if !GLOBAL_COLLECTIVE_USABLE {
            return Err(StudioError::config("--nodes", GLOBAL_COLLECTIVE_REFUSAL));
        }
        Ok(())
    }

    /// The coordinator's socket address (resolved).
    fn coordinator_addr(&self) -> Result<SocketAddr> {
        let (h, p) = host_port(&self.coordinator, "--coordinator")?;
        (h.as_str(), p)
            .to_socket_addrs()
            .map_err(|e| StudioError::config("--coordinator", format!("{}: {e}", self.coordinator)))?
            .next()
            .ok_or_else(|| StudioError::config("--coordinator", format!("{}: no address", self.coordinator)))
    }

    /// `(host, port)` of this rank's data service.
    fn data_address(&self, coordinator: SocketAddr) -> Result<(String, u16)> {
        if let Some(a) = &self.node_address {
            return host_port(a, "--node-address");
        }
        let port = u32::from(coordinator.port()) + 1 + self.rank as u32;
        let port = u16::try_from(port).map_err(|_| {
            StudioError::config("--node-address", "coordinator port + 1 + rank exceeds 65535: pass --node-address")
        })?;
        // The local address of the route to the coordinator (no packet is sent).
        let host = std::net::UdpSocket::bind(if coordinator.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
            .and_then(|s| s.connect(coordinator).and_then(|_| s.local_addr()))
            .map(|a| a.ip().to_string())
            .map_err(|e| StudioError::config("--node-address", format!("cannot find this machine's address: {e}")))?;
        Ok((host, port))
    }
}

fn host_port(s: &str, opt: &str) -> Result<(String, u16)> {
    let bad = || StudioError::config(opt, format!("`{s}`: expected HOST:PORT"));
    let (h, p) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = p.parse().map_err(|_| bad())?;
    let h = h.trim_start_matches('[').trim_end_matches(']');
    if h.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((h.to_string(), port))
}

/// One cluster at a time per process (Burn's local server is a process
/// global keyed by backend type).
static SLOT: Mutex<bool> = Mutex::new(false);
static SLOT_FREE: Condvar = Condvar::new();

struct SlotGuard;

impl SlotGuard {
    fn acquire() -> SlotGuard {
        let mut busy = SLOT.lock().unwrap_or_else(|e| e.into_inner());
        while *busy {
            busy = SLOT_FREE.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy = true;
        SlotGuard
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        *SLOT.lock().unwrap_or_else(|e| e.into_inner()) = false;
        SLOT_FREE.notify_one();
    }
}

fn collective_err(what: &str, e: bc::CollectiveError) -> StudioError {
    StudioError::Invalid(format!("data parallelism: {what} failed in Burn's collective ({e:?})"))
}

/// The registered peers of this process: `local` replicas (threads) with
/// peer ids `rank * local + i`, joined to the other nodes when
/// [`NodeSpec`] was given. `B` is the INNER (non-autodiff) backend, whose
/// tensors the gradients are.
pub struct Cluster<B: Backend> {
    peers: Vec<PeerId>,
    devices: Vec<B::Device>,
    node: Option<NodeSpec>,
    _slot: SlotGuard,
}

impl<B: Backend> std::fmt::Debug for Cluster<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("peers", &self.peers).field("node", &self.node).finish()
    }
}

impl<B: Backend> Cluster<B> {
    /// Registers one local peer per device (concurrently: Burn answers
    /// when all have registered) and, with `node`, joins the coordinator
    /// (refused by [`NodeSpec::validate`] while [`GLOBAL_COLLECTIVE_USABLE`]
    /// is `false`, before any network call).
    ///
    /// # Errors
    /// [`StudioError::Config`] for an invalid `node`; [`StudioError::Invalid`]
    /// when the coordinator does not answer within `node.timeout`, when not
    /// all ranks join within it, or when Burn refuses the registration.
    pub fn join(devices: Vec<B::Device>, node: Option<NodeSpec>) -> Result<Self> {
        let local = devices.len().max(1);
        let mut config = CollectiveConfig::default()
            .with_num_devices(local)
            .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
        let rank = node.as_ref().map_or(0, |n| n.rank);
        let mut deadline = None;
        if let Some(n) = &node {
            n.validate()?;
            let coord = n.coordinator_addr()?;
            let (host, port) = n.data_address(coord)?;
            wait_for(coord, n)?;
            let addr = |s: String| -> burn_communication::Address { s.parse().expect("Address parses any string") };
            config = config
                .with_num_nodes(n.nodes as u32)
                .with_global_address(addr(format!("ws://{}", n.coordinator)))
                .with_node_address(addr(format!("ws://{host}:{port}")))
                .with_data_service_port(port)
                .with_global_all_reduce_strategy(AllReduceStrategy::Tree(2));
            deadline = Some(n.timeout);
        }
        let slot = SlotGuard::acquire();
        let peers: Vec<PeerId> = (0..local).map(|i| PeerId::from((rank * local + i) as u32)).collect();
        // Detached threads: a registration that never completes (a rank that
        // never comes) must not hold this one past the timeout.
        let (tx, rx) = std::sync::mpsc::channel();
        for (p, d) in peers.iter().zip(&devices) {
            let (p, d, c, tx) = (*p, d.clone(), config.clone(), tx.clone());
            std::thread::spawn(move || {
                let _ = tx.send(bc::register::<B>(p, d, c));
            });
        }
        drop(tx);
        let t0 = Instant::now();
        for _ in 0..local {
            let r = match deadline {
                Some(t) => rx.recv_timeout(t.saturating_sub(t0.elapsed())).map_err(|_| {
                    let n = node.as_ref().expect("node");
                    StudioError::Invalid(format!(
                        "rank {}: not all {} ranks joined the coordinator {} within {} s (start every rank with the \
                         same --nodes and --coordinator, or raise --join-timeout)",
                        n.rank,
                        n.nodes,
                        n.coordinator,
                        t.as_secs()
                    ))
                })?,
                None => rx.recv().map_err(|_| StudioError::Invalid("a collective registration panicked".into()))?,
            };
            r.map_err(|e| collective_err("registering the replicas", e))?;
        }
        Ok(Cluster { peers, devices, node, _slot: slot })
    }

    /// Replicas in this process.
    pub fn local(&self) -> usize {
        self.peers.len()
    }

    /// Replicas in the whole run (`local * nodes`).
    pub fn world(&self) -> usize {
        self.local() * self.node.as_ref().map_or(1, |n| n.nodes)
    }

    /// This process's rank (0 without nodes).
    pub fn rank(&self) -> usize {
        self.node.as_ref().map_or(0, |n| n.rank)
    }

    /// The node spec, when joined across processes.
    pub fn node(&self) -> Option<&NodeSpec> {
        self.node.as_ref()
    }

    /// Sum of `values` over all replicas of the run, called by local
    /// replica `i` (every replica must call it, in the same order, with a
    /// vector of the same length). Exact for integers below 2^24.
    ///
    /// # Errors
    /// Burn's collective errors (a peer that left, a length mismatch).
    pub fn all_reduce_sum(&self, i: usize, values: &[f32]) -> Result<Vec<f32>> {
        let t = Tensor::<B, 1>::from_data(TensorData::new(values.to_vec(), [values.len()]), &self.devices[i]);
        let r = bc::all_reduce::<B>(self.peers[i], t.into_primitive().tensor(), ReduceOperation::Sum)
            .map_err(|e| collective_err("an all-reduce", e))?;
        Ok(Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(r))
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32"))
    }

    /// [`Cluster::all_reduce_sum`] of the same `values` from every local
    /// replica at once (for the process-level checks: checksums, the stop
    /// flag).
    ///
    /// # Errors
    /// Those of [`Cluster::all_reduce_sum`].
    pub fn all_reduce_process(&self, values: &[f32]) -> Result<Vec<f32>> {
        if self.local() == 1 {
            return self.all_reduce_sum(0, values);
        }
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..self.local()).map(|i| s.spawn(move || self.all_reduce_sum(i, values))).collect();
            let mut out = None;
            for h in hs {
                let r = h.join().map_err(|_| StudioError::Invalid("a collective worker panicked".into()))??;
                out.get_or_insert(r);
            }
            Ok(out.expect("at least one replica"))
        })
    }

    /// Sums `grads` over all replicas, called by local replica `i` (Burn's
    /// `GradientsParams::all_reduce`, in `ParamId` order: every replica
    /// must hold the same parameter ids).
    ///
    /// # Errors
    /// Burn's collective errors.
    pub fn all_reduce_grads(&self, i: usize, grads: GradientsParams) -> Result<GradientsParams> {
        grads
            .all_reduce::<B>(self.peers[i], ReduceOperation::Sum)
            .map_err(|e| collective_err("the gradient all-reduce", e))
    }
}

impl<B: Backend> Drop for Cluster<B> {
    fn drop(&mut self) {
        for p in &self.peers {
            let _ = bc::finish_collective::<B>(*p);
        }
    }
}

/// Waits until the coordinator accepts a TCP connection, up to
/// `n.timeout`.
fn wait_for(coord: SocketAddr, n: &NodeSpec) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let left = n.timeout.saturating_sub(t0.elapsed());
        if TcpStream::connect_timeout(&coord, left.clamp(Duration::from_millis(10), Duration::from_secs(1))).is_ok() {
            return Ok(());
        }
        if t0.elapsed() >= n.timeout {
            return Err(StudioError::Invalid(format!(
                "rank {}: the coordinator {} did not answer within {} s (start it first: `moe-studio coordinator \
                 --port {}` on that host; or raise --join-timeout)",
                n.rank,
                n.coordinator,
                n.timeout.as_secs(),
                coord.port()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// 64-bit checksums of what every rank must share: the options, the
/// weights (f32 bits, module order) and the data (sources, position,
/// step). Compared across ranks by [`Fingerprint::verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Options (`TrainConfig` as JSON).
    pub config: u64,
    /// Weights.
    pub weights: u64,
    /// Data sources, mixture position and step.
    pub data: u64,
}

/// FNV-1a over 32-bit words.
pub(crate) fn fnv(mut h: u64, words: impl IntoIterator<Item = u32>) -> u64 {
    for w in words {
        h ^= u64::from(w);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// FNV-1a's offset basis.
pub(crate) const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

impl Fingerprint {
    /// Checks that all ranks have the same fingerprint with one all-reduce:
    /// per byte `x` of each checksum, the sums of `x` and `x^2` over the
    /// `W` replicas satisfy `W * sum x^2 = (sum x)^2` iff all `x` are equal
    /// (Cauchy-Schwarz); exact in f32 for `W <= 256`.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] naming what differs.
    pub fn verify<B: Backend>(&self, cluster: &Cluster<B>) -> Result<()> {
        let parts = [("options", self.config), ("weights", self.weights), ("data or position", self.data)];
        let mut v = Vec::with_capacity(48);
        for (_, h) in parts {
            for b in h.to_le_bytes() {
                let x = f32::from(b);
                v.push(x);
                v.push(x * x);
            }
        }
        let s = cluster.all_reduce_process(&v)?;
        let w = cluster.world() as f64;
        let differ: Vec<&str> = parts
            .iter()
            .enumerate()
            .filter(|(k, _)| {
                (0..8).any(|j| {
                    let (s1, s2) = (f64::from(s[k * 16 + 2 * j]), f64::from(s[k * 16 + 2 * j + 1]));
                    (w * s2 - s1 * s1).abs() > 0.5
                })
            })
            .map(|(_, (name, _))| *name)
            .collect();
        if differ.is_empty() {
            return Ok(());
        }
        Err(StudioError::Invalid(format!(
            "rank {}: the {} ranks disagree on the {} (checksums differ): every rank must run the same command on \
             the same model, --data files and checkpoint",
            cluster.rank(),
            cluster.node().map_or(1, |n| n.nodes),
            differ.join(" and ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rank: usize, nodes: usize, c: &str) -> NodeSpec {
        NodeSpec { nodes, rank, coordinator: c.into(), node_address: None, timeout: Duration::from_secs(1) }
    }

    #[test]
    fn ranks_and_addresses_are_checked() {
        // A well-formed spec: accepted only where Burn's global path works.
        let r = spec(1, 2, "127.0.0.1:29500").validate();
        if GLOBAL_COLLECTIVE_USABLE {
            r.unwrap();
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("--nodes") && e.contains("sync.rs:71-79") && e.contains("--devices N"), "{e}");
            // Cluster::join refuses too, before any network or Burn call.
            let t0 = Instant::now();
            let e = Cluster::<crate::CpuBackend>::join(vec![Default::default()], Some(spec(0, 1, "127.0.0.1:1")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("multi-process training is disabled"), "{e}");
            assert!(t0.elapsed() < Duration::from_secs(1));
        }
        let e = spec(2, 2, "127.0.0.1:29500").validate().unwrap_err().to_string();
        assert!(e.contains("--node-rank") && e.contains("out of range") && e.contains("0..=1"), "{e}");
        let e = spec(0, 2, "localhost").validate().unwrap_err().to_string();
        assert!(e.contains("--coordinator") && e.contains("HOST:PORT"), "{e}");
        let e = spec(0, 0, "a:1").validate().unwrap_err().to_string();
        assert!(e.contains("--nodes"), "{e}");
        assert_eq!(host_port("[::1]:80", "x").unwrap(), ("::1".to_string(), 80));
    }

    #[test]
    fn a_silent_coordinator_times_out_with_a_clear_error() {
        // A port nobody listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let s = NodeSpec { timeout: Duration::from_millis(600), ..spec(1, 2, &format!("127.0.0.1:{port}")) };
        let t0 = Instant::now();
        let e = wait_for(s.coordinator_addr().unwrap(), &s).unwrap_err().to_string();
        assert!(t0.elapsed() >= Duration::from_millis(600) && t0.elapsed() < Duration::from_secs(5));
        assert!(e.contains("did not answer within") && e.contains("moe-studio coordinator"), "{e}");
    }
}
