//! Chunked, resumable uploads of local files to `moe-studio serve`.
//!
//! A file is read in `chunk_size` slices (`Blob.slice` + `arrayBuffer`), so
//! it is never whole in memory: a first pass hashes it (sha256, updated per
//! slice) for `POST /api/uploads`, the second sends chunk `i` with
//! `PUT /api/uploads/{id}/chunks/{i}` and its own sha256 in
//! `X-Chunk-Sha256`, then `POST .../complete`. Every started upload is
//! recorded in `localStorage` until it completes; after a lost connection
//! or a reload, [`continue_upload`] asks the server for `chunks_received`
//! and carries on from there.

use std::cell::RefCell;
use std::collections::HashMap;

use moe_shared::api::{CreateUpload, UploadState, UploadStatus};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasm_bindgen_futures::JsFuture;

use super::api::{self, ApiFailure, Body};

/// `localStorage` key of the unfinished uploads.
pub const PENDING_KEY: &str = "moe-studio.pending-uploads";

/// An upload that was started and not completed (kept in `localStorage`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Upload id.
    pub id: String,
    /// File name.
    pub file_name: String,
    /// Size, bytes.
    pub size: u64,
    /// sha256 of the whole file (announced at creation).
    pub sha256: String,
    /// Bytes per chunk.
    pub chunk_size: u64,
}

/// The unfinished uploads recorded in this browser.
pub fn pending() -> Vec<Pending> {
    api::load(PENDING_KEY).and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default()
}

fn set_pending(v: &[Pending]) {
    api::save(PENDING_KEY, &serde_json::to_string(v).unwrap_or_else(|_| "[]".into()));
}

/// Forgets an unfinished upload (completed, or deleted on the server).
pub fn forget(id: &str) {
    let mut v = pending();
    v.retain(|p| p.id != id);
    set_pending(&v);
    FILES.with(|f| f.borrow_mut().remove(id));
}

thread_local! {
    /// The picked files of this tab's uploads (lost on reload: the user
    /// picks the file again to resume).
    static FILES: RefCell<HashMap<String, web_sys::File>> = RefCell::new(HashMap::new());
}

/// The file an upload of this tab was started from, if still known.
pub fn file_of(id: &str) -> Option<web_sys::File> {
    FILES.with(|f| f.borrow().get(id).cloned())
}

/// Where an upload is.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadProgress {
    /// File name.
    pub file_name: String,
    /// `hashing`, `uploading`, `verifying` or `done`.
    pub phase: &'static str,
    /// Bytes done in this phase.
    pub done: u64,
    /// Bytes in all.
    pub total: u64,
    /// Chunks received by the server.
    pub chunks: u64,
    /// Chunks in all (0 while hashing).
    pub chunks_total: u64,
}

async fn read_slice(file: &web_sys::File, start: u64, end: u64) -> Result<js_sys::Uint8Array, ApiFailure> {
    let fail = |e: wasm_bindgen::JsValue| {
        ApiFailure::Network(format!("reading {} [{start}..{end}): {}", file.name(), e.as_string().unwrap_or_default()))
    };
    let blob = file.slice_with_f64_and_f64(start as f64, end as f64).map_err(fail)?;
    let buf = JsFuture::from(blob.array_buffer()).await.map_err(fail)?;
    Ok(js_sys::Uint8Array::new(&buf))
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file, read `chunk` bytes at a time.
///
/// # Errors
/// The browser could not read the file.
pub async fn hash_file(file: &web_sys::File, chunk: u64, on: &dyn Fn(UploadProgress)) -> Result<String, ApiFailure> {
    let size = file.size() as u64;
    let step = chunk.max(1 << 20);
    let mut h = Sha256::new();
    let mut at = 0;
    while at < size {
        let end = (at + step).min(size);
        h.update(read_slice(file, at, end).await?.to_vec());
        at = end;
        on(UploadProgress {
            file_name: file.name(),
            phase: "hashing",
            done: at,
            total: size,
            chunks: 0,
            chunks_total: 0,
        });
    }
    Ok(hex(h.finalize()))
}

/// Hashes `file`, announces it (`POST /api/uploads`), records it as pending
/// and sends its chunks ([`continue_upload`]).
///
/// # Errors
/// The first failure; after a [`ApiFailure::Network`] the upload stays
/// pending and [`continue_upload`] resumes it.
pub async fn upload_file(
    file: &web_sys::File,
    chunk_size: Option<u64>,
    token: &str,
    on: &dyn Fn(UploadProgress),
) -> Result<UploadStatus, ApiFailure> {
    let sha256 = hash_file(file, chunk_size.unwrap_or(8 << 20), on).await?;
    let body = CreateUpload { file_name: file.name(), size: file.size() as u64, sha256, chunk_size };
    let st: UploadStatus = api::send("POST", "api/uploads", token, Some(&body)).await?;
    let mut v = pending();
    v.push(Pending {
        id: st.id.clone(),
        file_name: st.file_name.clone(),
        size: st.size,
        sha256: st.sha256.clone(),
        chunk_size: st.chunk_size,
    });
    set_pending(&v);
    FILES.with(|f| f.borrow_mut().insert(st.id.clone(), file.clone()));
    continue_upload(&st.id, file, token, on).await
}

/// Sends the chunks the server does not have yet (from its
/// `chunks_received`), then completes the upload and forgets it.
///
/// # Errors
/// A network failure (resume later), a file that does not match the
/// upload, or the server's refusal (e.g. a whole-file sha256 mismatch).
pub async fn continue_upload(
    id: &str,
    file: &web_sys::File,
    token: &str,
    on: &dyn Fn(UploadProgress),
) -> Result<UploadStatus, ApiFailure> {
    let url = format!("api/uploads/{id}");
    let mut st: UploadStatus = api::get(&url).await?;
    FILES.with(|f| f.borrow_mut().insert(id.to_string(), file.clone()));
    if matches!(st.state, UploadState::Complete | UploadState::Consumed) {
        forget(id);
        return Ok(st);
    }
    if file.name() != st.file_name || file.size() as u64 != st.size {
        return Err(ApiFailure::Http {
            status: 400,
            error: format!(
                "{} ({} bytes) is not the file of this upload: {} ({} bytes)",
                file.name(),
                file.size() as u64,
                st.file_name,
                st.size
            ),
            reason: None,
        });
    }
    let report = |st: &UploadStatus, phase| {
        on(UploadProgress {
            file_name: st.file_name.clone(),
            phase,
            done: st.received_bytes,
            total: st.size,
            chunks: st.chunks_received,
            chunks_total: st.chunks_total,
        })
    };
    report(&st, "uploading");
    while st.chunks_received < st.chunks_total {
        let i = st.chunks_received;
        let start = i * st.chunk_size;
        let end = (start + st.chunk_size).min(st.size);
        let bytes = read_slice(file, start, end).await?;
        let sha = hex(Sha256::digest(bytes.to_vec()));
        let r = api::request(
            "PUT",
            &format!("{url}/chunks/{i}"),
            Some(token),
            Body::Bytes(bytes),
            &[("X-Chunk-Sha256", &sha)],
        )
        .await;
        st = match r {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| ApiFailure::Http {
                status: 200,
                error: format!("chunk {i}: unexpected answer: {e}"),
                reason: None,
            })?,
            // Out of order (another tab, or an answer lost after the server
            // counted the chunk): ask where the upload stands and go on.
            Err(ApiFailure::Http { status: 409, .. }) => api::get(&url).await?,
            Err(e) => return Err(e),
        };
        report(&st, "uploading");
    }
    report(&st, "verifying");
    let st: UploadStatus = api::send::<(), _>("POST", &format!("{url}/complete"), token, None).await?;
    forget(id);
    report(&st, "done");
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase_sha256() {
        assert_eq!(hex(Sha256::digest(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
