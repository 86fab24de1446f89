//! Tokenizers from GGUF metadata — placeholder until the full builder lands.

use crate::checkpoint::gguf::GgufModel;
use crate::error::{Result, StudioError};

/// Builds a tokenizer from `tokenizer.ggml.*` metadata.
///
/// # Errors
/// Always, for now.
pub fn tokenizer_from_gguf(_model: &GgufModel) -> Result<tokenizers::Tokenizer> {
    Err(StudioError::Tokenizer { source_name: "gguf".into(), what: "not built".into() })
}
