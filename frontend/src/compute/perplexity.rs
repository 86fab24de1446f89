//! Perplexity of several models on one text, as `moe-studio perplexity`
//! computes it (`moe_shared::eval::perplexity`: strided windows, learned
//! routing for an MoE). The Graft page uses it for the "ability" text: the
//! MoE before the graft vs the grafted MoE (DeltaMoE's claim that the
//! delta carries the post-training ability; docs/methods.md, "Delta graft").

use moe_shared::eval::{perplexity, PerplexityOptions};

use super::progress::Progress;
use super::{cpu_model, msg};
use crate::store::Picked;

/// Tokens per window (and stride) when the model's context allows: the
/// window `scripts/demo_preset.sh` gives the CLI, so the page and the
/// preset's `preset.json` score the same windows.
pub const WINDOW: usize = 128;

/// Most tokens scored per model (the page stays in seconds).
pub const MAX_TOKENS: usize = 4096;

/// Each model's perplexity on `text`'s token stream (`moe_shared::corpus`:
/// documents separated by blank lines, each followed by the end-of-text
/// token, as the CLI's `perplexity` and `eval`), in the order given;
/// progress in windows over all models.
///
/// # Errors
/// No model, a model without tokenizer, a text of fewer than two tokens,
/// or the forward pass's error, named after the model.
pub fn run(progress: &Progress, models: &[Picked], text: &str) -> Result<Vec<f64>, String> {
    if models.is_empty() {
        return Err("choose at least one model to score".into());
    }
    let mut out = Vec::with_capacity(models.len());
    for (i, p) in models.iter().enumerate() {
        let m = p.model();
        let tok = m
            .tokenizer
            .as_ref()
            .ok_or_else(|| format!("{} has no tokenizer: load it with its tokenizer file", m.path))?;
        // The CLI's `perplexity`/`eval` token stream: documents separated by
        // blank lines, each followed by the end-of-text token.
        let ids =
            moe_shared::corpus::text_stream(text, "the text", moe_shared::corpus::DocSplit::Blank, tok).map_err(msg)?;
        if ids.len() < 2 {
            return Err(format!("the text has {} token(s) for {}: at least 2 are needed", ids.len(), p.name()));
        }
        let window = WINDOW.min(m.config.max_position_embeddings).max(2);
        let opts = PerplexityOptions { window, stride: window, max_tokens: Some(MAX_TOKENS), ..Default::default() };
        let model = cpu_model(m)?;
        let what = format!("perplexity ({})", p.name());
        let r = perplexity(&model, &ids, opts, &Default::default(), |w, total| {
            progress.step(&what, (i * total + w) as u64, (models.len() * total) as u64, "windows")
        })
        .map_err(|e| format!("{}: {}", p.name(), msg(e)))?;
        out.push(r.ppl);
    }
    Ok(out)
}
