//! GGUF v3 reader — placeholder until the full reader lands.

use super::{Bytes, TensorInfo, TensorSource};
use crate::config::ModelConfig;
use crate::error::{Result, StudioError};

/// A GGUF model seen with Hugging Face tensor names.
#[derive(Debug)]
pub struct GgufModel {
    name: String,
}

/// Parses a GGUF file.
///
/// # Errors
/// Always, for now.
pub fn open(_bytes: Bytes, file_name: &str) -> Result<GgufModel> {
    Err(StudioError::format(file_name, "GGUF", "GGUF support is not built yet"))
}

impl GgufModel {
    /// Model configuration from metadata.
    ///
    /// # Errors
    /// Always, for now.
    pub fn model_config(&self) -> Result<ModelConfig> {
        Err(StudioError::format(&self.name, "GGUF", "not built"))
    }
}

impl TensorSource for GgufModel {
    fn source_name(&self) -> &str {
        &self.name
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        vec![]
    }
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        Err(StudioError::tensor(&self.name, name, "not built"))
    }
}
