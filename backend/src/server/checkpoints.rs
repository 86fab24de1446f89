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
        ModelSummary::new(name, m.format, &m.config, m.source.as_ref(), m.tokenizer.as_ref().map(|t| t.vocab_size()));
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
            return Err(AppError::conflict(Some(&field), format!("upload {id} ({}) is not complete", u.file_name)));
        }
        if ups.iter().any(|x: &moe_shared::api::UploadStatus| x.file_name == u.file_name) {
            return Err(AppError::unprocessable(&field, format!("two uploads are named {}", u.file_name)));
        }
        ups.push(u);
    }
    let id = uuid::Uuid::new_v4().to_string();
    let tmp_rel = format!("checkpoints/.tmp-{id}");
    let tmp = st.data.join(&tmp_rel);
    tokio::fs::create_dir_all(&tmp).await?;
    for u in &ups {
        let src = file_path(&st, u);
        let dst = tmp.join(&u.file_name);
        if std::fs::hard_link(&src, &dst).is_err() {
            tokio::fs::copy(&src, &dst).await?;
        }
    }
    let known: Vec<(String, String)> = ups.iter().map(|u| (u.file_name.clone(), u.sha256.clone())).collect();
    let data = st.data.clone();
    let (n2, t2) = (name.clone(), tmp_rel.clone());
    let res = tokio::task::spawn_blocking(move || register_dir(&data, &t2, &n2, None, &known))
        .await
        .map_err(|e| AppError::internal(format!("validating: {e}")))?;
    let mut row = match res {
        Ok(r) => r,
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&tmp).await;
            return Err(AppError::unprocessable("uploads", format!("not a usable checkpoint: {e}")));
        }
    };
    let rel = format!("checkpoints/{id}");
    tokio::fs::rename(&tmp, st.data.join(&rel)).await?;
    row.info.id = id.clone();
    row.dir = rel;
    let r2 = row.clone();
    let up_ids: Vec<String> = ups.iter().map(|u| u.id.clone()).collect();
    let idc = id.clone();
    st.db
        .call(move |c| {
            db::insert_checkpoint(c, &r2)?;
            for u in &up_ids {
                c.execute("UPDATE uploads SET state = 'consumed', checkpoint_id = ?2 WHERE id = ?1", [u, &idc])?;
            }
            Ok(())
        })
        .await?;
    for u in &ups {
        let _ = tokio::fs::remove_dir_all(upload_dir(&st, &u.id)).await;
    }
    let mut info = row.info;
    info.summary = serde_json::from_str(&row.summary).ok();
    Ok((StatusCode::CREATED, Json(info)))
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
    let users: Vec<String> = st
        .db
        .call(move |c| {
            let mut s = c.prepare(
                "SELECT id FROM jobs WHERE state IN ('queued', 'running', 'interrupted') AND instr(spec, ?1) > 0",
            )?;
            let v = s.query_map([&idc], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
            Ok(v)
        })
        .await?;
    if !users.is_empty() {
        return Err(AppError::conflict(Some("id"), format!("checkpoint {id} is used by unfinished job(s) {users:?}")));
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

/// Serves one file with Range support.
pub async fn serve_file(path: PathBuf, req: Request) -> AppResult<Response> {
    match ServeFile::new(path).oneshot(req).await {
        Ok(r) => Ok(r.into_response()),
        Err(e) => Err(AppError::internal(format!("serving file: {e}"))),
    }
}
