//! The upcycling invariant, checked on a sample text: right after
//! upcycling (identical experts, top-k weights summing to 1) the MoE's
//! logits equal the dense model's up to float error.

use burn::tensor::Tensor;
use moe_shared::checkpoint::LoadedModel;

use super::{cpu_model, encode, tokens};
use crate::task::Task;
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

/// Runs `dense` and `moe` on `text` and compares their logits.
///
/// # Errors
/// No tokenizer, an empty text, model load errors, cancellation.
pub async fn check(task: &Task, dense: &LoadedModel, moe: &LoadedModel, text: &str) -> Result<LogitsCheck, String> {
    let t0 = crate::web::now_ms();
    let mut ids = encode(dense, text, true)?;
    ids.truncate(dense.config.max_position_embeddings.min(256));
    if ids.len() < 2 {
        return Err("the sample text is too short: type a sentence".into());
    }
    task.step("dense forward pass", 0.1).await?;
    let a = flat(cpu_model(dense)?.forward(tokens(&ids), None));
    task.step("MoE forward pass", 0.5).await?;
    let b = flat(cpu_model(moe)?.forward(tokens(&ids), None));
    if a.len() != b.len() {
        return Err(format!("the models disagree on the vocabulary ({} vs {} logits)", a.len(), b.len()));
    }
    let max_abs_diff = a.iter().zip(&b).map(|(x, y)| f64::from((x - y).abs())).fold(0.0, f64::max);
    let max_abs = a.iter().map(|x| f64::from(x.abs())).fold(0.0, f64::max);
    Ok(LogitsCheck { tokens: ids.len(), max_abs_diff, max_abs, millis: crate::web::now_ms() - t0 })
}
