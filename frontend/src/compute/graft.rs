//! Delta grafting in the browser: `plan_graft` + `write_graft` into a
//! `MemorySink`, as `moe-studio graft` does into its directory, one delta
//! group at a time (each group whole, so the bytes and the per-tensor
//! statistics equal one uninterrupted call's).

use moe_shared::checkpoint::LoadedModel;
use moe_shared::methods::delta::{
    generated_config_json, graft_report, plan_graft, write_graft, DeltaStat, GraftOptions, GraftPlan, GraftReport,
};
use moe_shared::tensor_io::sink::{to_bytes, MemorySink, TensorSink};

use super::artifact::{card_file, into_artifact, pretty, Output};
use super::msg;
use super::progress::Progress;
use crate::store::{Artifact, Picked};
use moe_shared::checkpoint::output::card_moe_details;
use moe_shared::tensor_io::card::{CardMethod, ModelCard};

/// The `config.json` / `tokenizer.json` the CLI's `companion_files` copies
/// for `target`: a produced checkpoint's own files, or (for a `.gguf` /
/// llama2.c input) a config generated from its configuration.
fn companion(target: &Picked) -> (Vec<u8>, Option<Vec<u8>>) {
    match target {
        Picked::Artifact(a) => (a.config_json.clone(), a.tokenizer_json.clone()),
        Picked::Input(i) => {
            let m = &i.model;
            let cfg = generated_config_json(m);
            (pretty(&cfg), super::artifact::tokenizer_json(m.tokenizer.as_ref()))
        }
    }
}

/// One delta group (a delta and every target tensor it goes to) with the
/// elementwise graft on the WGSL kernel; the statistics are those of
/// `write_graft` (f64 norms of the unscaled delta).
async fn gpu_group(
    gpu: &moe_kernels::Gpu,
    t: &LoadedModel,
    b: &LoadedModel,
    i: &LoadedModel,
    plan: &GraftPlan,
    r: std::ops::Range<usize>,
    sink: &mut MemorySink,
) -> Result<Vec<DeltaStat>, String> {
    let scale = plan.options.scale as f32;
    let group = &plan.tensors[r];
    let mut stats = Vec::new();
    let delta = match group[0].origin.delta_name() {
        Some(dname) => {
            let base = b.source.read_f32(dname).map_err(msg)?;
            let inst = i.source.read_f32(dname).map_err(msg)?;
            let n: usize = group[0].shape.iter().product();
            if base.len() != n || inst.len() != n {
                return Err(format!(
                    "`{dname}`: base/instruct hold {}/{} values, shape needs {n}",
                    base.len(),
                    inst.len()
                ));
            }
            stats.push(DeltaStat {
                applied_to: group.len(),
                ..DeltaStat::measure(dname, &group[0].shape, &base, &inst)
            });
            Some((base, inst))
        }
        None => None,
    };
    for gt in group {
        let theta = t.source.read_f32(&gt.name).map_err(msg)?;
        let values = match &delta {
            Some((base, inst)) => {
                let out = gpu
                    .graft(
                        bytemuck::cast_slice(&theta),
                        bytemuck::cast_slice(inst),
                        bytemuck::cast_slice(base),
                        scale,
                        moe_kernels::ElemDtype::F32,
                    )
                    .await
                    .map_err(|e| format!("WebGPU graft of `{}`: {e}", gt.name))?;
                out.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>()
            }
            None => theta,
        };
        let name = plan.choice.as_ref().map_or_else(|| gt.name.clone(), |c| c.disk_name(&gt.name));
        sink.write_tensor(&name, &to_bytes(gt.dtype, &values, &name).map_err(msg)?).map_err(msg)?;
    }
    Ok(stats)
}

/// Grafts `scale * (instruct - base)` onto `target` (on the WGSL kernel
/// when `use_gpu` and a WebGPU device is open, else the shared CPU code);
/// progress in output tensors.
///
/// # Errors
/// MoE base/instruct, mismatched models (named by the plan).
pub async fn run(
    progress: &Progress,
    target: &Picked,
    base: &Picked,
    instruct: &Picked,
    scale: f64,
    use_gpu: bool,
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
        &GraftOptions { scale, ..Default::default() },
    )
    .map_err(msg)?;
    // The output (sink + serialised copy) and, per delta group, the f32
    // reads of target, base and instruct, the kernel's result and its bytes.
    let largest = plan.planned.iter().map(|p| p.byte_len() as u64).max().unwrap_or(0);
    crate::memory::ensure(
        "the graft",
        crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64)) + 5 * largest,
    )?;
    let keys: Vec<Option<String>> = plan.tensors.iter().map(|x| x.origin.delta_name().map(str::to_string)).collect();
    let runs = super::slices::runs(&keys);
    let mut sink = MemorySink::new(plan.planned.clone());
    let mut stats: Vec<DeltaStat> = Vec::new();
    let mut part = GraftPlan { tensors: Vec::new(), planned: Vec::new(), ..plan.clone() };
    let gpu = if use_gpu { super::gpu::gpu() } else { None };
    let n = plan.tensors.len() as u64;
    for r in &runs {
        match &gpu {
            Some(g) => stats.extend(gpu_group(g, t, b, i, &plan, r.clone(), &mut sink).await?),
            None => {
                part.tensors = plan.tensors[r.clone()].to_vec();
                part.planned = plan.planned[r.clone()].to_vec();
                stats.extend(
                    write_graft(t.source.as_ref(), b.source.as_ref(), i.source.as_ref(), &part, &mut sink)
                        .map_err(msg)?,
                );
            }
        }
        progress.step("grafting the delta", r.end as u64, n, "tensors");
    }
    if let Some(choice) = &plan.choice {
        // The layout's zero tensors (a Qwen2-MoE zero shared expert) end the plan.
        moe_shared::checkpoint::output::layout_sink(&mut sink, choice, &plan.planned, plan.tensors.len())
            .finish()
            .map_err(msg)?;
    }
    progress.step("serialising safetensors", 0, 1, "files");
    let report = graft_report(t.source.as_ref(), b.source.as_ref(), i.source.as_ref(), &plan, stats);
    let (config_json, tokenizer_json) = companion(target);
    let config_json = moe_shared::methods::delta::graft_config_json(&plan, &t.config, &config_json);
    let name = format!("{}-grafted", target.name());
    let mut card = ModelCard::new(CardMethod::DeltaMoe)
        .input("target", target.name(), None)
        .input("delta base", base.name(), None)
        .input("delta instruct", instruct.name(), None);
    card.detail("scale", format!("{scale} (θ + scale · (instruct − base))"));
    if let Some(choice) = &plan.choice {
        card_moe_details(&mut card, &t.config, choice, &plan.planned);
    }
    let readme = card_file(card, &name, &serde_json::from_slice(&config_json).unwrap_or_default());
    let out = Output {
        name,
        method: "graft",
        safetensors: sink.into_safetensors().map_err(msg)?,
        config_json,
        tokenizer: t.tokenizer.clone(),
        tokenizer_json,
        extra: vec![("graft_report.json".into(), serde_json::to_vec_pretty(&report).expect("json")), readme],
        millis: crate::web::now_ms() - t0,
    };
    Ok((into_artifact(out)?, report))
}
