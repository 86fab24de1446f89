//! Multiple-choice task accuracy of several models on one JSONL task, as
//! `moe-studio eval --task` computes it (`moe_shared::eval::evaluate_task`:
//! lm-evaluation-harness's `acc` / `acc_norm`). The Evaluate page uses it.

use moe_shared::api::TaskResult;
use moe_shared::eval::{evaluate_task, McOptions, McTask};
use moe_shared::ops::task::TaskParams;

use super::progress::Progress;
use super::{cpu_model, msg};
use crate::store::Picked;

/// Requests (one per choice) per forward pass in the tab.
pub const BATCH: usize = 4;

/// Each model's result on the task `text` (JSONL, named `name` in errors),
/// its first `params.limit` items with `params.target_delimiter`, in the order given; the rows are named after
/// the models. Progress in requests over all models.
///
/// # Errors
/// No model, a bad task line (named with its line number), a model
/// without tokenizer, or the scorer's error, named after the model.
pub fn run(
    progress: &Progress,
    models: &[Picked],
    name: &str,
    text: &str,
    params: &TaskParams,
) -> Result<Vec<TaskResult>, String> {
    if models.is_empty() {
        return Err("choose at least one model to score".into());
    }
    params.check().map_err(|e| e.to_string())?;
    let task = McTask::parse(text, name).map_err(msg)?.limited(params.limit);
    let opts = McOptions { target_delimiter: params.target_delimiter.clone(), batch: BATCH };
    let mut out = Vec::with_capacity(models.len());
    for (i, p) in models.iter().enumerate() {
        let m = p.model();
        let tok = m
            .tokenizer
            .as_ref()
            .ok_or_else(|| format!("{} has no tokenizer: load it with its tokenizer file", m.path))?;
        let model = cpu_model(m)?;
        let what = format!("scoring {name} ({})", p.name());
        let n = models.len();
        let r = evaluate_task(&model, tok, &task, &opts, &Default::default(), |done, total| {
            progress.step(&what, (i * total + done) as u64, (n * total) as u64, "requests")
        })
        .map_err(|e| format!("{}: {}", p.name(), msg(e)))?;
        out.push(TaskResult::new(p.name(), name, &r));
    }
    Ok(out)
}
