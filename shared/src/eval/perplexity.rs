//! Token-level perplexity with strided sliding windows.
//!
//! Source: the Hugging Face "Perplexity of fixed-length models" guide
//! (transformers docs): windows of `window` tokens advancing by `stride`;
//! each token is scored once, by the first window in which it is a target,
//! conditioned on the tokens of that window before it. The Python twin is
//! `tests/reference/make_golden.py`.

use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};
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
}

impl Default for PerplexityOptions {
    fn default() -> Self {
        PerplexityOptions { window: 512, stride: 256, max_tokens: None }
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
/// [`StudioError::Invalid`] for fewer than 2 tokens, `stride` of 0 or larger
/// than `window`, or a window beyond the model's context.
pub fn perplexity<B: Backend>(
    model: &Transformer<B>,
    ids: &[u32],
    opts: PerplexityOptions,
    device: &B::Device,
    mut on_window: impl FnMut(usize, usize),
) -> Result<PerplexityReport> {
    let ids = match opts.max_tokens {
        Some(m) => &ids[..ids.len().min(m)],
        None => ids,
    };
    let n = ids.len();
    if n < 2 {
        return Err(StudioError::Invalid(format!("perplexity needs at least 2 tokens, the text has {n}")));
    }
    if opts.stride == 0 || opts.stride > opts.window {
        return Err(StudioError::Invalid(format!("stride ({}) must be in 1..=window ({})", opts.stride, opts.window)));
    }
    if opts.window > model.config.max_position_embeddings {
        return Err(StudioError::Invalid(format!(
            "window {} exceeds the model's context {}",
            opts.window, model.config.max_position_embeddings
        )));
    }
    let total_windows = n.saturating_sub(1).div_ceil(opts.stride).max(1);
    let v = model.config.vocab_size;
    let mut prev_end = 0usize;
    let mut sum = 0f64;
    let mut count = 0usize;
    let mut begin = 0usize;
    let mut done = 0usize;
    while begin < n {
        let end = (begin + opts.window).min(n);
        let first = prev_end.max(begin + 1);
        if first < end {
            let window: Vec<i64> = ids[begin..end].iter().map(|&x| x as i64).collect();
            let len = end - begin;
            let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(window, [1, len]), device);
            // Positions first-1-begin .. end-1-begin predict tokens first..end.
            let from = first - 1 - begin;
            let used = end - first;
            let hidden = model.forward_hidden(tokens, None).narrow(1, from, used);
            let logp = log_softmax(model.head(hidden), 2).reshape([used, v]);
            let targets: Vec<i64> = ids[first..end].iter().map(|&x| x as i64).collect();
            let idx = Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [used, 1]), device);
            let picked: Vec<f32> = logp.gather(1, idx).into_data().convert::<f32>().to_vec().expect("f32");
            sum -= picked.iter().map(|&x| x as f64).sum::<f64>();
            count += used;
        }
        prev_end = end;
        done += 1;
        on_window(done, total_windows);
        if end == n {
            break;
        }
        begin += opts.stride;
    }
    let nll = sum / count as f64;
    Ok(PerplexityReport { tokens: count, nll, ppl: nll.exp() })
}
