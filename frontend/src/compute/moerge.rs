//! MoErge in the browser: N dense models -> one MoE with N experts
//! (`plan_moerge` + `write_moerge` into memory, as `moe-studio moerge`).

use moe_shared::methods::sink::MemorySink;
use moe_shared::methods::{plan_moerge, write_moerge, MoergeInput, MoergeOptions, MoergePlan};

use super::artifact::{into_artifact, pretty, tokenizer_json, Output};
use super::msg;
use crate::store::{Artifact, Picked};
use crate::task::Task;

/// MoErges `models` (expert `i` = model `i`).
///
/// # Errors
/// Fewer than two models, MoE inputs, mismatched architectures or
/// tokenizers (named by the plan), cancellation.
pub async fn run(task: &Task, models: &[Picked], opts: &MoergeOptions) -> Result<Artifact, String> {
    let t0 = crate::web::now_ms();
    if let Some(p) = models.iter().find(|p| p.model().moe.is_some()) {
        return Err(format!("{} is already an MoE; MoErge takes dense models", p.name()));
    }
    let inputs: Vec<MoergeInput<'_>> = models
        .iter()
        .map(|p| {
            let m = p.model();
            MoergeInput {
                name: p.name(),
                source: m.source.as_ref(),
                config: &m.config,
                tokenizer: m.tokenizer.as_ref(),
            }
        })
        .collect();
    let plan = plan_moerge(&inputs, opts).map_err(msg)?;
    crate::load::check_fits("the MoErged model", &models[0].model().config, Some(&plan.moe))?;
    crate::memory::ensure("MoErge", crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64)))?;
    let mut sink = MemorySink::new(plan.planned.clone());
    let mut part = MoergePlan { tensors: Vec::new(), planned: Vec::new(), ..plan.clone() };
    let n = plan.tensors.len();
    let mut last = crate::web::now_ms();
    for i in 0..n {
        part.tensors = vec![plan.tensors[i].clone()];
        part.planned = vec![plan.planned[i].clone()];
        write_moerge(&inputs, &part, opts, &mut sink).map_err(msg)?;
        if crate::web::now_ms() - last > 40.0 {
            task.step("merging tensors", (i + 1) as f64 / n as f64).await?;
            last = crate::web::now_ms();
        }
    }
    let first = models[0].model();
    let out = Output {
        name: format!("moerge-{}", models.iter().map(|p| p.name().to_string()).collect::<Vec<_>>().join("+")),
        method: "moerge",
        safetensors: sink.into_safetensors().map_err(msg)?,
        config_json: pretty(&plan.config_json),
        tokenizer: first.tokenizer.clone(),
        tokenizer_json: tokenizer_json(first.tokenizer.as_ref()),
        extra: Vec::new(),
        millis: crate::web::now_ms() - t0,
    };
    into_artifact(out)
}
