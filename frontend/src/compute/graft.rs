//! Delta grafting in the browser: `plan_graft` + `write_graft` into a
//! `MemorySink`, as `moe-studio graft` does into its directory, one delta
//! group at a time (each group whole, so the bytes and the per-tensor
//! statistics equal one uninterrupted call's).

use moe_shared::config::HfConfig;
use moe_shared::methods::delta::{
    graft_report, plan_graft, write_graft, DeltaStat, GraftOptions, GraftPlan, GraftReport,
};
use moe_shared::methods::sink::MemorySink;

use super::artifact::{into_artifact, pretty, Output};
use super::msg;
use crate::store::{Artifact, Picked};
use crate::task::Task;

/// The `config.json` / `tokenizer.json` the CLI's `companion_files` copies
/// for `target`: a produced checkpoint's own files, or (for a `.gguf` /
/// llama2.c input) a config generated from its configuration.
fn companion(target: &Picked) -> (Vec<u8>, Option<Vec<u8>>) {
    match target {
        Picked::Artifact(a) => (a.config_json.clone(), a.tokenizer_json.clone()),
        Picked::Input(i) => {
            let m = &i.model;
            let cfg = match &m.moe {
                Some(moe) => moe.to_config_json(&m.config),
                None => {
                    let mut v =
                        serde_json::to_value(HfConfig::from_model_config(&m.config)).expect("config serialises");
                    if let Some(o) = v.as_object_mut() {
                        o.retain(|_, x| !x.is_null());
                    }
                    v
                }
            };
            (pretty(&cfg), super::artifact::tokenizer_json(m.tokenizer.as_ref()))
        }
    }
}

/// Grafts `scale * (instruct - base)` onto `target`.
///
/// # Errors
/// MoE base/instruct, mismatched models (named by the plan), cancellation.
pub async fn run(
    task: &Task,
    target: &Picked,
    base: &Picked,
    instruct: &Picked,
    scale: f64,
) -> Result<(Artifact, GraftReport), String> {
    let t0 = crate::web::now_ms();
    for (p, role) in [(base, "base"), (instruct, "instruct")] {
        if p.model().moe.is_some() {
            return Err(format!(
                "the {role} model {} is an MoE; the delta is taken between two dense models",
                p.name()
            ));
        }
    }
    let (t, b, i) = (target.model(), base.model(), instruct.model());
    let plan = plan_graft(
        t.source.as_ref(),
        &t.config,
        t.moe.as_ref(),
        b.source.as_ref(),
        i.source.as_ref(),
        &GraftOptions { scale },
    )
    .map_err(msg)?;
    let keys: Vec<Option<String>> = plan.tensors.iter().map(|x| x.origin.delta_name().map(str::to_string)).collect();
    let runs = super::slices::runs(&keys);
    let mut sink = MemorySink::new(plan.planned.clone());
    let mut stats: Vec<DeltaStat> = Vec::new();
    let mut part = GraftPlan { tensors: Vec::new(), planned: Vec::new(), ..plan.clone() };
    let mut last = crate::web::now_ms();
    for (k, r) in runs.iter().enumerate() {
        part.tensors = plan.tensors[r.clone()].to_vec();
        part.planned = plan.planned[r.clone()].to_vec();
        stats.extend(
            write_graft(t.source.as_ref(), b.source.as_ref(), i.source.as_ref(), &part, &mut sink).map_err(msg)?,
        );
        if crate::web::now_ms() - last > 40.0 {
            task.step("grafting the delta", (k + 1) as f64 / runs.len() as f64).await?;
            last = crate::web::now_ms();
        }
    }
    task.step("serialising safetensors", 1.0).await?;
    let report = graft_report(t.source.as_ref(), b.source.as_ref(), i.source.as_ref(), &plan, stats);
    let (config_json, tokenizer_json) = companion(target);
    let out = Output {
        name: format!("{}-grafted", target.name()),
        method: "graft",
        safetensors: sink.into_safetensors().map_err(msg)?,
        config_json,
        tokenizer: t.tokenizer.clone(),
        tokenizer_json,
        extra: vec![("graft_report.json".into(), serde_json::to_vec_pretty(&report).expect("json"))],
        millis: crate::web::now_ms() - t0,
    };
    Ok((into_artifact(out)?, report))
}
