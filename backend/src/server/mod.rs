//! `moe-studio serve`: the studio's HTTP server — the built frontend, a JSON
//! API for checkpoints and jobs, and server-sent events for progress.
//!
//! # Running
//! ```text
//! moe-studio [--backend cpu|wgpu|cuda] serve [--addr 127.0.0.1:8080] [--data-dir DIR]
//!     [--token-file FILE] [--static-dir DIR] [--max-upload-bytes N] [--max-chunk-bytes N]
//!     [--workers N] [--auto-resume] [--allow-host NAME]... [--upload-ttl-hours 24]
//!     [--chunk-timeout-secs 60] [--job-memory-limit BYTES] [--cancel-grace-secs 30]
//!     [--header-timeout-secs 20] [--max-connections 1024]
//! ```
//! Binds loopback by default; prints `listening on http://ADDR` (port 0
//! picks a free port). Bound to a non-loopback address it prints a warning:
//! the token then travels in clear text (plain HTTP). The data directory
//! holds `studio.db` (SQLite:
//! uploads, checkpoints, jobs; migrations in `backend/migrations/`),
//! `uploads/{id}/`, `checkpoints/{id}/`, `jobs/{id}/` and, unless
//! `--token-file` is given, `token` (generated on first start, mode 0600,
//! printed once). Everything the server and its jobs create there is private
//! (umask 077: files 0600, directories 0700; the data dir, `uploads/`,
//! `checkpoints/`, `jobs/` and `studio.db` are re-chmodded at start). At
//! start, incomplete uploads created more than `--upload-ttl-hours` ago
//! (default 24; 0: all of them) are deleted. The frontend is served from
//! `--static-dir` (default `frontend/dist` when present; single-page
//! fallback to `index.html` for paths without a file extension, 404 for a
//! missing file). CORS headers are never sent.
//!
//! DNS-rebinding guard: bound to loopback, a request (any route) whose
//! `Host` is not `127.0.0.1`, `localhost` or `[::1]` (with or without the
//! port) or an `--allow-host` name is a 421 JSON error (`field: "Host"`).
//! Bound elsewhere, `Host` is checked only when `--allow-host` is given
//! (then those names, the loopback names and the bound IP).
//!
//! # API
//! Every route is under `/api`, and every one but `GET /api/info` needs
//! credentials (401 otherwise): `Authorization: Bearer TOKEN` for any
//! method, or — for `GET` / `HEAD` only — the read cookie that `POST
//! /api/session` sets. The cookie exists because the browser's
//! `EventSource` and download links cannot send headers; it is chosen over
//! a per-job read token because one mechanism then covers every read (SSE,
//! logs, artefacts, checkpoint files) and no secret ever appears in a URL
//! (history, logs, `Referer`). It is `HttpOnly` (no script reads it),
//! `SameSite=Strict` (no other site's page sends it) and `Path=/api`; its
//! value is derived from the token (a leaked cookie reads, never writes),
//! and a mutating request never accepts it: on loopback every port is the
//! same site, so another local page could otherwise send it. Both are
//! compared as sha256 digests in constant time, so neither the time nor
//! the answer depends on the token's length. The static frontend is
//! public. Bodies are JSON (limit 1 MiB) except chunks. Every 4xx/5xx answer is
//! `{"error": "...", "field": "..."}` ([`ApiError`](moe_shared::api::ApiError);
//! also the router's 405, a request target over 8 KiB (414) and an
//! unsatisfiable `Range` (416);
//! `field` names the body field, path parameter or header at fault). Ids
//! are lowercase hyphenated UUIDs; anything else in an id position is a 400,
//! so no request string ever becomes a path. Types: `moe_shared::api`.
//!
//! | route | body -> answer |
//! |---|---|
//! | `GET /api/info` | -> `ServerInfo` (public) |
//! | `POST /api/session` | -> 204, `Set-Cookie` of the read cookie (bearer token needed) |
//! | `DELETE /api/session` | -> 204, the read cookie cleared |
//! | `POST /api/uploads` | `CreateUpload` -> 201 `UploadStatus` (413 over `max_upload_bytes`, 507 over the data dir's free space less what unfinished uploads still have to send) |
//! | `GET /api/uploads` | -> `[UploadStatus]` |
//! | `GET /api/uploads/{id}` | -> `UploadStatus`: `chunks_received` is the next chunk to send |
//! | `PUT /api/uploads/{id}/chunks/{index}` | raw bytes, header `X-Chunk-Sha256: HEX` -> `UploadStatus` (408 when the body stalls `--chunk-timeout-secs`) |
//! | `POST /api/uploads/{id}/complete` | -> `UploadStatus` (`complete`; 422 on whole-file sha256 mismatch, which resets the upload) |
//! | `DELETE /api/uploads/{id}` | -> 204 |
//! | `POST /api/checkpoints` | `CreateCheckpoint` -> 201 `CheckpointInfo` (422 when the files are not a model, e.g. a llama2.c `.bin` without its `tok*.bin`; 409 naming `uploads[i]` when an upload is not complete or was already used by a checkpoint) |
//! | `GET /api/checkpoints` | -> `[CheckpointInfo]` (no `summary`) |
//! | `GET /api/checkpoints/{id}` | -> `CheckpointInfo` with `summary` (`ModelSummary`) |
//! | `GET /api/checkpoints/{id}/files/{name}` | -> the file (HTTP Range; an unparsable `Range` is ignored: 200, whole file) |
//! | `DELETE /api/checkpoints/{id}` | -> 204 (409 while a job that uses it is queued, running or interrupted, or is a cancelled/failed train job with a saved checkpoint) |
//! | `POST /api/jobs` | `CreateJob` -> 201 `JobInfo` (422 naming the invalid `spec.*` field, also checked against the input models: layers, context, experts; MoE where route needs one, dense where moerge / graft's base and instruct must be; merge inputs of one set of tensor shapes; train `devices` within the backend's, its memory estimate within the job memory limit; 400 for a bad `name`) |
//! | `GET /api/jobs` | -> `[JobInfo]`, newest first |
//! | `GET /api/jobs/{id}` | -> `JobInfo` |
//! | `GET /api/jobs/{id}/events` | SSE: `event: state\|progress\|log`, `data: JobEvent` JSON |
//! | `GET /api/jobs/{id}/metrics` | -> `[StepMetrics]` of a train job (`metrics.jsonl`) |
//! | `GET /api/jobs/{id}/log` | -> text (HTTP Range) |
//! | `GET /api/jobs/{id}/artifacts` | -> `[FileInfo]` (paths relative to the job's output) |
//! | `GET /api/jobs/{id}/artifacts/{*path}` | -> the file (HTTP Range); only paths of that listing |
//! | `POST /api/jobs/{id}/cancel` | -> `JobInfo` (queued: cancelled at once, and it never starts; running: SIGINT, a train job saves a checkpoint; SIGKILL after the grace period, which the state's `error` then says) |
//! | `POST /api/jobs/{id}/resume` | -> `JobInfo` (interrupted/cancelled/failed -> queued; train continues from its last checkpoint; 422 naming `spec.*` when an input checkpoint was deleted) |
//!
//! ## Uploads: fixed-size chunks, strictly in order
//! `POST /api/uploads {file_name, size, sha256, chunk_size?}` fixes the
//! chunking: chunk `i` is bytes `[i*chunk_size, min((i+1)*chunk_size, size))`.
//! Send chunk `i` with `PUT .../chunks/{i}` and its sha256 in
//! `X-Chunk-Sha256`; it is streamed to `uploads/{id}/FILE.part` at its
//! offset, hashed on the way, fsynced, and counted only if the length and
//! hash match (400 for a wrong length, 422 for a wrong hash, 409 for any
//! index other than `chunks_received`; re-sending an already received chunk
//! with the same hash is a no-op 200). After a lost connection, `GET
//! /api/uploads/{id}` and continue at `chunks_received`. `complete` re-hashes
//! the whole file and renames it into place. Completed uploads are usable
//! as datasets in job specs (`DataRef.upload`) or become checkpoint files
//! through `POST /api/checkpoints`: the uploads are first claimed
//! atomically (`complete` -> `consumed`, so of concurrent requests naming
//! one upload exactly one proceeds, the others get 409), then hard-linked
//! into `checkpoints/.tmp-{id}/`, validated with the same loaders as
//! `moe-studio inspect` and renamed into `checkpoints/{id}/`; on any error
//! the temporary directory is removed and the uploads are `complete` again.
//! The validation runs `moe-studio inspect --json` in a child process (its
//! own process group) under a memory budget of twice the files' size plus
//! 256 MB, so a hostile file can fail its registration but never grow the
//! server. After a crash (even `kill -9`) anywhere in between, the start
//! brings each registration to one end: the uploads `complete` again, or
//! the checkpoint registered (`checkpoints::recover`). A crash inside
//! `complete`'s rename leaves the file renamed: `complete` again finishes.
//!
//! ## Connections
//! Every connection must send a complete request head within
//! `--header-timeout-secs` (default 20; an idle keep-alive connection is
//! closed after the same time). At most `--max-connections` (default 1024,
//! lowered to fit the open-file limit, which is raised to its hard limit at
//! start) are open; at most a quarter of them may be connections that have
//! not yet presented the token or the read cookie, and a new one beyond
//! that closes the oldest of those: a flood of half-open connections only
//! evicts itself, and the other slots stay for authorised users (a
//! per-address cap would not do on loopback, where attacker and user are
//! both 127.0.0.1). See `conn.rs`.
//!
//! ## Jobs
//! A job runs the CLI command of its kind (`moe-studio train ...`,
//! `upcycle`, ...) as a child process in its own process group, so the
//! numbers are those of the CLI: arguments are built from the validated
//! spec and the checkpoint / upload ids resolved to server-owned paths,
//! relative to the job's directory (its working directory), so neither the
//! log nor what a command records of its inputs names the data directory. At
//! most `--workers` run at once (queued FIFO). Output goes to
//! `jobs/{id}/out/` (artefacts), stderr and stdout to `jobs/{id}/log.txt`; a
//! model written there (`out/` or train's `out/final/`) is registered as a
//! checkpoint (`output_checkpoint`). A failed job's `error` (from its
//! stderr) shows the data directory as `<data>`. A train job checkpoints every
//! `save_every` steps; `resume` continues it exactly (`train --resume`).
//! Children watch their stdin (`MOE_STUDIO_EXIT_WITH_PARENT`): if the server
//! dies, even by `kill -9`, they exit; at restart jobs left `running` become
//! `interrupted` (with `--auto-resume`, train jobs are re-queued), and the
//! hidden temporary directories of writers that a killed attempt left in a
//! job's directory are removed (also before every start and resume).
//!
//! A worker takes a job with one conditional statement (`queued ->
//! running` only while it is still queued), and `cancel` of a queued job is
//! the mirror statement: exactly one of them wins, so a `cancelled` answer
//! means the job never starts. Each job runs under a memory limit
//! (`--job-memory-limit`, default 80% of the host's memory): a cgroup v2
//! `memory.max` where the server's cgroup delegates the memory controller,
//! else the server polls the job's process group (resident anonymous +
//! shared memory, every 100 ms; memory-mapped checkpoints are page cache and
//! do not count) and kills it above the limit; not `RLIMIT_AS`, which
//! memory-mapped checkpoints and CUDA's address reservations defeat. The
//! memory is in `JobInfo.memory` and in `memory` events. Cancel sends
//! SIGINT, then SIGKILL after `--cancel-grace-secs` (default 30) plus, for
//! train, two steps at its pace and its checkpoint's size at 50 MB/s.

mod checkpoints;
mod conn;
mod db;
mod error;
mod jobs;
mod limits;
mod uploads;

pub use jobs::EXIT_WITH_PARENT_ENV;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use moe_shared::api::ServerInfo;
use tower_http::services::{ServeDir, ServeFile};
use tower_http::trace::TraceLayer;

pub use db::Db;
use error::AppError;

/// Arguments of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Data directory (database, uploads, checkpoints, jobs, token).
    #[arg(long, default_value = "moe-studio-data")]
    pub data_dir: PathBuf,
    /// File holding the API token (default: DATA_DIR/token, generated on first start).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The built frontend (default: frontend/dist when it exists).
    #[arg(long)]
    pub static_dir: Option<PathBuf>,
    /// Largest accepted upload, bytes.
    #[arg(long, default_value_t = 64 << 30)]
    pub max_upload_bytes: u64,
    /// Largest chunk an upload may use, bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_chunk_bytes: u64,
    /// Jobs that run at once.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// At start, re-queue train jobs that were interrupted (they resume from their last checkpoint).
    #[arg(long)]
    pub auto_resume: bool,
    /// Another accepted `Host` header value (repeatable; with or without `:PORT`).
    /// On loopback only 127.0.0.1, localhost and [::1] are accepted otherwise.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_host: Vec<String>,
    /// At start, delete incomplete uploads older than this many hours (0: every incomplete upload).
    #[arg(long, default_value_t = 24)]
    pub upload_ttl_hours: u64,
    /// A chunk whose body stalls this long (no byte) is dropped and its upload unlocked (408).
    #[arg(long, default_value_t = 60)]
    pub chunk_timeout_secs: u64,
    /// Memory limit of each job's process group, bytes (0: 80% of the host's memory).
    #[arg(long, default_value_t = 0)]
    pub job_memory_limit: u64,
    /// A cancelled job's time between SIGINT and SIGKILL, seconds; a train job gets two of its
    /// steps and the time to write its checkpoint on top.
    #[arg(long, default_value_t = 30)]
    pub cancel_grace_secs: u64,
    /// A connection that sends no complete request head within this many seconds is closed
    /// (also an idle keep-alive connection).
    #[arg(long, default_value_t = 20)]
    pub header_timeout_secs: u64,
    /// Most connections open at once (lowered to fit the open-file limit); a quarter of them
    /// at most may be connections that have not presented the token.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
}

/// Chunk size when an upload does not choose one.
const DEFAULT_CHUNK: u64 = 8 << 20;
/// Smallest chunk size an upload may choose.
pub const MIN_CHUNK: u64 = 1024;
/// Limit of JSON bodies.
const JSON_LIMIT: usize = 1 << 20;

/// Everything a handler needs.
pub struct AppState {
    /// Absolute data directory.
    pub data: PathBuf,
    /// The registry.
    pub db: Db,
    /// The bearer token's and the read cookie's digests.
    pub credentials: Credentials,
    /// Limits and settings.
    pub args: ServeArgs,
    /// The default Burn backend of jobs.
    pub default_backend: String,
    /// Held while an upload is announced (free space vs. promised space).
    pub upload_reserve: tokio::sync::Mutex<()>,
    /// The memory limit of each job, bytes.
    pub job_memory_limit: u64,
    /// Per-upload locks (one chunk of an upload at a time).
    pub upload_locks: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The job runner.
    pub jobs: jobs::Runner,
    /// Accepted `Host` values (lowercase; empty: any).
    allowed_hosts: Vec<String>,
}

/// Shared state handle.
pub type AppStateRef = Arc<AppState>;

/// Backends compiled into this binary (`cpu` always; `wgpu`, `cuda`).
pub fn backends() -> Vec<String> {
    crate::cli::backend::built().into_iter().map(String::from).collect()
}

/// Reads `--token-file`, or DATA_DIR/token (creating it, mode 0600, on
/// first start). Returns the token and whether it was just generated.
fn load_token(args: &ServeArgs, data: &Path) -> anyhow::Result<(String, bool)> {
    let read = |p: &Path| -> anyhow::Result<String> {
        let t = std::fs::read_to_string(p).with_context(|| format!("reading token file {}", p.display()))?;
        let t = t.trim().to_string();
        if t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            anyhow::bail!("token file {}: expected one token of at least 16 printable characters", p.display());
        }
        Ok(t)
    };
    if let Some(p) = &args.token_file {
        return Ok((read(p)?, false));
    }
    let p = data.join("token");
    if p.exists() {
        return Ok((read(&p)?, false));
    }
    let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = data.join(".token.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    writeln!(f, "{token}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))?;
    Ok((token, true))
}

/// Name of the read cookie set by `POST /api/session`.
pub const READ_COOKIE: &str = "moe_studio_read";

/// The credentials of the server: digests of the token and of the read
/// cookie's value, compared in constant time and at a fixed length (the
/// sha256 of what was presented against the sha256 of the token), so that
/// neither the time of a refusal nor its answer depends on the token's
/// length or on how many leading characters were right.
pub struct Credentials {
    token_digest: [u8; 32],
    cookie_value: String,
    cookie_digest: [u8; 32],
}

/// What a request presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    /// `Authorization: Bearer` with the right token (reads and writes).
    Token,
    /// The read cookie of `POST /api/session` (reads only).
    ReadCookie,
    /// A wrong bearer token or cookie.
    Wrong,
    /// Nothing.
    Nothing,
}

fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}

/// Constant-time equality of two digests.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Credentials {
    /// The credentials of `token`.
    pub fn new(token: &str) -> Self {
        // The cookie carries a value derived from the token, not the token:
        // a leaked cookie reads, it never writes.
        let cookie_value = uploads::hex(&sha256(format!("moe-studio read cookie v1\0{token}").as_bytes()));
        Credentials {
            token_digest: sha256(token.as_bytes()),
            cookie_digest: sha256(cookie_value.as_bytes()),
            cookie_value,
        }
    }

    /// Whether `given` is the token (constant time whatever its length).
    pub fn token_matches(&self, given: &str) -> bool {
        digests_equal(&sha256(given.as_bytes()), &self.token_digest)
    }

    /// What the request headers present: the bearer token first, else the read cookie.
    pub fn presented(&self, headers: &axum::http::HeaderMap) -> Presented {
        if let Some(auth) = headers.get(header::AUTHORIZATION) {
            let t = auth.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
            return match t {
                Some(t) if self.token_matches(t) => Presented::Token,
                _ => Presented::Wrong,
            };
        }
        let mut seen = false;
        for v in headers.get_all(header::COOKIE) {
            for kv in v.to_str().unwrap_or("").split(';') {
                if let Some((k, val)) = kv.trim().split_once('=') {
                    if k == READ_COOKIE {
                        if digests_equal(&sha256(val.trim().as_bytes()), &self.cookie_digest) {
                            return Presented::ReadCookie;
                        }
                        seen = true;
                    }
                }
            }
        }
        if seen {
            Presented::Wrong
        } else {
            Presented::Nothing
        }
    }

    /// The `Set-Cookie` value of `POST /api/session`: `HttpOnly` (no script
    /// reads it), `SameSite=Strict` (no other site's page sends it),
    /// `Path=/api`.
    fn set_cookie(&self) -> String {
        format!("{READ_COOKIE}={}; Path=/api; HttpOnly; SameSite=Strict", self.cookie_value)
    }
}

/// Whether a request needs no credentials: `GET /api/info` (what the page
/// probes before it has a token).
fn is_public(method: &Method, path: &str) -> bool {
    matches!(*method, Method::GET | Method::HEAD) && path == "/info"
}

/// Every API route but `GET /api/info` needs credentials: the bearer token
/// for any method, or the read cookie for `GET` / `HEAD` (an `EventSource`
/// and a download link cannot set headers). A mutating request never
/// accepts the cookie: on loopback every port is the same site, so
/// `SameSite` alone would not stop another local page from sending it.
async fn require_token(State(st): State<AppStateRef>, req: Request, next: Next) -> Response {
    if is_public(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    match st.credentials.presented(req.headers()) {
        Presented::Token => next.run(req).await,
        Presented::ReadCookie if read => next.run(req).await,
        Presented::ReadCookie => AppError::new(
            StatusCode::UNAUTHORIZED,
            Some("Authorization"),
            "the session cookie only reads: this route needs `Authorization: Bearer TOKEN`",
        )
        .into_response(),
        Presented::Wrong => {
            AppError::new(StatusCode::UNAUTHORIZED, Some("Authorization"), "wrong token").into_response()
        }
        Presented::Nothing => AppError::new(
            StatusCode::UNAUTHORIZED,
            Some("Authorization"),
            "this route needs `Authorization: Bearer TOKEN` (the token is in DATA_DIR/token or --token-file)",
        )
        .into_response(),
    }
}

/// `POST /api/session` (bearer token): sets the read cookie, so that the
/// page's `EventSource` and download links are authorised. 204.
async fn create_session(State(st): State<AppStateRef>) -> Response {
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, st.credentials.set_cookie())]).into_response()
}

/// `DELETE /api/session`: clears the read cookie. 204.
async fn delete_session() -> Response {
    let clear = format!("{READ_COOKIE}=; Path=/api; HttpOnly; SameSite=Strict; Max-Age=0");
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, clear)]).into_response()
}

/// The `Host` values accepted by a server bound to `addr`: on loopback
/// `127.0.0.1`, `localhost` and `[::1]` with and without the port, plus
/// `--allow-host` names; elsewhere no check (empty list) unless names are given.
fn allowed_hosts(addr: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut v = Vec::new();
    if addr.ip().is_loopback() || !extra.is_empty() {
        let port = addr.port();
        let mut names: Vec<String> = vec!["127.0.0.1".into(), "localhost".into(), "[::1]".into()];
        if !addr.ip().is_loopback() {
            names.push(match addr.ip() {
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
                ip => ip.to_string(),
            });
        }
        names.extend(extra.iter().map(|n| n.trim().to_ascii_lowercase()));
        for n in names {
            if n.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && !h.ends_with(':') && p.parse::<u16>().is_ok())
                && !n.ends_with(']')
            {
                v.push(n); // given with its port
            } else {
                v.push(format!("{n}:{port}"));
                v.push(n);
            }
        }
    }
    v
}

/// DNS-rebinding guard: a request whose `Host` is not an accepted name of
/// this server is a 421 (JSON), whatever the route.
async fn check_host(State(st): State<AppStateRef>, req: Request, next: Next) -> Response {
    if st.allowed_hosts.is_empty() {
        return next.run(req).await;
    }
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}").to_ascii_lowercase())
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_ascii_lowercase()));
    match host {
        Some(h) if !st.allowed_hosts.contains(&h) => {
            let shown: String = h.chars().take(80).collect();
            AppError::new(
                StatusCode::MISDIRECTED_REQUEST,
                Some("Host"),
                format!("Host `{shown}` is not a name of this server (allowed: 127.0.0.1, localhost, [::1]; add others with --allow-host)"),
            )
            .into_response()
        }
        _ => next.run(req).await,
    }
}

/// Longest request target the API answers (longer: 414).
const MAX_URI: usize = 8192;

/// Makes every 4xx/5xx answer of the API JSON (`ApiError`): those made by
/// axum's router (405), tower-http's `ServeFile` (416) and the like come
/// with an empty or plain-text body; it becomes the message.
async fn json_errors(req: Request, next: Next) -> Response {
    if req.uri().to_string().len() > MAX_URI {
        return AppError::new(
            StatusCode::URI_TOO_LONG,
            Some("path"),
            format!("the request target is longer than {MAX_URI} bytes"),
        )
        .into_response();
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let res = next.run(req).await;
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return res;
    }
    let (parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.map(|b| String::from_utf8_lossy(&b).trim().to_string());
    let reason = status.canonical_reason().unwrap_or("error");
    let msg = match text {
        Ok(t) if !t.is_empty() => format!("{reason}: {t}"),
        _ => match status {
            StatusCode::METHOD_NOT_ALLOWED => format!("{reason}: {method} is not allowed on {path}"),
            StatusCode::RANGE_NOT_SATISFIABLE => format!("{reason}: the Range is outside the file"),
            _ => format!("{reason} ({method} {path})"),
        },
    };
    let field = match status {
        StatusCode::RANGE_NOT_SATISFIABLE => Some("Range"),
        StatusCode::METHOD_NOT_ALLOWED => Some("method"),
        _ => None,
    };
    let mut out = AppError::new(status, field, msg).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH && k != header::TRANSFER_ENCODING {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

async fn info(State(st): State<AppStateRef>) -> axum::Json<ServerInfo> {
    axum::Json(ServerInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        backends: backends(),
        default_backend: st.default_backend.clone(),
        workers: st.args.workers,
        max_upload_bytes: st.args.max_upload_bytes,
        default_chunk_size: DEFAULT_CHUNK.min(st.args.max_chunk_bytes),
        max_chunk_size: st.args.max_chunk_bytes,
    })
}

async fn api_not_found(req: Request) -> AppError {
    AppError::new(StatusCode::NOT_FOUND, Some("path"), format!("no API route {} {}", req.method(), req.uri().path()))
}

const NO_FRONTEND: &str = "<!doctype html><meta charset=utf-8><title>moe-studio</title>\
<h1>moe-studio server</h1><p>The frontend is not built. Build it with <code>bash scripts/build_web.sh</code> \
in <code>frontend/</code> (or pass <code>--static-dir</code>). The JSON API is at <code>/api</code> \
(<a href=/api/info>/api/info</a>).</p>";

async fn no_frontend() -> impl IntoResponse {
    (StatusCode::NOT_FOUND, Html(NO_FRONTEND))
}

/// The router over `st`.
pub fn router(st: AppStateRef) -> Router {
    let api = Router::new()
        .route("/info", get(info))
        .route("/session", post(create_session).delete(delete_session))
        .route("/uploads", post(uploads::create).get(uploads::list))
        .route("/uploads/{id}", get(uploads::status).delete(uploads::delete))
        .route(
            "/uploads/{id}/chunks/{index}",
            // Chunk bodies are streamed and counted by the handler (never
            // more than the announced chunk length, itself <= --max-chunk-bytes).
            put(uploads::put_chunk).layer(DefaultBodyLimit::disable()),
        )
        .route("/uploads/{id}/complete", post(uploads::complete))
        .route("/checkpoints", post(checkpoints::create).get(checkpoints::list))
        .route("/checkpoints/{id}", get(checkpoints::get_one).delete(checkpoints::delete))
        .route("/checkpoints/{id}/files/{name}", get(checkpoints::download))
        .route("/jobs", post(jobs::create).get(jobs::list))
        .route("/jobs/{id}", get(jobs::get_one))
        .route("/jobs/{id}/events", get(jobs::events))
        .route("/jobs/{id}/metrics", get(jobs::metrics))
        .route("/jobs/{id}/log", get(jobs::log))
        .route("/jobs/{id}/artifacts", get(jobs::artifacts))
        .route("/jobs/{id}/artifacts/{*path}", get(jobs::artifact))
        .route("/jobs/{id}/cancel", post(jobs::cancel))
        .route("/jobs/{id}/resume", post(jobs::resume))
        .fallback(api_not_found)
        .layer(axum::middleware::from_fn_with_state(st.clone(), require_token))
        .layer(DefaultBodyLimit::max(JSON_LIMIT))
        .layer(axum::middleware::from_fn(json_errors))
        .with_state(st.clone());
    let static_dir = st.args.static_dir.clone().or_else(|| {
        let d = PathBuf::from("frontend/dist");
        d.join("index.html").exists().then_some(d)
    });
    let app = Router::new().nest("/api", api);
    let app = match static_dir {
        Some(d) => {
            let index = d.join("index.html");
            let files = ServeDir::new(&d);
            let pages = ServeDir::new(&d).fallback(ServeFile::new(index));
            app.fallback(move |req: axum::extract::Request| async move {
                use tower::ServiceExt;
                // A missing file (its last segment has an extension: `demo/manifest.json`,
                // `x.wasm`) is a 404; any other path is a page of the app: index.html.
                let last = req.uri().path().rsplit('/').next().unwrap_or("");
                let res = if last.contains('.') { files.oneshot(req).await } else { pages.oneshot(req).await };
                match res {
                    Ok(r) => r.map(axum::body::Body::new).into_response(),
                    Err(e) => match e {},
                }
            })
        }
        None => app.fallback(no_frontend),
    };
    app.layer(axum::middleware::from_fn_with_state(st, check_host)).layer(TraceLayer::new_for_http())
}

/// Runs the server until Ctrl-C / SIGTERM.
///
/// # Errors
/// Data directory, database, token and bind failures.
pub fn run(backend: &str, args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).try_init().ok();
    // `auto` is resolved once, here: every job then names its backend.
    let backend = crate::cli::backend::resolve(backend)?;
    tracing::info!(
        "jobs run on the {} backend unless their spec names another{}",
        backend.name,
        if backend.reason.is_empty() { String::new() } else { format!(" ({})", backend.reason) }
    );
    if args.workers == 0 || args.workers > 256 {
        anyhow::bail!("--workers {}: expected 1 to 256", args.workers);
    }
    if args.max_chunk_bytes < MIN_CHUNK {
        anyhow::bail!("--max-chunk-bytes {}: expected at least {MIN_CHUNK}", args.max_chunk_bytes);
    }
    // Everything the server and its jobs create is private: files 0600,
    // directories 0700 (like the token).
    // SAFETY: umask(2) only sets the process's file mode creation mask.
    unsafe {
        libc::umask(0o077);
    }
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data = args.data_dir.canonicalize().with_context(|| format!("resolving {}", args.data_dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let private = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("making {} private", p.display()))
        };
        private(&data, 0o700)?;
        for sub in ["uploads", "checkpoints", "jobs"] {
            std::fs::create_dir_all(data.join(sub))
                .with_context(|| format!("creating {}", data.join(sub).display()))?;
            private(&data.join(sub), 0o700)?;
        }
        for f in ["studio.db", "studio.db-wal", "studio.db-shm"] {
            if data.join(f).exists() {
                private(&data.join(f), 0o600)?;
            }
        }
    }
    let db = Db::open(&data.join("studio.db"))?;
    uploads::expire(&db, &data, args.upload_ttl_hours)?;
    checkpoints::recover(&db, &data)?;
    let fd_limit = conn::raise_fd_limit();
    let job_memory_limit = match args.job_memory_limit {
        0 => limits::host_memory().map(|(total, _)| total / 10 * 8).unwrap_or(u64::MAX),
        n => n,
    };
    let (token, generated) = load_token(&args, &data)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(args.addr).await.with_context(|| format!("binding {}", args.addr))?;
        let (max_conns, max_unauth) = conn::caps(args.max_connections, fd_limit);
        let limits = conn::Limits::new(max_conns, max_unauth);
        tracing::info!(
            "at most {max_conns} connections ({max_unauth} without the token) under an open-file limit of {fd_limit}"
        );
        let addr = listener.local_addr()?;
        let default_backend = backend.name.to_string();
        let allowed_hosts = allowed_hosts(addr, &args.allow_host);
        let st = Arc::new(AppState {
            data: data.clone(),
            db,
            credentials: Credentials::new(&token),
            args: args.clone(),
            default_backend,
            upload_locks: Default::default(),
            upload_reserve: Default::default(),
            job_memory_limit,
            jobs: jobs::Runner::new(args.workers)?,
            allowed_hosts,
        });
        jobs::recover(&st).await.map_err(|e| anyhow::anyhow!("recovering jobs: {}", e.body.error))?;
        if generated {
            println!("API token (saved in {}): {token}", data.join("token").display());
        } else {
            println!("API token: in {}", args.token_file.clone().unwrap_or_else(|| data.join("token")).display());
        }
        println!("data dir {}", data.display());
        if !addr.ip().is_loopback() {
            let w = format!(
                "WARNING: listening on {addr}, not loopback: the token travels in clear text over plain HTTP \
                 to and from anyone who can reach this address. Bind 127.0.0.1 unless this network is trusted."
            );
            eprintln!("{w}");
            println!("{w}");
        }
        println!("listening on http://{addr}");
        use std::io::Write;
        std::io::stdout().flush().ok();
        let app = router(st.clone());
        let st2 = st.clone();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let ctrl_c = tokio::signal::ctrl_c();
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            tracing::info!("shutting down: interrupting running jobs, closing event streams");
            // Ends the SSE streams (or the graceful shutdown would wait for
            // their clients) and sends SIGINT to the running jobs.
            jobs::begin_shutdown(&st2);
            let _ = stop_tx.send(true);
        });
        conn::serve(st.clone(), listener, app, limits, stop_rx).await;
        jobs::shutdown(&st).await;
        Ok(())
    })
}
