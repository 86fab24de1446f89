//! Evaluation: perplexity with strided windows, per-dataset evaluation
//! with routing load, and multiple-choice task accuracy with the
//! lm-evaluation-harness semantics.

pub mod dataset;
pub mod multiple_choice;
pub mod perplexity;
pub mod task;
pub mod text;

pub use dataset::{evaluate, randomize_routers, retention, DatasetEval};
pub use multiple_choice::{evaluate_task, McOptions, McReport, McSample, Metric};
pub use perplexity::{perplexity, PerplexityOptions, PerplexityReport};
pub use task::{McItem, McTask};
pub use text::text_ids;
