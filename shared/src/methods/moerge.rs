//! MoErging (DUME, methods.md §2): `N` dense models fine-tuned from one base
//! become one MoE with `N` experts per layer, without training.
//!
//! - Every tensor outside the FFNs (embeddings, attention, norms, LM head)
//!   is the element-wise mean over the `N` models ([`MeanAccumulator`]:
//!   f64 sums, shapes aligned to the first model with a warning).
//! - Layer `l`'s FFN of model `i` becomes expert `i` of MoE layer `l`
//!   (`w1 = gate_proj`, `w3 = up_proj`, `w2 = down_proj`), unchanged.
//! - Routers start at zero (or seeded random); DUME's ridge-regression
//!   router is fitted afterwards on the merged model.
//!
//! No shared experts in DUME's MoErge: its MoE computes
//! `sum_i p_i(x) FFN_i(x)` with the ridge router predicting the domain `i`,
//! and each term keeps its meaning only because expert `i` is domain `i`'s
//! own FFN. A shared expert would add an always-on term that no domain was
//! trained with (the mean FFN, say, is the weight-averaging baseline's FFN
//! and would double-count it), so without a base model `moerge` refuses
//! `--shared-expert`; upcycle with shared experts and train them instead
//! (methods.md "Shared experts").
//!
//! **mergekit-moe's variant** ([`plan_moerge_with_base`]): with a base
//! model every non-FFN tensor is the base's, unchanged (mergekit-moe copies
//! them from `base_model`; it averages nothing), and the router may start
//! from hidden states or prompt embeddings of the base (`hidden`,
//! `cheap_embed`; docs/methods.md §6.1 "mergekit recipes"). Here shared
//! experts keep the meaning mergekit gives them — a named model's whole
//! FFN, always on, optionally gated by `sigmoid(g · x)` with `g` from its
//! own prompts ([`super::moerge_shared`]) — a starting point for training
//! like the rest of this merge, which computes no source model's function.
//!
//! Refused before anything is written: fewer than two models, different
//! architectures or tokenizers (naming both models), a model whose tensors
//! disagree with its own config. Streaming: one tensor per model at a time.

use super::average::{weighted_mean, MeanAccumulator, WeightedMean};
use super::compat::{check_architecture, check_tokenizer};
use super::moerge_shared::{mergekit_shared_expert_tensor, SharedGate};
use super::router_init::RouterInit;
use crate::checkpoint::output::{
    check_dense_source, config_json, layout_sink, planned_tensors, LayoutChoice, LayoutRequest,
};
use crate::checkpoint::plan::{MoeTensor, Origin};
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};
use crate::error::{Result, StudioError};
use crate::tensor_io::sink::{write_values, TensorSink};
use crate::tensor_io::{DType, PlannedTensor, TensorSource};
use crate::tokenizer::Tokenizer;

/// One input model of [`moerge`].
#[derive(Clone, Copy)]
pub struct MoergeInput<'a> {
    /// Name for messages (usually the path).
    pub name: &'a str,
    /// Its tensors.
    pub source: &'a dyn TensorSource,
    /// Its configuration.
    pub config: &'a ModelConfig,
    /// Its tokenizer, when it has one.
    pub tokenizer: Option<&'a Tokenizer>,
}

impl std::fmt::Debug for MoergeInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoergeInput").field("name", &self.name).finish()
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl<'a> From<&'a crate::checkpoint::LoadedModel> for MoergeInput<'a> {
    fn from(m: &'a crate::checkpoint::LoadedModel) -> Self {
        MoergeInput { name: &m.path, source: m.source.as_ref(), config: &m.config, tokenizer: m.tokenizer.as_ref() }
    }
}

/// Options of [`moerge`].
#[derive(Debug, Clone)]
pub struct MoergeOptions {
    /// Experts per token (DUME reference: 1).
    pub top_k: usize,
    /// Router temperature (folded into the weight in every public layout).
    pub temperature: f64,
    /// Router initialisation: zeros (default) or random (`hidden` is
    /// refused: the experts come from different models).
    pub router_init: RouterInit,
    /// Seed of a random router.
    pub seed: u64,
    /// Frozen experts of every layer (default none).
    pub frozen: Vec<usize>,
    /// Output dtype (default: the first model's float dtypes).
    pub dtype: Option<DType>,
    /// Load-balancing loss coefficient recorded in the config.
    pub router_aux_loss_coef: f64,
    /// On-disk layout (`--layout`; default `auto`).
    pub layout: LayoutRequest,
    /// How the routed experts are stored (`--experts-format`; default per
    /// expert).
    pub experts_format: crate::layout::ExpertsFormat,
    /// How the shared experts (mergekit-moe's `shared_experts`, given to
    /// [`plan_moerge_with_base`]) are weighed; ignored without them
    /// (default ungated).
    pub shared_gate: SharedGate,
}

impl Default for MoergeOptions {
    fn default() -> Self {
        MoergeOptions {
            top_k: 1,
            temperature: 1.0,
            router_init: RouterInit::Zeros,
            seed: 0,
            frozen: vec![],
            dtype: None,
            router_aux_loss_coef: 0.01,
            layout: LayoutRequest::Auto,
            experts_format: crate::layout::ExpertsFormat::PerExpert,
            shared_gate: SharedGate::Ungated,
        }
    }
}

/// A validated MoErge: layout, tensors, config and warnings.
#[derive(Debug, Clone)]
pub struct MoergePlan {
    /// The MoE layout as requested.
    pub moe: MoeConfig,
    /// Layout choice and the config as written.
    pub choice: LayoutChoice,
    /// Output tensors and their origins.
    pub tensors: Vec<MoeTensor>,
    /// The writer's plan: `tensors` with output dtypes under the layout's
    /// names, then the layout's zero tensors.
    pub planned: Vec<PlannedTensor>,
    /// `config.json`.
    pub config_json: serde_json::Value,
    /// Alignment, tokenizer and layout notes.
    pub warnings: Vec<String>,
}

/// Validates the inputs and plans the merged checkpoint (headers only).
///
/// # Errors
/// [`StudioError::Invalid`] for fewer than two models;
/// [`StudioError::Config`] / [`StudioError::Tokenizer`] naming both models
/// when architectures or tokenizers differ; [`StudioError::Tensor`] when a
/// model's tensor is missing or disagrees with its config, or a
/// vocabulary-sized tensor has a different rank; option errors
/// (top-k > N, frozen index, temperature, hidden router).
pub fn plan_moerge(inputs: &[MoergeInput<'_>], opts: &MoergeOptions) -> Result<MoergePlan> {
    plan_moerge_with_base(inputs, None, &[], opts)
}

/// [`plan_moerge`] with an optional `base` (mergekit-moe's `base_model`):
/// when given, every non-FFN tensor is the base's (not the mean of the
/// experts), the base's tensors and config set the output's shapes, dtypes
/// and config, and the router may be `hidden` / `cheap_embed` (rows the
/// caller computed from the base). Without a base it is DUME's MoErge.
///
/// `shared` (mergekit-moe's `shared_experts`, base only): model `j`'s FFN
/// becomes shared expert `j` of every MoE layer, weighed as
/// `opts.shared_gate` says ([`super::moerge_shared`]).
///
/// # Errors
/// Those of [`plan_moerge`], with the base and every shared expert checked
/// like every expert (architecture, tokenizer, tensors vs config), a
/// `hidden` or `cheap_embed` router without a base (DUME fits the ridge
/// router instead), shared experts without a base (the reason in the
/// module docs), and the shared gate's errors
/// ([`SharedGate::validate`]); a named layout that cannot hold the shared
/// experts is refused with the layouts that can.
pub fn plan_moerge_with_base(
    inputs: &[MoergeInput<'_>],
    base_input: Option<MoergeInput<'_>>,
    shared: &[MoergeInput<'_>],
    opts: &MoergeOptions,
) -> Result<MoergePlan> {
    if inputs.len() < 2 {
        return Err(StudioError::Invalid(format!(
            "MoErging needs at least two models (got {}); each becomes one expert",
            inputs.len()
        )));
    }
    if base_input.is_none() && matches!(opts.router_init, RouterInit::Hidden { .. } | RouterInit::CheapEmbed { .. }) {
        return Err(StudioError::config(
            "--router-init",
            "the hidden and cheap_embed routers need a base model (mergekit-moe's base_model) to read prompts \
             with; MoErge with zeros or random and fit the ridge router",
        ));
    }
    if !shared.is_empty() && base_input.is_none() {
        return Err(StudioError::config(
            "--shared-expert",
            "shared experts need a base model (mergekit-moe's base_model, --base): in DUME's MoErge every expert \
             is one domain's FFN and the ridge router picks the domain, so an always-on FFN no domain was trained \
             with would change every domain's function (upcycle with --shared-experts and train them instead)",
        ));
    }
    let first = base_input.unwrap_or(inputs[0]);
    let base = first.config;
    let mut warnings = Vec::new();
    for m in base_input.iter().chain(inputs).chain(shared) {
        check_dense_source(m.source, m.config)?;
    }
    let others = if base_input.is_some() { inputs } else { &inputs[1..] };
    for m in others.iter().chain(shared) {
        warnings.extend(check_architecture(first.name, base, m.name, m.config)?);
        warnings.extend(check_tokenizer(first.name, first.tokenizer, m.name, m.tokenizer)?);
    }
    let spec = MoeLayerSpec {
        num_experts: inputs.len(),
        top_k: opts.top_k,
        frozen: opts.frozen.clone(),
        temperature: opts.temperature,
        shared_experts: shared.len(),
        shared_expert_gate: !shared.is_empty() && opts.shared_gate.is_gated(),
        ..Default::default()
    };
    let moe =
        MoeConfig { router_aux_loss_coef: opts.router_aux_loss_coef, ..MoeConfig::uniform(base.num_layers, spec) };
    moe.validate(base, "moerge options")?;
    opts.router_init.validate(&moe, base.hidden_size, "--router-init")?;
    opts.shared_gate.validate(shared.len(), &moe, base.hidden_size)?;
    if let Some(d) = opts.dtype.filter(|d| d.float_size().is_none()) {
        return Err(StudioError::Invalid(format!("cannot write dtype {d} (use f32, f16 or bf16)")));
    }
    let choice = crate::layout::choose(base, &moe, opts.layout)?.with_experts(opts.experts_format);
    let (tensors, planned) = planned_tensors(first.source, base, &choice.written, opts.dtype);
    let planned = choice.disk_plan(base, &planned);
    // Shared tensors are averaged over the experts (DUME) or copied from
    // the base (mergekit-moe): only the first case aligns shapes.
    let averaged: &[MoergeInput<'_>] = if base_input.is_some() { &[] } else { &inputs[1..] };
    for t in tensors.iter().filter(|t| matches!(t.origin, Origin::Dense { .. })) {
        for m in averaged {
            let info = m.source.info(&t.name).ok_or_else(|| StudioError::tensor(m.name, &t.name, "missing"))?;
            if info.shape.len() != t.shape.len() {
                return Err(StudioError::tensor(
                    m.name,
                    &t.name,
                    format!("rank of shape {:?} differs from {:?} in {}", info.shape, t.shape, first.name),
                ));
            }
            if info.shape != t.shape {
                warnings.push(format!(
                    "`{}`: shape {:?} in {} aligned to {:?} of {} (rows/columns only some models have are averaged \
                     over those models)",
                    t.name, info.shape, m.name, t.shape, first.name
                ));
            }
        }
    }
    warnings.extend(choice.warnings.iter().cloned());
    let mut provenance = serde_json::json!({
        "method": if base_input.is_some() { "moerge-on-base" } else { "moerge" },
        "base": base_input.map(|b| b.name),
        "sources": inputs.iter().map(|m| m.name).collect::<Vec<_>>(),
        "router_init": opts.router_init,
        "seed": opts.seed,
        "temperature": opts.temperature,
    });
    // Recorded only when used, so that plain MoErges keep their bytes.
    if !shared.is_empty() {
        let obj = provenance.as_object_mut().expect("object");
        obj.insert("shared_experts".into(), serde_json::json!(shared.iter().map(|m| m.name).collect::<Vec<_>>()));
        obj.insert("shared_gate".into(), opts.shared_gate.kind().into());
    }
    let dtype = planned.first().map(|p| p.dtype).unwrap_or(DType::F32);
    let config_json = config_json(base, &choice, dtype, provenance);
    Ok(MoergePlan { moe, choice, tensors, planned, config_json, warnings })
}

/// The tensors of `plan` (same order) that an f32 weighted sum of the
/// inputs' tensors of the same name computes bit for bit: the averaged
/// (shared, non-FFN) tensors for which [`weighted_mean`] finds weights — two
/// models whose tensor shapes agree. `None` for experts, routers and the
/// means only [`MeanAccumulator`] computes exactly (three or more models,
/// shapes that differ).
///
/// [`write_moerge`] computes every tensor on the CPU; a GPU path (the
/// browser's WGSL `weighted_sum`) may compute the `Some` tensors with these
/// weights instead, reading each input's tensor with `read_f32`, checking
/// [`WeightedMean::inputs_exact`] / [`WeightedMean::output_exact`] and
/// writing the f32 result in the planned dtype — the same bytes.
pub fn weighted_means(inputs: &[MoergeInput<'_>], plan: &MoergePlan) -> Vec<Option<WeightedMean>> {
    plan.tensors
        .iter()
        .map(|t| match t.origin {
            Origin::Dense { .. } => {
                let shapes: Option<Vec<Vec<usize>>> =
                    inputs.iter().map(|m| m.source.info(&t.name).map(|i| i.shape)).collect();
                let shapes = shapes?;
                if shapes.first() != Some(&t.shape) {
                    return None;
                }
                weighted_mean(&shapes.iter().map(Vec::as_slice).collect::<Vec<_>>())
            }
            _ => None,
        })
        .collect()
}

/// Streams the merged tensors of `plan` into `sink`, reading one tensor of
/// one model at a time.
///
/// # Errors
/// Read errors of the sources, write errors of `sink`.
pub fn write_moerge(
    inputs: &[MoergeInput<'_>],
    plan: &MoergePlan,
    opts: &MoergeOptions,
    sink: &mut dyn TensorSink,
) -> Result<()> {
    write_moerge_with_base(inputs, None, &[], plan, opts, sink)
}

/// [`write_moerge`] for a plan of [`plan_moerge_with_base`]: with `base`,
/// the non-FFN tensors are the base's values (read once, unchanged); the
/// shared experts and their gate are
/// [`mergekit_shared_expert_tensor`]'s (`shared` as planned).
///
/// # Errors
/// Read errors of the sources, write errors of `sink`.
pub fn write_moerge_with_base(
    inputs: &[MoergeInput<'_>],
    base: Option<MoergeInput<'_>>,
    shared: &[MoergeInput<'_>],
    plan: &MoergePlan,
    opts: &MoergeOptions,
    sink: &mut dyn TensorSink,
) -> Result<()> {
    let mut out = layout_sink(sink, &plan.choice, &plan.planned, plan.tensors.len());
    let sink: &mut dyn TensorSink = &mut out;
    for (t, p) in plan.tensors.iter().zip(&plan.planned) {
        let values = match &t.origin {
            Origin::Dense { .. } if base.is_some() => base.expect("checked").source.read_f32(&t.name)?,
            Origin::Dense { .. } => {
                let mut acc = MeanAccumulator::new(&t.shape);
                for m in inputs {
                    let shape = m.source.info(&t.name).map(|i| i.shape).unwrap_or_default();
                    acc.add(&m.source.read_f32(&t.name)?, &shape);
                }
                acc.mean()
            }
            Origin::Expert { expert, dense_name, .. } => inputs[*expert].source.read_f32(dense_name)?,
            Origin::RouterWeight { layer } => opts.router_init.weight(
                *layer,
                t.shape[0],
                t.shape[1],
                opts.seed,
                &t.name,
                plan.choice.router_scale[*layer],
            ),
            Origin::RouterBias { .. } => vec![0.0; t.shape[0]],
            Origin::SharedGate { .. } | Origin::SharedExpert { .. } => {
                mergekit_shared_expert_tensor(&t.origin, &t.shape, &t.name, shared, &opts.shared_gate, opts.seed)
                    .expect("a shared-expert origin")?
            }
            // plan_moerge's layout has no selection bias.
            Origin::SelectionBias { .. } => {
                return Err(StudioError::Invalid(format!("moerge does not make `{}`", t.name)))
            }
        };
        write_values(sink, &t.name, p.dtype, &values)?;
    }
    out.finish()
}

/// MoErges `inputs` into the checkpoint directory `out_dir` (safetensors,
/// `config.json` in the layout `opts.layout` picks, and `tokenizer.json`
/// when given — normally the first model's). Validation happens before the
/// output is created; the directory appears atomically and no partial
/// output is left on error.
///
/// # Errors
/// Those of [`plan_moerge`] and [`write_moerge`]; [`StudioError::Invalid`]
/// when `out_dir` exists and is not empty; I/O.
#[cfg(not(target_arch = "wasm32"))]
pub fn moerge(
    inputs: &[MoergeInput<'_>],
    opts: &MoergeOptions,
    out_dir: &std::path::Path,
    tokenizer_json: Option<Vec<u8>>,
    write_opts: crate::tensor_io::WriteOptions,
) -> Result<crate::checkpoint::output::MoeReport> {
    moerge_with_base(inputs, None, &[], opts, out_dir, tokenizer_json, write_opts)
}

/// [`moerge`] with an optional base model (mergekit-moe's `base_model`) and
/// shared experts (its `shared_experts`), see [`plan_moerge_with_base`].
///
/// # Errors
/// As [`moerge`].
#[cfg(not(target_arch = "wasm32"))]
pub fn moerge_with_base(
    inputs: &[MoergeInput<'_>],
    base: Option<MoergeInput<'_>>,
    shared: &[MoergeInput<'_>],
    opts: &MoergeOptions,
    out_dir: &std::path::Path,
    tokenizer_json: Option<Vec<u8>>,
    write_opts: crate::tensor_io::WriteOptions,
) -> Result<crate::checkpoint::output::MoeReport> {
    let plan = plan_moerge_with_base(inputs, base, shared, opts)?;
    let mut write_opts = write_opts;
    let dense = base.unwrap_or(inputs[0]).config;
    if let Some(c) = write_opts.card.as_mut() {
        crate::checkpoint::output::card_moe_details(c, dense, &plan.choice, &plan.planned);
        let shared_tensors = if base.is_some() { "taken from the base model" } else { "averaged over the experts" };
        c.detail("non-expert tensors", shared_tensors);
        c.detail("router", format!("{} initialisation, seed {}", opts.router_init.kind(), opts.seed));
    }
    let file_plan = plan.choice.file_plan(&plan.planned)?;
    let mut w = crate::tensor_io::SafetensorsWriter::create(out_dir, file_plan, write_opts)?;
    write_moerge_with_base(inputs, base, shared, &plan, opts, &mut plan.choice.packing_sink(&mut w, &plan.planned)?)?;
    let mut extra = vec![("config.json", serde_json::to_vec_pretty(&plan.config_json).expect("json"))];
    if let Some(t) = tokenizer_json {
        extra.push(("tokenizer.json", t));
    }
    w.finish(&extra)?;
    let mut report = crate::checkpoint::output::MoeReport::new(
        "moerge",
        base.iter().chain(inputs).chain(shared).map(|m| m.name.to_string()).collect(),
        base.unwrap_or(inputs[0]).config,
        &plan.choice,
        &plan.planned,
        opts.router_init.kind(),
        plan.warnings,
    );
    report.out_dir = Some(out_dir.display().to_string());
    Ok(report)
}
