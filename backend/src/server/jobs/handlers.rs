//! The HTTP handlers of `/api/jobs`: submitting a job (with the checks that
//! need its input models and this server's resources), listing, cancelling
//! and resuming jobs, their event stream, metrics, log and artefacts.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use moe_shared::api::{ApiError, CreateJob, FileInfo, JobEvent, JobInfo, JobSpec, JobState, ModelSummary, UploadState};
use tokio::sync::broadcast;

use super::supervisor::{cancel_grace, enqueue, requeue};
use super::{data_ext, data_rel, job_dir, load, signal_group, Killed};
use crate::server::checkpoints::{resolve, serve_file, upload_unusable};
use crate::server::db::{self, get_job, get_upload, now_ms, JOB_COLS};
use crate::server::error::{parse_id, AppError, AppResult, J, P};
use crate::server::uploads::file_path;
use crate::server::AppStateRef;

/// `POST /api/jobs`.
pub async fn create(State(st): State<AppStateRef>, J(req): J<CreateJob>) -> AppResult<(StatusCode, Json<JobInfo>)> {
    req.spec.validate()?;
    let backend = match req.backend.as_deref() {
        None | Some("auto") => st.default_backend.clone(),
        // `ndarray` and `flex` are older / library names of the CPU backend.
        Some("cpu" | "ndarray" | "flex") => "cpu".to_string(),
        Some(b) => b.to_string(),
    };
    if !crate::server::backends().contains(&backend) {
        return Err(AppError::unprocessable(
            "backend",
            format!("`{backend}` is not built into this server (built: {})", crate::server::backends().join(", ")),
        ));
    }
    let name = match &req.name {
        Some(n) => Some(moe_shared::api::check_name("name", n).map_err(crate::server::checkpoints::bad_request)?),
        None => None,
    };
    let mut summaries: HashMap<String, ModelSummary> = HashMap::new();
    for (field, id) in req.spec.checkpoints() {
        let row = resolve(&st, &field, &id).await?;
        if let Ok(s) = serde_json::from_str::<ModelSummary>(&row.summary) {
            summaries.insert(id, s);
        }
    }
    req.spec.validate_against(&summaries)?;
    check_resources(&st, &backend, &req.spec, &summaries)?;
    // Datasets: each upload must be complete; hard-linked into the job so
    // that deleting the upload later cannot break a resume.
    let mut links: Vec<(PathBuf, String)> = Vec::new();
    for f in req.spec.data_files() {
        let uid = f.upload.to_string();
        let u2 = uid.clone();
        let u = st
            .db
            .call(move |c| get_upload(c, &u2).map_err(AppError::from))
            .await?
            .ok_or_else(|| AppError::unprocessable(&f.field, format!("upload {uid} not found")))?;
        if u.state != UploadState::Complete {
            return Err(AppError::unprocessable(&f.field, upload_unusable(&u)));
        }
        links.push((file_path(&st, &u), data_rel(f.data, f.heldout, data_ext(&u.file_name))));
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
    for (file, body) in req.spec.job_files() {
        tokio::fs::write(dir.join(file), body).await?;
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
    let devices = s.params.devices;
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
    let (batch, seq) = (s.params.batch as u64, s.params.seq_len as u64);
    let need = moe_shared::train::memory_estimate(&m.config, params, top_k, batch, seq, devices as u64);
    if need > st.job_memory_limit {
        // Name the one the user moved from its default (batch when both or neither).
        let d = moe_shared::ops::train::TrainParams::default();
        let field =
            if s.params.batch != d.batch || s.params.seq_len == d.seq_len { "spec.batch" } else { "spec.seq_len" };
        return Err(ApiError::field(
            field,
            format!(
                "batch {batch} x seq_len {seq} x vocabulary {} on {devices} device(s) needs about {} (weights, \
                 gradients and AdamW state of {params} parameters, logits, activations), more than this server's \
                 job memory limit of {}: lower batch or seq_len (grad_accum keeps the tokens per step)",
                m.config.vocab_size,
                crate::server::limits::human(need),
                crate::server::limits::human(st.job_memory_limit)
            ),
        ));
    }
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
            // (a task that has claimed it but not started it releases it when it loses the start)
            st.jobs.finish_unclaimed(&id);
            return Ok(Json(load(&st, &id).await?));
        }
        state = load(&st, &id).await?.state;
    }
    match state {
        JobState::Running => {
            let grace = cancel_grace(&st, &job).await;
            // Stored first (idempotent, and only while it runs): a server that dies before the
            // job's end is recorded makes it `cancelled` at the next start, not `interrupted`
            // (--auto-resume would run it again). A failed write leaves nothing marked, so the
            // user can cancel again.
            let idc = id.clone();
            st.db
                .call(move |c| {
                    Ok(c.execute(
                        "UPDATE jobs SET cancel_requested_at = ?2 WHERE id = ?1 AND state = 'running'",
                        rusqlite::params![idc, now_ms()],
                    )?)
                })
                .await?;
            // From here to the timer's spawn nothing awaits: this request cannot be dropped
            // between marking the run signalled and signalling it.
            // `cancel` is set under the same lock the worker takes to record
            // the pid: either the pid is known here, or the worker sees the
            // flag right after spawning and sends the SIGINT itself. No pid
            // either when a server stop has already sent the run its SIGINT.
            let Some((true, pid)) = st.jobs.mark_cancel(&id) else {
                // Already stopping (one SIGINT and one grace timer per run),
                // or it has just finished.
                return Ok(Json(load(&st, &id).await?));
            };
            if let Some(pid) = pid {
                signal_group(pid, libc::SIGINT);
            }
            // (`if_live`: a job that ended just now gets no new entry; its timer then matches nothing)
            let run = st.jobs.if_live(&id, |l| l.run).unwrap_or(u64::MAX);
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
