//! Typed errors of the `shared` crate.
//!
//! Every variant names the file (or source) it concerns and, where relevant,
//! the tensor and what was expected, so that a user can act on the message
//! without reading code.

use std::fmt;

/// Result alias used across the crate.
pub type Result<T, E = StudioError> = std::result::Result<T, E>;

/// The errors produced by checkpoint I/O, configuration validation,
/// tokenization and the model.
#[derive(Debug, thiserror::Error)]
pub enum StudioError {
    /// An operating-system I/O error while touching `path`.
    ///
    /// The OS error is part of the message and deliberately not exposed as
    /// `Error::source` (a field named `source` would be), so that
    /// `anyhow`'s `{:#}` does not print it twice ("x: No such file or
    /// directory (os error 2): No such file or directory (os error 2)").
    #[error("{path}: {error}")]
    Io {
        /// The file or directory concerned.
        path: String,
        /// The underlying error.
        error: std::io::Error,
    },
    /// A file whose bytes do not follow its format (safetensors, GGUF,
    /// llama2.c, JSON): `what` says which field/offset and what was expected.
    #[error("{file}: malformed {format}: {what}")]
    Format {
        /// The file concerned.
        file: String,
        /// The format name ("safetensors", "GGUF", "llama2.c", "config.json").
        format: &'static str,
        /// What is wrong, naming the field/tensor and the expectation.
        what: String,
    },
    /// A tensor that exists but whose shape or dtype disagrees with the
    /// configuration, or that is missing.
    #[error("{file}: tensor `{tensor}`: {what}")]
    Tensor {
        /// The file concerned.
        file: String,
        /// The tensor name (Hugging Face naming where mapped).
        tensor: String,
        /// What is wrong (expected vs found).
        what: String,
    },
    /// A configuration value (config.json or CLI) that is invalid or not
    /// supported by the studio.
    #[error("{source_name}: {what}")]
    Config {
        /// Where the configuration came from (file path or "arguments").
        source_name: String,
        /// What is wrong and what is supported.
        what: String,
    },
    /// A data type or quantisation type the studio cannot read.
    #[error("{file}: tensor `{tensor}`: unsupported dtype {dtype} ({hint})")]
    UnsupportedDType {
        /// The file concerned.
        file: String,
        /// The tensor.
        tensor: String,
        /// The dtype found.
        dtype: String,
        /// What is supported.
        hint: String,
    },
    /// A tokenizer problem (building, encoding, decoding).
    #[error("tokenizer ({source_name}): {what}")]
    Tokenizer {
        /// Where the tokenizer came from.
        source_name: String,
        /// What went wrong.
        what: String,
    },
    /// A parameter of an operation outside what it accepts (top-k above
    /// the expert count, a drop ratio outside `[0, 1]`, ...). `param` says
    /// which one, so a caller (the tab's form) puts the message next to
    /// that parameter without reading the text; the message is as
    /// [`StudioError::Config`]'s.
    #[error("{source_name}: {what}")]
    Param {
        /// Where the value came from (the CLI flag, the allocation file, the
        /// form's field label).
        source_name: String,
        /// Which parameter is wrong.
        param: Param,
        /// What is wrong and what is accepted.
        what: String,
    },
    /// Invalid arguments to an operation (e.g. an empty prompt).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// The MoE layout and upcycling parameters a [`StudioError::Param`] can
/// name (docs/methods.md §1.1 upcycling, §1.3 variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// Experts per layer (the uniform count or an allocation: its length,
    /// a layer with 0 experts).
    Experts,
    /// Experts each token is routed to (`top_k`).
    TopK,
    /// The frozen experts (indices into a layer's experts).
    Frozen,
    /// The router's softmax temperature.
    Temperature,
    /// The router's initialisation (random std, hidden-state or
    /// embedding prompts).
    Router,
    /// The routed experts' FFN width.
    ExpertWidth,
    /// Shared experts (count, gate, initialisation, frozen).
    SharedExperts,
    /// The Drop-Upcycling re-initialisation ratio.
    DropRatio,
    /// Fine-grained expert granularity `G`.
    Granularity,
    /// The noise added to expert copies.
    Noise,
}

impl StudioError {
    /// Builds a [`StudioError::Format`].
    pub fn format(file: impl fmt::Display, format: &'static str, what: impl Into<String>) -> Self {
        StudioError::Format { file: file.to_string(), format, what: what.into() }
    }
    /// Builds a [`StudioError::Tensor`].
    pub fn tensor(file: impl fmt::Display, tensor: impl Into<String>, what: impl Into<String>) -> Self {
        StudioError::Tensor { file: file.to_string(), tensor: tensor.into(), what: what.into() }
    }
    /// Builds a [`StudioError::Config`].
    pub fn config(source_name: impl fmt::Display, what: impl Into<String>) -> Self {
        StudioError::Config { source_name: source_name.to_string(), what: what.into() }
    }
    /// Builds a [`StudioError::Param`].
    pub fn param(source_name: impl fmt::Display, param: Param, what: impl Into<String>) -> Self {
        StudioError::Param { source_name: source_name.to_string(), param, what: what.into() }
    }
    /// Builds a [`StudioError::Io`].
    pub fn io(path: impl fmt::Display, source: std::io::Error) -> Self {
        StudioError::Io { path: path.to_string(), error: source }
    }
}
