//! `moe-studio serve`: the studio's HTTP server — the built frontend, a JSON
//! API for checkpoints and jobs, and server-sent events for progress.
//!
//! # Running
//! ```text
//! moe-studio [--backend ndarray|wgpu|cuda] serve [--addr 127.0.0.1:8080] [--data-dir DIR]
//!     [--token-file FILE] [--static-dir DIR] [--max-upload-bytes N] [--max-chunk-bytes N]
//!     [--workers N] [--auto-resume]
//! ```
//! Binds loopback by default; prints `listening on http://ADDR` (port 0
//! picks a free port). The data directory holds `studio.db` (SQLite:
//! uploads, checkpoints, jobs; migrations in `backend/migrations/`),
//! `uploads/{id}/`, `checkpoints/{id}/`, `jobs/{id}/` and, unless
//! `--token-file` is given, `token` (generated on first start, mode 0600,
//! printed once). The frontend is served from `--static-dir` (default
//! `frontend/dist` when present; single-page fallback to `index.html`).
//! CORS headers are never sent.
//!
//! # API
//! Every route is under `/api`. `POST`, `PUT` and `DELETE` need
//! `Authorization: Bearer TOKEN` (401 otherwise); `GET`s are open (the
//! browser's `EventSource` cannot send headers). Bodies are JSON (limit
//! 1 MiB) except chunks. Every 4xx/5xx answer is
//! `{"error": "...", "field": "..."}` ([`ApiError`](moe_shared::api::ApiError);
//! `field` names the body field, path parameter or header at fault). Ids
//! are lowercase hyphenated UUIDs; anything else in an id position is a 400,
//! so no request string ever becomes a path. Types: `moe_shared::api`.
//!
//! | route | body -> answer |
//! |---|---|
//! | `GET /api/info` | -> `ServerInfo` |
//! | `POST /api/uploads` | `CreateUpload` -> 201 `UploadStatus` (413 over `max_upload_bytes`) |
//! | `GET /api/uploads` | -> `[UploadStatus]` |
//! | `GET /api/uploads/{id}` | -> `UploadStatus`: `chunks_received` is the next chunk to send |
//! | `PUT /api/uploads/{id}/chunks/{index}` | raw bytes, header `X-Chunk-Sha256: HEX` -> `UploadStatus` |
//! | `POST /api/uploads/{id}/complete` | -> `UploadStatus` (`complete`; 422 on whole-file sha256 mismatch, which resets the upload) |
//! | `DELETE /api/uploads/{id}` | -> 204 |
//! | `POST /api/checkpoints` | `CreateCheckpoint` -> 201 `CheckpointInfo` (422 when the files are not a model) |
//! | `GET /api/checkpoints` | -> `[CheckpointInfo]` (no `summary`) |
//! | `GET /api/checkpoints/{id}` | -> `CheckpointInfo` with `summary` (`ModelSummary`) |
//! | `GET /api/checkpoints/{id}/files/{name}` | -> the file (HTTP Range) |
//! | `DELETE /api/checkpoints/{id}` | -> 204 (409 while an unfinished job uses it) |
//! | `POST /api/jobs` | `CreateJob` -> 201 `JobInfo` (422 naming the invalid `spec.*` field) |
//! | `GET /api/jobs` | -> `[JobInfo]`, newest first |
//! | `GET /api/jobs/{id}` | -> `JobInfo` |
//! | `GET /api/jobs/{id}/events` | SSE: `event: state\|progress\|log`, `data: JobEvent` JSON |
//! | `GET /api/jobs/{id}/metrics` | -> `[StepMetrics]` of a train job (`metrics.jsonl`) |
//! | `GET /api/jobs/{id}/log` | -> text (HTTP Range) |
//! | `GET /api/jobs/{id}/artifacts` | -> `[FileInfo]` (paths relative to the job's output) |
//! | `GET /api/jobs/{id}/artifacts/{*path}` | -> the file (HTTP Range); only paths of that listing |
//! | `POST /api/jobs/{id}/cancel` | -> `JobInfo` (queued: cancelled at once; running: SIGINT, a train job saves a checkpoint) |
//! | `POST /api/jobs/{id}/resume` | -> `JobInfo` (interrupted/cancelled/failed -> queued; train continues from its last checkpoint) |
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
//! through `POST /api/checkpoints` (hard-linked, validated with the same
//! loaders as `moe-studio inspect`, renamed into `checkpoints/{id}/`).
//!
//! ## Jobs
//! A job runs the CLI command of its kind (`moe-studio train ...`,
//! `upcycle`, ...) as a child process in its own process group, so the
//! numbers are those of the CLI: arguments are built from the validated
//! spec and the checkpoint / upload ids resolved to server-owned paths. At
//! most `--workers` run at once (queued FIFO). Output goes to
//! `jobs/{id}/out/` (artefacts), stderr and stdout to `jobs/{id}/log.txt`; a
//! model written there (`out/` or train's `out/final/`) is registered as a
//! checkpoint (`output_checkpoint`). A train job checkpoints every
//! `save_every` steps; `resume` continues it exactly (`train --resume`).
//! Children watch their stdin (`MOE_STUDIO_EXIT_WITH_PARENT`): if the server
//! dies, even by `kill -9`, they exit; at restart jobs left `running` become
//! `interrupted` (with `--auto-resume`, train jobs are re-queued).

mod checkpoints;
mod db;
mod error;
mod jobs;
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
    /// The bearer token.
    token: String,
    /// Limits and settings.
    pub args: ServeArgs,
    /// The default Burn backend of jobs.
    pub default_backend: String,
    /// Per-upload locks (one chunk of an upload at a time).
    pub upload_locks: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The job runner.
    pub jobs: jobs::Runner,
}

/// Shared state handle.
pub type AppStateRef = Arc<AppState>;

/// Backends compiled into this binary.
pub fn backends() -> Vec<String> {
    let mut v = vec!["ndarray".to_string()];
    if cfg!(feature = "wgpu") {
        v.push("wgpu".into());
    }
    if cfg!(feature = "cuda") {
        v.push("cuda".into());
    }
    v
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

/// Constant-time comparison of the presented and expected tokens.
fn token_matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_token(State(st): State<AppStateRef>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let auth = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match auth.and_then(|v| v.strip_prefix("Bearer ")) {
        Some(t) if token_matches(t.trim(), &st.token) => next.run(req).await,
        Some(_) => AppError::new(StatusCode::UNAUTHORIZED, Some("Authorization"), "wrong token").into_response(),
        None => AppError::new(
            StatusCode::UNAUTHORIZED,
            Some("Authorization"),
            "this route needs `Authorization: Bearer TOKEN` (the token is in DATA_DIR/token or --token-file)",
        )
        .into_response(),
    }
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
<h1>moe-studio server</h1><p>The frontend is not built. Build it with <code>trunk build --release</code> \
in <code>frontend/</code> (or pass <code>--static-dir</code>). The JSON API is at <code>/api</code> \
(<a href=/api/info>/api/info</a>).</p>";

async fn no_frontend() -> impl IntoResponse {
    (StatusCode::NOT_FOUND, Html(NO_FRONTEND))
}

/// The router over `st`.
pub fn router(st: AppStateRef) -> Router {
    let api = Router::new()
        .route("/info", get(info))
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
        .with_state(st.clone());
    let static_dir = st.args.static_dir.clone().or_else(|| {
        let d = PathBuf::from("frontend/dist");
        d.join("index.html").exists().then_some(d)
    });
    let app = Router::new().nest("/api", api);
    let app = match static_dir {
        Some(d) => {
            let index = d.join("index.html");
            app.fallback_service(ServeDir::new(&d).fallback(ServeFile::new(index)))
        }
        None => app.fallback(no_frontend),
    };
    app.layer(TraceLayer::new_for_http())
}

/// Runs the server until Ctrl-C / SIGTERM.
///
/// # Errors
/// Data directory, database, token and bind failures.
pub fn run(backend: &str, args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).try_init().ok();
    if !backends().iter().any(|b| b == backend) && backend != "cpu" {
        anyhow::bail!("--backend `{backend}` is not built into this binary (built: {})", backends().join(", "));
    }
    if args.workers == 0 || args.workers > 256 {
        anyhow::bail!("--workers {}: expected 1 to 256", args.workers);
    }
    if args.max_chunk_bytes < MIN_CHUNK {
        anyhow::bail!("--max-chunk-bytes {}: expected at least {MIN_CHUNK}", args.max_chunk_bytes);
    }
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data = args.data_dir.canonicalize().with_context(|| format!("resolving {}", args.data_dir.display()))?;
    for sub in ["uploads", "checkpoints", "jobs"] {
        std::fs::create_dir_all(data.join(sub)).with_context(|| format!("creating {}", data.join(sub).display()))?;
    }
    let db = Db::open(&data.join("studio.db"))?;
    let (token, generated) = load_token(&args, &data)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(args.addr).await.with_context(|| format!("binding {}", args.addr))?;
        let addr = listener.local_addr()?;
        let default_backend = if backend == "cpu" { "ndarray".to_string() } else { backend.to_string() };
        let st = Arc::new(AppState {
            data: data.clone(),
            db,
            token: token.clone(),
            args: args.clone(),
            default_backend,
            upload_locks: Default::default(),
            jobs: jobs::Runner::new(args.workers)?,
        });
        jobs::recover(&st).await.map_err(|e| anyhow::anyhow!("recovering jobs: {}", e.body.error))?;
        if generated {
            println!("API token (saved in {}): {token}", data.join("token").display());
        } else {
            println!("API token: in {}", args.token_file.clone().unwrap_or_else(|| data.join("token")).display());
        }
        println!("data dir {}", data.display());
        println!("listening on http://{addr}");
        use std::io::Write;
        std::io::stdout().flush().ok();
        let app = router(st.clone());
        let st2 = st.clone();
        let shutdown = async move {
            let ctrl_c = tokio::signal::ctrl_c();
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            tracing::info!("shutting down: interrupting running jobs, closing event streams");
            // Ends the SSE streams (or the graceful shutdown would wait for
            // their clients) and sends SIGINT to the running jobs.
            jobs::begin_shutdown(&st2);
        };
        axum::serve(listener, app).with_graceful_shutdown(shutdown).await.context("serving")?;
        jobs::shutdown(&st).await;
        Ok(())
    })
}
