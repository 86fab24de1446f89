//! Running jobs: the queue (a bounded pool of workers), each job's child
//! process from start to its recorded end (log, progress, memory, cancel and
//! kill, registering its output), and recovery and shutdown of the pool.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use moe_shared::api::{DataRef, JobEvent, JobInfo, JobMemory, JobSpec, JobState, ModelSummary};
use moe_shared::jobs::{JobFile, JOB_FILE};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::progress::{job_stage, StepReader};
use super::{data_rel, job_dir, load, pid_alive, signal_group, Killed, EXIT_WITH_PARENT_ENV};
use crate::server::checkpoints::{model_path, register_dir, resolve};
use crate::server::db::{self, now_ms};
use crate::server::error::{AppError, AppResult};
use crate::server::AppStateRef;

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

/// The ids of the jobs in `state`, in submission order.
async fn ids_in_state(st: &AppStateRef, state: &'static str) -> AppResult<Vec<String>> {
    st.db
        .call(move |c| {
            let mut s = c.prepare("SELECT id FROM jobs WHERE state = ?1 ORDER BY seq")?;
            let v = s.query_map([state], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
            Ok(v)
        })
        .await
}

/// Stops a job's memory watch ([`crate::server::limits::Watch::stop`])
/// when dropped.
struct StopWatch(std::sync::Arc<crate::server::limits::Watch>);

impl Drop for StopWatch {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// How long a cancelled job gets between SIGINT and SIGKILL: `serve
/// --cancel-grace-secs`, plus for a train job (which finishes its step,
/// then saves a checkpoint of the weights and the AdamW moments) two
/// steps at its measured pace and the checkpoint's size at a slow disk's
/// 50 MB/s.
pub(super) async fn cancel_grace(st: &AppStateRef, job: &JobInfo) -> Duration {
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
pub(super) fn enqueue(st: AppStateRef, id: String) {
    tokio::spawn(async move {
        let (job, run, _permit) = match claim_job(&st, &id).await {
            Ok(Some(c)) => c,
            Ok(None) => return,
            // Before the claim nothing of the job was touched (another task may be running it).
            Err(e) => return tracing::error!("job {id}: {}", e.body.error),
        };
        if let Err(e) = run_job(&st, &id, job, run).await {
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
            st.jobs.release(&id, run);
        }
    });
}

/// Waits for a worker slot and claims job `id` when it is still queued:
/// the job, the claim's run number (released by [`Runner::release`] when the
/// job's end is recorded) and the slot. `None` when the job is no longer
/// queued, another task holds it, or the server is stopping.
///
/// Claimed before anything is touched: a second task for this job (a resume
/// while this one waited for a worker, two workers) leaves here, before it
/// could remove the first's temporaries or reset its live state.
async fn claim_job(st: &AppStateRef, id: &str) -> AppResult<Option<(JobInfo, u64, tokio::sync::OwnedSemaphorePermit)>> {
    let mut shutdown = st.jobs.shutdown.subscribe();
    let permit = tokio::select! {
        p = st.jobs.sem.clone().acquire_owned() => p.map_err(|e| AppError::internal(e.to_string()))?,
        _ = shutdown.wait_for(|s| *s) => return Ok(None),
    };
    if *st.jobs.shutdown.borrow() {
        return Ok(None);
    }
    let job = load(st, id).await?;
    if job.state != JobState::Queued {
        return Ok(None);
    }
    let run = st.jobs.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(st.jobs.claim(id, run).then_some((job, run, permit)))
}

/// What a job's child process is told, and where its model lands.
struct Plan {
    argv: Vec<String>,
    /// Output model directory relative to the data dir.
    model_out: Option<String>,
    /// Whether stdout is the result (eval).
    stdout_result: bool,
}

/// Where dataset `d`'s file (its held-out file when `heldout`) was linked
/// in the job's directory `dir`, relative to it.
fn data_path(dir: &Path, d: &DataRef, heldout: bool) -> String {
    for ext in [".txt", ".jsonl", ".json"] {
        let rel = data_rel(d, heldout, ext);
        if dir.join(&rel).exists() {
            return rel;
        }
    }
    data_rel(d, heldout, ".txt")
}

/// Writes `job`'s job file ([`JobFile`]: the spec, the backend, and each
/// input as a path relative to the job's directory) as `job.json` in that
/// directory, and returns the command that runs it (`run-job job.json`)
/// and where its output lands.
async fn plan(st: &AppStateRef, job: &JobInfo, resume: bool) -> AppResult<Plan> {
    // Input models by their path relative to the job's directory (the
    // child's working directory, `DATA/jobs/{id}`): the data directory is
    // then named neither in the job file nor in what the CLI records of
    // its inputs (moerge's `sources`, route's `source`, graft / merge
    // summaries), which the API serves.
    let mut models = BTreeMap::new();
    for (field, id) in job.spec.checkpoints() {
        let row = resolve(st, &field, &id).await?;
        models.insert(id, model_path(Path::new("../.."), &row).display().to_string());
    }
    let dir = job_dir(st, &job.id);
    let mut data = BTreeMap::new();
    for f in job.spec.data_files() {
        data.insert(JobFile::data_key(f.data, f.heldout), data_path(&dir, f.data, f.heldout));
    }
    let file = JobFile { backend: job.backend.clone(), spec: job.spec.clone(), resume, models, data };
    let text = serde_json::to_string_pretty(&file).map_err(|e| AppError::internal(e.to_string()))?;
    // Whole or not at all: written beside, then renamed.
    let tmp = dir.join(format!(".{JOB_FILE}.tmp"));
    tokio::fs::write(&tmp, text).await?;
    tokio::fs::rename(&tmp, dir.join(JOB_FILE)).await?;
    Ok(Plan {
        argv: vec!["run-job".to_string(), JOB_FILE.to_string()],
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

/// Runs job `id`, claimed for run `run` by [`claim_job`]: queued -> running,
/// the child process, its recorded end; releases the claim on every `Ok`
/// path (on `Err`, [`enqueue`] records the job failed and releases it).
async fn run_job(st: &AppStateRef, id: &str, job: JobInfo, run: u64) -> AppResult<()> {
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
    let started = now_ms();
    let idc = id.to_string();
    let won = st
        .db
        .call(move |c| {
            Ok(c.execute(
                "UPDATE jobs SET state = 'running', pid = NULL, cancel_requested_at = NULL, attempts = attempts + 1, started_at = ?2, \
                 finished_at = NULL, error = NULL WHERE id = ?1 AND state = 'queued'",
                rusqlite::params![idc, started as i64],
            )?)
        })
        .await?;
    if won != 1 {
        st.jobs.release(id, run);
        // Cancelled while this task prepared, then resumed before it lost the start: the
        // resume's own task left because this one held the claim, so it is queued again.
        if load(st, id).await?.state == JobState::Queued {
            enqueue(st.clone(), id.to_string());
        }
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
    let limit = st.job_memory_limit;
    let memory = crate::server::limits::watch(pid, limit, &format!("moe-studio-job-{id}"));
    // Stopped however this function leaves (an error after the spawn
    // included): a watch left polling a dead pid could, without a cgroup,
    // SIGKILL a later process group that reuses it.
    let _stop_watch = StopWatch(memory.clone());
    // A cancel that came after the transition but before the pid was known, or a server stop
    // whose SIGINT pass ran before it: this run's one SIGINT is sent here (decided under the
    // lock both of those take, so it is sent once).
    let signal_now = st.jobs.with_live(id, |l| {
        l.pid = Some(pid);
        l.memory = Some(memory.clone());
        let now = (l.cancel || *st.jobs.shutdown.borrow()) && !l.interrupted;
        l.interrupted |= now;
        now
    });
    // Before the database write below: a run marked signalled gets its signal even if that
    // write fails.
    if signal_now {
        signal_group(pid, libc::SIGINT);
    }
    set_state(
        st,
        id,
        "UPDATE jobs SET pid = ?2, memory_current = 0, memory_peak = 0, memory_limit = ?3 WHERE id = ?1",
        vec![(pid as i64).into(), (limit as i64).into()],
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
    let stage = job_stage(&job.spec);
    let mut progress = job.progress.clone().unwrap_or_default();
    progress.stage = stage.clone();
    let mut steps_read = StepReader::new(stage);
    let mut stdout_buf = String::new();
    let mut tail: Vec<String> = Vec::new();
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
                if let Some(p) = steps_read.read(&l) {
                    progress = p;
                    let (step, steps) = (progress.step, progress.steps);
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
            crate::server::limits::human(peak),
            crate::server::limits::human(limit),
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
    st.jobs.release(id, run);
    Ok(())
}

/// At start-up: jobs left `running` by a dead server become `interrupted`
/// (a surviving child is killed first); queued jobs are queued again;
/// with `--auto-resume` every interrupted train job too (a dead server's,
/// and those a clean stop recorded `interrupted`).
///
/// # Errors
/// Database errors.
pub async fn recover(st: &AppStateRef) -> AppResult<()> {
    let running: Vec<(String, Option<i64>, Option<i64>)> = st
        .db
        .call(|c| {
            let mut s = c.prepare("SELECT id, pid, cancel_requested_at FROM jobs WHERE state = 'running'")?;
            let v =
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
        .await?;
    for (id, pid, cancel_requested) in &running {
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
        if cancel_requested.is_some() {
            // The user had cancelled it; the server stopped before the job's end was recorded.
            set_state(
                st,
                id,
                "UPDATE jobs SET state = 'cancelled', pid = NULL, error = 'cancelled; the server stopped before the \
                 job had finished stopping', finished_at = ?2 WHERE id = ?1",
                vec![(now_ms() as i64).into()],
            )
            .await?;
            tracing::info!("job {id}: cancelled (its cancel was requested before the previous server stopped)");
            continue;
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
    for id in ids_in_state(st, "queued").await? {
        enqueue(st.clone(), id);
    }
    if st.args.auto_resume {
        // Every interrupted train job: those a dead server left running
        // (just marked) and those a clean stop recorded `interrupted`
        // itself. After the queued ones, so that `requeue` (which enqueues)
        // gives none of them a second task.
        for id in &ids_in_state(st, "interrupted").await? {
            let job = load(st, id).await?;
            if matches!(job.spec, JobSpec::Train(_)) {
                tracing::info!("job {id}: resumed at start (--auto-resume)");
                requeue(st, &job).await?;
            }
        }
    }
    Ok(())
}

/// Marks the pool as stopping (queued jobs stay queued for the next start,
/// event streams end) and sends SIGINT to every running job that has not
/// had one (from a cancel; a second SIGINT would stop `train` without its
/// checkpoint).
pub fn begin_shutdown(st: &AppStateRef) {
    if st.jobs.shutdown.send_replace(true) {
        return;
    }
    for pid in st.jobs.take_uninterrupted_pids() {
        signal_group(pid, libc::SIGINT);
    }
}

/// Stops the pool: SIGINT to every running job (train saves a
/// checkpoint), then waits for them to be recorded `interrupted`: 20 s, or
/// the longest [`cancel_grace`] of a running job when longer (a large
/// model's checkpoint takes minutes to write), then SIGKILL.
pub async fn shutdown(st: &AppStateRef) {
    begin_shutdown(st);
    let mut wait = Duration::from_secs(20);
    for id in &ids_in_state(st, "running").await.unwrap_or_default() {
        if let Ok(job) = load(st, id).await {
            wait = wait.max(cancel_grace(st, &job).await);
        }
    }
    let deadline = Instant::now() + wait;
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
pub(super) async fn requeue(st: &AppStateRef, job: &JobInfo) -> AppResult<()> {
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
