//! Data parallelism: `train --devices N` (N replicas as threads of one
//! process, summed by Burn's collective *local* all-reduce,
//! `burn-collective` 0.21) and `train --nodes N --node-rank R --coordinator
//! HOST:PORT` (one process per node; the processes sum through
//! `moe-studio coordinator`, [`serve_coordinator`], over Burn's websocket
//! transport, `burn-communication` 0.21).
//!
//! Every collective call here is an all-reduce (sum). Per optimizer step
//! each replica (docs/methods.md §1-2, the trainer in [`super::trainer`]):
//! 1. per micro-step, all-reduces its per-expert routing counts and its
//!    number of original-language rows before the losses, so that the
//!    load-balancing fractions `f_i` and the language prior's denominator
//!    are those of the whole global batch
//!    ([`super::losses::load_balancing_loss_dp`],
//!    [`super::losses::language_prior_loss_dp`]);
//! 2. accumulates its gradients over the micro-steps, then sums them over
//!    the replicas (the losses are scaled by `1 / (grad_accum * world)`,
//!    so the sum is the mean): between threads with Burn's
//!    `GradientsParams::all_reduce` (in `ParamId` order), across processes
//!    as ONE flat vector (gradients in module order, then which replicas
//!    had each one, then the loss terms for the metrics:
//!    [`Cluster::all_reduce_sum`]); a parameter that got no gradient on
//!    some replica (an expert no token of its share chose) is sent as
//!    zeros, and dropped after the reduction when no replica had one,
//!    exactly as one replica with the whole batch would leave it;
//! 3. (threads only) all-reduces its loss terms for the metrics.
//!
//! Every replica then clips and steps the same gradients with the same
//! AdamW state, so the replicas stay bit-identical without broadcasting
//! weights; at start (and after `--resume`) the ranks compare checksums of
//! the options, the weights and the data position with one all-reduce
//! ([`Fingerprint`]).
//!
//! Across processes, every rank's process first sums its threads with
//! Burn's local all-reduce, then its local replica 0 sends the sum to the
//! coordinator, which adds the ranks' vectors in rank order (so every rank
//! gets the same bits) and sends the total back; the other local replicas
//! take it from replica 0 ([`Cluster`]). One coordinator serves one run at
//! a time; a rank that leaves or breaks its connection ends the run on
//! every other rank with an error naming it, never a hang.
//!
//! ## Why not burn-collective's global all-reduce
//! burn-collective 0.21.0 has a cross-process all-reduce (`register` with
//! `with_num_nodes`, Burn's orchestrator `start_global_orchestrator`), but
//! it cannot carry a training loop (read in its sources, and run on
//! loopback: backend/tests/collective_epochs.rs):
//! - **it hangs at its second call.** Every global all-reduce (tree,
//!   centralized, ring: `src/global/node/tree.rs:92`, `centralized.rs:85`,
//!   `ring.rs:110`) ends in the barrier `SyncService::sync`
//!   (`src/global/node/sync.rs`), which returns when its sorted list of
//!   synced peers equals the node ids (:71-77); the reset at :79 clears a
//!   *copy* of the list (`lock().unwrap().to_vec()`, :71), never the list,
//!   so from the second call on the list holds duplicates and `sync` waits
//!   on its `Notify` (:84) forever. Burn keeps one `SyncService` per
//!   global node (`src/global/node/base.rs:55`), which lives until every
//!   local peer has called `finish_collective` (`src/local/server.rs:487`).
//! - **re-registering for each all-reduce (register, one all-reduce,
//!   finish: a fresh `SyncService` every time) still hangs, intermittently.**
//!   It needs two orchestrators used alternately (the orchestrator numbers
//!   a node by how many are registered, `src/global/orchestrator/state.rs:188`,
//!   so a rank that re-registers before another has finished takes that
//!   one's id) and two data ports per rank (the old server releases its
//!   port asynchronously). So arranged it passes hundreds of all-reduces,
//!   then one rank waits forever (loopback, 2 processes: 572 of 2000):
//!   `sync` checks the list (:71-77) and only then creates its
//!   `notified()` future (:84), and `notify_waiters` (:98) stores no
//!   permit, so a peer's message that lands between the two is lost; the
//!   tensor data service waits the same way
//!   (burn-communication 0.21.0 `src/data_service.rs:206-223` vs :120).
//!   It also costs ~50 ms per all-reduce (the orchestrator answers
//!   `Finish` ~40 ms late) and leaks one websocket and one task per
//!   registration in the orchestrator (its sessions are never removed,
//!   `state.rs:65-70`).
//! - `reduce` and `broadcast` across nodes are `unimplemented!`
//!   (`src/global/node/base.rs:183`, :191).
//!
//! Packing a whole step into the first all-reduce after a registration
//! does not avoid the re-registration: the routing counts must be summed
//! before each micro-step's losses. So the processes use Burn's transport
//! (`burn_communication::websocket`, the one its global all-reduce uses)
//! with a centralized sum at the coordinator, a request and its answer per
//! all-reduce on one connection, no barrier to lose.
//!
//! Burn keeps ONE local collective server per process and backend type, so
//! one [`Cluster`] exists at a time per process (a second waits).

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use burn::collective::{self as bc, AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_communication::websocket::{WsClient, WsClientChannel, WsServer, WsServerChannel};
use burn_communication::{CommunicationChannel, Message, ProtocolClient, ProtocolServer};

use crate::error::{Result, StudioError};

/// How long a rank waits for the coordinator's answer to one all-reduce
/// (the other ranks may be writing a checkpoint meanwhile); PyTorch's
/// `torch.distributed` default timeout.
pub const ALL_REDUCE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The coordinator's websocket route (`ws://HOST:PORT/all-reduce`).
const ROUTE: &str = "all-reduce";

/// Floats per websocket message: axum, under Burn's websocket server,
/// refuses frames over 16 MiB, so a long vector travels in pieces of
/// 8 MiB.
const CHUNK: usize = 2 << 20;

/// This process's place in a multi-process run (`--nodes`, `--node-rank`,
/// `--coordinator`, `--join-timeout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Processes in the run, >= 1.
    pub nodes: usize,
    /// This process's rank in `0..nodes`; rank 0 writes checkpoints and
    /// metrics.
    pub rank: usize,
    /// `HOST:PORT` of the coordinator (`moe-studio coordinator --port PORT`).
    pub coordinator: String,
    /// How long to wait for the coordinator to answer and for all ranks to
    /// join.
    pub timeout: Duration,
}

impl NodeSpec {
    /// Checks the rank against `nodes` and the coordinator's form.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `--nodes`, `--node-rank` or
    /// `--coordinator`.
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
        if u32::try_from(self.nodes).is_err() {
            return Err(StudioError::config("--nodes", format!("{} is too many", self.nodes)));
        }
        host_port(&self.coordinator, "--coordinator")?;
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The messages between a rank and the coordinator (one websocket binary
/// message each, little-endian):
/// - rank -> coordinator: `HELLO magic nodes:u32 rank:u32` once, then per
///   all-reduce `VALUES seq:u64 total:u32 offset:u32 f32...` pieces of at
///   most [`CHUNK`] floats in order, and `BYE` when it leaves;
/// - coordinator -> rank: `READY nodes:u32` once all ranks have joined,
///   then per all-reduce `SUM` pieces laid out as `VALUES`, or
///   `ERROR utf8` (the run is over).
mod wire {
    pub const HELLO: u8 = 1;
    pub const VALUES: u8 = 2;
    pub const BYE: u8 = 3;
    pub const READY: u8 = 4;
    pub const SUM: u8 = 5;
    pub const ERROR: u8 = 6;
    /// Protocol name and version in `HELLO`.
    const MAGIC: &[u8; 8] = b"moe-ar/1";

    pub fn hello(nodes: u32, rank: u32) -> Vec<u8> {
        let mut b = vec![HELLO];
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&nodes.to_le_bytes());
        b.extend_from_slice(&rank.to_le_bytes());
        b
    }

    /// `(nodes, rank)` of a `HELLO`.
    pub fn read_hello(b: &[u8]) -> Result<(usize, usize), String> {
        if b.len() != 17 || b[0] != HELLO || &b[1..9] != MAGIC {
            return Err(
                "expected a moe-studio rank's HELLO (moe-ar/1): is this rank another program or version?".into()
            );
        }
        let nodes = u32::from_le_bytes(b[9..13].try_into().expect("4 bytes")) as usize;
        let rank = u32::from_le_bytes(b[13..17].try_into().expect("4 bytes")) as usize;
        if nodes == 0 || rank >= nodes {
            return Err(format!("rank {rank} of {nodes} is out of range"));
        }
        Ok((nodes, rank))
    }

    pub fn ready(nodes: u32) -> Vec<u8> {
        let mut b = vec![READY];
        b.extend_from_slice(&nodes.to_le_bytes());
        b
    }

    pub fn error(msg: &str) -> Vec<u8> {
        let mut b = vec![ERROR];
        b.extend_from_slice(msg.as_bytes());
        b
    }

    /// The pieces of `v` for all-reduce `seq`, tagged `tag` (`VALUES` or
    /// `SUM`); an empty `v` is one empty piece.
    pub fn pieces(tag: u8, seq: u64, v: &[f32]) -> Vec<Vec<u8>> {
        let total = u32::try_from(v.len()).expect("fewer than 2^32 values");
        let mut out = Vec::with_capacity(v.len().div_ceil(super::CHUNK).max(1));
        let mut offset = 0usize;
        loop {
            let end = (offset + super::CHUNK).min(v.len());
            let mut b = Vec::with_capacity(17 + 4 * (end - offset));
            b.push(tag);
            b.extend_from_slice(&seq.to_le_bytes());
            b.extend_from_slice(&total.to_le_bytes());
            b.extend_from_slice(&(offset as u32).to_le_bytes());
            for x in &v[offset..end] {
                b.extend_from_slice(&x.to_le_bytes());
            }
            out.push(b);
            offset = end;
            if offset >= v.len() {
                return out;
            }
        }
    }

    /// Assembles the pieces of one vector.
    #[derive(Default)]
    pub struct Assembly {
        seq: u64,
        total: usize,
        values: Vec<f32>,
    }

    impl Assembly {
        /// Adds piece `b` (tag `tag`, for all-reduce `seq`); `Some` with
        /// the whole vector at its last piece.
        pub fn add(&mut self, tag: u8, seq: u64, b: &[u8]) -> Result<Option<Vec<f32>>, String> {
            if b.len() < 17 || b[0] != tag || !(b.len() - 17).is_multiple_of(4) {
                return Err(format!(
                    "a malformed message (tag {}, {} bytes)",
                    b.first().copied().unwrap_or(0),
                    b.len()
                ));
            }
            let s = u64::from_le_bytes(b[1..9].try_into().expect("8 bytes"));
            let total = u32::from_le_bytes(b[9..13].try_into().expect("4 bytes")) as usize;
            let offset = u32::from_le_bytes(b[13..17].try_into().expect("4 bytes")) as usize;
            if s != seq {
                return Err(format!("all-reduce #{s} arrived while #{seq} was due (the ranks run different code?)"));
            }
            if offset == 0 {
                *self = Assembly { seq, total, values: Vec::with_capacity(total.min(super::CHUNK)) };
            }
            let n = (b.len() - 17) / 4;
            if self.seq != seq || self.total != total || offset != self.values.len() || offset + n > total {
                return Err(format!("piece {offset}..{} of {total} values out of order", offset + n));
            }
            self.values.extend(b[17..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))));
            Ok((self.values.len() == total).then(|| std::mem::take(&mut self.values)))
        }
    }
}

/// What the coordinator tells one rank's connection.
#[derive(Clone)]
enum Reply {
    Ready(u32),
    Sum(u64, Arc<Vec<f32>>),
    Error(String),
}

/// The run a coordinator serves (at most one at a time).
struct HubRun {
    /// Which run (a rank's connection outlives a run that ended).
    id: u64,
    nodes: usize,
    /// The joined ranks' reply queues (`None`: not joined, or left).
    seats: Vec<Option<tokio::sync::mpsc::UnboundedSender<Reply>>>,
    joined: usize,
    left: usize,
    /// All ranks have joined (no one else may join).
    started: bool,
    /// The all-reduce being collected and each rank's vector for it.
    seq: u64,
    pending: Vec<Option<Vec<f32>>>,
    /// The run failed: every rank has been told why, and the next run may
    /// start.
    ended: bool,
}

impl HubRun {
    fn broadcast(&self, r: &Reply) {
        for s in self.seats.iter().flatten() {
            let _ = s.send(r.clone());
        }
    }

    fn end(&mut self, why: String) {
        if !self.ended {
            self.broadcast(&Reply::Error(why));
            self.ended = true;
        }
    }
}

#[derive(Default)]
struct Hub {
    run: Option<HubRun>,
    runs: u64,
}

impl Hub {
    /// Seats rank `rank` of a run of `nodes`; the run's id.
    fn join(
        &mut self,
        nodes: usize,
        rank: usize,
        tx: tokio::sync::mpsc::UnboundedSender<Reply>,
    ) -> Result<u64, String> {
        if self.run.as_ref().is_none_or(|r| r.ended) {
            self.runs += 1;
            self.run = Some(HubRun {
                id: self.runs,
                nodes,
                seats: vec![None; nodes],
                joined: 0,
                left: 0,
                started: false,
                seq: 0,
                pending: vec![None; nodes],
                ended: false,
            });
        }
        let run = self.run.as_mut().expect("a run");
        if run.nodes != nodes {
            return Err(format!(
                "this coordinator serves a run of {} ranks, this rank was started with --nodes {nodes}",
                run.nodes
            ));
        }
        if run.started {
            return Err(format!("a run of {} ranks is in progress on this coordinator", run.nodes));
        }
        if run.seats[rank].is_some() {
            return Err(format!("rank {rank} has joined already: every process needs its own --node-rank"));
        }
        run.seats[rank] = Some(tx);
        run.joined += 1;
        if run.joined == nodes {
            run.started = true;
            run.broadcast(&Reply::Ready(nodes as u32));
        }
        Ok(run.id)
    }

    /// The current run, if it is run `id` and has not failed.
    fn live(&mut self, id: u64) -> Option<&mut HubRun> {
        self.run.as_mut().filter(|r| r.id == id && !r.ended)
    }

    /// Rank `rank`'s vector for all-reduce `seq` of run `id`; with the last
    /// rank's, the sum (in rank order) goes to every rank. (A run that
    /// ended has told this rank already.)
    fn deposit(&mut self, id: u64, rank: usize, seq: u64, v: Vec<f32>) {
        let Some(run) = self.live(id) else { return };
        if seq != run.seq {
            run.end(format!("rank {rank} sent all-reduce #{seq} while the run is at #{}", run.seq));
            return;
        }
        if let Some(n) = run.pending.iter().flatten().map(Vec::len).next() {
            if n != v.len() {
                run.end(format!(
                    "rank {rank} sent {} values for all-reduce #{seq}, another rank {n} (different models or options?)",
                    v.len()
                ));
                return;
            }
        }
        run.pending[rank] = Some(v);
        if run.pending.iter().all(Option::is_some) {
            let mut all = run.pending.iter_mut().map(|p| p.take().expect("all present"));
            let mut sum = all.next().expect("at least one rank");
            for v in all {
                sum.iter_mut().zip(&v).for_each(|(a, b)| *a += b);
            }
            run.seq += 1;
            run.broadcast(&Reply::Sum(seq, Arc::new(sum)));
        }
    }

    /// Ends run `id` (if live) with `why`.
    fn fail(&mut self, id: u64, why: String) {
        if let Some(run) = self.live(id) {
            run.end(why);
        }
    }

    /// Rank `rank`'s connection to run `id` ended (`said_bye`: it said so
    /// first). Every other rank gets an error naming it (a run that is
    /// complete has no calls left to fail); the run is forgotten once
    /// every joined rank has left.
    fn leave(&mut self, id: u64, rank: usize, said_bye: bool) {
        let Some(run) = self.run.as_mut().filter(|r| r.id == id) else { return };
        if run.seats[rank].take().is_none() {
            return;
        }
        run.left += 1;
        if run.left < run.joined || !run.started {
            run.end(if said_bye {
                format!("rank {rank} left the run (it finished, or stopped on an error of its own)")
            } else {
                format!("rank {rank}'s connection to the coordinator broke (did its process end?)")
            });
        }
        if run.left == run.joined {
            self.run = None;
        }
    }
}

/// Leaves the hub when a rank's connection handler ends (also on panic).
struct Seat {
    hub: Arc<Mutex<Hub>>,
    run: u64,
    rank: usize,
    said_bye: bool,
}

impl Drop for Seat {
    fn drop(&mut self) {
        lock(&self.hub).leave(self.run, self.rank, self.said_bye);
    }
}

async fn send(ch: &mut WsServerChannel, b: Vec<u8>) -> bool {
    ch.send(Message::new(b.into())).await.is_ok()
}

/// One rank's connection to the coordinator.
async fn serve_rank(hub: Arc<Mutex<Hub>>, mut ch: WsServerChannel) {
    let hello = match ch.recv().await {
        Ok(Some(m)) => wire::read_hello(&m.data),
        _ => return,
    };
    let (nodes, rank) = match hello {
        Ok(x) => x,
        Err(e) => {
            let _ = send(&mut ch, wire::error(&e)).await;
            return;
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let joined = lock(&hub).join(nodes, rank, tx);
    let id = match joined {
        Ok(id) => id,
        Err(e) => {
            let _ = send(&mut ch, wire::error(&e)).await;
            let _ = ch.close().await;
            return;
        }
    };
    let mut seat = Seat { hub: hub.clone(), run: id, rank, said_bye: false };
    let mut piece = wire::Assembly::default();
    let mut seq = 0u64;
    loop {
        // Wait for the hub's answer (READY first, then a SUM per VALUES);
        // the rank says nothing meanwhile unless it leaves.
        let reply = tokio::select! {
            r = rx.recv() => r,
            m = ch.recv() => {
                seat.said_bye = matches!(&m, Ok(Some(m)) if m.data.first() == Some(&wire::BYE));
                return;
            }
        };
        let ok = match reply {
            Some(Reply::Ready(n)) => send(&mut ch, wire::ready(n)).await,
            Some(Reply::Sum(s, v)) => {
                let mut ok = true;
                for b in wire::pieces(wire::SUM, s, &v) {
                    ok = ok && send(&mut ch, b).await;
                }
                ok
            }
            Some(Reply::Error(e)) => {
                let _ = send(&mut ch, wire::error(&e)).await;
                return;
            }
            None => return,
        };
        if !ok {
            return;
        }
        // The rank's next vector, piece by piece (or BYE).
        let v = loop {
            let m = match ch.recv().await {
                Ok(Some(m)) => m,
                _ => return,
            };
            match m.data.first() {
                Some(&wire::BYE) => {
                    seat.said_bye = true;
                    return;
                }
                _ => match piece.add(wire::VALUES, seq, &m.data) {
                    Ok(Some(v)) => break v,
                    Ok(None) => {}
                    Err(e) => {
                        let e = format!("rank {rank}: {e}");
                        lock(&hub).fail(id, e.clone());
                        let _ = send(&mut ch, wire::error(&e)).await;
                        return;
                    }
                },
            }
        };
        lock(&hub).deposit(id, rank, seq, v);
        seq += 1;
    }
}

/// Serves `moe-studio coordinator` on `port` (all interfaces) until
/// `shutdown` completes: the ranks of a `train --nodes N` run connect to
/// `ws://HOST:PORT/all-reduce` (Burn's websocket server,
/// `burn_communication::websocket::WsServer`), and once all `N` have
/// joined, each all-reduce is the sum of their vectors in rank order,
/// sent back to every rank. One run at a time; the next may start when
/// every rank of the last has left. A rank that leaves mid-run ends the
/// run on the others with an error naming it.
///
/// # Errors
/// [`StudioError::Invalid`] when the port cannot be bound.
pub async fn serve_coordinator(port: u16, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
    let hub = Arc::new(Mutex::new(Hub::default()));
    WsServer::new(port)
        .route(ROUTE, move |ch: WsServerChannel| {
            let hub = hub.clone();
            async move { serve_rank(hub, ch).await }
        })
        .serve(shutdown)
        .await
        .map_err(|e| StudioError::Invalid(format!("coordinator on port {port}: {e:?}")))
}

/// A rank's connection to the coordinator.
struct NodeLink {
    rt: tokio::runtime::Runtime,
    /// The channel (`None` once broken) and the next all-reduce's number.
    state: Mutex<(Option<WsClientChannel>, u64)>,
    rank: usize,
    nodes: usize,
}

impl NodeLink {
    /// Connects to the coordinator (retrying until `spec.timeout`) and
    /// waits, within the same time, until all ranks have joined.
    fn connect(spec: &NodeSpec) -> Result<Self> {
        let coord = spec.coordinator_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StudioError::Invalid(format!("data parallelism: no tokio runtime ({e})")))?;
        let url: burn_communication::Address = format!("ws://{coord}").parse().expect("Address parses any string");
        let t0 = Instant::now();
        let (rank, nodes, timeout) = (spec.rank, spec.nodes, spec.timeout);
        let silent = || {
            StudioError::Invalid(format!(
                "rank {rank}: the coordinator {} did not answer within {} s (start it first: `moe-studio coordinator \
                 --port {}` on that host; or raise --join-timeout)",
                spec.coordinator,
                timeout.as_secs(),
                coord.port()
            ))
        };
        let mut ch = rt.block_on(async {
            loop {
                let left = timeout.saturating_sub(t0.elapsed());
                let attempt =
                    tokio::time::timeout(left.max(Duration::from_millis(10)), WsClient::connect(url.clone(), ROUTE));
                if let Ok(Some(ch)) = attempt.await {
                    return Ok(ch);
                }
                if t0.elapsed() >= timeout {
                    return Err(silent());
                }
                tokio::time::sleep(Duration::from_millis(200).min(timeout.saturating_sub(t0.elapsed()))).await;
            }
        })?;
        let ready = rt.block_on(async {
            ch.send(Message::new(wire::hello(nodes as u32, rank as u32).into()))
                .await
                .map_err(|e| format!("the coordinator closed the connection ({e:?})"))?;
            match tokio::time::timeout(timeout.saturating_sub(t0.elapsed()), ch.recv()).await {
                Err(_) => Err(format!(
                    "not all {nodes} ranks joined the coordinator {} within {} s (start every rank with the same \
                     --nodes and --coordinator, or raise --join-timeout)",
                    spec.coordinator,
                    timeout.as_secs()
                )),
                Ok(Ok(Some(m))) if m.data.first() == Some(&wire::READY) => Ok(()),
                Ok(Ok(Some(m))) if m.data.first() == Some(&wire::ERROR) => {
                    Err(format!("the coordinator refused it: {}", String::from_utf8_lossy(&m.data[1..])))
                }
                Ok(_) => Err("the coordinator gave no READY (is it `moe-studio coordinator`?)".to_string()),
            }
        });
        if let Err(e) = ready {
            let _ = rt.block_on(ch.close());
            return Err(StudioError::Invalid(format!("rank {rank}: {e}")));
        }
        Ok(NodeLink { rt, state: Mutex::new((Some(ch), 0)), rank, nodes })
    }

    /// The sum of `values` over all ranks (every rank calls it in the same
    /// order with a vector of the same length).
    fn all_reduce(&self, values: &[f32]) -> Result<Vec<f32>> {
        let mut st = lock(&self.state);
        let seq = st.1;
        let Some(ch) = st.0.as_mut() else {
            return Err(StudioError::Invalid(format!(
                "rank {}: the connection to the coordinator broke at an earlier all-reduce",
                self.rank
            )));
        };
        let r = self.rt.block_on(async {
            tokio::time::timeout(ALL_REDUCE_TIMEOUT, exchange(ch, seq, values)).await.unwrap_or_else(|_| {
                Err(format!("no answer from the coordinator within {} s", ALL_REDUCE_TIMEOUT.as_secs()))
            })
        });
        match r {
            Ok(v) if v.len() == values.len() => {
                st.1 += 1;
                Ok(v)
            }
            Ok(v) => Err(StudioError::Invalid(format!(
                "rank {}: all-reduce #{seq} returned {} values for {}",
                self.rank,
                v.len(),
                values.len()
            ))),
            Err(e) => {
                st.0 = None;
                Err(StudioError::Invalid(format!(
                    "rank {}: all-reduce #{seq} across the {} ranks failed: {e}",
                    self.rank, self.nodes
                )))
            }
        }
    }
}

/// Sends `values` as all-reduce `seq` and reads the coordinator's sum.
async fn exchange(ch: &mut WsClientChannel, seq: u64, values: &[f32]) -> std::result::Result<Vec<f32>, String> {
    for b in wire::pieces(wire::VALUES, seq, values) {
        ch.send(Message::new(b.into())).await.map_err(|e| format!("sending failed ({e:?})"))?;
    }
    let mut sum = wire::Assembly::default();
    loop {
        let m = match ch.recv().await {
            Ok(Some(m)) => m,
            Ok(None) => return Err("the coordinator closed the connection".into()),
            Err(e) => return Err(format!("the connection to the coordinator broke ({e:?})")),
        };
        if m.data.first() == Some(&wire::ERROR) {
            return Err(String::from_utf8_lossy(&m.data[1..]).into_owned());
        }
        if let Some(v) = sum.add(wire::SUM, seq, &m.data)? {
            return Ok(v);
        }
    }
}

impl Drop for NodeLink {
    fn drop(&mut self) {
        let ch = lock(&self.state).0.take();
        if let Some(mut ch) = ch {
            // The timer is made inside the runtime (tokio needs its
            // reactor when a `timeout` is created).
            self.rt.block_on(async move {
                let bye = async {
                    let _ = ch.send(Message::new(vec![wire::BYE].into())).await;
                    let _ = ch.close().await;
                };
                let _ = tokio::time::timeout(Duration::from_secs(5), bye).await;
            });
        }
    }
}

/// A relayed all-reduce: the sum, or the error as text.
type RelayResult = std::result::Result<Arc<Vec<f32>>, String>;

/// Hands local replica 0's cross-process sum to the other local replicas.
struct Relay {
    /// Calls made by each local replica.
    calls: Vec<AtomicU64>,
    /// The latest call's number and result.
    slot: Mutex<(u64, RelayResult)>,
    ready: Condvar,
}

impl Relay {
    fn new(local: usize) -> Self {
        Relay {
            calls: (0..local).map(|_| AtomicU64::new(0)).collect(),
            slot: Mutex::new((0, Ok(Arc::new(Vec::new())))),
            ready: Condvar::new(),
        }
    }

    /// Replica `i`'s result of this call: replica 0 runs `f`, the others
    /// wait for it. Every replica calls in the same order, and replica 0
    /// cannot reach call `k + 1` before all have entered it (they meet in
    /// Burn's local all-reduce first), so one slot suffices.
    fn pass(&self, i: usize, f: impl FnOnce() -> Result<Vec<f32>>) -> Result<Vec<f32>> {
        let k = self.calls[i].fetch_add(1, Ordering::SeqCst) + 1;
        if i == 0 {
            let r = f();
            *lock(&self.slot) = (k, r.as_ref().map(|v| Arc::new(v.clone())).map_err(|e| e.to_string()));
            self.ready.notify_all();
            return r;
        }
        let mut g = lock(&self.slot);
        while g.0 < k {
            g = self.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.1.as_ref().map(|v| v.to_vec()).map_err(|e| StudioError::Invalid(e.clone()))
    }
}

/// One cluster at a time per process (Burn's local server is a process
/// global keyed by backend type).
static SLOT: Mutex<bool> = Mutex::new(false);
static SLOT_FREE: Condvar = Condvar::new();

struct SlotGuard;

impl SlotGuard {
    fn acquire() -> SlotGuard {
        let mut busy = lock(&SLOT);
        while *busy {
            busy = SLOT_FREE.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy = true;
        SlotGuard
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        *lock(&SLOT) = false;
        SLOT_FREE.notify_one();
    }
}

fn collective_err(what: &str, e: bc::CollectiveError) -> StudioError {
    StudioError::Invalid(format!("data parallelism: {what} failed in Burn's collective ({e:?})"))
}

/// The data-parallel replicas of this process: `local` replicas (threads,
/// Burn's local collective peers `0..local`), joined to the other
/// processes through the coordinator when a [`NodeSpec`] was given. `B` is
/// the INNER (non-autodiff) backend, whose tensors the gradients are.
pub struct Cluster<B: Backend> {
    /// Burn's local peers (empty for one replica in a multi-process run).
    peers: Vec<PeerId>,
    devices: Vec<B::Device>,
    node: Option<NodeSpec>,
    link: Option<NodeLink>,
    relay: Relay,
    _slot: SlotGuard,
}

impl<B: Backend> std::fmt::Debug for Cluster<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("peers", &self.peers).field("node", &self.node).finish()
    }
}

impl<B: Backend> Cluster<B> {
    /// With `node`, joins the coordinator (waiting up to `node.timeout` for
    /// it to answer and for all ranks to join); then registers one Burn
    /// local peer per device (concurrently: Burn answers when all have
    /// registered; none for a single replica of a multi-process run).
    ///
    /// # Errors
    /// [`StudioError::Config`] for an invalid `node`; [`StudioError::Invalid`]
    /// when the coordinator does not answer or not all ranks join within
    /// `node.timeout`, when the coordinator refuses the rank (a rank number
    /// taken twice, another run in progress, another `--nodes`), or when
    /// Burn refuses the registration.
    pub fn join(devices: Vec<B::Device>, node: Option<NodeSpec>) -> Result<Self> {
        if let Some(n) = &node {
            n.validate()?;
        }
        let local = devices.len().max(1);
        let slot = SlotGuard::acquire();
        let link = node.as_ref().map(NodeLink::connect).transpose()?;
        let mut peers = Vec::new();
        if node.is_none() || local > 1 {
            let config = CollectiveConfig::default()
                .with_num_devices(local)
                .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
            peers = (0..local).map(|i| PeerId::from(i as u32)).collect();
            let results: Vec<std::thread::Result<std::result::Result<(), bc::CollectiveError>>> =
                std::thread::scope(|s| {
                    let hs: Vec<_> = peers
                        .iter()
                        .zip(&devices)
                        .map(|(p, d)| {
                            let (p, d, c) = (*p, d.clone(), config.clone());
                            s.spawn(move || bc::register::<B>(p, d, c))
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join()).collect()
                });
            for r in results {
                r.map_err(|_| StudioError::Invalid("a collective registration panicked".into()))?
                    .map_err(|e| collective_err("registering the replicas", e))?;
            }
        }
        Ok(Cluster { peers, devices, node, link, relay: Relay::new(local), _slot: slot })
    }

    /// Replicas in this process.
    pub fn local(&self) -> usize {
        self.devices.len().max(1)
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
    /// vector of the same length): Burn's local all-reduce over this
    /// process's replicas, then, across processes, the coordinator's sum
    /// in rank order. Exact for integers below 2^24.
    ///
    /// # Errors
    /// Burn's collective errors; across processes, a rank that left, a
    /// broken connection, a length that differs between ranks, no answer
    /// within [`ALL_REDUCE_TIMEOUT`].
    pub fn all_reduce_sum(&self, i: usize, values: &[f32]) -> Result<Vec<f32>> {
        let here = if self.peers.is_empty() { values.to_vec() } else { self.local_sum(i, values)? };
        match &self.link {
            None => Ok(here),
            Some(link) if self.local() == 1 => link.all_reduce(&here),
            Some(link) => self.relay.pass(i, || link.all_reduce(&here)),
        }
    }

    /// Burn's local all-reduce (sum) of `values` over this process's replicas.
    fn local_sum(&self, i: usize, values: &[f32]) -> Result<Vec<f32>> {
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

    /// Sums `grads` over this process's replicas, called by local replica
    /// `i` (Burn's `GradientsParams::all_reduce`, in `ParamId` order: every
    /// replica must hold the same parameter ids). Threads only: across
    /// processes the trainer sends its gradients as one vector through
    /// [`Cluster::all_reduce_sum`].
    ///
    /// # Errors
    /// Burn's collective errors; [`StudioError::Invalid`] in a
    /// multi-process cluster.
    pub fn all_reduce_grads(&self, i: usize, grads: GradientsParams) -> Result<GradientsParams> {
        if self.link.is_some() || self.peers.is_empty() {
            return Err(StudioError::Invalid(
                "data parallelism: across processes the gradients travel as one vector (Cluster::all_reduce_sum)"
                    .into(),
            ));
        }
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
        NodeSpec { nodes, rank, coordinator: c.into(), timeout: Duration::from_secs(5) }
    }

    #[test]
    fn ranks_and_addresses_are_checked() {
        spec(1, 2, "127.0.0.1:29500").validate().unwrap();
        let e = spec(2, 2, "127.0.0.1:29500").validate().unwrap_err().to_string();
        assert!(e.contains("--node-rank") && e.contains("out of range") && e.contains("0..=1"), "{e}");
        let e = spec(0, 2, "localhost").validate().unwrap_err().to_string();
        assert!(e.contains("--coordinator") && e.contains("HOST:PORT"), "{e}");
        let e = spec(0, 0, "a:1").validate().unwrap_err().to_string();
        assert!(e.contains("--nodes"), "{e}");
        assert_eq!(host_port("[::1]:80", "x").unwrap(), ("::1".to_string(), 80));
    }

    #[test]
    fn pieces_reassemble_and_refuse_disorder() {
        let v: Vec<f32> = (0..CHUNK + 3).map(|i| i as f32 * 0.5).collect();
        let p = wire::pieces(wire::VALUES, 7, &v);
        assert_eq!(p.len(), 2);
        let mut a = wire::Assembly::default();
        assert_eq!(a.add(wire::VALUES, 7, &p[0]).unwrap(), None);
        assert_eq!(a.add(wire::VALUES, 7, &p[1]).unwrap(), Some(v.clone()));
        // An empty vector is one piece; a piece of another all-reduce or
        // out of order is an error.
        assert_eq!(a.add(wire::VALUES, 8, &wire::pieces(wire::VALUES, 8, &[])[0]).unwrap(), Some(vec![]));
        let e = a.add(wire::VALUES, 9, &p[0]).unwrap_err();
        assert!(e.contains("#7 arrived while #9"), "{e}");
        let e = wire::Assembly::default().add(wire::VALUES, 7, &p[1]).unwrap_err();
        assert!(e.contains("out of order"), "{e}");
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A coordinator on a free loopback port, served by a runtime that
    /// stops when the returned sender is dropped.
    fn coordinator() -> (String, tokio::sync::oneshot::Sender<()>) {
        let port = free_port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(serve_coordinator(port, async move {
                let _ = stopped.await;
            }))
            .unwrap();
        });
        (format!("127.0.0.1:{port}"), stop)
    }

    #[test]
    fn the_coordinator_sums_in_rank_order_and_names_a_rank_that_leaves() {
        let (c, _stop) = coordinator();
        let nodes = 3;
        // Each rank: a short vector, a long one (two pieces each way), then
        // rank 2 leaves while the others call once more.
        /// A rank's small sum, last long-sum value, and error after rank 2 left.
        type Outcome = (Vec<f32>, f32, Option<String>);
        let results: Vec<Result<Outcome>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..nodes)
                .map(|r| {
                    let c = c.clone();
                    s.spawn(move || -> Result<Outcome> {
                        let link = NodeLink::connect(&spec(r, nodes, &c))?;
                        let small = link.all_reduce(&[1.0, r as f32, 1e8, if r == 1 { 1.0 } else { 0.0 }])?;
                        let long: Vec<f32> = (0..CHUNK + 10).map(|i| (i % 7) as f32 + r as f32).collect();
                        let sum = link.all_reduce(&long)?;
                        let want = |i: usize| 3.0 * (i % 7) as f32 + 3.0;
                        let bad = sum.iter().enumerate().filter(|(i, &x)| x != want(*i)).count();
                        assert_eq!(bad, 0, "rank {r}: {bad} wrong sums");
                        if r == 2 {
                            return Ok((small, sum[CHUNK + 9], None));
                        }
                        let e = link.all_reduce(&[1.0]).unwrap_err().to_string();
                        // After the failure the link stays broken.
                        let e2 = link.all_reduce(&[1.0]).unwrap_err().to_string();
                        assert!(e2.contains("broke at an earlier all-reduce"), "{e2}");
                        Ok((small, sum[CHUNK + 9], Some(e)))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, res) in results.into_iter().enumerate() {
            let (small, last, err) = res.unwrap();
            assert_eq!(small, vec![3.0, 3.0, 3e8, 1.0], "rank {r}");
            assert_eq!(last, 3.0 * (((CHUNK + 9) % 7) as f32 + 1.0));
            if let Some(e) = err {
                assert!(e.contains(&format!("rank {r}: all-reduce #2 across the 3 ranks failed")), "{e}");
                assert!(e.contains("rank 2 left the run"), "{e}");
            }
        }
        // The coordinator forgot the run: a new one of another size joins.
        let r: Vec<Result<Vec<f32>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let c = c.clone();
                    s.spawn(move || NodeLink::connect(&spec(r, 2, &c))?.all_reduce(&[r as f32 + 1.0]))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for x in r {
            assert_eq!(x.unwrap(), vec![3.0]);
        }
    }

    #[test]
    fn the_coordinator_refuses_a_rank_twice_and_another_node_count() {
        let (c, _stop) = coordinator();
        let first = std::thread::spawn({
            let c = c.clone();
            move || NodeLink::connect(&spec(0, 2, &c)).map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(500));
        let e = NodeLink::connect(&spec(0, 2, &c)).err().expect("refused").to_string();
        assert!(e.contains("rank 0 has joined already") && e.contains("--node-rank"), "{e}");
        let e = NodeLink::connect(&spec(1, 3, &c)).err().expect("refused").to_string();
        assert!(e.contains("serves a run of 2 ranks") && e.contains("--nodes 3"), "{e}");
        // Rank 0 alone gives up after its join timeout.
        let e = first.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("not all 2 ranks joined") && e.contains("within 5 s"), "{e}");
    }

    #[test]
    fn a_silent_coordinator_times_out_with_a_clear_error() {
        // A port nobody listens on: bind, read the port, close.
        let s = NodeSpec { timeout: Duration::from_millis(600), ..spec(1, 2, &format!("127.0.0.1:{}", free_port())) };
        let t0 = Instant::now();
        let e = NodeLink::connect(&s).err().expect("no coordinator").to_string();
        assert!(t0.elapsed() >= Duration::from_millis(600) && t0.elapsed() < Duration::from_secs(5));
        assert!(e.contains("did not answer within") && e.contains("moe-studio coordinator"), "{e}");
    }

    /// Not a regular test: milliseconds per all-reduce through a loopback
    /// coordinator for 2 ranks (threads of this process, each with its own
    /// connection, as two processes would have), for a routing-count sized
    /// vector, stories260K's experts-stage gradient (496,640 floats) and a
    /// ~135M-parameter one (`MOE_AR_BIG=0` skips it). `cargo test -p
    /// moe-studio-shared --lib all_reduce_overhead -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn all_reduce_overhead() {
        let (c, _stop) = coordinator();
        let big = std::env::var("MOE_AR_BIG").map_or(true, |v| v != "0");
        let mut sizes = vec![(8usize, 50usize), (496_640, 20)];
        if big {
            sizes.push((135_000_000, 3));
        }
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let (c, sizes) = (c.clone(), sizes.clone());
                    s.spawn(move || {
                        let link = NodeLink::connect(&spec(r, 2, &c)).unwrap();
                        for (n, reps) in sizes {
                            let v = vec![r as f32 + 1.0; n];
                            let _ = link.all_reduce(&v).unwrap(); // warm-up
                            let t0 = Instant::now();
                            for _ in 0..reps {
                                let out = link.all_reduce(&v).unwrap();
                                assert_eq!((out.len(), out[n - 1]), (n, 3.0));
                            }
                            let ms = 1e3 * t0.elapsed().as_secs_f64() / reps as f64;
                            if r == 0 {
                                eprintln!(
                                    "2 ranks, {n} f32 ({:.1} MB): {ms:.2} ms per all-reduce ({:.0} MB/s per rank each way)",
                                    4.0 * n as f64 / 1e6,
                                    4.0 * n as f64 / 1e3 / ms
                                );
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
    }
}
