//! Delta grafting (DeltaMoE phase 2, methods.md §1 "Phase 2 — delta
//! grafting"): add the post-training delta of a dense model to an upcycled
//! MoE (or, as plain task arithmetic, to any model of the same shapes).
//!
//! `Delta = theta_instruct - theta_base`, tensor by tensor, from a dense base
//! model and its post-trained (instruct / SFT) version. On the target:
//!
//! - **shared tensors** (embeddings, attention, norms, LM head: every tensor
//!   the target has under the same name as the delta) get
//!   `theta + scale * Delta`;
//! - **experts**: every expert `e` of MoE layer `l`
//!   (canonical `model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`,
//!   [`crate::layout::names`]) gets layer `l`'s dense FFN delta
//!   (`mlp.gate_proj -> w1`, `mlp.up_proj -> w3`, `mlp.down_proj -> w2`),
//!   the frozen expert 0 and the trained ones alike;
//! - layers that a studio-layout MoE keeps dense (`model.layers.{l}.mlp.*`)
//!   get their own `mlp` delta (they are shared tensors by name);
//! - **routers** (`block_sparse_moe.gate.{weight,bias}`, the aux-free
//!   `gate.e_score_correction_bias`) get no delta and are copied unchanged;
//! - **shared experts** and their gate (`block_sparse_moe.shared_experts.*`,
//!   `shared_expert_gate`) are copied unchanged too: the routed experts,
//!   whose weights sum to 1, already carry the whole FFN delta, and a
//!   shared expert is a learned residual beside them (zero at upcycling by
//!   default), not a copy of the FFN whose delta it could take;
//! - granular experts (slices of `f/G` units, scaled) are refused: the
//!   dense delta would have to be sliced and scaled as the upcycle did.
//!
//! A dense target works too: grafting onto a dense model is task arithmetic
//! on one model (`theta + scale * (instruct - base)`).
//!
//! An MoE target is read with canonical names (its on-disk layout renamed
//! by [`crate::layout::LayoutSource`]) and written in the layout
//! [`GraftOptions::layout`] picks (the CLI's default: the target's own).
//!
//! # Numerics
//! Every output element is computed in f32 from the f32 values of the inputs
//! (bf16 and f16 are upcast exactly) and rounded **once** to the target
//! tensor's dtype (round-to-nearest-even):
//! `out = round(theta + s * (instruct - base))` with `s = scale as f32` and
//! each operation an f32 operation in that order. Where `s * Delta` is
//! exactly zero the target's value is kept as it is, so a zero delta leaves
//! every tensor bit for bit unchanged (`-0.0 + 0.0` would otherwise become
//! `+0.0`). Quantised (GGUF) targets are written as f32.
//!
//! # Streaming
//! The output tensors are written grouped by the delta they receive: all
//! `E_l` experts of one projection of layer `l` one after another (readers
//! look tensors up by name, so the order is invisible to them). Each delta is
//! computed once and kept only while its group is written, so memory holds
//! about three tensors in f32 (the delta, the target tensor, the output
//! bytes) whatever the model size.
//!
//! # Validation
//! Everything is checked from the tensor headers before any output exists
//! ([`plan_graft`]): base and instruct must have the same tensor names and
//! shapes (the error names both sources and the first tensor that differs;
//! a different first dimension of the embedding or LM head is reported as a
//! vocabulary mismatch), every target tensor except the routers must have a
//! delta of its shape, every delta tensor must land somewhere in the target,
//! the target must hold the tensors its configuration describes, and `scale`
//! must be finite. The output directory is written atomically
//! ([`crate::tensor_io::SafetensorsWriter`]).

use std::collections::HashMap;

use serde::Serialize;

use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};
use crate::layout::names::{self, TensorRole};
use crate::layout::{LayoutChoice, LayoutRequest};
use crate::tensor_io::sink::{to_bytes, TensorSink};
use crate::tensor_io::{DType, PlannedTensor, TensorInfo, TensorSource};

/// Where the delta of one output tensor comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeltaOrigin {
    /// A tensor the target shares with the dense delta, by name
    /// (embeddings, attention, norms, LM head, FFN of a dense layer).
    Shared {
        /// Name of the delta tensor (the same as the output's).
        delta: String,
    },
    /// Expert `expert` of MoE layer `layer`: the layer's dense FFN delta.
    Expert {
        /// Decoder layer.
        layer: usize,
        /// Expert index.
        expert: usize,
        /// Name of the dense FFN delta tensor
        /// (`model.layers.{layer}.mlp.{gate,up,down}_proj.weight`).
        delta: String,
    },
    /// A router weight, bias or selection bias, a shared expert or its
    /// gate: copied, no delta.
    Router {
        /// Decoder layer.
        layer: usize,
    },
    /// A bias the target has and neither the base nor the instruct model
    /// does (mergekit-moe's Qwen output writes all-zero q/k/v biases for
    /// experts that have none): a model without a bias adds zero, so its
    /// delta is zero and the tensor is copied.
    NoBias,
}

impl DeltaOrigin {
    /// The delta tensor's name, `None` for routers.
    pub fn delta_name(&self) -> Option<&str> {
        match self {
            DeltaOrigin::Shared { delta } | DeltaOrigin::Expert { delta, .. } => Some(delta),
            DeltaOrigin::Router { .. } | DeltaOrigin::NoBias => None,
        }
    }
}

/// Classifies a target tensor name (see the module docs), through the one
/// name parser [`crate::layout::names::parse`]: routers, selection biases,
/// shared experts and their gate get no delta, expert projections map to the layer's dense FFN projection
/// (`model.layers.{l}.mlp.{gate,up,down}_proj.weight`), every other name
/// maps to itself.
pub fn delta_origin(name: &str) -> DeltaOrigin {
    match names::parse(name) {
        TensorRole::Router { layer }
        | TensorRole::RouterBias { layer }
        | TensorRole::SelectionBias { layer }
        | TensorRole::SharedExpert { layer, .. }
        | TensorRole::SharedExpertGate { layer } => DeltaOrigin::Router { layer },
        TensorRole::Expert { layer, expert, proj } => {
            DeltaOrigin::Expert { layer, expert, delta: names::dense_ffn_name(layer, proj) }
        }
        _ => DeltaOrigin::Shared { delta: name.to_string() },
    }
}

/// Options of [`graft`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraftOptions {
    /// The scale `lambda` on the delta (1.0 = the paper). Must be finite.
    pub scale: f64,
    /// Layout of an MoE output (`--layout`; default `auto`, the CLI passes
    /// the target's own layout when none is given).
    #[serde(skip)]
    pub layout: LayoutRequest,
    /// How an MoE output stores its routed experts (`--experts-format`;
    /// default per expert).
    #[serde(skip)]
    pub experts_format: crate::layout::ExpertsFormat,
}

impl Default for GraftOptions {
    /// `scale = 1.0` (DeltaMoE), layout `auto`, experts per expert.
    fn default() -> Self {
        GraftOptions { scale: 1.0, layout: LayoutRequest::Auto, experts_format: Default::default() }
    }
}

/// One output tensor of a graft.
#[derive(Debug, Clone, PartialEq)]
pub struct GraftTensor {
    /// Output tensor name (the target's).
    pub name: String,
    /// Shape (the target's, equal to the delta's).
    pub shape: Vec<usize>,
    /// Output dtype: the target tensor's float dtype (f32 for quantised).
    pub dtype: DType,
    /// Which delta it receives.
    pub origin: DeltaOrigin,
}

/// A validated graft: the output tensors in write order, nothing written.
#[derive(Debug, Clone)]
pub struct GraftPlan {
    /// Output tensors in write order (grouped by delta, see the module docs).
    pub tensors: Vec<GraftTensor>,
    /// The writer's plan: `tensors` under the output layout's names, then
    /// the layout's zero tensors.
    pub planned: Vec<PlannedTensor>,
    /// The output layout of an MoE target (`None` for a dense one).
    pub choice: Option<LayoutChoice>,
    /// The delta tensors in the order they are computed, with their shapes.
    pub deltas: Vec<(String, Vec<usize>)>,
    /// The options.
    pub options: GraftOptions,
    /// Notes for the user (e.g. base and instruct stored in different
    /// dtypes).
    pub warnings: Vec<String>,
}

/// Norms of one delta tensor (for the report and the browser's chart).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeltaStat {
    /// Delta tensor name (a dense model's name).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// `||instruct - base||_2` (unscaled), accumulated in f64.
    pub delta_l2: f64,
    /// `||base||_2`.
    pub base_l2: f64,
    /// `delta_l2 / base_l2` (0 when `base_l2` is 0).
    pub relative: f64,
    /// `max |instruct - base|`.
    pub max_abs: f64,
    /// How many output tensors received it (1, or `E_l` for an FFN delta).
    pub applied_to: usize,
}

/// Summary of a graft (the CLI's `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct GraftReport {
    /// Always `"graft"`.
    pub method: &'static str,
    /// The target model (MoE or dense).
    pub target: String,
    /// The dense base model.
    pub base: String,
    /// The post-trained model.
    pub instruct: String,
    /// Output directory, when written to disk.
    pub out_dir: Option<String>,
    /// The delta scale `lambda`.
    pub scale: f64,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written (headers and JSON files excluded).
    pub tensor_bytes: u64,
    /// Output tensors that received a delta.
    pub grafted: usize,
    /// Expert tensors among them.
    pub expert_tensors: usize,
    /// Router tensors copied unchanged.
    pub routers: usize,
    /// Wall time of the whole graft in seconds (native [`graft`] only).
    pub seconds: Option<f64>,
    /// Per-delta-tensor norms, in computation order.
    pub deltas: Vec<DeltaStat>,
    /// Notes for the user.
    pub warnings: Vec<String>,
}

fn sources_label(a: &dyn TensorSource, b: &dyn TensorSource) -> String {
    format!("{} vs {}", a.source_name(), b.source_name())
}

fn is_vocab_tensor(name: &str) -> bool {
    name == "model.embed_tokens.weight" || name == "lm_head.weight"
}

/// Checks that two checkpoints hold the same tensor names with the same
/// shapes (the dtypes may differ). `role_a` / `role_b` name them in errors
/// ("base", "instruct", "model 2", ...).
///
/// # Errors
/// [`StudioError::Tensor`] naming both sources and the first tensor (in
/// `a`'s order) that is missing from one of them or whose shape differs; a
/// different first dimension of `model.embed_tokens.weight` or
/// `lm_head.weight` is reported as different vocabularies.
/// [`StudioError::Invalid`] when `a` holds no tensor.
pub fn check_same_tensors(a: &dyn TensorSource, role_a: &str, b: &dyn TensorSource, role_b: &str) -> Result<()> {
    let ta = a.tensors();
    if ta.is_empty() {
        return Err(StudioError::Invalid(format!("{role_a} {} holds no tensors", a.source_name())));
    }
    let tb: HashMap<String, TensorInfo> = b.tensors().into_iter().map(|t| (t.name.clone(), t)).collect();
    let label = sources_label(a, b);
    for t in &ta {
        let Some(u) = tb.get(&t.name) else {
            return Err(StudioError::tensor(
                &label,
                &t.name,
                format!(
                    "present in the {role_a} ({}) but missing from the {role_b} ({})",
                    a.source_name(),
                    b.source_name()
                ),
            ));
        };
        if t.shape != u.shape {
            let vocab = is_vocab_tensor(&t.name)
                && t.shape.len() == 2
                && u.shape.len() == 2
                && t.shape[1] == u.shape[1]
                && t.shape[0] != u.shape[0];
            let what = if vocab {
                format!(
                    "different vocabularies: the {role_a} ({}) has {} tokens, the {role_b} ({}) has {} (shapes {:?} and {:?})",
                    a.source_name(),
                    t.shape[0],
                    b.source_name(),
                    u.shape[0],
                    t.shape,
                    u.shape
                )
            } else {
                format!(
                    "shape {:?} in the {role_a} ({}) but {:?} in the {role_b} ({})",
                    t.shape,
                    a.source_name(),
                    u.shape,
                    b.source_name()
                )
            };
            return Err(StudioError::tensor(&label, &t.name, what));
        }
    }
    if tb.len() != ta.len() {
        let names: std::collections::HashSet<&str> = ta.iter().map(|t| t.name.as_str()).collect();
        let extra = b.tensors().into_iter().find(|t| !names.contains(t.name.as_str())).map(|t| t.name);
        if let Some(extra) = extra {
            return Err(StudioError::tensor(
                &label,
                extra,
                format!(
                    "present in the {role_b} ({}) but missing from the {role_a} ({})",
                    b.source_name(),
                    a.source_name()
                ),
            ));
        }
    }
    Ok(())
}

/// Output dtype of a target tensor: its float dtype, f32 for quantised.
fn out_dtype(src: DType) -> DType {
    if src.float_size().is_some() {
        src
    } else {
        DType::F32
    }
}

/// Validates a graft and plans its output (reads tensor headers only).
///
/// `target` is the model that receives the delta (an MoE from
/// [`super::upcycle`], a Mixtral checkpoint, or a dense model) with its
/// configuration `target_config` / `target_moe`; `base` and `instruct` are
/// the dense pair whose difference is the delta.
///
/// # Errors
/// - [`StudioError::Config`] when `scale` is not finite;
/// - those of [`check_same_tensors`] for base vs instruct;
/// - [`StudioError::Tensor`] naming the target and tensor when the target
///   lacks a tensor its configuration describes (or has it in another
///   shape), when a target tensor (router aside) has no delta tensor or one
///   of another shape ("the MoE's dense source does not match the delta"),
///   or when a delta tensor has no place in the target.
pub fn plan_graft(
    target: &dyn TensorSource,
    target_config: &ModelConfig,
    target_moe: Option<&MoeConfig>,
    base: &dyn TensorSource,
    instruct: &dyn TensorSource,
    opts: &GraftOptions,
) -> Result<GraftPlan> {
    // The arithmetic is f32: a scale finite in f64 but not in f32 (1e39)
    // would turn every zero delta into NaN.
    if !opts.scale.is_finite() || !(opts.scale as f32).is_finite() {
        return Err(StudioError::config(
            "--scale",
            format!("the delta scale must be a finite f32 number, |scale| < 3.4e38 (got {})", opts.scale),
        ));
    }
    if let Some((l, s)) = target_moe.into_iter().flat_map(|m| m.layers.iter().enumerate()).find_map(|(l, s)| {
        s.as_ref().filter(|s| s.expert_width(target_config) != target_config.intermediate_size).map(|s| (l, s))
    }) {
        return Err(StudioError::config(
            target.source_name(),
            format!(
                "layer {l}'s experts are slices of {} of the FFN's {} units (granular upcycling): grafting the dense \
                 FFN delta onto them would need it sliced and scaled as the upcycle did, which graft does not do",
                s.expert_width(target_config),
                target_config.intermediate_size
            ),
        ));
    }
    check_same_tensors(base, "base", instruct, "instruct")?;
    let target_tensors = target.tensors();
    if target_tensors.is_empty() {
        return Err(StudioError::Invalid(format!("target {} holds no tensors", target.source_name())));
    }
    let by_name: HashMap<&str, &TensorInfo> = target_tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    for (name, shape) in crate::checkpoint::check::expected_tensors(target_config, target_moe) {
        match by_name.get(name.as_str()) {
            None => {
                return Err(StudioError::tensor(
                    target.source_name(),
                    &name,
                    format!("missing, but the target's configuration describes it (shape {shape:?})"),
                ))
            }
            Some(t) if t.shape != shape => {
                return Err(StudioError::tensor(
                    target.source_name(),
                    &name,
                    format!("shape {:?} does not match the target's configuration (expected {shape:?})", t.shape),
                ))
            }
            Some(_) => {}
        }
    }
    let base_infos: HashMap<String, TensorInfo> = base.tensors().into_iter().map(|t| (t.name.clone(), t)).collect();
    let mut groups: Vec<Vec<GraftTensor>> = Vec::new();
    let mut group_of: HashMap<String, usize> = HashMap::new();
    let mut deltas = Vec::new();
    for t in &target_tensors {
        let origin = delta_origin(&t.name);
        let gt = GraftTensor { name: t.name.clone(), shape: t.shape.clone(), dtype: out_dtype(t.dtype), origin };
        let Some(dname) = gt.origin.delta_name().map(str::to_string) else {
            groups.push(vec![gt]);
            continue;
        };
        if dname == t.name && t.name.ends_with(".bias") && !base_infos.contains_key(&dname) {
            // Neither base nor instruct has it (their tensors are the same, checked above).
            groups.push(vec![GraftTensor { origin: DeltaOrigin::NoBias, ..gt }]);
            continue;
        }
        let Some(d) = base_infos.get(&dname) else {
            let what = if dname == t.name {
                format!(
                    "has no counterpart in the base model {} (the target must be built from a model with the base's tensors)",
                    base.source_name()
                )
            } else {
                format!(
                    "its delta would come from `{dname}`, which the base model {} does not have (the MoE's dense source does not match the delta)",
                    base.source_name()
                )
            };
            return Err(StudioError::tensor(target.source_name(), &t.name, what));
        };
        if d.shape != t.shape {
            return Err(StudioError::tensor(
                target.source_name(),
                &t.name,
                format!(
                    "shape {:?}, but its delta `{dname}` in {} has shape {:?} (the MoE's dense source does not match the delta's shapes)",
                    t.shape,
                    base.source_name(),
                    d.shape
                ),
            ));
        }
        match group_of.get(&dname) {
            Some(&g) => groups[g].push(gt),
            None => {
                group_of.insert(dname.clone(), groups.len());
                deltas.push((dname, d.shape.clone()));
                groups.push(vec![gt]);
            }
        }
    }
    if let Some(unused) = base.tensors().into_iter().find(|t| !group_of.contains_key(&t.name)) {
        return Err(StudioError::tensor(
            sources_label(base, target),
            &unused.name,
            format!(
                "the delta has this tensor but the target {} has nowhere to put it (is the target built from this base? e.g. tied vs untied embeddings, a different layer count)",
                target.source_name()
            ),
        ));
    }
    let mut warnings = Vec::new();
    let ib: HashMap<String, DType> = instruct.tensors().into_iter().map(|t| (t.name, t.dtype)).collect();
    if let Some((n, bd, id)) = base.tensors().into_iter().find_map(|t| {
        let id = ib.get(&t.name).copied()?;
        (id != t.dtype).then_some((t.name, t.dtype, id))
    }) {
        warnings.push(format!(
            "base and instruct store tensors in different dtypes (e.g. `{n}`: {bd} vs {id}): the delta includes their rounding difference"
        ));
    }
    let tensors: Vec<GraftTensor> = groups.into_iter().flatten().collect();
    let planned: Vec<PlannedTensor> = tensors
        .iter()
        .map(|t| PlannedTensor { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() })
        .collect();
    let choice = target_moe
        .map(|m| crate::layout::choose(target_config, m, opts.layout).map(|c| c.with_experts(opts.experts_format)))
        .transpose()?;
    let planned = match &choice {
        Some(c) => {
            warnings.extend(c.warnings.iter().cloned());
            c.disk_plan(target_config, &planned)
        }
        None => planned,
    };
    Ok(GraftPlan { tensors, planned, choice, deltas, options: opts.clone(), warnings })
}

/// `theta + s_delta` elementwise, in place, keeping `theta` where `s_delta`
/// is exactly zero (so a zero delta is bit-exact, `-0.0` included).
pub fn add_scaled_delta(theta: &mut [f32], scaled_delta: &[f32]) {
    for (t, &d) in theta.iter_mut().zip(scaled_delta) {
        if d != 0.0 {
            *t += d;
        }
    }
}

impl DeltaStat {
    /// Norms of `instruct - base` for the tensor `name` (`applied_to` 0;
    /// the caller counts the outputs). Both slices hold the tensor's values
    /// (f32, same length); sums are accumulated in f64.
    pub fn measure(name: &str, shape: &[usize], base: &[f32], instruct: &[f32]) -> DeltaStat {
        let (mut d2, mut b2, mut max_abs) = (0f64, 0f64, 0f64);
        for (&i, &b) in instruct.iter().zip(base) {
            let d = i - b;
            d2 += f64::from(d) * f64::from(d);
            b2 += f64::from(b) * f64::from(b);
            max_abs = max_abs.max(f64::from(d.abs()));
        }
        let (delta_l2, base_l2) = (d2.sqrt(), b2.sqrt());
        DeltaStat {
            name: name.to_string(),
            shape: shape.to_vec(),
            delta_l2,
            base_l2,
            relative: if base_l2 > 0.0 { delta_l2 / base_l2 } else { 0.0 },
            max_abs,
            applied_to: 0,
        }
    }
}

/// Computes `scale * (instruct - base)` (f32, in place into `instruct`) and
/// its statistics.
fn scaled_delta(
    name: &str,
    shape: &[usize],
    base: Vec<f32>,
    mut instruct: Vec<f32>,
    scale: f32,
) -> (Vec<f32>, DeltaStat) {
    let stat = DeltaStat::measure(name, shape, &base, &instruct);
    for (i, &b) in instruct.iter_mut().zip(&base) {
        *i = scale * (*i - b);
    }
    (instruct, stat)
}

/// Streams the grafted tensors of `plan` into `sink`; returns the delta
/// statistics in computation order.
///
/// # Errors
/// Read errors of the sources (a tensor whose element count disagrees with
/// its header is reported as [`StudioError::Tensor`]); write errors of
/// `sink`.
pub fn write_graft(
    target: &dyn TensorSource,
    base: &dyn TensorSource,
    instruct: &dyn TensorSource,
    plan: &GraftPlan,
    sink: &mut dyn TensorSink,
) -> Result<Vec<DeltaStat>> {
    let scale = plan.options.scale as f32;
    let studio: &dyn crate::layout::MoeLayout = &crate::layout::studio::Studio;
    let (layout, zeros, router_scale) = match &plan.choice {
        Some(c) => (c.layout, &plan.planned[plan.tensors.len()..], c.router_scale.as_slice()),
        None => (studio, &plan.planned[..0], &[][..]),
    };
    let mut out = crate::layout::LayoutSink::new(sink, layout, zeros);
    let sink: &mut dyn TensorSink = &mut out;
    let mut stats: Vec<DeltaStat> = Vec::with_capacity(plan.deltas.len());
    let mut current: Option<(String, Vec<f32>)> = None;
    let check_len = |src: &dyn TensorSource, name: &str, v: &[f32], shape: &[usize]| -> Result<()> {
        let n: usize = shape.iter().product();
        if v.len() != n {
            return Err(StudioError::tensor(
                src.source_name(),
                name,
                format!("read {} values but shape {shape:?} needs {n}", v.len()),
            ));
        }
        Ok(())
    };
    for t in &plan.tensors {
        // The delta first (base and instruct are dropped once it exists),
        // then the target tensor: at most three f32 tensors live at once.
        if let Some(dname) = t.origin.delta_name() {
            if current.as_ref().map(|c| c.0.as_str()) != Some(dname) {
                // Free the previous delta before reading the next pair.
                drop(current.take());
                let b = base.read_f32(dname)?;
                check_len(base, dname, &b, &t.shape)?;
                let i = instruct.read_f32(dname)?;
                check_len(instruct, dname, &i, &t.shape)?;
                let (d, stat) = scaled_delta(dname, &t.shape, b, i, scale);
                stats.push(stat);
                current = Some((dname.to_string(), d));
            }
        }
        let mut theta = target.read_f32(&t.name)?;
        check_len(target, &t.name, &theta, &t.shape)?;
        if t.origin.delta_name().is_some() {
            let (_, d) = current.as_ref().expect("set above");
            let was_finite = theta.iter().all(|v| v.is_finite());
            add_scaled_delta(&mut theta, d);
            if was_finite && !theta.iter().all(|v| v.is_finite()) {
                return Err(StudioError::tensor(
                    target.source_name(),
                    &t.name,
                    format!(
                        "theta + {} * (instruct - base) overflows f32 (inf/NaN); use a smaller --scale",
                        plan.options.scale
                    ),
                ));
            }
            if let Some(s) = stats.last_mut() {
                s.applied_to += 1;
            }
        }
        if let TensorRole::Router { layer } = names::parse(&t.name) {
            // A temperature the output layout folds (studio target, public output).
            let s = router_scale.get(layer).copied().unwrap_or(1.0) as f32;
            if s != 1.0 {
                theta.iter_mut().for_each(|w| *w *= s);
            }
        }
        sink.write_tensor(&t.name, &to_bytes(t.dtype, &theta, &t.name)?)?;
    }
    out.finish()?;
    Ok(stats)
}

/// A report for `plan` with its delta statistics.
pub fn graft_report(
    target: &dyn TensorSource,
    base: &dyn TensorSource,
    instruct: &dyn TensorSource,
    plan: &GraftPlan,
    deltas: Vec<DeltaStat>,
) -> GraftReport {
    let grafted = plan.tensors.iter().filter(|t| t.origin.delta_name().is_some()).count();
    let expert_tensors = plan.tensors.iter().filter(|t| matches!(t.origin, DeltaOrigin::Expert { .. })).count();
    GraftReport {
        method: "graft",
        target: target.source_name().to_string(),
        base: base.source_name().to_string(),
        instruct: instruct.source_name().to_string(),
        out_dir: None,
        scale: plan.options.scale,
        tensors: plan.planned.len(),
        tensor_bytes: plan.planned.iter().map(|p| p.byte_len() as u64).sum(),
        grafted,
        expert_tensors,
        routers: plan.tensors.len() - grafted,
        seconds: None,
        deltas,
        warnings: plan.warnings.clone(),
    }
}

/// Grafts `scale * (instruct - base)` onto `target` (see the module docs)
/// and writes the result to `out_dir` atomically: safetensors (sharded per
/// `write_opts`) plus `extra_files` (the target's `config.json`,
/// `tokenizer.json`, ... copied by the caller). Everything is validated
/// before the output is created; no partial directory is left on error.
///
/// # Errors
/// Those of [`plan_graft`] and [`write_graft`]; [`StudioError::Invalid`]
/// when `out_dir` exists and is not empty; I/O.
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::too_many_arguments)]
pub fn graft(
    target: &dyn TensorSource,
    target_config: &ModelConfig,
    target_moe: Option<&MoeConfig>,
    base: &dyn TensorSource,
    instruct: &dyn TensorSource,
    opts: &GraftOptions,
    out_dir: &std::path::Path,
    extra_files: &[(&str, Vec<u8>)],
    write_opts: crate::tensor_io::WriteOptions,
) -> Result<GraftReport> {
    let start = std::time::Instant::now();
    let plan = plan_graft(target, target_config, target_moe, base, instruct, opts)?;
    let mut write_opts = write_opts;
    write_opts.card_detail("scale", format!("{} (θ + scale · (instruct − base))", opts.scale));
    let (w, stats) = match &plan.choice {
        Some(choice) => {
            if let Some(c) = write_opts.card.as_mut() {
                crate::checkpoint::output::card_moe_details(c, target_config, choice, &plan.planned);
            }
            let file_plan = choice.file_plan(&plan.planned)?;
            let mut w = crate::tensor_io::SafetensorsWriter::create(out_dir, file_plan, write_opts)?;
            let stats = write_graft(target, base, instruct, &plan, &mut choice.packing_sink(&mut w, &plan.planned)?)?;
            (w, stats)
        }
        None => {
            let mut w = crate::tensor_io::SafetensorsWriter::create(out_dir, plan.planned.clone(), write_opts)?;
            let stats = write_graft(target, base, instruct, &plan, &mut w)?;
            (w, stats)
        }
    };
    let extra: Vec<(&str, Vec<u8>)> = extra_files
        .iter()
        .map(|(n, b)| (*n, if *n == "config.json" { graft_config_json(&plan, target_config, b) } else { b.clone() }))
        .collect();
    w.finish(&extra)?;
    let mut report = graft_report(target, base, instruct, &plan, stats);
    report.out_dir = Some(out_dir.display().to_string());
    report.seconds = Some(start.elapsed().as_secs_f64());
    Ok(report)
}

/// The output `config.json` of a graft, from the target's `old` one: the
/// same bytes when the output keeps the target's layout (or is dense), else
/// the output layout's `config.json` of the same MoE (temperatures folded
/// as written), with `torch_dtype` and the target's `moe_studio.provenance`
/// carried over. The CLI and the browser both call it.
pub fn graft_config_json(plan: &GraftPlan, target_config: &ModelConfig, old: &[u8]) -> Vec<u8> {
    let Some(choice) = &plan.choice else { return old.to_vec() };
    let Ok(old_v) = serde_json::from_slice::<serde_json::Value>(old) else { return old.to_vec() };
    if old_v.get("model_type").and_then(|t| t.as_str()) == choice.layout.model_type() {
        return old.to_vec();
    }
    let dtype = plan.planned.first().map(|p| p.dtype).unwrap_or(DType::F32);
    let provenance = old_v.pointer("/moe_studio/provenance").cloned().unwrap_or(serde_json::Value::Null);
    let v = crate::checkpoint::output::config_json(target_config, choice, dtype, provenance);
    serde_json::to_vec_pretty(&v).expect("json")
}

/// The Hugging Face `config.json` for a model that has none of its own
/// (a `.gguf` or llama2.c input): the MoE config in the layout it was read
/// in, or the dense config, null fields left out. Used by [`companion_files`]
/// and by the browser, so both write the same bytes.
pub fn generated_config_json(model: &crate::checkpoint::LoadedModel) -> serde_json::Value {
    match &model.moe {
        Some(m) => {
            let layout = model.layout.unwrap_or(&crate::layout::studio::Studio);
            layout.write_config(&model.config, m)
        }
        None => model.config.to_config_json(None),
    }
}

/// The files of a model directory that a derived checkpoint copies:
/// `config.json`, `tokenizer.json`, `tokenizer_config.json`,
/// `special_tokens_map.json`, `generation_config.json` (those present).
/// For a model that is not a directory (GGUF, llama2.c), `config.json` is
/// generated from its configuration and the tokenizer exported when it has
/// a Hugging Face form.
///
/// # Errors
/// I/O errors reading the files.
#[cfg(not(target_arch = "wasm32"))]
pub fn companion_files(
    model_path: &std::path::Path,
    model: &crate::checkpoint::LoadedModel,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    const NAMES: [&str; 5] =
        ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"];
    let mut out = Vec::new();
    if model_path.is_dir() {
        for n in NAMES {
            let p = model_path.join(n);
            if p.exists() {
                out.push((n, std::fs::read(&p).map_err(|e| StudioError::io(p.display(), e))?));
            }
        }
        return Ok(out);
    }
    out.push(("config.json", serde_json::to_vec_pretty(&generated_config_json(model)).expect("json")));
    if let Some(t) = model.tokenizer.as_ref().and_then(|t| t.to_hf_json()) {
        out.push(("tokenizer.json", t.into_bytes()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_their_deltas() {
        assert_eq!(
            delta_origin("model.layers.3.block_sparse_moe.experts.2.w1.weight"),
            DeltaOrigin::Expert { layer: 3, expert: 2, delta: "model.layers.3.mlp.gate_proj.weight".into() }
        );
        assert_eq!(
            delta_origin("model.layers.0.block_sparse_moe.experts.0.w3.weight").delta_name(),
            Some("model.layers.0.mlp.up_proj.weight")
        );
        assert_eq!(
            delta_origin("model.layers.0.block_sparse_moe.experts.7.w2.weight").delta_name(),
            Some("model.layers.0.mlp.down_proj.weight")
        );
        assert_eq!(delta_origin("model.layers.1.block_sparse_moe.gate.weight"), DeltaOrigin::Router { layer: 1 });
        assert_eq!(delta_origin("model.layers.1.block_sparse_moe.gate.bias"), DeltaOrigin::Router { layer: 1 });
        for kept in [
            "model.layers.2.block_sparse_moe.gate.e_score_correction_bias",
            "model.layers.2.block_sparse_moe.shared_expert_gate.weight",
            "model.layers.2.block_sparse_moe.shared_experts.1.w2.weight",
        ] {
            assert_eq!(delta_origin(kept), DeltaOrigin::Router { layer: 2 }, "{kept}");
        }
        for n in ["model.embed_tokens.weight", "model.layers.2.mlp.up_proj.weight", "lm_head.weight"] {
            assert_eq!(delta_origin(n).delta_name(), Some(n));
        }
    }

    #[test]
    fn zero_delta_keeps_negative_zero() {
        let mut t = vec![-0.0f32, 1.0, f32::MIN_POSITIVE];
        add_scaled_delta(&mut t, &[0.0, 0.0, 0.0]);
        assert_eq!(t[0].to_bits(), (-0.0f32).to_bits());
        add_scaled_delta(&mut t, &[1.0, -1.0, 0.0]);
        assert_eq!(t, vec![1.0, 0.0, f32::MIN_POSITIVE]);
    }
}
