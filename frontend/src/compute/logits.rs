//! The upcycling invariant, checked on a sample text: right after
//! upcycling (identical experts, top-k weights summing to 1) the MoE's
//! logits equal the dense model's up to float error.

use burn::tensor::Tensor;
use moe_shared::checkpoint::LoadedModel;

use super::progress::Progress;
use super::{cpu_model, encode, tokens};
use crate::Cpu;

/// Result of a logits comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsCheck {
    /// Tokens compared.
    pub tokens: usize,
    /// `max |dense - moe|` over every position and vocabulary entry.
    pub max_abs_diff: f64,
    /// `max |dense|` (scale of the logits).
    pub max_abs: f64,
    /// Milliseconds for both forward passes.
    pub millis: f64,
}

/// Tolerance under which the check passes.
pub const TOLERANCE: f64 = 1e-4;

fn flat(t: Tensor<Cpu, 3>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().expect("f32 logits")
}

/// Tokens per forward call: both models read the text in chunks of this
/// many tokens through their KV cache (the same chunks for both, so the
/// comparison is unchanged), which lets the progress count tokens.
pub const CHUNK: usize = 16;

/// The logits of `ids` through `model`, `CHUNK` tokens at a time with its
/// KV cache; `on_chunk(tokens done)` after each chunk.
fn chunked_logits(
    model: &moe_shared::model::Transformer<Cpu>,
    ids: &[u32],
    mut on_chunk: impl FnMut(usize),
) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    let mut done = 0;
    for chunk in ids.chunks(CHUNK) {
        out.extend(flat(model.forward(tokens(chunk), Some(&mut cache))));
        done += chunk.len();
        on_chunk(done);
    }
    out
}

/// Runs `dense` and `moe` on `text` and compares their logits; progress in
/// tokens (of both passes).
///
/// # Errors
/// No tokenizer, an empty text, model load errors.
pub fn check(progress: &Progress, dense: &LoadedModel, moe: &LoadedModel, text: &str) -> Result<LogitsCheck, String> {
    let t0 = crate::web::now_ms();
    let mut ids = encode(dense, text, true)?;
    ids.truncate(dense.config.max_position_embeddings.min(256));
    if ids.len() < 2 {
        return Err("the sample text is too short: type a sentence".into());
    }
    let n = ids.len() as u64;
    progress.step("dense forward pass", 0, 2 * n, "tokens");
    let a =
        chunked_logits(&cpu_model(dense)?, &ids, |d| progress.step("dense forward pass", d as u64, 2 * n, "tokens"));
    let b =
        chunked_logits(&cpu_model(moe)?, &ids, |d| progress.step("MoE forward pass", n + d as u64, 2 * n, "tokens"));
    if a.len() != b.len() {
        return Err(format!("the models disagree on the vocabulary ({} vs {} logits)", a.len(), b.len()));
    }
    let max_abs_diff = a.iter().zip(&b).map(|(x, y)| f64::from((x - y).abs())).fold(0.0, f64::max);
    let max_abs = a.iter().map(|x| f64::from(x.abs())).fold(0.0, f64::max);
    Ok(LogitsCheck { tokens: ids.len(), max_abs_diff, max_abs, millis: crate::web::now_ms() - t0 })
}
