//! Registered checkpoints (`/api/checkpoints`).

use serde::{Deserialize, Serialize};

use super::ModelSummary;
use crate::checkpoint::ModelFormat;

/// `POST /api/checkpoints`: turn completed uploads into one checkpoint.
///
/// The files land side by side in one directory under their upload names,
/// which is then opened the way `moe-studio inspect` opens models: with a
/// `config.json` as a Hugging Face directory (safetensors, optional
/// `tokenizer.json`), else the one `.gguf`, else the llama2.c `.bin` that is
/// not a tokenizer (`tok*.bin` / `tokenizer.bin` beside it is its vocabulary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCheckpoint {
    /// Display name (1-200 characters).
    pub name: String,
    /// Completed upload ids, one per file.
    pub uploads: Vec<String>,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Name inside the checkpoint (or path relative to a job's output).
    pub name: String,
    /// Size, bytes.
    pub size: u64,
    /// sha256, lowercase hex (absent for job artefacts listed on the fly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A registered checkpoint (`GET /api/checkpoints`, `GET /api/checkpoints/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// Checkpoint id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Format it was read as.
    pub format: ModelFormat,
    /// Its files (download: `GET /api/checkpoints/{id}/files/{name}`).
    pub files: Vec<FileInfo>,
    /// The job that produced it, for job outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_job: Option<String>,
    /// Parameters.
    pub parameters: usize,
    /// Architecture (`llama`, `qwen2`, ...) and whether it is an MoE.
    pub architecture: String,
    /// Registration time, Unix ms.
    pub created_at: u64,
    /// The full summary (only in `GET /api/checkpoints/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ModelSummary>,
}
