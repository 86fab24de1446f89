//! Types that cross the wire between the browser app and the server (and
//! the CLI's `--json` output). One definition, used by both sides.

use serde::{Deserialize, Serialize};

use crate::checkpoint::{ModelFormat, TensorSource};
use crate::config::ModelConfig;

/// One tensor in a model summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSummary {
    /// Hugging Face name.
    pub name: String,
    /// Storage dtype (e.g. "BF16", "Q4_1").
    pub dtype: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
}

/// What `moe-studio inspect` reports about a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSummary {
    /// Path or name of the model.
    pub path: String,
    /// File format.
    pub format: ModelFormat,
    /// The validated configuration.
    pub config: ModelConfig,
    /// Parameters counted from the tensors present.
    pub parameters: usize,
    /// Count of tensors per storage dtype.
    pub dtypes: std::collections::BTreeMap<String, usize>,
    /// Every tensor.
    pub tensors: Vec<TensorSummary>,
    /// Vocabulary size of the tokenizer, when one was found.
    pub tokenizer_vocab: Option<usize>,
}

impl ModelSummary {
    /// Summarises a model's tensors.
    pub fn new(
        path: &str,
        format: ModelFormat,
        config: &ModelConfig,
        src: &dyn TensorSource,
        tokenizer_vocab: Option<usize>,
    ) -> Self {
        let tensors: Vec<TensorSummary> = src
            .tensors()
            .into_iter()
            .map(|t| TensorSummary { name: t.name, dtype: t.dtype.to_string(), shape: t.shape })
            .collect();
        let mut dtypes = std::collections::BTreeMap::new();
        for t in &tensors {
            *dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
        }
        let parameters = tensors.iter().map(|t| t.shape.iter().product::<usize>()).sum();
        ModelSummary { path: path.into(), format, config: config.clone(), parameters, dtypes, tensors, tokenizer_vocab }
    }
}
