//! Greedy continuations of one prompt by several models (the Inspect page:
//! dense vs MoE, side by side), with `moe_shared::generate` as
//! `moe-studio generate` uses it.

use moe_shared::generate::{generate_with, Sampling};

use super::progress::Progress;
use super::{cpu_model, encode};
use crate::store::Picked;
use crate::worker::protocol::Continuation;

/// Most new tokens the page asks for.
pub const MAX_NEW_TOKENS: usize = 256;

/// Each model's greedy continuation of `prompt`; progress in new tokens
/// over all models.
///
/// # Errors
/// No model, a model without tokenizer, an empty prompt, a count outside
/// `1..=MAX_NEW_TOKENS`, or one beyond a model's context.
pub fn run(
    progress: &Progress,
    models: &[Picked],
    prompt: &str,
    max_new_tokens: usize,
) -> Result<Vec<Continuation>, String> {
    if models.is_empty() {
        return Err("choose at least one model to generate with".into());
    }
    if !(1..=MAX_NEW_TOKENS).contains(&max_new_tokens) {
        return Err(format!("new tokens must be between 1 and {MAX_NEW_TOKENS}; got {max_new_tokens}"));
    }
    let total = (models.len() * max_new_tokens) as u64;
    let mut out = Vec::new();
    for (i, p) in models.iter().enumerate() {
        let t0 = crate::web::now_ms();
        let m = p.model();
        let ids = encode(m, prompt, true)?;
        if ids.is_empty() {
            return Err("type a prompt".into());
        }
        let model = cpu_model(m)?;
        let what = format!("generating with {}", p.name());
        let base = (i * max_new_tokens) as u64;
        let new = generate_with(
            &model,
            &ids,
            max_new_tokens,
            Sampling::default(),
            m.config.eos_token_id,
            &Default::default(),
            |n| progress.step(&what, base + n as u64, total, "tokens"),
        )
        .map_err(|e| format!("{}: {e}", p.name()))?;
        let tok = m.tokenizer.as_ref().ok_or_else(|| format!("{} has no tokenizer", p.name()))?;
        // The continuation as it reads after the prompt (decoding the new
        // ids alone would drop a leading space).
        let dec = |v: &[u32]| tok.decode(v).map_err(|e| format!("{}: {e}", p.name()));
        let (pre, full) = (dec(&ids)?, dec(&[ids.as_slice(), new.as_slice()].concat())?);
        let text = match full.strip_prefix(pre.as_str()) {
            Some(t) => t.to_string(),
            None => dec(&new)?,
        };
        out.push(Continuation {
            model: p.name().to_string(),
            text,
            tokens: new.len(),
            millis: crate::web::now_ms() - t0,
        });
    }
    Ok(out)
}
