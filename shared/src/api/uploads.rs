//! Chunked uploads (`/api/uploads`).

use serde::{Deserialize, Serialize};

/// `POST /api/uploads`: announce a file to upload in chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateUpload {
    /// The file's name (see [`is_valid_file_name`](super::is_valid_file_name)); it keeps this name
    /// inside a checkpoint, so `config.json`, `tokenizer.json`,
    /// `model.safetensors`, `stories260K.bin`, `tok512.bin`, `x.gguf`.
    pub file_name: String,
    /// Total size in bytes (at most the server's `max_upload_bytes`).
    pub size: u64,
    /// sha256 of the whole file, lowercase hex; checked at `complete`.
    pub sha256: String,
    /// Bytes per chunk (every chunk but the last has exactly this size);
    /// default and bounds in [`ServerInfo`](super::ServerInfo).
    #[serde(default)]
    pub chunk_size: Option<u64>,
}

/// Where an upload stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UploadState {
    /// Taking chunks.
    Uploading,
    /// Every chunk received and the whole-file sha256 verified; usable as a
    /// dataset in job specs or as a file of a new checkpoint.
    Complete,
    /// Moved into a checkpoint (see `checkpoint_id`).
    Consumed,
}

/// `GET /api/uploads/{id}` (and the answer of the other upload routes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadStatus {
    /// Upload id.
    pub id: String,
    /// File name.
    pub file_name: String,
    /// Total size, bytes.
    pub size: u64,
    /// Announced sha256.
    pub sha256: String,
    /// Bytes per chunk.
    pub chunk_size: u64,
    /// Number of chunks (`ceil(size / chunk_size)`, at least 1).
    pub chunks_total: u64,
    /// Chunks received and verified: chunks `0..chunks_received`. The next
    /// chunk to send is `chunks_received` (this is how a client resumes).
    pub chunks_received: u64,
    /// Bytes received and verified (`min(chunks_received * chunk_size, size)`).
    pub received_bytes: u64,
    /// State.
    pub state: UploadState,
    /// The checkpoint that took this file, once consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
    /// Creation time, Unix ms.
    pub created_at: u64,
}

/// Expected length of chunk `index` of an upload of `size` bytes in chunks
/// of `chunk_size` (`None` past the last chunk).
pub fn chunk_len(size: u64, chunk_size: u64, index: u64) -> Option<u64> {
    let total = chunks_total(size, chunk_size);
    if index >= total {
        return None;
    }
    Some(if index + 1 == total { size - index * chunk_size } else { chunk_size })
}

/// Number of chunks of an upload (an empty file has one empty chunk).
pub fn chunks_total(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks() {
        assert_eq!(chunks_total(10, 4), 3);
        assert_eq!(chunk_len(10, 4, 2), Some(2));
        assert_eq!(chunk_len(10, 4, 3), None);
        assert_eq!(chunk_len(0, 4, 0), Some(0));
    }
}
