//! Checkpoints: completed uploads assembled into `checkpoints/{id}/` and
//! validated with the studio's loaders, or job outputs registered in place.

use std::path::{Path, PathBuf};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use moe_shared::api::{CheckpointInfo, CreateCheckpoint, FileInfo, ModelSummary, UploadState};
use moe_shared::checkpoint::open_model;
use tower::ServiceExt;
use tower_http::services::ServeFile;

use super::db::{self, get_checkpoint, get_upload, now_ms, CheckpointRow};
use super::error::{parse_id, AppError, AppResult, J, P};
use super::uploads::{file_path, sha256_file, upload_dir};
use super::AppStateRef;

/// The model path inside a checkpoint directory: the directory itself when
/// it has `config.json`, else its one `.gguf`, else its one llama2.c `.bin`
/// that is not a vocabulary. Returns the entry ('' for the directory).
///
/// # Errors
/// A sentence saying what was found and what is needed.
pub fn find_entry(dir: &Path) -> Result<String, String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    if names.iter().any(|n| n == "config.json") {
        return Ok(String::new());
    }
    let gguf: Vec<&String> = names.iter().filter(|n| n.ends_with(".gguf")).collect();
    if gguf.len() == 1 {
        return Ok(gguf[0].clone());
    }
    let bins: Vec<&String> =
        names.iter().filter(|n| n.ends_with(".bin") && !n.starts_with("tok") && *n != "tokenizer.bin").collect();
    if gguf.is_empty() && bins.len() == 1 {
        let has_vocab = names.iter().any(|n| n.ends_with(".bin") && (n.starts_with("tok") || n == "tokenizer.bin"));
        if !has_vocab {
            return Err(format!(
                "{} looks like a llama2.c checkpoint, which needs its tokenizer .bin (tok*.bin, e.g. tok512.bin): \
                 upload it and register both files together",
                bins[0]
            ));
        }
        return Ok(bins[0].clone());
    }
    if names.iter().any(|n| n.ends_with(".safetensors")) {
        return Err("safetensors weights need their config.json (upload config.json, the .safetensors files and \
                    tokenizer.json together)"
            .into());
    }
    Err(format!(
        "files {names:?} are not a model: expected a config.json with safetensors, one .gguf, or one llama2.c .bin \
         (with its tok*.bin)"
    ))
}

/// Opens the model at `dir`/`entry` and summarises it (blocking).
pub fn summarise(dir: &Path, entry: &str, name: &str) -> Result<ModelSummary, String> {
    let p = if entry.is_empty() { dir.to_path_buf() } else { dir.join(entry) };
    let m = open_model(&p).map_err(|e| {
        // Do not leak server paths: name the file by its checkpoint name.
        e.to_string().replace(&dir.display().to_string(), name)
    })?;
    let mut s =
        ModelSummary::new(name, m.format, &m.config, m.source.as_ref(), m.tokenizer.as_ref().map(|t| t.vocab_size()))
            .with_moe(m.moe.as_ref(), m.layout);
    s.path = if entry.is_empty() { name.to_string() } else { format!("{name}/{entry}") };
    Ok(s)
}

fn architecture(s: &ModelSummary, moe: bool) -> String {
    format!("{}{}", s.config.architecture.model_type(), if moe { " moe" } else { "" })
}

/// Registers the model in `dir` (relative to the data dir `data`) as a
/// checkpoint: files hashed, summary stored. Blocking.
///
/// # Errors
/// When the directory is not a model (the message says why).
pub fn register_dir(
    data: &Path,
    rel: &str,
    name: &str,
    source_job: Option<String>,
    known_sha: &[(String, String)],
) -> Result<CheckpointRow, String> {
    let dir = data.join(rel);
    let entry = find_entry(&dir)?;
    let summary = summarise(&dir, &entry, name)?;
    let p = if entry.is_empty() { dir.clone() } else { dir.join(&entry) };
    let moe = open_model(&p).map(|m| m.moe.is_some()).unwrap_or(false);
    let mut files = Vec::new();
    let mut rd: Vec<_> = std::fs::read_dir(&dir).map_err(|e| e.to_string())?.filter_map(|e| e.ok()).collect();
    rd.sort_by_key(|e| e.file_name());
    for e in rd {
        let n = e.file_name().to_string_lossy().into_owned();
        if !e.file_type().is_ok_and(|t| t.is_file()) || !moe_shared::api::is_valid_file_name(&n) {
            continue;
        }
        let size = e.metadata().map(|m| m.len()).unwrap_or(0);
        let sha = match known_sha.iter().find(|(k, _)| *k == n) {
            Some((_, s)) => s.clone(),
            None => sha256_file(&e.path()).map_err(|err| format!("hashing {n}: {err}"))?,
        };
        files.push(FileInfo { name: n, size, sha256: Some(sha) });
    }
    Ok(CheckpointRow {
        info: CheckpointInfo {
            id: uuid::Uuid::new_v4().to_string(),
            name: name.to_string(),
            format: summary.format,
            files,
            source_job,
            parameters: summary.parameters,
            architecture: architecture(&summary, moe),
            created_at: now_ms(),
            summary: None,
        },
        dir: rel.to_string(),
        entry,
        summary: serde_json::to_string(&summary).map_err(|e| e.to_string())?,
    })
}

/// `POST /api/checkpoints`.
pub async fn create(
    State(st): State<AppStateRef>,
    J(req): J<CreateCheckpoint>,
) -> AppResult<(StatusCode, Json<CheckpointInfo>)> {
    let name = req.name.trim().to_string();
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(|c| c.is_control()) {
        return Err(AppError::bad("name", "expected 1-200 printable characters"));
    }
    if req.uploads.is_empty() || req.uploads.len() > 64 {
        return Err(AppError::bad("uploads", format!("{} uploads: expected 1 to 64", req.uploads.len())));
    }
    let mut ups = Vec::new();
    for (i, id) in req.uploads.iter().enumerate() {
        let field = format!("uploads[{i}]");
        let id = parse_id(&field, id)?;
        let idc = id.clone();
        let u = st
            .db
            .call(move |c| get_upload(c, &idc).map_err(AppError::from))
            .await?
            .ok_or_else(|| AppError::unprocessable(&field, format!("upload {id} not found")))?;
        if u.state != UploadState::Complete {
            return Err(AppError::conflict(Some(&field), upload_unusable(&u)));
        }
        if ups.iter().any(|x: &moe_shared::api::UploadStatus| x.file_name == u.file_name) {
            return Err(AppError::unprocessable(&field, format!("two uploads are named {}", u.file_name)));
        }
        ups.push(u);
    }
    let id = uuid::Uuid::new_v4().to_string();
    // Claim the uploads (complete -> consumed, all or none) before touching
    // a file: of concurrent requests naming the same upload one wins, the
    // others are 409s.
    let claim: Vec<String> = ups.iter().map(|u| u.id.clone()).collect();
    let (c2, idc) = (claim.clone(), id.clone());
    st.db
        .call(move |c| {
            let tx = c.transaction()?;
            for (i, u) in c2.iter().enumerate() {
                let n = tx.execute(
                    "UPDATE uploads SET state = 'consumed', checkpoint_id = ?2 WHERE id = ?1 AND state = 'complete'",
                    [u, &idc],
                )?;
                if n != 1 {
                    let msg = match get_upload(&tx, u)? {
                        Some(now) => upload_unusable(&now),
                        None => format!("upload {u} not found"),
                    };
                    return Err(AppError::conflict(Some(&format!("uploads[{i}]")), msg));
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await?;
    match assemble(&st, &id, &name, &ups).await {
        Ok(info) => {
            for u in &ups {
                let _ = tokio::fs::remove_dir_all(upload_dir(&st, &u.id)).await;
            }
            Ok((StatusCode::CREATED, Json(info)))
        }
        Err(e) => {
            // Give the uploads back.
            let idc = id.clone();
            let r = st
                .db
                .call(move |c| {
                    for u in &claim {
                        c.execute(
                            "UPDATE uploads SET state = 'complete', checkpoint_id = NULL \
                             WHERE id = ?1 AND state = 'consumed' AND checkpoint_id = ?2",
                            [u, &idc],
                        )?;
                    }
                    Ok(())
                })
                .await;
            if let Err(r) = r {
                tracing::error!("releasing the uploads of checkpoint {id}: {}", r.body.error);
            }
            Err(e)
        }
    }
}

/// Why upload `u` (not `complete`) cannot be used.
pub fn upload_unusable(u: &moe_shared::api::UploadStatus) -> String {
    match (&u.state, &u.checkpoint_id) {
        (UploadState::Consumed, Some(c)) => {
            format!("upload {} ({}) was already used by checkpoint {c}", u.id, u.file_name)
        }
        (UploadState::Consumed, None) => format!("upload {} ({}) was already used", u.id, u.file_name),
        _ => format!("upload {} ({}) is not complete", u.id, u.file_name),
    }
}

/// A directory removed on drop unless committed.
struct TmpDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Links the claimed uploads into `checkpoints/.tmp-{id}`, validates them
/// and moves them to `checkpoints/{id}`; the temporary directory never
/// survives an error.
async fn assemble(
    st: &AppStateRef,
    id: &str,
    name: &str,
    ups: &[moe_shared::api::UploadStatus],
) -> AppResult<CheckpointInfo> {
    let tmp_rel = format!("checkpoints/.tmp-{id}");
    let mut tmp = TmpDir { path: st.data.join(&tmp_rel), keep: false };
    tokio::fs::create_dir_all(&tmp.path).await?;
    for u in ups {
        let src = file_path(st, u);
        let dst = tmp.path.join(&u.file_name);
        if std::fs::hard_link(&src, &dst).is_err() && tokio::fs::copy(&src, &dst).await.is_err() {
            return Err(AppError::conflict(
                Some("uploads"),
                format!("upload {} ({}) was deleted meanwhile", u.id, u.file_name),
            ));
        }
    }
    let known: Vec<(String, String)> = ups.iter().map(|u| (u.file_name.clone(), u.sha256.clone())).collect();
    let data = st.data.clone();
    let (n2, t2) = (name.to_string(), tmp_rel.clone());
    let res = tokio::task::spawn_blocking(move || register_dir(&data, &t2, &n2, None, &known))
        .await
        .map_err(|e| AppError::internal(format!("validating: {e}")))?;
    let mut row = res.map_err(|e| AppError::unprocessable("uploads", format!("not a usable checkpoint: {e}")))?;
    let rel = format!("checkpoints/{id}");
    let mut dst = TmpDir { path: st.data.join(&rel), keep: false };
    tokio::fs::rename(&tmp.path, &dst.path).await?;
    tmp.keep = true;
    row.info.id = id.to_string();
    row.dir = rel;
    let r2 = row.clone();
    st.db.call(move |c| Ok(db::insert_checkpoint(c, &r2)?)).await?;
    dst.keep = true;
    let mut info = row.info;
    info.summary = serde_json::from_str(&row.summary).ok();
    Ok(info)
}

/// `GET /api/checkpoints`.
pub async fn list(State(st): State<AppStateRef>) -> AppResult<Json<Vec<CheckpointInfo>>> {
    let rows = st.db.call(|c| db::list_checkpoints(c).map_err(AppError::from)).await?;
    Ok(Json(rows.into_iter().map(|r| r.info).collect()))
}

async fn load(st: &AppStateRef, id: &str) -> AppResult<CheckpointRow> {
    let idc = id.to_string();
    st.db
        .call(move |c| get_checkpoint(c, &idc).map_err(AppError::from))
        .await?
        .ok_or_else(|| AppError::not_found("id", format!("checkpoint {id}")))
}

/// The model path of a checkpoint (what a CLI command is given).
pub fn model_path(data: &Path, row: &CheckpointRow) -> PathBuf {
    let d = data.join(&row.dir);
    if row.entry.is_empty() {
        d
    } else {
        d.join(&row.entry)
    }
}

/// Loads checkpoint `id` for a job spec field (422 naming `field`).
pub async fn resolve(st: &AppStateRef, field: &str, id: &str) -> AppResult<CheckpointRow> {
    let idc = id.to_string();
    st.db
        .call(move |c| get_checkpoint(c, &idc).map_err(AppError::from))
        .await?
        .ok_or_else(|| AppError::unprocessable(field, format!("checkpoint {id} not found")))
}

/// `GET /api/checkpoints/{id}`.
pub async fn get_one(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<CheckpointInfo>> {
    let id = parse_id("id", &id)?;
    let row = load(&st, &id).await?;
    let mut info = row.info;
    info.summary = serde_json::from_str(&row.summary).ok();
    Ok(Json(info))
}

/// `DELETE /api/checkpoints/{id}`.
pub async fn delete(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<StatusCode> {
    let id = parse_id("id", &id)?;
    let row = load(&st, &id).await?;
    let idc = id.clone();
    let candidates: Vec<(String, String, String)> = st
        .db
        .call(move |c| {
            let mut s = c.prepare(
                "SELECT id, kind, state FROM jobs WHERE state IN ('queued', 'running', 'interrupted', 'cancelled', \
                 'failed') AND instr(spec, ?1) > 0",
            )?;
            let v = s
                .query_map([&idc], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<Vec<(String, String, String)>>>()?;
            Ok(v)
        })
        .await?;
    // Unfinished jobs, and cancelled / failed train jobs that saved a
    // checkpoint (a resume continues from it and reads this model).
    let users: Vec<String> = candidates
        .into_iter()
        .filter(|(jid, kind, state)| {
            matches!(state.as_str(), "queued" | "running" | "interrupted")
                || (kind == "train"
                    && moe_shared::train::checkpoint::latest_checkpoint(&st.data.join("jobs").join(jid).join("out"))
                        .is_some())
        })
        .map(|(jid, _, _)| jid)
        .collect();
    if !users.is_empty() {
        return Err(AppError::conflict(
            Some("id"),
            format!("checkpoint {id} is used by job(s) {users:?} that are unfinished or can still resume"),
        ));
    }
    let idc = id.clone();
    st.db.call(move |c| Ok(c.execute("DELETE FROM checkpoints WHERE id = ?1", [idc])?)).await?;
    if row.dir == format!("checkpoints/{id}") {
        let _ = tokio::fs::remove_dir_all(st.data.join(&row.dir)).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/checkpoints/{id}/files/{name}`: only names listed for the
/// checkpoint are served.
pub async fn download(
    State(st): State<AppStateRef>,
    P((id, name)): P<(String, String)>,
    req: Request,
) -> AppResult<Response> {
    let id = parse_id("id", &id)?;
    let row = load(&st, &id).await?;
    let f = row
        .info
        .files
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| AppError::not_found("name", format!("file `{name}` of checkpoint {id}")))?;
    serve_file(st.data.join(&row.dir).join(&f.name), req).await
}

/// Whether `v` is a syntactically valid `bytes=` range set (RFC 9110 §14.1.2).
fn valid_range(v: &str) -> bool {
    let Some(set) = v.trim().strip_prefix("bytes=") else { return false };
    let num = |x: &str| !x.is_empty() && x.len() <= 19 && x.bytes().all(|b| b.is_ascii_digit());
    set.split(',').map(str::trim).all(|r| match r.split_once('-') {
        Some((a, "")) => num(a),
        Some(("", b)) => num(b),
        Some((a, b)) => num(a) && num(b) && a.parse::<u64>().ok() <= b.parse::<u64>().ok(),
        None => false,
    })
}

/// Serves one file with Range support. A `Range` that does not parse (or
/// names another unit) is ignored, as RFC 9110 §14.2 allows: the whole file.
pub async fn serve_file(path: PathBuf, mut req: Request) -> AppResult<Response> {
    let bad = req.headers().get_all(axum::http::header::RANGE).iter().any(|v| !v.to_str().is_ok_and(valid_range));
    if bad || req.headers().get_all(axum::http::header::RANGE).iter().count() > 1 {
        req.headers_mut().remove(axum::http::header::RANGE);
    }
    match ServeFile::new(path).oneshot(req).await {
        Ok(r) => Ok(r.into_response()),
        Err(e) => Err(AppError::internal(format!("serving file: {e}"))),
    }
}
