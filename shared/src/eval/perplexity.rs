//! Token-level perplexity with strided sliding windows.
//!
//! Source: the Hugging Face "Perplexity of fixed-length models" guide
//! (transformers docs): windows of `window` tokens advancing by `stride`;
//! each token is scored once, by the first window in which it is a target,
//! conditioned on the tokens of that window before it. The Python twin is
//! `tests/reference/make_golden.py`.

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::model::Transformer;

/// Window options.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PerplexityOptions {
    /// Tokens per forward pass.
    pub window: usize,
    /// Advance between windows (`<= window`).
    pub stride: usize,
    /// Keep only the first `max_tokens` tokens of the text (`None`: all).
    pub max_tokens: Option<usize>,
    /// Windows per forward pass (one right-padded batch, [`crate::model::Padding`]);
    /// the numbers do not depend on it beyond float summation order.
    #[serde(default = "default_batch")]
    pub batch: usize,
}

fn default_batch() -> usize {
    PerplexityOptions::DEFAULT_BATCH
}

impl PerplexityOptions {
    /// Default windows per forward pass.
    pub const DEFAULT_BATCH: usize = 4;
}

impl Default for PerplexityOptions {
    fn default() -> Self {
        PerplexityOptions { window: 512, stride: 256, max_tokens: None, batch: Self::DEFAULT_BATCH }
    }
}

/// Result: the number of scored tokens, the mean negative log-likelihood
/// (nats per token) and `ppl = exp(nll)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PerplexityReport {
    /// Scored tokens (all but the first).
    pub tokens: usize,
    /// Mean NLL in nats per token.
    pub nll: f64,
    /// Perplexity.
    pub ppl: f64,
}

/// Perplexity of `model` on token ids `ids`; `on_window(done, total)` is
/// called after each window (progress).
///
/// # Errors
/// [`crate::StudioError::Invalid`] for fewer than 2 tokens, `stride` of 0 or larger
/// than `window`, or a window beyond the model's context.
pub fn perplexity<B: Backend>(
    model: &Transformer<B>,
    ids: &[u32],
    opts: PerplexityOptions,
    device: &B::Device,
    on_window: impl FnMut(usize, usize),
) -> Result<PerplexityReport> {
    // One windowing loop for every evaluation: `eval::dataset::evaluate`
    // with learned routing (its routing load is simply not returned here).
    Ok(super::dataset::evaluate(model, ids, opts, crate::model::Routing::Learned, device, on_window)?.report)
}
