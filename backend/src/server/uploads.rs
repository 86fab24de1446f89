//! Chunked, resumable uploads (protocol in the module docs of
//! [`super`]): `uploads/{id}/FILE.part` while chunks arrive, renamed to
//! `uploads/{id}/FILE` once the whole-file sha256 matches.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use futures_util::StreamExt;
use moe_shared::api::{
    chunk_len, chunks_total, is_sha256_hex, is_valid_file_name, CreateUpload, UploadState, UploadStatus,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::db::{self, get_upload, now_ms, UPLOAD_COLS};
use super::error::{parse_id, AppError, AppResult, J, P};
use super::{AppStateRef, DEFAULT_CHUNK, MIN_CHUNK};

/// Header carrying a chunk's sha256.
pub const CHUNK_SHA_HEADER: &str = "x-chunk-sha256";

/// `uploads/{id}` of an (already validated) id.
pub fn upload_dir(st: &AppStateRef, id: &str) -> PathBuf {
    st.data.join("uploads").join(id)
}

fn part_path(st: &AppStateRef, u: &UploadStatus) -> PathBuf {
    upload_dir(st, &u.id).join(format!("{}.part", u.file_name))
}

/// The finished file of a complete upload.
pub fn file_path(st: &AppStateRef, u: &UploadStatus) -> PathBuf {
    upload_dir(st, &u.id).join(&u.file_name)
}

fn lock_for(st: &AppStateRef, id: &str) -> Arc<tokio::sync::Mutex<()>> {
    let mut m = st.upload_locks.lock().unwrap_or_else(|e| e.into_inner());
    m.entry(id.to_string()).or_default().clone()
}

async fn load(st: &AppStateRef, id: &str) -> AppResult<UploadStatus> {
    let idc = id.to_string();
    st.db
        .call(move |c| get_upload(c, &idc).map_err(AppError::from))
        .await?
        .ok_or_else(|| AppError::not_found("id", format!("upload {id}")))
}

/// At start: deletes incomplete uploads (rows and `uploads/{id}/`) created
/// more than `ttl_hours` ago (0: every incomplete upload).
///
/// # Errors
/// Database errors.
pub fn expire(db: &db::Db, data: &std::path::Path, ttl_hours: u64) -> anyhow::Result<()> {
    let cutoff = now_ms().saturating_sub(ttl_hours.saturating_mul(3_600_000));
    let ids: Vec<String> = db.blocking(|c| -> rusqlite::Result<Vec<String>> {
        let mut s = c.prepare("SELECT id FROM uploads WHERE state = 'uploading' AND created_at <= ?1")?;
        let v = s.query_map([cutoff as i64], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(v)
    })?;
    for id in ids {
        if !moe_shared::api::is_valid_id(&id) {
            continue;
        }
        db.blocking(|c| c.execute("DELETE FROM uploads WHERE id = ?1 AND state = 'uploading'", [&id]))?;
        let _ = std::fs::remove_dir_all(data.join("uploads").join(&id));
        tracing::info!("upload {id}: incomplete for more than {ttl_hours} h, deleted");
    }
    Ok(())
}

/// `POST /api/uploads`.
pub async fn create(
    State(st): State<AppStateRef>,
    J(req): J<CreateUpload>,
) -> AppResult<(StatusCode, Json<UploadStatus>)> {
    if !is_valid_file_name(&req.file_name) {
        return Err(AppError::bad(
            "file_name",
            format!(
                "`{}`: expected 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit",
                req.file_name
            ),
        ));
    }
    let sha = req.sha256.to_ascii_lowercase();
    if !is_sha256_hex(&sha) {
        return Err(AppError::bad("sha256", "expected 64 hex digits"));
    }
    if req.size > st.args.max_upload_bytes {
        return Err(AppError::too_large(
            "size",
            format!("{} bytes is over this server's upload limit of {} bytes", req.size, st.args.max_upload_bytes),
        ));
    }
    let max_chunk = st.args.max_chunk_bytes;
    let chunk_size = req.chunk_size.unwrap_or(DEFAULT_CHUNK.min(max_chunk));
    if !(MIN_CHUNK..=max_chunk).contains(&chunk_size) {
        return Err(AppError::bad("chunk_size", format!("{chunk_size}: expected {MIN_CHUNK} to {max_chunk} bytes")));
    }
    // One announcement at a time: the space promised to unfinished uploads
    // and this one's row are counted and written under the same lock.
    let _reserve = st.upload_reserve.lock().await;
    let promised = st
        .db
        .call(|c| {
            let v: i64 = c.query_row(
                "SELECT coalesce(sum(max(size - min(chunks_received * chunk_size, size), 0)), 0) \
                 FROM uploads WHERE state = 'uploading'",
                [],
                |r| r.get(0),
            )?;
            Ok(v.max(0) as u64)
        })
        .await?;
    if let Ok(free) = fs4::available_space(&st.data) {
        if req.size.saturating_add(promised) > free {
            return Err(AppError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                Some("size"),
                format!(
                    "{} bytes do not fit: the server's data directory has {free} bytes free, of which {promised} \
                     are promised to the chunks still to come of unfinished uploads (finish or delete them first)",
                    req.size
                ),
            ));
        }
    }
    let id = uuid::Uuid::new_v4().to_string();
    let u = UploadStatus {
        id: id.clone(),
        file_name: req.file_name,
        size: req.size,
        sha256: sha,
        chunk_size,
        chunks_total: chunks_total(req.size, chunk_size),
        chunks_received: 0,
        received_bytes: 0,
        state: UploadState::Uploading,
        checkpoint_id: None,
        created_at: now_ms(),
    };
    let dir = upload_dir(&st, &id);
    tokio::fs::create_dir_all(&dir).await?;
    let f = tokio::fs::File::create(part_path(&st, &u)).await?;
    f.set_len(u.size).await?;
    let row = u.clone();
    st.db
        .call(move |c| {
            c.execute(
                &format!("INSERT INTO uploads ({UPLOAD_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, 0, 'uploading', NULL, ?6)"),
                rusqlite::params![row.id, row.file_name, row.size, row.sha256, row.chunk_size, row.created_at],
            )?;
            Ok(())
        })
        .await?;
    Ok((StatusCode::CREATED, Json(u)))
}

/// `GET /api/uploads`.
pub async fn list(State(st): State<AppStateRef>) -> AppResult<Json<Vec<UploadStatus>>> {
    let v = st
        .db
        .call(|c| {
            let mut s = c.prepare(&format!("SELECT {UPLOAD_COLS} FROM uploads ORDER BY created_at DESC"))?;
            let rows = s.query_map([], db::upload_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await?;
    Ok(Json(v))
}

/// `GET /api/uploads/{id}`.
pub async fn status(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<UploadStatus>> {
    let id = parse_id("id", &id)?;
    Ok(Json(load(&st, &id).await?))
}

/// `DELETE /api/uploads/{id}`.
pub async fn delete(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<StatusCode> {
    let id = parse_id("id", &id)?;
    let lock = lock_for(&st, &id);
    let _g = lock.try_lock().map_err(|_| AppError::conflict(Some("id"), "a chunk of this upload is being written"))?;
    load(&st, &id).await?;
    let idc = id.clone();
    st.db.call(move |c| Ok(c.execute("DELETE FROM uploads WHERE id = ?1", [idc])?)).await?;
    let dir = upload_dir(&st, &id);
    if dir.exists() {
        tokio::fs::remove_dir_all(&dir).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /api/uploads/{id}/chunks/{index}`: streams one chunk to its offset.
///
/// A chunk answered before its body was read (refused for its index, state or
/// header, or a resent chunk already received with the same sha256) has its
/// body read and dropped first, up to `--max-chunk-bytes`, so that the client,
/// still sending, receives the answer rather than a reset connection.
pub async fn put_chunk(
    State(st): State<AppStateRef>,
    P((id, index)): P<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> AppResult<Json<UploadStatus>> {
    let mut body = Some(body);
    let r = put_chunk_inner(&st, id, index, &headers, &mut body).await;
    if let Some(b) = body.take() {
        let limit = st.args.max_chunk_bytes;
        let declared = headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_none_or(|n| n <= limit) {
            let drain = async {
                let mut n = 0u64;
                let mut s = b.into_data_stream();
                while let Some(Ok(f)) = s.next().await {
                    n += f.len() as u64;
                    if n > limit {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), drain).await;
        }
    }
    r
}

async fn put_chunk_inner(
    st: &AppStateRef,
    id: String,
    index: String,
    headers: &HeaderMap,
    body: &mut Option<Body>,
) -> AppResult<Json<UploadStatus>> {
    let st = st.clone();
    let id = parse_id("id", &id)?;
    let index: u64 = index.parse().map_err(|_| AppError::bad("index", format!("`{index}` is not a chunk index")))?;
    let want_sha =
        headers
            .get(CHUNK_SHA_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_ascii_lowercase())
            .ok_or_else(|| AppError::bad("X-Chunk-Sha256", "missing: send the chunk's sha256 (64 hex digits)"))?;
    if !is_sha256_hex(&want_sha) {
        return Err(AppError::bad("X-Chunk-Sha256", "expected 64 hex digits"));
    }
    let lock = lock_for(&st, &id);
    let _g = lock
        .try_lock()
        .map_err(|_| AppError::conflict(Some("index"), "another chunk of this upload is being written"))?;
    let u = load(&st, &id).await?;
    if u.state != UploadState::Uploading {
        return Err(AppError::conflict(Some("id"), format!("upload {id} is already {:?}", u.state).to_lowercase()));
    }
    let expected = chunk_len(u.size, u.chunk_size, index).ok_or_else(|| {
        AppError::bad("index", format!("chunk {index} is past the last chunk ({} chunks)", u.chunks_total))
    })?;
    if index < u.chunks_received {
        let (idc, i) = (id.clone(), index as i64);
        let have: Option<String> = st
            .db
            .call(move |c| {
                use rusqlite::OptionalExtension;
                Ok(c.query_row(
                    "SELECT sha256 FROM upload_chunks WHERE upload_id = ?1 AND idx = ?2",
                    rusqlite::params![idc, i],
                    |r| r.get(0),
                )
                .optional()?)
            })
            .await?;
        return if have.as_deref() == Some(want_sha.as_str()) {
            Ok(Json(u))
        } else {
            Err(AppError::conflict(
                Some("index"),
                format!(
                    "chunk {index} was already received with another sha256; the next chunk is {}",
                    u.chunks_received
                ),
            ))
        };
    }
    if index > u.chunks_received {
        return Err(AppError::conflict(
            Some("index"),
            format!("chunk {index} is out of order: the next chunk is {}", u.chunks_received),
        ));
    }
    if let Some(cl) = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()) {
        if let Ok(n) = cl.parse::<u64>() {
            if n > expected {
                return Err(AppError::too_large("body", format!("chunk {index} is {n} bytes; expected {expected}")));
            }
        }
    }
    let mut f = tokio::fs::OpenOptions::new().write(true).open(part_path(&st, &u)).await?;
    f.seek(std::io::SeekFrom::Start(index * u.chunk_size)).await?;
    let mut hasher = Sha256::new();
    let mut got: u64 = 0;
    let mut stream = body.take().expect("body not read yet").into_data_stream();
    let idle = std::time::Duration::from_secs(st.args.chunk_timeout_secs.max(1));
    loop {
        // A stalled sender (no byte for `--chunk-timeout-secs`) loses the
        // chunk and its lock, so that the client's retry is accepted.
        let frame = match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => {
                return Err(AppError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    Some("body"),
                    format!(
                    "chunk {index}: no bytes for {} s after {got} of {expected}; the chunk was dropped, send it again",
                    idle.as_secs()
                ),
                ))
            }
        };
        let bytes = frame
            .map_err(|e| AppError::bad("body", format!("chunk {index}: the body was cut off ({e}); send it again")))?;
        got += bytes.len() as u64;
        if got > expected {
            return Err(AppError::too_large("body", format!("chunk {index} is longer than {expected} bytes")));
        }
        hasher.update(&bytes);
        f.write_all(&bytes).await?;
    }
    if got != expected {
        return Err(AppError::bad("body", format!("chunk {index} is {got} bytes; expected {expected}")));
    }
    let sha = hex(&hasher.finalize());
    if sha != want_sha {
        return Err(AppError::unprocessable(
            "X-Chunk-Sha256",
            format!("chunk {index}: the body's sha256 is {sha}, the header says {want_sha}; send it again"),
        ));
    }
    f.flush().await?;
    f.sync_data().await?;
    drop(f);
    let (idc, i) = (id.clone(), index as i64);
    let u = st
        .db
        .call(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT OR REPLACE INTO upload_chunks (upload_id, idx, sha256) VALUES (?1, ?2, ?3)",
                rusqlite::params![idc, i, sha],
            )?;
            tx.execute("UPDATE uploads SET chunks_received = ?2 WHERE id = ?1", rusqlite::params![idc, i + 1])?;
            tx.commit()?;
            get_upload(c, &idc)?.ok_or_else(|| AppError::internal("upload vanished"))
        })
        .await?;
    Ok(Json(u))
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// sha256 of a file, streamed (blocking).
pub fn sha256_file(p: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// `POST /api/uploads/{id}/complete`: whole-file sha256, then the rename.
pub async fn complete(State(st): State<AppStateRef>, P(id): P<String>) -> AppResult<Json<UploadStatus>> {
    let id = parse_id("id", &id)?;
    let lock = lock_for(&st, &id);
    let _g = lock.try_lock().map_err(|_| AppError::conflict(Some("id"), "a chunk of this upload is being written"))?;
    let u = load(&st, &id).await?;
    if u.state != UploadState::Uploading {
        return Ok(Json(u));
    }
    if u.chunks_received < u.chunks_total {
        return Err(AppError::conflict(
            Some("id"),
            format!(
                "{} of {} chunks received; send chunk {} next",
                u.chunks_received, u.chunks_total, u.chunks_received
            ),
        ));
    }
    let part = part_path(&st, &u);
    let fin = file_path(&st, &u);
    // A crash between the rename below and the database update leaves the
    // file renamed and the row `uploading`: completing again finishes it.
    let renamed = !part.exists() && fin.exists();
    let p2 = if renamed { fin.clone() } else { part.clone() };
    let sha = tokio::task::spawn_blocking(move || sha256_file(&p2))
        .await
        .map_err(|e| AppError::internal(format!("hashing: {e}")))??;
    if sha != u.sha256 && renamed {
        tokio::fs::rename(&fin, &part).await?;
    }
    if sha != u.sha256 {
        let idc = id.clone();
        st.db
            .call(move |c| {
                c.execute("DELETE FROM upload_chunks WHERE upload_id = ?1", [&idc])?;
                c.execute("UPDATE uploads SET chunks_received = 0 WHERE id = ?1", [&idc])?;
                Ok(())
            })
            .await?;
        return Err(AppError::unprocessable(
            "sha256",
            format!("the file's sha256 is {sha}, not the announced {}; the upload was reset to chunk 0", u.sha256),
        ));
    }
    if !renamed {
        std::fs::File::open(&part)?.sync_all()?;
        tokio::fs::rename(&part, &fin).await?;
        // The rename itself is durable once the directory is synced.
        if let Ok(d) = std::fs::File::open(upload_dir(&st, &id)) {
            let _ = d.sync_all();
        }
    }
    let idc = id.clone();
    let u = st
        .db
        .call(move |c| {
            c.execute("UPDATE uploads SET state = 'complete' WHERE id = ?1", [&idc])?;
            get_upload(c, &idc)?.ok_or_else(|| AppError::internal("upload vanished"))
        })
        .await?;
    Ok(Json(u))
}
