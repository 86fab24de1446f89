//! What a task job writes as its result (`moe-studio eval --task --json`).

use serde::{Deserialize, Serialize};

/// One task's result in `moe-studio eval --task ... --json` (a task job's
/// `result.json`), with lm-eval's metric names: `acc`, `acc_norm` (per
/// character), `acc_bytes` (per UTF-8 byte) and their `_stderr` (`null`
/// for a single item, lm-eval's "N/A").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The task's name.
    pub name: String,
    /// Its file.
    pub file: String,
    /// Items scored.
    pub items: usize,
    /// Requests cut from the left to fit the model's context.
    pub truncated: usize,
    /// The delimiter between context and choice.
    pub target_delimiter: String,
    /// Accuracy of `argmax ll`.
    pub acc: f64,
    /// Its standard error.
    pub acc_stderr: Option<f64>,
    /// Accuracy of `argmax ll / characters`.
    pub acc_norm: f64,
    /// Its standard error.
    pub acc_norm_stderr: Option<f64>,
    /// Accuracy of `argmax ll / bytes`.
    pub acc_bytes: f64,
    /// Its standard error.
    pub acc_bytes_stderr: Option<f64>,
    /// Per item, in file order.
    pub samples: Vec<crate::eval::McSample>,
}

impl TaskResult {
    /// The result of task `name` read from `file`.
    pub fn new(name: &str, file: &str, r: &crate::eval::McReport) -> Self {
        TaskResult {
            name: name.to_string(),
            file: file.to_string(),
            items: r.items,
            truncated: r.truncated,
            target_delimiter: r.target_delimiter.clone(),
            acc: r.acc.value,
            acc_stderr: r.acc.stderr,
            acc_norm: r.acc_norm.value,
            acc_norm_stderr: r.acc_norm.stderr,
            acc_bytes: r.acc_bytes.value,
            acc_bytes_stderr: r.acc_bytes.stderr,
            samples: r.samples.clone(),
        }
    }
}

/// `moe-studio eval --task ... --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEvalReport {
    /// The model's path.
    pub model: String,
    /// `learned` or `random`.
    pub routing: String,
    /// Whether the model is an MoE.
    pub moe: bool,
    /// One per `--task`, in order.
    pub tasks: Vec<TaskResult>,
}
