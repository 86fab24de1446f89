//! The SQLite registry (`DATA_DIR/studio.db`): uploads, checkpoints and
//! jobs. Migrations are the SQL files of `backend/migrations/`, applied in
//! order at start up to `PRAGMA user_version`.
//!
//! `rusqlite::Connection` is not `Sync`: one connection behind a mutex, and
//! every query runs on tokio's blocking pool through [`Db::call`].

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use rusqlite::{Connection, OptionalExtension, Row};

use moe_shared::api::{CheckpointInfo, FileInfo, JobInfo, JobMemory, JobState, UploadState, UploadStatus};

use super::error::AppError;

/// The migrations, in order; migration `i` brings `user_version` to `i + 1`.
const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init.sql", include_str!("../../migrations/0001_init.sql")),
    ("0002_job_memory.sql", include_str!("../../migrations/0002_job_memory.sql")),
    ("0003_job_cancel.sql", include_str!("../../migrations/0003_job_cancel.sql")),
];

/// A shared handle on the database.
#[derive(Clone)]
pub struct Db(Arc<Mutex<Connection>>);

impl Db {
    /// Opens (creating) the database at `path` and applies pending migrations.
    ///
    /// # Errors
    /// Open, pragma and migration failures, naming the file or migration.
    pub fn open(path: &Path) -> anyhow::Result<Db> {
        let mut c = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
        c.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;")
            .with_context(|| format!("{}: setting pragmas", path.display()))?;
        c.busy_timeout(std::time::Duration::from_secs(10))?;
        let version: usize = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > MIGRATIONS.len() {
            anyhow::bail!(
                "{}: schema version {version} is newer than this moe-studio knows ({}); use a newer build",
                path.display(),
                MIGRATIONS.len()
            );
        }
        for (i, (name, sql)) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = c.transaction()?;
            tx.execute_batch(sql).with_context(|| format!("{}: applying migration {name}", path.display()))?;
            tx.pragma_update(None, "user_version", i + 1)?;
            tx.commit()?;
        }
        Ok(Db(Arc::new(Mutex::new(c))))
    }

    /// Runs `f` on the connection on the calling thread (start-up only).
    pub fn blocking<R>(&self, f: impl FnOnce(&mut Connection) -> R) -> R {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// Runs `f` on the connection on the blocking pool.
    ///
    /// # Errors
    /// `f`'s error, as a 500 (or what `f` returned as an [`AppError`]).
    pub async fn call<R, F>(&self, f: F) -> Result<R, AppError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, AppError> + Send + 'static,
    {
        let c = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let mut g = c.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut g)
        })
        .await
        .map_err(|e| AppError::internal(format!("database task: {e}")))?
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

// ----- uploads ---------------------------------------------------------------

/// Columns read by [`upload_from_row`].
pub const UPLOAD_COLS: &str =
    "id, file_name, size, sha256, chunk_size, chunks_received, state, checkpoint_id, created_at";

/// An upload row (columns [`UPLOAD_COLS`]).
pub fn upload_from_row(r: &Row) -> rusqlite::Result<UploadStatus> {
    let size: u64 = r.get(2)?;
    let chunk_size: u64 = r.get(4)?;
    let chunks_received: u64 = r.get(5)?;
    let state: String = r.get(6)?;
    let state = match state.as_str() {
        "complete" => UploadState::Complete,
        "consumed" => UploadState::Consumed,
        _ => UploadState::Uploading,
    };
    Ok(UploadStatus {
        id: r.get(0)?,
        file_name: r.get(1)?,
        size,
        sha256: r.get(3)?,
        chunk_size,
        chunks_total: moe_shared::api::chunks_total(size, chunk_size),
        chunks_received,
        received_bytes: (chunks_received * chunk_size).min(size),
        state,
        checkpoint_id: r.get(7)?,
        created_at: r.get(8)?,
    })
}

/// One upload by id.
pub fn get_upload(c: &Connection, id: &str) -> rusqlite::Result<Option<UploadStatus>> {
    c.query_row(&format!("SELECT {UPLOAD_COLS} FROM uploads WHERE id = ?1"), [id], upload_from_row).optional()
}

// ----- checkpoints -----------------------------------------------------------

/// A checkpoint row plus where its model is on disk.
#[derive(Debug, Clone)]
pub struct CheckpointRow {
    /// The API view (without summary).
    pub info: CheckpointInfo,
    /// Directory relative to the data dir.
    pub dir: String,
    /// Model file inside `dir` ('' = the directory).
    pub entry: String,
    /// ModelSummary JSON.
    pub summary: String,
}

/// Columns read by [`checkpoint_from_row`].
pub const CHECKPOINT_COLS: &str =
    "id, name, dir, entry, format, parameters, architecture, summary, source_job, created_at";

fn checkpoint_from_row(r: &Row) -> rusqlite::Result<CheckpointRow> {
    let format: String = r.get(4)?;
    let format = serde_json::from_value(serde_json::Value::String(format))
        .unwrap_or(moe_shared::checkpoint::ModelFormat::Safetensors);
    Ok(CheckpointRow {
        info: CheckpointInfo {
            id: r.get(0)?,
            name: r.get(1)?,
            format,
            files: Vec::new(),
            source_job: r.get(8)?,
            parameters: r.get::<_, i64>(5)? as usize,
            architecture: r.get(6)?,
            created_at: r.get(9)?,
            summary: None,
        },
        dir: r.get(2)?,
        entry: r.get(3)?,
        summary: r.get(7)?,
    })
}

fn checkpoint_files(c: &Connection, id: &str) -> rusqlite::Result<Vec<FileInfo>> {
    let mut st = c.prepare("SELECT name, size, sha256 FROM checkpoint_files WHERE checkpoint_id = ?1 ORDER BY name")?;
    let rows = st.query_map([id], |r| Ok(FileInfo { name: r.get(0)?, size: r.get(1)?, sha256: r.get(2)? }))?;
    rows.collect()
}

/// One checkpoint (with files) by id.
pub fn get_checkpoint(c: &Connection, id: &str) -> rusqlite::Result<Option<CheckpointRow>> {
    let row = c
        .query_row(&format!("SELECT {CHECKPOINT_COLS} FROM checkpoints WHERE id = ?1"), [id], checkpoint_from_row)
        .optional()?;
    match row {
        Some(mut r) => {
            r.info.files = checkpoint_files(c, id)?;
            Ok(Some(r))
        }
        None => Ok(None),
    }
}

/// Every checkpoint (with files), oldest first.
pub fn list_checkpoints(c: &Connection) -> rusqlite::Result<Vec<CheckpointRow>> {
    let mut st = c.prepare(&format!("SELECT {CHECKPOINT_COLS} FROM checkpoints ORDER BY created_at, id"))?;
    let mut rows: Vec<CheckpointRow> = st.query_map([], checkpoint_from_row)?.collect::<rusqlite::Result<_>>()?;
    for r in &mut rows {
        r.info.files = checkpoint_files(c, &r.info.id)?;
    }
    Ok(rows)
}

/// Inserts a checkpoint and its files.
pub fn insert_checkpoint(c: &mut Connection, row: &CheckpointRow) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    let i = &row.info;
    let format = serde_json::to_value(i.format).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    tx.execute(
        &format!("INSERT INTO checkpoints ({CHECKPOINT_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
        rusqlite::params![
            i.id,
            i.name,
            row.dir,
            row.entry,
            format,
            i.parameters as i64,
            i.architecture,
            row.summary,
            i.source_job,
            i.created_at
        ],
    )?;
    for f in &i.files {
        tx.execute(
            "INSERT INTO checkpoint_files (checkpoint_id, name, size, sha256) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![i.id, f.name, f.size, f.sha256],
        )?;
    }
    tx.commit()
}

// ----- jobs ------------------------------------------------------------------

/// Columns read by [`job_from_row`].
pub const JOB_COLS: &str = "id, name, kind, spec, backend, state, error, progress, output_checkpoint, attempts, \
                            created_at, started_at, finished_at, memory_current, memory_peak, memory_limit";

/// A job row (columns [`JOB_COLS`]).
pub fn job_from_row(r: &Row) -> rusqlite::Result<JobInfo> {
    let spec: String = r.get(3)?;
    let spec = serde_json::from_str(&spec)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, Box::new(e)))?;
    let state: String = r.get(5)?;
    let progress: Option<String> = r.get(7)?;
    Ok(JobInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        kind: r.get(2)?,
        spec,
        backend: r.get(4)?,
        state: JobState::parse(&state).unwrap_or(JobState::Failed),
        error: r.get(6)?,
        progress: progress.and_then(|p| serde_json::from_str(&p).ok()),
        output_checkpoint: r.get(8)?,
        attempts: r.get(9)?,
        created_at: r.get(10)?,
        started_at: r.get(11)?,
        finished_at: r.get(12)?,
        memory: match (r.get::<_, Option<u64>>(13)?, r.get::<_, Option<u64>>(14)?, r.get::<_, Option<u64>>(15)?) {
            (c, Some(peak), Some(limit)) => {
                Some(JobMemory { current_bytes: c.unwrap_or(0), peak_bytes: peak, limit_bytes: limit })
            }
            _ => None,
        },
    })
}

/// One job by id.
pub fn get_job(c: &Connection, id: &str) -> rusqlite::Result<Option<JobInfo>> {
    c.query_row(&format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"), [id], job_from_row).optional()
}
