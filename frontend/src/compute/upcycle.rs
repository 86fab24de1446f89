//! Upcycle in the browser: `plan_upcycle` + `write_upcycle` into a
//! `MemorySink`, exactly as `moe-studio upcycle` (which streams the same
//! plan into its directory writer), in runs of tensors with yields between.

use moe_shared::methods::moe_plan::Origin;
use moe_shared::methods::sink::MemorySink;
use moe_shared::methods::{plan_upcycle, write_upcycle, UpcycleOptions, UpcyclePlan};

use super::artifact::{into_artifact, pretty, tokenizer_json, Output};
use super::msg;
use crate::store::{Artifact, Picked};
use crate::task::Task;

/// Upcycles the dense model `src` with `opts`.
///
/// # Errors
/// An MoE or too-large input, the plan's validation errors, cancellation.
pub async fn run(task: &Task, src: &Picked, opts: &UpcycleOptions) -> Result<Artifact, String> {
    let t0 = crate::web::now_ms();
    let m = src.model();
    if m.moe.is_some() {
        return Err(format!("{} is already an MoE; upcycle takes a dense model", src.name()));
    }
    let plan = plan_upcycle(m.source.as_ref(), &m.config, opts).map_err(msg)?;
    crate::load::check_fits("the upcycled model", &m.config, Some(&plan.moe))?;
    crate::memory::ensure("the upcycle", crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64)))?;
    let keys: Vec<Option<String>> = plan
        .tensors
        .iter()
        .map(|t| match &t.origin {
            Origin::Expert { dense_name, .. } | Origin::SharedExpert { dense_name, .. } => Some(dense_name.clone()),
            _ => None,
        })
        .collect();
    let runs = super::slices::runs(&keys);
    let mut sink = MemorySink::new(plan.planned.clone());
    let mut part =
        UpcyclePlan { tensors: Vec::new(), planned: Vec::new(), config_json: serde_json::Value::Null, ..plan.clone() };
    let mut last = crate::web::now_ms();
    for (i, r) in runs.iter().enumerate() {
        part.tensors = plan.tensors[r.clone()].to_vec();
        part.planned = plan.planned[r.clone()].to_vec();
        write_upcycle(m.source.as_ref(), &part, opts, &mut sink).map_err(msg)?;
        if crate::web::now_ms() - last > 40.0 {
            task.step("copying FFNs into experts", (i + 1) as f64 / runs.len() as f64).await?;
            last = crate::web::now_ms();
        }
    }
    // The layout's zero tensors (a Qwen2-MoE zero shared expert) end the plan.
    moe_shared::methods::output::layout_sink(&mut sink, &plan.choice, &plan.planned, plan.tensors.len())
        .finish()
        .map_err(msg)?;
    task.step("serialising safetensors", 1.0).await?;
    let safetensors = sink.into_safetensors().map_err(msg)?;
    let experts = plan.moe.layers.iter().flatten().map(|s| s.num_experts).max().unwrap_or(0);
    let out = Output {
        name: format!("{}-upcycled-{}x", src.name().trim_end_matches(".bin").trim_end_matches(".gguf"), experts),
        method: "upcycle",
        safetensors,
        config_json: pretty(&plan.config_json),
        tokenizer: m.tokenizer.clone(),
        tokenizer_json: tokenizer_json(m.tokenizer.as_ref()),
        extra: Vec::new(),
        millis: crate::web::now_ms() - t0,
    };
    into_artifact(out)
}
