//! Evaluation: perplexity with strided windows (and, later, retention and
//! routing statistics).

pub mod dataset;
pub mod perplexity;
pub mod text;

pub use dataset::{evaluate, randomize_routers, retention, DatasetEval};
pub use perplexity::{perplexity, PerplexityOptions, PerplexityReport};
pub use text::text_ids;
