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
    ApiError, CreateJob, DataRef, FileInfo, JobEvent, JobInfo, JobSpec, JobState, ModelSummary, Progress, TrainStage,
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

/// Seconds a cancelled job gets to stop after SIGINT before SIGKILL.
const CANCEL_GRACE: Duration = Duration::from_secs(30);

struct Live {
    tx: broadcast::Sender<JobEvent>,
    pid: Option<u32>,
    cancel: bool,
}

/// The worker pool and the live state of running jobs.
pub struct Runner {
    sem: Arc<Semaphore>,
    live: Mutex<HashMap<String, Live>>,
    shutdown: watch::Sender<bool>,
    exe: PathBuf,
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
        })
    }

    fn with_live<R>(&self, id: &str, f: impl FnOnce(&mut Live) -> R) -> R {
        let mut m = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let l =
            m.entry(id.to_string()).or_insert_with(|| Live { tx: broadcast::channel(256).0, pid: None, cancel: false });
        f(l)
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
}

/// Sends `sig` to the process group led by `pid` (jobs run in their own group).
fn signal_group(pid: u32, sig: i32) {
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
    if let Some(n) = &req.name {
        if n.chars().count() > 200 || n.chars().any(|c| c.is_control()) {
            return Err(AppError::bad("name", "expected at most 200 printable characters"));
        }
    }
    let mut summaries: HashMap<String, ModelSummary> = HashMap::new();
    for (field, id) in req.spec.checkpoints() {
        let row = resolve(&st, &field, &id).await?;
        if let Ok(s) = serde_json::from_str::<ModelSummary>(&row.summary) {
            summaries.insert(id, s);
        }
    }
    check_against_models(&req.spec, &summaries)?;
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
            tokio::fs::write(dir.join("allocation.json"), body.to_string()).await?;
        }
    }
    let spec_json = serde_json::to_string(&req.spec).map_err(|e| AppError::internal(e.to_string()))?;
    tokio::fs::write(dir.join("spec.json"), &spec_json).await?;
    let kind = req.spec.kind().to_string();
    let (idc, name) = (id.clone(), req.name.clone());
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
        JobSpec::Neurons(_) => {}
    }
    Ok(())
}

/// Experts of each MoE layer of a summarised model, read from the routers'
/// shapes (`model.layers.{l}.block_sparse_moe.gate.weight`, `[E, d]` in both
/// MoE layouts); empty for a dense model.
fn moe_experts(m: &ModelSummary) -> Vec<usize> {
    m.tensors
        .iter()
        .filter(|t| t.name.starts_with("model.layers.") && t.name.ends_with(".block_sparse_moe.gate.weight"))
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
                        "UPDATE jobs SET state = 'failed', error = ?2, pid = NULL, finished_at = ?3 WHERE id = ?1",
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

fn opt<T: ToString>(argv: &mut Vec<String>, flag: &str, v: Option<T>) {
    if let Some(v) = v {
        // `--flag=value` so that negative numbers are not taken for flags.
        argv.push(format!("--{flag}={}", v.to_string()));
    }
}

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
    let m = |id: &String| models[id].clone();
    let data_arg = |d: &DataRef, heldout_ext: Option<&str>, dir: &Path| -> String {
        let find = |heldout: bool| -> String {
            for ext in [".txt", ".jsonl", ".json"] {
                let rel = data_rel(d, heldout, ext);
                if dir.join(&rel).exists() {
                    return rel;
                }
            }
            data_rel(d, heldout, ".txt")
        };
        let mut s = format!("{}={}", d.name, find(false));
        if heldout_ext.is_some() && d.heldout.is_some() {
            s.push(':');
            s.push_str(&find(true));
        }
        s
    };
    let dir = job_dir(st, &job.id);
    let rel_out = format!("jobs/{}/out", job.id);
    let mut a: Vec<String> = vec![format!("--backend={}", job.backend)];
    let mut model_out = Some(rel_out.clone());
    let mut stdout_result = false;
    match &job.spec {
        JobSpec::Train(s) => {
            a.extend(["train".into(), m(&s.model)]);
            let stage = match s.stage {
                TrainStage::Experts => "experts",
                TrainStage::Router => "router",
                TrainStage::Dense => "dense",
            };
            a.push(format!("--stage={stage}"));
            for d in &s.data {
                let mut x = data_arg(d, None, &dir);
                if let Some(w) = d.weight {
                    x.push_str(&format!(":{w}"));
                }
                if d.original {
                    x.push_str(":orig");
                }
                a.push(format!("--data={x}"));
            }
            a.push(format!("--steps={}", s.steps));
            opt(&mut a, "seq-len", s.seq_len);
            opt(&mut a, "batch", s.batch);
            opt(&mut a, "lr", s.lr);
            opt(&mut a, "warmup", s.warmup);
            opt(&mut a, "min-lr", s.min_lr);
            opt(&mut a, "grad-accum", s.grad_accum);
            opt(&mut a, "clip", s.clip);
            opt(&mut a, "alpha", s.alpha);
            opt(&mut a, "prior", s.prior);
            opt(&mut a, "weight-decay", s.weight_decay);
            a.push(format!("--save-every={}", s.save_every.unwrap_or((s.steps / 10).max(1))));
            opt(&mut a, "seed", s.seed);
            opt(&mut a, "devices", s.devices);
            a.extend(["--out=out".into(), "--json".into()]);
            if resume {
                a.push("--resume".into());
            }
            model_out = Some(format!("{rel_out}/final"));
        }
        JobSpec::Upcycle(s) => {
            a.extend(["upcycle".into(), m(&s.model)]);
            opt(&mut a, "experts", s.experts);
            if s.experts_per_layer.is_some() {
                a.push("--allocation=allocation.json".into());
            }
            opt(&mut a, "top-k", s.top_k);
            match &s.frozen {
                Some(f) if f.is_empty() => a.push("--no-frozen".into()),
                Some(f) => {
                    a.push(format!("--frozen={}", f.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")))
                }
                None => {}
            }
            opt(&mut a, "router-init", s.router_init.clone());
            opt(&mut a, "noise", s.noise);
            opt(&mut a, "seed", s.seed);
            opt(&mut a, "dtype", s.dtype.clone());
            a.extend(["--out=out".into(), "--json".into()]);
        }
        JobSpec::Moerge(s) => {
            a.push("moerge".into());
            a.extend(s.models.iter().map(m));
            opt(&mut a, "top-k", s.top_k);
            opt(&mut a, "seed", s.seed);
            opt(&mut a, "dtype", s.dtype.clone());
            a.extend(["--out=out".into(), "--json".into()]);
        }
        JobSpec::Route(s) => {
            a.extend(["route".into(), m(&s.model)]);
            for d in &s.domains {
                a.push(format!("--domain={}", data_arg(d, Some(""), &dir)));
            }
            opt(&mut a, "lambda", s.lambda);
            opt(&mut a, "top-k", s.top_k);
            opt(&mut a, "max-tokens", s.max_tokens);
            opt(&mut a, "context", s.context);
            a.extend(["--out=out".into(), "--json".into()]);
        }
        JobSpec::Graft(s) => {
            a.extend(["graft".into(), m(&s.target), format!("--base={}", m(&s.base))]);
            a.push(format!("--instruct={}", m(&s.instruct)));
            opt(&mut a, "scale", s.scale);
            a.extend(["--out=out".into(), "--json".into()]);
        }
        JobSpec::Merge(s) => {
            a.extend(["merge".into(), s.method.as_str().into()]);
            a.extend(s.models.iter().map(m));
            if let Some(w) = &s.weights {
                a.push(format!("--weights={}", w.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")));
            }
            if let Some(b) = &s.base {
                a.push(format!("--base={}", m(b)));
            }
            opt(&mut a, "density", s.density);
            opt(&mut a, "seed", s.seed);
            opt(&mut a, "dtype", s.dtype.clone());
            a.extend(["--out=out".into(), "--json".into()]);
        }
        JobSpec::Neurons(s) => {
            a.extend(["neurons".into(), m(&s.model)]);
            for d in &s.langs {
                a.push(format!("--lang={}", data_arg(d, None, &dir)));
            }
            if !s.new.is_empty() {
                a.push(format!("--new={}", s.new.join(",")));
            }
            opt(&mut a, "top-n", s.top_n);
            opt(&mut a, "max-texts", s.max_texts);
            opt(&mut a, "max-tokens", s.max_tokens);
            a.push("--out=out".into());
            model_out = None;
        }
        JobSpec::Eval(s) => {
            a.extend(["eval".into(), m(&s.model)]);
            for d in &s.data {
                a.push(format!("--data={}", data_arg(d, None, &dir)));
            }
            opt(&mut a, "window", s.window);
            opt(&mut a, "stride", s.stride);
            opt(&mut a, "max-tokens", s.max_tokens);
            opt(&mut a, "routing", s.routing.clone());
            a.push("--json".into());
            model_out = None;
            stdout_result = true;
        }
    }
    Ok(Plan { argv: a, model_out, stdout_result })
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
    st.jobs.with_live(id, |l| {
        l.pid = Some(pid);
        l.cancel = false;
    });
    let started = now_ms();
    set_state(
        st,
        id,
        "UPDATE jobs SET state = 'running', pid = ?2, attempts = attempts + 1, started_at = ?3, finished_at = NULL, error = NULL WHERE id = ?1",
        vec![(pid as i64).into(), (started as i64).into()],
    )
    .await?;
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
        JobSpec::Train(s) => format!(
            "train/{}",
            serde_json::to_value(s.stage).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
        ),
        other => other.kind().to_string(),
    };
    let mut progress = job.progress.clone().unwrap_or_default();
    progress.stage = stage.clone();
    let mut stdout_buf = String::new();
    let mut tail: Vec<String> = Vec::new();
    let mut first: Option<(usize, Instant)> = None;
    let mut last_db = Instant::now() - Duration::from_secs(10);
    while let Some(line) = rx.recv().await {
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
    log.write_all(format!("--- exit {status}\n").as_bytes()).await?;
    log.flush().await?;
    let cancelled = st.jobs.with_live(id, |l| {
        l.pid = None;
        l.cancel
    });
    let shutting_down = *st.jobs.shutdown.borrow();
    let p = serde_json::to_string(&progress).unwrap_or_default();
    let (state, error, output) = if status.success() {
        let mut res: Result<Option<String>, String> = Ok(None);
        if plan.stdout_result {
            let out = dir.join("out");
            tokio::fs::create_dir_all(&out).await?;
            tokio::fs::write(out.join("result.json"), &stdout_buf).await?;
        }
        if let Some(rel) = plan.model_out.clone() {
            let data = st.data.clone();
            let name = job.name.clone().unwrap_or_else(|| format!("{} {}", job.kind, &id[..8]));
            let jid = id.to_string();
            let r = tokio::task::spawn_blocking(move || register_dir(&data, &rel, &name, Some(jid), &[]))
                .await
                .map_err(|e| AppError::internal(e.to_string()))?;
            res = match r {
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
    } else if cancelled {
        (JobState::Cancelled, None, None)
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
    if let Ok(rd) = std::fs::read_dir(st.data.join("checkpoints")) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
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
    Ok(Json(load(&st, &id).await?))
}

/// `POST /api/jobs/{id}/cancel`.
pub async fn cancel(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<JobInfo>> {
    let id = parse_id("id", &id)?;
    let job = load(&st, &id).await?;
    match job.state {
        JobState::Queued => {
            let idc = id.clone();
            st.db
                .call(move |c| {
                    Ok(c.execute(
                        "UPDATE jobs SET state = 'cancelled', finished_at = ?2 WHERE id = ?1 AND state = 'queued'",
                        rusqlite::params![idc, now_ms()],
                    )?)
                })
                .await?;
            st.jobs.emit(&id, JobEvent::State { state: JobState::Cancelled, error: None, output_checkpoint: None });
            st.jobs.finish(&id);
        }
        JobState::Running => {
            let pid = st.jobs.with_live(&id, |l| {
                l.cancel = true;
                l.pid
            });
            if let Some(pid) = pid {
                signal_group(pid, libc::SIGINT);
                let st2 = st.clone();
                let id2 = id.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(CANCEL_GRACE).await;
                    if st2.jobs.with_live(&id2, |l| l.pid) == Some(pid) {
                        signal_group(pid, libc::SIGKILL);
                    }
                });
            }
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
