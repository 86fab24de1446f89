//! Jobs: validated specs stored in SQLite, run as child processes of the
//! same binary (`moe-studio <kind> ...`) by a bounded pool, with progress
//! parsed from the child's output and broadcast as server-sent events.
//!
//! Why a child process per job rather than a thread: each job gets its own
//! log (the CLI's stderr), its own Ctrl-C handling (a SIGINT makes `train`
//! save a checkpoint), and a job that runs out of memory or panics takes
//! down only itself, never the server. The code run is the CLI's, so a job
//! and the same command typed by hand give the same numbers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use moe_shared::api::{
    ApiError, CreateJob, DataRef, FileInfo, JobEvent, JobInfo, JobMemory, JobSpec, JobState, ModelSummary, Progress,
    UploadState,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, mpsc, watch, Semaphore};

use super::checkpoints::{model_path, register_dir, resolve, serve_file, upload_unusable};
use super::db::{self, get_job, get_upload, now_ms, JOB_COLS};
use super::error::{parse_id, AppError, AppResult, J, P};
use super::uploads::file_path;
use super::AppStateRef;

/// Set in a job's environment: the child exits when its stdin (a pipe from
/// the server) closes, so no job outlives a killed server.
pub const EXIT_WITH_PARENT_ENV: &str = "MOE_STUDIO_EXIT_WITH_PARENT";

/// Why the server killed a job (SIGKILL).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Killed {
    /// It did not stop within this long after the SIGINT of a cancel.
    Grace(Duration),
    /// Its memory went over its limit.
    Memory { peak: u64, limit: u64 },
}

struct Live {
    tx: broadcast::Sender<JobEvent>,
    pid: Option<u32>,
    cancel: bool,
    /// Which start of a job this is (a cancel's SIGKILL timer kills only the start it cancelled).
    run: u64,
    /// Why the server killed it, if it did.
    killed: Option<Killed>,
    /// The memory watch of the running child.
    memory: Option<Arc<super::limits::Watch>>,
}

/// The worker pool and the live state of running jobs.
pub struct Runner {
    sem: Arc<Semaphore>,
    live: Mutex<HashMap<String, Live>>,
    shutdown: watch::Sender<bool>,
    exe: PathBuf,
    runs: std::sync::atomic::AtomicU64,
}

impl Runner {
    /// A pool of `workers` slots running this executable.
    ///
    /// # Errors
    /// When the executable's path cannot be found.
    pub fn new(workers: usize) -> anyhow::Result<Runner> {
        Ok(Runner {
            sem: Arc::new(Semaphore::new(workers)),
            live: Mutex::new(HashMap::new()),
            shutdown: watch::channel(false).0,
            exe: std::env::current_exe()?,
            runs: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// The executable jobs run (this binary).
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    fn with_live<R>(&self, id: &str, f: impl FnOnce(&mut Live) -> R) -> R {
        let mut m = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let l = m.entry(id.to_string()).or_insert_with(|| Live {
            tx: broadcast::channel(256).0,
            pid: None,
            cancel: false,
            run: 0,
            killed: None,
            memory: None,
        });
        f(l)
    }

    /// `f` on the live state of `id` when there is one (never creates it).
    fn if_live<R>(&self, id: &str, f: impl FnOnce(&mut Live) -> R) -> Option<R> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).get_mut(id).map(f)
    }

    fn emit(&self, id: &str, ev: JobEvent) {
        self.with_live(id, |l| {
            let _ = l.tx.send(ev);
        });
    }

    fn finish(&self, id: &str) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    fn live_pids(&self) -> Vec<u32> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).values().filter_map(|l| l.pid).collect()
    }

    /// The memory of running job `id` now.
    fn memory(&self, id: &str) -> Option<JobMemory> {
        self.if_live(id, |l| {
            l.memory.as_ref().map(|w| JobMemory {
                current_bytes: w.current(),
                peak_bytes: w.peak(),
                limit_bytes: w.limit,
            })
        })
        .flatten()
    }
}

/// Sends `sig` to the process group led by `pid` (jobs run in their own group).
pub fn signal_group(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory effects; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// `jobs/{id}` of a validated id.
fn job_dir(st: &AppStateRef, id: &str) -> PathBuf {
    st.data.join("jobs").join(id)
}

async fn load(st: &AppStateRef, id: &str) -> AppResult<JobInfo> {
    let idc = id.to_string();
    st.db
        .call(move |c| get_job(c, &idc).map_err(AppError::from))
        .await?
        .ok_or_else(|| AppError::not_found("id", format!("job {id}")))
}

fn data_ext(file_name: &str) -> &'static str {
    if file_name.ends_with(".jsonl") {
        ".jsonl"
    } else if file_name.ends_with(".json") {
        ".json"
    } else {
        ".txt"
    }
}

/// Relative path (from the job directory) of a dataset's file.
fn data_rel(d: &DataRef, heldout: bool, ext: &str) -> String {
    format!("data/{}{}{ext}", d.name, if heldout { ".heldout" } else { "" })
}

/// `POST /api/jobs`.
pub async fn create(State(st): State<AppStateRef>, J(req): J<CreateJob>) -> AppResult<(StatusCode, Json<JobInfo>)> {
    req.spec.validate()?;
    let backend = match req.backend.as_deref() {
        None | Some("auto") => st.default_backend.clone(),
        // `ndarray` and `flex` are older / library names of the CPU backend.
        Some("cpu" | "ndarray" | "flex") => "cpu".to_string(),
        Some(b) => b.to_string(),
    };
    if !super::backends().contains(&backend) {
        return Err(AppError::unprocessable(
            "backend",
            format!("`{backend}` is not built into this server (built: {})", super::backends().join(", ")),
        ));
    }
    let name = match &req.name {
        Some(n) => Some(moe_shared::api::check_name("name", n).map_err(super::checkpoints::bad_request)?),
        None => None,
    };
    let mut summaries: HashMap<String, ModelSummary> = HashMap::new();
    for (field, id) in req.spec.checkpoints() {
        let row = resolve(&st, &field, &id).await?;
        if let Ok(s) = serde_json::from_str::<ModelSummary>(&row.summary) {
            summaries.insert(id, s);
        }
    }
    check_against_models(&req.spec, &summaries)?;
    check_resources(&st, &backend, &req.spec, &summaries)?;
    // Datasets: each upload must be complete; hard-linked into the job so
    // that deleting the upload later cannot break a resume.
    let mut links: Vec<(PathBuf, String)> = Vec::new();
    let mut counters: HashMap<&str, usize> = HashMap::new();
    for (list, d) in req.spec.datasets() {
        let i = counters.entry(list).or_default();
        let mut pairs = vec![(format!("{list}[{i}].upload"), d.upload.clone(), false)];
        if let Some(h) = &d.heldout {
            pairs.push((format!("{list}[{i}].heldout"), h.clone(), true));
        }
        *i += 1;
        for (field, uid, heldout) in pairs {
            let u2 = uid.clone();
            let u = st
                .db
                .call(move |c| get_upload(c, &u2).map_err(AppError::from))
                .await?
                .ok_or_else(|| AppError::unprocessable(&field, format!("upload {uid} not found")))?;
            if u.state != UploadState::Complete {
                return Err(AppError::unprocessable(&field, upload_unusable(&u)));
            }
            links.push((file_path(&st, &u), data_rel(d, heldout, data_ext(&u.file_name))));
        }
    }
    let id = uuid::Uuid::new_v4().to_string();
    let dir = job_dir(&st, &id);
    tokio::fs::create_dir_all(dir.join("data")).await?;
    for (src, rel) in &links {
        let dst = dir.join(rel);
        if std::fs::hard_link(src, &dst).is_err() && tokio::fs::copy(src, &dst).await.is_err() {
            // The upload was consumed by a checkpoint meanwhile.
            let _ = tokio::fs::remove_dir_all(&dir).await;
            return Err(AppError::conflict(Some("spec"), format!("the upload for {rel} is no longer available")));
        }
    }
    if let JobSpec::Upcycle(u) = &req.spec {
        if let Some(l) = &u.experts_per_layer {
            let body = serde_json::json!({ "experts_per_layer": l });
            tokio::fs::write(dir.join(moe_shared::jobs::ALLOCATION_FILE), body.to_string()).await?;
        }
    }
    let spec_json = serde_json::to_string(&req.spec).map_err(|e| AppError::internal(e.to_string()))?;
    tokio::fs::write(dir.join("spec.json"), &spec_json).await?;
    let kind = req.spec.kind().to_string();
    let idc = id.clone();
    let job = st
        .db
        .call(move |c| {
            c.execute(
                "INSERT INTO jobs (id, name, kind, spec, backend, state, created_at) VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6)",
                rusqlite::params![idc, name, kind, spec_json, backend, now_ms()],
            )?;
            get_job(c, &idc)?.ok_or_else(|| AppError::internal("job vanished"))
        })
        .await?;
    enqueue(st.clone(), id);
    Ok((StatusCode::CREATED, Json(job)))
}

/// Checks the parameters that depend on the input models (layers, context,
/// experts) against their stored summaries; the error names the field.
fn check_against_models(spec: &JobSpec, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
    let ctx = |id: &String| models.get(id).map(|m| m.config.max_position_embeddings).filter(|&c| c > 0);
    let over_ctx = |field: &str, v: Option<usize>, id: &String| -> Result<(), ApiError> {
        match (v, ctx(id)) {
            (Some(v), Some(c)) if v > c => {
                Err(ApiError::field(field, format!("{v} is longer than the model's context ({c} tokens)")))
            }
            _ => Ok(()),
        }
    };
    match spec {
        JobSpec::Train(s) => over_ctx("spec.seq_len", s.seq_len, &s.model)?,
        JobSpec::Eval(s) => over_ctx("spec.window", s.window, &s.model)?,
        JobSpec::Upcycle(s) => {
            if let (Some(l), Some(m)) = (&s.experts_per_layer, models.get(&s.model)) {
                if l.len() != m.config.num_layers {
                    return Err(ApiError::field(
                        "spec.experts_per_layer",
                        format!("{} entries for a model of {} layers", l.len(), m.config.num_layers),
                    ));
                }
            }
            // The fewest experts of any MoE layer bounds top_k and the frozen indices.
            let fewest = match (&s.experts, &s.experts_per_layer) {
                (Some(e), _) => Some(*e),
                (None, Some(l)) => l.iter().flatten().min().copied(),
                _ => None,
            };
            if let Some(e) = fewest {
                if let Some(k) = s.top_k.filter(|&k| k > e) {
                    return Err(ApiError::field("spec.top_k", format!("{k} is more than the {e} experts of a layer")));
                }
                for (i, f) in s.frozen.iter().flatten().enumerate() {
                    if *f >= e {
                        return Err(ApiError::field(
                            &format!("spec.frozen[{i}]"),
                            format!("expert {f} does not exist (a layer has {e} experts, 0-{})", e - 1),
                        ));
                    }
                }
            }
        }
        JobSpec::Moerge(s) => {
            if let Some(k) = s.top_k.filter(|&k| k > s.models.len()) {
                return Err(ApiError::field(
                    "spec.top_k",
                    format!("{k} is more than the {} models (one expert each)", s.models.len()),
                ));
            }
            for (i, id) in s.models.iter().enumerate() {
                if models.get(id).is_some_and(|m| !moe_experts(m).is_empty()) {
                    return Err(ApiError::field(
                        &format!("spec.models[{i}]"),
                        format!("checkpoint {id} is already an MoE; moerge takes dense models"),
                    ));
                }
            }
        }
        JobSpec::Route(s) => {
            over_ctx("spec.context", s.context, &s.model)?;
            if let Some(m) = models.get(&s.model) {
                let experts = moe_experts(m);
                if experts.is_empty() {
                    return Err(ApiError::field(
                        "spec.model",
                        format!("checkpoint {} is not an MoE: route needs a MoErged model (run moerge first)", s.model),
                    ));
                }
                if let Some(e) = experts.iter().find(|&&e| e != s.domains.len()) {
                    return Err(ApiError::field(
                        "spec.domains",
                        format!(
                            "{} domains for a model with {e} experts in a layer: one domain per expert, in expert order",
                            s.domains.len()
                        ),
                    ));
                }
                let fewest = experts.iter().min().copied().unwrap_or(0);
                if let Some(k) = s.top_k.filter(|&k| k > fewest) {
                    return Err(ApiError::field(
                        "spec.top_k",
                        format!("{k} is more than the {fewest} experts of a layer"),
                    ));
                }
            }
        }
        JobSpec::Graft(s) => {
            for (field, id) in [("spec.base", &s.base), ("spec.instruct", &s.instruct)] {
                if models.get(id).is_some_and(|m| !moe_experts(m).is_empty()) {
                    return Err(ApiError::field(
                        field,
                        format!("checkpoint {id} is an MoE; the delta is taken between two dense models"),
                    ));
                }
            }
        }
        JobSpec::Merge(s) => {
            // Every model (and the base) must have the tensors of the first.
            let Some(first) = models.get(&s.models[0]) else { return Ok(()) };
            let others = s.models.iter().enumerate().skip(1).map(|(i, id)| (format!("spec.models[{i}]"), id));
            for (field, id) in others.chain(s.base.iter().map(|b| ("spec.base".to_string(), b))) {
                if let Some(why) = models.get(id).and_then(|m| tensor_mismatch(first, m)) {
                    return Err(ApiError::field(
                        &field,
                        format!(
                            "checkpoint {id} cannot be merged with checkpoint {} (spec.models[0]): {why}",
                            s.models[0]
                        ),
                    ));
                }
            }
        }
        JobSpec::Neurons(_) | JobSpec::Task(_) => {}
    }
    Ok(())
}

/// Refuses a spec that cannot fit this server: a train job's `devices`
/// above what its backend has ([`crate::cli::backend::device_count`]), or
/// whose [`moe_shared::train::memory_estimate`] (batch × sequence ×
/// vocabulary, parameters and optimizer state, activations) exceeds the
/// job memory limit (`--job-memory-limit`).
fn check_resources(
    st: &AppStateRef,
    backend: &str,
    spec: &JobSpec,
    models: &HashMap<String, ModelSummary>,
) -> Result<(), ApiError> {
    let JobSpec::Train(s) = spec else { return Ok(()) };
    if s.engine == Some(moe_shared::api::TrainEngine::Torch) {
        // Emitting the PyTorch job trains nothing here: it holds the f32
        // model once and streams the data (the job memory limit still
        // applies); `devices` only sizes the job's global batch.
        return Ok(());
    }
    let devices = s.devices.unwrap_or(1);
    let have = crate::cli::backend::device_count(backend);
    if devices > have {
        return Err(ApiError::field(
            "spec.devices",
            format!(
                "{devices} devices: the {backend} backend of this server has {have} (on the CPU every \"device\" \
                 would be one more copy of the model on the same cores)"
            ),
        ));
    }
    let Some(m) = models.get(&s.model) else { return Ok(()) };
    let params = m.moe.as_ref().map(|x| x.total_parameters).unwrap_or(m.parameters) as u64;
    let top_k = m.moe.as_ref().and_then(|x| x.top_k_per_layer.iter().flatten().max().copied()).unwrap_or(1) as u64;
    let (batch, seq) = (s.batch.unwrap_or(8) as u64, s.seq_len.unwrap_or(256) as u64);
    let need = moe_shared::train::memory_estimate(&m.config, params, top_k, batch, seq, devices as u64);
    if need > st.job_memory_limit {
        let field = if s.batch.is_some() || s.seq_len.is_none() { "spec.batch" } else { "spec.seq_len" };
        return Err(ApiError::field(
            field,
            format!(
                "batch {batch} x seq_len {seq} x vocabulary {} on {devices} device(s) needs about {} (weights, \
                 gradients and AdamW state of {params} parameters, logits, activations), more than this server's \
                 job memory limit of {}: lower batch or seq_len (grad_accum keeps the tokens per step)",
                m.config.vocab_size,
                super::limits::human(need),
                super::limits::human(st.job_memory_limit)
            ),
        ));
    }
    Ok(())
}

/// Experts of each MoE layer of a summarised model, read from the routers'
/// shapes (`[E, d]`; summaries list canonical names whatever the on-disk
/// layout, parsed by `moe_shared::layout::names`); empty for a dense model.
fn moe_experts(m: &ModelSummary) -> Vec<usize> {
    use moe_shared::layout::names::{parse, TensorRole};
    m.tensors
        .iter()
        .filter(|t| matches!(parse(&t.name), TensorRole::Router { .. }))
        .filter_map(|t| t.shape.first().copied())
        .collect()
}

/// How `b`'s tensors differ from `a`'s (names and shapes; dtypes may
/// differ), or `None` when they match.
fn tensor_mismatch(a: &ModelSummary, b: &ModelSummary) -> Option<String> {
    let shapes = |m: &ModelSummary| -> HashMap<String, Vec<usize>> {
        m.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect()
    };
    let (sa, sb) = (shapes(a), shapes(b));
    for t in &a.tensors {
        match sb.get(&t.name) {
            None => return Some(format!("it has no tensor `{}`", t.name)),
            Some(s) if *s != t.shape => {
                return Some(format!("tensor `{}` is {s:?}, expected {:?}", t.name, t.shape));
            }
            _ => {}
        }
    }
    b.tensors.iter().find(|t| !sa.contains_key(&t.name)).map(|t| format!("it has an extra tensor `{}`", t.name))
}

/// For a train job killed by the server: where a resume continues from
/// (its newest saved checkpoint, or the start); empty for other kinds.
fn checkpoint_note(dir: &Path, spec: &JobSpec) -> String {
    if !matches!(spec, JobSpec::Train(_)) {
        return String::new();
    }
    match moe_shared::train::checkpoint::latest_checkpoint(&dir.join("out")) {
        Some((step, _)) => format!("; a resume continues from its last checkpoint, step {step}"),
        None => "; it has no checkpoint yet: a resume starts over".to_string(),
    }
}

/// How long a cancelled job gets between SIGINT and SIGKILL: `serve
/// --cancel-grace-secs`, plus for a train job (which finishes its step,
/// then saves a checkpoint of the weights and the AdamW moments) two
/// steps at its measured pace and the checkpoint's size at a slow disk's
/// 50 MB/s.
async fn cancel_grace(st: &AppStateRef, job: &JobInfo) -> Duration {
    let base = Duration::from_secs(st.args.cancel_grace_secs);
    if !matches!(job.spec, JobSpec::Train(_)) {
        return base;
    }
    let step = job
        .progress
        .as_ref()
        .and_then(|p| Some(p.eta_s? / (p.steps.checked_sub(p.step).filter(|&n| n > 0)? as f64)))
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(0.0);
    // Weights (4 bytes) + two AdamW moments (8 bytes) per parameter.
    let bytes = job_parameters(st, job).await.saturating_mul(12);
    base + Duration::from_secs_f64(2.0 * step + bytes as f64 / 50e6)
}

/// Parameters of a train job's model, from its stored summary (0 when unknown).
async fn job_parameters(st: &AppStateRef, job: &JobInfo) -> u64 {
    let JobSpec::Train(s) = &job.spec else { return 0 };
    let id = s.model.clone();
    st.db
        .call(move |c| Ok(db::get_checkpoint(c, &id)?))
        .await
        .ok()
        .flatten()
        .and_then(|r| serde_json::from_str::<ModelSummary>(&r.summary).ok())
        .map(|m| m.moe.as_ref().map(|x| x.total_parameters).unwrap_or(m.parameters) as u64)
        .unwrap_or(0)
}

/// Removes the hidden temporary entries of a job's directory or its
/// output: the temporary directories of writers (a model `out/` is written
/// as `.out.tmp-PID` beside it, a train checkpoint as
/// `out/.checkpoint-N.tmp-PID`) that a killed attempt left behind.
fn remove_hidden_temporaries(out: &Path) {
    let Ok(rd) = std::fs::read_dir(out) else { return };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with('.') && n.contains(".tmp") {
            let p = e.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}

/// `text` with the absolute data directory replaced by `<data>` (job
/// errors are shown through the API).
fn hide_data_dir(st: &AppStateRef, text: &str) -> String {
    text.replace(&st.data.display().to_string(), "<data>")
}

/// Starts a task that waits for a worker slot and runs job `id`.
fn enqueue(st: AppStateRef, id: String) {
    tokio::spawn(async move {
        if let Err(e) = run_job(&st, &id).await {
            tracing::error!("job {id}: {}", e.body.error);
            let msg = hide_data_dir(&st, &e.body.error);
            let (idc, m2) = (id.clone(), msg.clone());
            let _ = st
                .db
                .call(move |c| {
                    c.execute(
                        "UPDATE jobs SET state = 'failed', error = ?2, pid = NULL, finished_at = ?3 \
                         WHERE id = ?1 AND state IN ('queued', 'running')",
                        rusqlite::params![idc, m2, now_ms()],
                    )?;
                    Ok(())
                })
                .await;
            st.jobs.emit(&id, JobEvent::State { state: JobState::Failed, error: Some(msg), output_checkpoint: None });
            st.jobs.finish(&id);
        }
    });
}

/// What a job's child process is told, and where its model lands.
struct Plan {
    argv: Vec<String>,
    /// Output model directory relative to the data dir.
    model_out: Option<String>,
    /// Whether stdout is the result (eval).
    stdout_result: bool,
}

/// A job's inputs as its child process sees them: paths relative to the
/// job's directory (its working directory).
struct JobDirInputs {
    /// Checkpoint id -> model path.
    models: HashMap<String, String>,
    /// The job's directory, where its datasets were linked.
    dir: PathBuf,
}

impl moe_shared::jobs::JobInputs for JobDirInputs {
    fn model(&self, id: &str) -> String {
        self.models.get(id).cloned().unwrap_or_default()
    }
    fn data(&self, d: &DataRef, heldout: bool) -> String {
        for ext in [".txt", ".jsonl", ".json"] {
            let rel = data_rel(d, heldout, ext);
            if self.dir.join(&rel).exists() {
                return rel;
            }
        }
        data_rel(d, heldout, ".txt")
    }
}

/// The command line of `job` ([`JobSpec::cli_args`], after `--backend`)
/// and where its output lands.
async fn plan(st: &AppStateRef, job: &JobInfo, resume: bool) -> AppResult<Plan> {
    // Input models by their path relative to the job's directory (the
    // child's working directory, `DATA/jobs/{id}`): the data directory is
    // then named neither in the command line shown in the job's log nor in
    // what the CLI records of its inputs (moerge's `sources`, route's
    // `source`, graft / merge summaries), which the API serves.
    let mut models: HashMap<String, String> = HashMap::new();
    for (field, id) in job.spec.checkpoints() {
        let row = resolve(st, &field, &id).await?;
        models.insert(id, model_path(Path::new("../.."), &row).display().to_string());
    }
    let inputs = JobDirInputs { models, dir: job_dir(st, &job.id) };
    let mut argv = vec![format!("--backend={}", job.backend)];
    argv.extend(job.spec.cli_args(&inputs, resume));
    Ok(Plan {
        argv,
        model_out: job.spec.output_model().map(|o| format!("jobs/{}/{o}", job.id)),
        stdout_result: job.spec.stdout_is_result(),
    })
}

async fn set_state(
    st: &AppStateRef,
    id: &str,
    sql: &'static str,
    params: Vec<rusqlite::types::Value>,
) -> AppResult<()> {
    let idc = id.to_string();
    st.db
        .call(move |c| {
            let mut p: Vec<rusqlite::types::Value> = vec![idc.into()];
            p.extend(params);
            c.execute(sql, rusqlite::params_from_iter(p))?;
            Ok(())
        })
        .await
}

enum Line {
    Out(String),
    Err(String),
}

async fn run_job(st: &AppStateRef, id: &str) -> AppResult<()> {
    let mut shutdown = st.jobs.shutdown.subscribe();
    let _permit = tokio::select! {
        p = st.jobs.sem.clone().acquire_owned() => p.map_err(|e| AppError::internal(e.to_string()))?,
        _ = shutdown.wait_for(|s| *s) => return Ok(()),
    };
    if *st.jobs.shutdown.borrow() {
        return Ok(());
    }
    let job = load(st, id).await?;
    if job.state != JobState::Queued {
        return Ok(());
    }
    let resume: bool = {
        let idc = id.to_string();
        st.db.call(move |c| Ok(c.query_row("SELECT resume FROM jobs WHERE id = ?1", [idc], |r| r.get(0))?)).await?
    };
    let plan = plan(st, &job, resume).await?;
    let dir = job_dir(st, id);
    // Writers' hidden temporary directories left by an earlier attempt
    // that was killed (a resumed train job writes beside them).
    remove_hidden_temporaries(&dir);
    remove_hidden_temporaries(&dir.join("out"));
    // queued -> running in one conditional statement: a cancel that won
    // (state already `cancelled`) leaves 0 rows changed and nothing starts.
    let run = st.jobs.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    st.jobs.with_live(id, |l| {
        l.pid = None;
        l.cancel = false;
        l.run = run;
        l.killed = None;
        l.memory = None;
    });
    let started = now_ms();
    let idc = id.to_string();
    let won = st
        .db
        .call(move |c| {
            Ok(c.execute(
                "UPDATE jobs SET state = 'running', pid = NULL, attempts = attempts + 1, started_at = ?2, \
                 finished_at = NULL, error = NULL WHERE id = ?1 AND state = 'queued'",
                rusqlite::params![idc, started as i64],
            )?)
        })
        .await?;
    if won != 1 {
        st.jobs.finish(id);
        return Ok(());
    }
    let log_path = dir.join("log.txt");
    let mut log = tokio::fs::OpenOptions::new().create(true).append(true).open(&log_path).await?;
    log.write_all(
        format!("--- start {} (attempt {}): moe-studio {}\n", now_ms(), job.attempts + 1, plan.argv.join(" "))
            .as_bytes(),
    )
    .await?;
    let mut cmd = tokio::process::Command::new(&st.jobs.exe);
    cmd.args(&plan.argv)
        .current_dir(&dir)
        .env(EXIT_WITH_PARENT_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Err(AppError::internal(format!("starting {}: {e}", st.jobs.exe.display()))),
    };
    // Held until the child exits: closing it tells the child to exit.
    let _stdin = child.stdin.take();
    let pid = child.id().unwrap_or(0);
    // A cancel that came after the transition but before the pid was known
    // set `cancel` and could not signal: do it now.
    let limit = st.job_memory_limit;
    let memory = super::limits::watch(pid, limit, &format!("moe-studio-job-{id}"));
    let cancel_early = st.jobs.with_live(id, |l| {
        l.pid = Some(pid);
        l.memory = Some(memory.clone());
        l.cancel
    });
    set_state(
        st,
        id,
        "UPDATE jobs SET pid = ?2, memory_current = 0, memory_peak = 0, memory_limit = ?3 WHERE id = ?1",
        vec![(pid as i64).into(), (limit as i64).into()],
    )
    .await?;
    if cancel_early {
        signal_group(pid, libc::SIGINT);
    }
    st.jobs.emit(id, JobEvent::State { state: JobState::Running, error: None, output_checkpoint: None });

    let (tx, mut rx) = mpsc::channel::<Line>(256);
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    let tx2 = tx.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(out).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if tx2.send(Line::Out(l)).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(err).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if tx.send(Line::Err(l)).await.is_err() {
                break;
            }
        }
    });
    let stage = match &job.spec {
        JobSpec::Train(s) => format!("train/{}", s.stage.name()),
        other => other.kind().to_string(),
    };
    let mut progress = job.progress.clone().unwrap_or_default();
    progress.stage = stage.clone();
    let mut stdout_buf = String::new();
    let mut tail: Vec<String> = Vec::new();
    let mut first: Option<(usize, Instant)> = None;
    let mut last_db = Instant::now() - Duration::from_secs(10);
    let mut memory_tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let line = tokio::select! {
            l = rx.recv() => match l {
                Some(l) => l,
                None => break,
            },
            _ = memory_tick.tick() => {
                st.jobs.emit(
                    id,
                    JobEvent::Memory(JobMemory {
                        current_bytes: memory.current(),
                        peak_bytes: memory.peak(),
                        limit_bytes: memory.limit,
                    }),
                );
                set_state(
                    st,
                    id,
                    "UPDATE jobs SET memory_current = ?2, memory_peak = ?3 WHERE id = ?1",
                    vec![(memory.current() as i64).into(), (memory.peak() as i64).into()],
                )
                .await?;
                continue;
            }
        };
        match line {
            Line::Out(l) => {
                if plan.stdout_result {
                    stdout_buf.push_str(&l);
                    stdout_buf.push('\n');
                    continue;
                }
                let v: Option<serde_json::Value> = serde_json::from_str(&l).ok();
                let step = v.as_ref().and_then(|v| v.get("step")).and_then(|s| s.as_u64());
                let loss = v.as_ref().and_then(|v| v.get("loss")).and_then(|s| s.as_f64());
                if let (Some(v), Some(step), Some(loss)) = (&v, step, loss) {
                    let step = step as usize;
                    let steps = v.get("steps").and_then(|s| s.as_u64()).unwrap_or(0) as usize;
                    let (s0, t0) = *first.get_or_insert((step.saturating_sub(1), Instant::now()));
                    let per = if step > s0 { t0.elapsed().as_secs_f64() / (step - s0) as f64 } else { 0.0 };
                    let per = if per > 0.0 { per } else { v.get("seconds").and_then(|s| s.as_f64()).unwrap_or(0.0) };
                    progress = Progress {
                        stage: stage.clone(),
                        step,
                        steps,
                        loss: Some(loss),
                        ce_loss: v.get("ce_loss").and_then(|s| s.as_f64()),
                        lr: v.get("lr").and_then(|s| s.as_f64()),
                        tokens_per_s: v.get("tokens_per_s").and_then(|s| s.as_f64()),
                        eta_s: Some(per * steps.saturating_sub(step) as f64),
                    };
                    st.jobs.emit(id, JobEvent::Progress(progress.clone()));
                    if last_db.elapsed() >= Duration::from_millis(500) || step == steps {
                        last_db = Instant::now();
                        let p = serde_json::to_string(&progress).unwrap_or_default();
                        set_state(st, id, "UPDATE jobs SET progress = ?2 WHERE id = ?1", vec![p.into()]).await?;
                    }
                } else {
                    log.write_all(l.as_bytes()).await?;
                    log.write_all(b"\n").await?;
                    st.jobs.emit(id, JobEvent::Log { line: l });
                }
            }
            Line::Err(l) => {
                log.write_all(l.as_bytes()).await?;
                log.write_all(b"\n").await?;
                tail.push(l.clone());
                if tail.len() > 8 {
                    tail.remove(0);
                }
                st.jobs.emit(id, JobEvent::Log { line: l });
            }
        }
    }
    let status = child.wait().await?;
    drop(_stdin);
    memory.stop();
    log.write_all(format!("--- exit {status}\n").as_bytes()).await?;
    log.flush().await?;
    let (cancelled, killed) = st.jobs.with_live(id, |l| {
        l.pid = None;
        (l.cancel, l.killed)
    });
    let killed = if memory.over_limit() {
        Some(Killed::Memory { peak: memory.peak().max(memory.limit), limit: memory.limit })
    } else {
        killed
    };
    let shutting_down = *st.jobs.shutdown.borrow();
    let p = serde_json::to_string(&progress).unwrap_or_default();
    let (state, error, output) = if status.success() && killed.is_none() {
        let mut res: Result<Option<String>, String> = Ok(None);
        if plan.stdout_result {
            let out = dir.join("out");
            tokio::fs::create_dir_all(&out).await?;
            tokio::fs::write(out.join("result.json"), &stdout_buf).await?;
        }
        if let Some(rel) = plan.model_out.clone() {
            let name = job.name.clone().unwrap_or_else(|| format!("{} {}", job.kind, &id[..8]));
            res = match register_dir(st, &rel, &name, Some(id.to_string()), &[]).await {
                Ok(row) => {
                    let cid = row.info.id.clone();
                    st.db.call(move |c| db::insert_checkpoint(c, &row).map_err(AppError::from)).await?;
                    Ok(Some(cid))
                }
                Err(e) => Err(format!("the job's output is not a loadable model: {e}")),
            };
        }
        match res {
            Ok(cid) => (JobState::Succeeded, None, cid),
            Err(e) => (JobState::Failed, Some(hide_data_dir(st, &e)), None),
        }
    } else if let Some(Killed::Memory { peak, limit }) = killed {
        let how =
            if memory.enforced_by_cgroup() { "the kernel killed it (cgroup memory.max)" } else { "killed (SIGKILL)" };
        let msg = format!(
            "its memory reached {} (resident, anonymous + shared), over the job memory limit of {} \
             (serve --job-memory-limit): {how}{}",
            super::limits::human(peak),
            super::limits::human(limit),
            checkpoint_note(&dir, &job.spec),
        );
        (JobState::Failed, Some(msg), None)
    } else if cancelled {
        let error = match killed {
            Some(Killed::Grace(g)) => Some(format!(
                "it did not stop within {:.0} s of the cancel's SIGINT and was killed (SIGKILL) before it saved a \
                 checkpoint{}",
                g.as_secs_f64(),
                checkpoint_note(&dir, &job.spec),
            )),
            _ => None,
        };
        (JobState::Cancelled, error, None)
    } else if shutting_down {
        (JobState::Interrupted, Some("the server stopped while this job ran".to_string()), None)
    } else {
        let errs: Vec<&String> = tail.iter().filter(|l| l.starts_with("error")).collect();
        let msg = if errs.is_empty() {
            tail.join("\n")
        } else {
            errs.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        };
        (JobState::Failed, Some(hide_data_dir(st, &format!("{msg} ({status})"))), None)
    };
    set_state(
        st,
        id,
        "UPDATE jobs SET memory_current = 0, memory_peak = ?2 WHERE id = ?1",
        vec![(memory.peak() as i64).into()],
    )
    .await?;
    set_state(
        st,
        id,
        "UPDATE jobs SET state = ?2, error = ?3, output_checkpoint = ?4, progress = ?5, pid = NULL, resume = 0, finished_at = ?6 WHERE id = ?1",
        vec![
            state.as_str().to_string().into(),
            error.clone().map(Into::into).unwrap_or(rusqlite::types::Value::Null),
            output.clone().map(Into::into).unwrap_or(rusqlite::types::Value::Null),
            p.into(),
            (now_ms() as i64).into(),
        ],
    )
    .await?;
    st.jobs.emit(id, JobEvent::State { state, error, output_checkpoint: output });
    st.jobs.finish(id);
    Ok(())
}

/// At start-up: jobs left `running` by a dead server become `interrupted`
/// (a surviving child is killed first); queued jobs are queued again;
/// with `--auto-resume` interrupted train jobs too.
///
/// # Errors
/// Database errors.
pub async fn recover(st: &AppStateRef) -> AppResult<()> {
    let running: Vec<(String, Option<i64>)> = st
        .db
        .call(|c| {
            let mut s = c.prepare("SELECT id, pid FROM jobs WHERE state = 'running'")?;
            let v = s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
        .await?;
    for (id, pid) in &running {
        if let Some(pid) = pid.map(|p| p as u32) {
            // The pid may have been reused since: only a process working in
            // this job's directory is the job's (its command line need not
            // name the job).
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
            if pid_alive(pid) && cwd.is_some_and(|c| c == job_dir(st, id)) {
                tracing::warn!("job {id}: killing its process {pid} left by the previous server");
                signal_group(pid, libc::SIGKILL);
                for _ in 0..100 {
                    if !pid_alive(pid) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        set_state(
            st,
            id,
            "UPDATE jobs SET state = 'interrupted', pid = NULL, error = 'the server stopped while this job ran', finished_at = ?2 WHERE id = ?1",
            vec![(now_ms() as i64).into()],
        )
        .await?;
        tracing::info!("job {id}: interrupted by the previous server's stop");
    }
    // No job runs yet: every hidden writer temporary under a job's output
    // was left by a killed attempt.
    if let Ok(rd) = std::fs::read_dir(st.data.join("jobs")) {
        for e in rd.flatten() {
            remove_hidden_temporaries(&e.path());
            remove_hidden_temporaries(&e.path().join("out"));
        }
    }
    if st.args.auto_resume {
        for (id, _) in &running {
            let job = load(st, id).await?;
            if matches!(job.spec, JobSpec::Train(_)) {
                requeue(st, &job).await?;
            }
        }
    }
    let queued: Vec<String> = st
        .db
        .call(|c| {
            let mut s = c.prepare("SELECT id FROM jobs WHERE state = 'queued' ORDER BY seq")?;
            let v = s.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
            Ok(v)
        })
        .await?;
    for id in queued {
        enqueue(st.clone(), id);
    }
    Ok(())
}

/// Marks the pool as stopping (queued jobs stay queued for the next start,
/// event streams end) and sends SIGINT to every running job once.
pub fn begin_shutdown(st: &AppStateRef) {
    if st.jobs.shutdown.send_replace(true) {
        return;
    }
    for pid in st.jobs.live_pids() {
        signal_group(pid, libc::SIGINT);
    }
}

/// Stops the pool: SIGINT to every running job (train saves a
/// checkpoint), then waits up to 20 s for them to be recorded `interrupted`.
pub async fn shutdown(st: &AppStateRef) {
    begin_shutdown(st);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let running: i64 = st
            .db
            .call(|c| Ok(c.query_row("SELECT count(*) FROM jobs WHERE state = 'running'", [], |r| r.get(0))?))
            .await
            .unwrap_or(0);
        if running == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for pid in st.jobs.live_pids() {
        signal_group(pid, libc::SIGKILL);
    }
}

/// Queues `job` again: a train job continues from its newest checkpoint
/// (when there is one), anything else starts over in a clean output.
async fn requeue(st: &AppStateRef, job: &JobInfo) -> AppResult<()> {
    let out = job_dir(st, &job.id).join("out");
    let resume =
        matches!(job.spec, JobSpec::Train(_)) && moe_shared::train::checkpoint::latest_checkpoint(&out).is_some();
    if !resume && out.exists() {
        tokio::fs::remove_dir_all(&out).await?;
    }
    remove_hidden_temporaries(&out);
    remove_hidden_temporaries(&job_dir(st, &job.id));
    let idc = job.id.clone();
    let changed = st
        .db
        .call(move |c| {
            Ok(c.execute(
                "UPDATE jobs SET state = 'queued', resume = ?2, error = NULL, finished_at = NULL \
                 WHERE id = ?1 AND state IN ('interrupted', 'cancelled', 'failed')",
                rusqlite::params![idc, resume as i64],
            )?)
        })
        .await?;
    if changed == 0 {
        return Err(AppError::conflict(Some("id"), format!("job {} is {}", job.id, job.state.as_str())));
    }
    st.jobs.emit(&job.id, JobEvent::State { state: JobState::Queued, error: None, output_checkpoint: None });
    enqueue(st.clone(), job.id.clone());
    Ok(())
}

/// `GET /api/jobs`.
pub async fn list(State(st): State<AppStateRef>) -> AppResult<Json<Vec<JobInfo>>> {
    let v = st
        .db
        .call(|c| {
            let mut s = c.prepare(&format!("SELECT {JOB_COLS} FROM jobs ORDER BY seq DESC"))?;
            let v = s.query_map([], db::job_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
        .await?;
    Ok(Json(v))
}

/// `GET /api/jobs/{id}`.
pub async fn get_one(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<JobInfo>> {
    let id = parse_id("id", &id)?;
    let mut job = load(&st, &id).await?;
    if job.state == JobState::Running {
        // The live measurement rather than the last one written (every second).
        job.memory = st.jobs.memory(&id).or(job.memory);
    }
    Ok(Json(job))
}

/// `POST /api/jobs/{id}/cancel`.
pub async fn cancel(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<JobInfo>> {
    let id = parse_id("id", &id)?;
    let job = load(&st, &id).await?;
    let mut state = job.state;
    if state == JobState::Queued {
        // queued -> cancelled in one conditional statement; when it changes
        // nothing, the worker took the job first (queued -> running, also
        // conditional) and it is cancelled as a running job below.
        let idc = id.clone();
        let n = st
            .db
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE jobs SET state = 'cancelled', finished_at = ?2 WHERE id = ?1 AND state = 'queued'",
                    rusqlite::params![idc, now_ms()],
                )?)
            })
            .await?;
        if n == 1 {
            st.jobs.emit(&id, JobEvent::State { state: JobState::Cancelled, error: None, output_checkpoint: None });
            st.jobs.finish(&id);
            return Ok(Json(load(&st, &id).await?));
        }
        state = load(&st, &id).await?.state;
    }
    match state {
        JobState::Running => {
            // `cancel` is set under the same lock the worker takes to record
            // the pid: either the pid is known here, or the worker sees the
            // flag right after spawning and sends the SIGINT itself.
            let pid = st.jobs.with_live(&id, |l| {
                l.cancel = true;
                l.pid
            });
            if let Some(pid) = pid {
                signal_group(pid, libc::SIGINT);
            }
            let run = st.jobs.with_live(&id, |l| l.run);
            let grace = cancel_grace(&st, &job).await;
            let st2 = st.clone();
            let id2 = id.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                let pid = st2
                    .jobs
                    .if_live(&id2, |l| match l.pid {
                        Some(pid) if l.run == run && l.cancel => {
                            l.killed = Some(Killed::Grace(grace));
                            Some(pid)
                        }
                        _ => None,
                    })
                    .flatten();
                if let Some(pid) = pid {
                    signal_group(pid, libc::SIGKILL);
                }
            });
        }
        s => return Err(AppError::conflict(Some("id"), format!("job {id} is already {}", s.as_str()))),
    }
    Ok(Json(load(&st, &id).await?))
}

/// `POST /api/jobs/{id}/resume`.
pub async fn resume(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<JobInfo>> {
    let id = parse_id("id", &id)?;
    let job = load(&st, &id).await?;
    if !matches!(job.state, JobState::Interrupted | JobState::Cancelled | JobState::Failed) {
        return Err(AppError::conflict(
            Some("id"),
            format!("job {id} is {}; only interrupted, cancelled or failed jobs resume", job.state.as_str()),
        ));
    }
    // Its input models must still exist (422 naming the spec field).
    for (field, cid) in job.spec.checkpoints() {
        resolve(&st, &field, &cid).await.map_err(|mut e| {
            e.body.error = format!("{}: it was deleted, so job {id} cannot resume", e.body.error);
            e
        })?;
    }
    requeue(&st, &job).await?;
    Ok(Json(load(&st, &id).await?))
}

/// `GET /api/jobs/{id}/events`: server-sent events (see [`JobEvent`]).
pub async fn events(
    State(st): State<AppStateRef>,
    P(id): P<String>,
) -> AppResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let id = parse_id("id", &id)?;
    let job = load(&st, &id).await?;
    let rx = (!job.state.is_terminal()).then(|| st.jobs.with_live(&id, |l| l.tx.subscribe()));
    let job = if rx.is_some() { load(&st, &id).await? } else { job };
    let mut initial = vec![JobEvent::State {
        state: job.state,
        error: job.error.clone(),
        output_checkpoint: job.output_checkpoint.clone(),
    }];
    if let Some(p) = job.progress.clone() {
        initial.push(JobEvent::Progress(p));
    }
    let done = job.state.is_terminal();
    let shutdown = st.jobs.shutdown.subscribe();
    let live = stream::unfold((rx, done, shutdown), |(rx, done, mut shutdown)| async move {
        let mut rx = rx?;
        if done || *shutdown.borrow() {
            return None;
        }
        loop {
            tokio::select! {
                r = rx.recv() => match r {
                    Ok(ev) => {
                        let end = matches!(&ev, JobEvent::State { state, .. } if state.is_terminal());
                        return Some((ev, (Some(rx), end, shutdown)));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                _ = shutdown.changed() => return None,
            }
        }
    });
    let s = stream::iter(initial).chain(live).map(|ev| {
        Ok::<_, Infallible>(Event::default().event(ev.name()).json_data(&ev).unwrap_or_else(|_| Event::default()))
    });
    Ok(Sse::new(s).keep_alive(KeepAlive::default()))
}

/// `GET /api/jobs/{id}/metrics`: the lines of a train job's `metrics.jsonl`.
pub async fn metrics(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<Vec<serde_json::Value>>> {
    let id = parse_id("id", &id)?;
    load(&st, &id).await?;
    let p = job_dir(&st, &id).join("out/metrics.jsonl");
    let text = tokio::fs::read_to_string(&p).await.unwrap_or_default();
    Ok(Json(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()))
}

/// `GET /api/jobs/{id}/log`.
pub async fn log(State(st): State<AppStateRef>, P(id): P<String>, req: Request) -> AppResult<Response> {
    let id = parse_id("id", &id)?;
    load(&st, &id).await?;
    let p = job_dir(&st, &id).join("log.txt");
    if !p.exists() {
        return Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], "").into_response());
    }
    serve_file(p, req).await
}

/// Files under `root`, as `/`-separated relative paths (hidden entries,
/// such as unfinished writers' temporary directories, skipped).
fn walk(root: &Path) -> Vec<FileInfo> {
    fn go(root: &Path, rel: &str, out: &mut Vec<FileInfo>) {
        let Ok(rd) = std::fs::read_dir(root.join(rel)) else { return };
        let mut es: Vec<_> = rd.flatten().collect();
        es.sort_by_key(|e| e.file_name());
        for e in es {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with('.') {
                continue;
            }
            let r = if rel.is_empty() { n } else { format!("{rel}/{n}") };
            match e.file_type() {
                Ok(t) if t.is_dir() => go(root, &r, out),
                Ok(t) if t.is_file() => {
                    out.push(FileInfo { name: r, size: e.metadata().map(|m| m.len()).unwrap_or(0), sha256: None })
                }
                _ => {}
            }
        }
    }
    let mut v = Vec::new();
    go(root, "", &mut v);
    v
}

/// `GET /api/jobs/{id}/artifacts`.
pub async fn artifacts(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<Vec<FileInfo>>> {
    let id = parse_id("id", &id)?;
    load(&st, &id).await?;
    let root = job_dir(&st, &id).join("out");
    Ok(Json(tokio::task::spawn_blocking(move || walk(&root)).await.map_err(|e| AppError::internal(e.to_string()))?))
}

/// `GET /api/jobs/{id}/artifacts/{*path}`: only a path of the listing.
pub async fn artifact(
    State(st): State<AppStateRef>,
    P((id, path)): P<(String, String)>,
    req: Request,
) -> AppResult<Response> {
    let id = parse_id("id", &id)?;
    load(&st, &id).await?;
    let root = job_dir(&st, &id).join("out");
    let r2 = root.clone();
    let list = tokio::task::spawn_blocking(move || walk(&r2)).await.map_err(|e| AppError::internal(e.to_string()))?;
    let f = list
        .into_iter()
        .find(|f| f.name == path)
        .ok_or_else(|| AppError::not_found("path", format!("artefact `{path}` of job {id}")))?;
    serve_file(root.join(&f.name), req).await
}
