//! Evaluation: perplexity with strided windows (and, later, retention and
//! routing statistics).

pub mod perplexity;

pub use perplexity::{perplexity, PerplexityOptions, PerplexityReport};
