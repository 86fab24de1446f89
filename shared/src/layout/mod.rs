//! MoE checkpoint layouts: one room for "how does this MoE look on disk".
//!
//! A layout is the on-disk form of an MoE checkpoint that some loader reads:
//! its `config.json`, its tensor names, the tensors it requires that the
//! studio's model does not have (a zero shared expert), and the check
//! whether a given MoE can be written in it **exactly** (same function,
//! bit for bit up to float rounding), with the reason shown to the user
//! when it cannot. The studio reads and writes MoE checkpoints only through
//! this module; everything else sees the canonical names of [`names`].
//!
//! The registry ([`REGISTRY`]), in the order `auto` tries them:
//!
//! | name | file | loaders | holds |
//! |---|---|---|---|
//! | `mixtral` | [`mixtral`] | transformers `MixtralForCausalLM`, candle `mixtral`, vLLM, llama.cpp (`convert --to gguf`) | every layer MoE, one `E`, `k` and expert width (granular experts: `intermediate_size` is the expert width), renormalised top-k, no router bias, no q/k/v bias, no shared experts, no selection bias |
//! | `qwen2_moe` | [`qwen2_moe`] | transformers `Qwen2MoeForCausalLM`, candle `qwen2_moe`, vLLM | one `E`, `k`, expert width (`moe_intermediate_size`) and `norm_topk_prob` (true or false); dense layers (`mlp_only_layers`); q/k/v bias on or off; exactly one sigmoid-gated shared expert per MoE layer (the model's own, else written as an exact zero) |
//! | `qwen3_moe` | [`qwen3_moe`] | transformers `Qwen3MoeForCausalLM` | qwen3 bases only (q/k RMSNorm), writer ready for when that family lands; no shared experts |
//! | `deepseek_moe` | [`deepseek_moe`] | no Hugging Face loader here (refused as safetensors, with the reason); llama.cpp `deepseek` through `convert --to gguf` ([`deepseek_moe::deepseek_form`]) | leading dense layers, one `E`, `k` and expert width, un-normalised top-k (or `k = E`), ungated shared experts (any number whose width is whole experts; none: a zero one), no router or selection bias, Llama attention with queries `hidden_size` wide, no per-frequency RoPE factors |
//! | `moe_studio` | [`studio`] | moe-studio | anything (per-layer `E_l`, `k_l`, expert widths, router bias, temperature, any number of shared experts gated or not, `norm_topk_prob`, the aux-loss-free selection bias) |
//!
//! Frozen experts are metadata (`moe_studio.frozen_experts` and, for
//! frozen shared experts, `moe_studio.shared_frozen` in `config.json`) in
//! every layout, so `--frozen 0` never forces the studio layout. Router temperatures are folded into the router weight (`W / T`,
//! exact) in every layout but the studio's.
//!
//! **Adding a layout** touches its own file (a unit struct implementing
//! [`MoeLayout`]) and one line of [`REGISTRY`]; see ARCHITECTURE.md.
//!
//! Sources: transformers' `MixtralConfig`, `Qwen2MoeConfig`,
//! `Qwen3MoeConfig` and their modelling files (field names, defaults and
//! the routing each computes); mergekit's `mergekit/moe/` output
//! architectures (the `supports_config(explain)` pattern); methods.md
//! "Checkpoint formats".

pub mod deepseek_moe;
mod io;
pub mod mixtral;
pub mod names;
pub mod packed;
pub mod qwen2_moe;
pub mod qwen3_moe;
pub mod studio;

pub use io::{wrap_source, LayoutSink, LayoutSource};
pub use names::{Proj, TensorRole};
pub use packed::ExpertsFormat;

use crate::config::{HfConfig, ModelConfig, MoeConfig, MoeLayerSpec};
use crate::error::{Result, StudioError};
use crate::tensor_io::{DType, PlannedTensor, TensorSource};

/// The layouts, in the order `auto` tries them (the studio layout last: it
/// holds everything).
pub static REGISTRY: &[&dyn MoeLayout] =
    &[&mixtral::Mixtral, &qwen2_moe::Qwen2Moe, &qwen3_moe::Qwen3Moe, &deepseek_moe::DeepseekMoe, &studio::Studio];

/// The shared experts a layout holds in each MoE layer (experts every token
/// goes through, beside the routed top-k).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedExperts {
    /// None (Mixtral).
    None,
    /// `count` shared experts, each scaled by `sigmoid(g · x)` with its own
    /// gate `g: [1, d]` (Qwen2-MoE: one). `required`: the layout has no way
    /// to leave them out, so a model without them is written with an exact
    /// zero shared expert (down projection 0).
    Gated {
        /// Shared experts per MoE layer.
        count: usize,
        /// Whether the layout always has them.
        required: bool,
    },
    /// Any number of ungated shared experts (DeepSeek-MoE: `n_shared_experts`).
    Ungated,
    /// Any number, gated or not (the studio layout).
    Any,
}

/// Why a layout cannot hold a model exactly: the field and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    /// The configuration field concerned (`router_bias`, `num_experts`,
    /// `attention_bias`, `architecture`, ...), as the user would look it up.
    pub field: &'static str,
    /// What is there and what the layout needs.
    pub why: String,
}

impl Blocker {
    /// A blocker on `field`.
    pub fn new(field: &'static str, why: impl Into<String>) -> Self {
        Blocker { field, why: why.into() }
    }
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (`{}`)", self.why, self.field)
    }
}

/// One MoE checkpoint layout (see the module docs). Implementations are
/// unit structs, one per file, listed in [`REGISTRY`].
pub trait MoeLayout: Sync + Send {
    /// Registry name, used by `--layout` and in reports (`mixtral`, ...).
    fn name(&self) -> &'static str;

    /// Who loads it, for messages and the compatibility matrix.
    fn loaders(&self) -> &'static str;

    /// Whether a public loader reads it (every layout but the studio's).
    fn public(&self) -> bool {
        true
    }

    /// The shared experts it holds.
    fn shared_experts(&self) -> SharedExperts;

    /// Whether router temperatures are stored (`true`: the studio layout)
    /// rather than folded into the router weight.
    fn keeps_temperature(&self) -> bool {
        false
    }

    /// Whether `moe` on `base` can be written in this layout exactly.
    ///
    /// # Errors
    /// The first [`Blocker`] found.
    fn check(&self, base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<(), Blocker>;

    /// `config.json` of `moe` (as written: temperatures already folded when
    /// the layout folds them) on `base`.
    fn write_config(&self, base: &ModelConfig, moe: &MoeConfig) -> serde_json::Value;

    /// The `model_type` of the `config.json` files this layout reads
    /// (`None`: it has no Hugging Face reader).
    fn model_type(&self) -> Option<&'static str>;

    /// Reads the dense base and the MoE layout of a `config.json` whose
    /// `model_type` is [`MoeLayout::model_type`].
    ///
    /// # Errors
    /// [`StudioError::Config`] / [`StudioError::Format`] naming `source_name`
    /// and the field.
    fn read_config(&self, config: &serde_json::Value, source_name: &str) -> Result<(ModelConfig, MoeConfig)>;

    /// The on-disk name of a canonical tensor (default: the canonical name).
    fn disk_name(&self, role: &TensorRole) -> String {
        names::canonical(role)
    }

    /// The role of an on-disk tensor name (default: [`names::parse`]).
    fn role_of(&self, disk: &str) -> TensorRole {
        names::parse(disk)
    }

    /// Whether [`MoeLayout::disk_name`] is the identity (no renaming view
    /// is needed on read).
    fn renames(&self) -> bool {
        false
    }

    /// The module prefixes under which layer `layer`'s routed experts may be
    /// packed (`{prefix}.experts.gate_up_proj [E, 2f, d]`,
    /// `{prefix}.experts.down_proj [E, d, f]`, [`packed`]), the one written
    /// first; when writing packed experts the router is
    /// `{prefix}.gate.weight`. Default: the canonical
    /// `model.layers.{layer}.block_sparse_moe` (the studio layout).
    fn packed_prefixes(&self, layer: usize) -> Vec<String> {
        vec![format!("model.layers.{layer}.block_sparse_moe")]
    }

    /// Tensors the layout requires that `moe` does not have, written as
    /// zeros (canonical roles with shapes; default none).
    fn zero_tensors(&self, _base: &ModelConfig, _moe: &MoeConfig) -> Vec<(TensorRole, Vec<usize>)> {
        Vec::new()
    }

    /// On read: checks the tensors of [`MoeLayout::zero_tensors`] in the
    /// on-disk source are what the studio can drop exactly (default: none
    /// to check).
    ///
    /// # Errors
    /// [`StudioError::Tensor`] naming the tensor and why it cannot be dropped.
    fn check_dropped(&self, _src: &dyn TensorSource, _base: &ModelConfig, _moe: &MoeConfig) -> Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for dyn MoeLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The layout named `name` (`studio` is accepted for `moe_studio`).
pub fn by_name(name: &str) -> Option<&'static dyn MoeLayout> {
    let name = if name == "studio" { "moe_studio" } else { name };
    REGISTRY.iter().copied().find(|l| l.name() == name)
}

/// The registry names, comma-separated (for help and errors).
pub fn names_list() -> String {
    REGISTRY.iter().map(|l| l.name()).collect::<Vec<_>>().join(", ")
}

/// The `config.json` `model_type`s of the MoE layouts the studio reads,
/// comma-separated (for errors).
pub fn readable_model_types() -> String {
    REGISTRY.iter().filter_map(|l| l.model_type()).collect::<Vec<_>>().join(", ")
}

/// What the user asked for with `--layout`.
#[derive(Debug, Clone, Copy, Default)]
pub enum LayoutRequest {
    /// The first public layout that holds the model exactly, else the
    /// studio layout (with the reasons).
    #[default]
    Auto,
    /// This layout, or a refusal naming why and which layouts can.
    Named(&'static dyn MoeLayout),
}

impl PartialEq for LayoutRequest {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (LayoutRequest::Auto, LayoutRequest::Auto) => true,
            (LayoutRequest::Named(a), LayoutRequest::Named(b)) => a.name() == b.name(),
            _ => false,
        }
    }
}

impl LayoutRequest {
    /// Parses `--layout`: `auto` or a registry name.
    ///
    /// # Errors
    /// [`StudioError::Config`] (source `--layout`) listing the names.
    pub fn parse(s: &str) -> Result<Self> {
        if s == "auto" {
            return Ok(LayoutRequest::Auto);
        }
        by_name(s).map(LayoutRequest::Named).ok_or_else(|| {
            StudioError::config("--layout", format!("unknown layout `{s}` (expected auto, {})", names_list()))
        })
    }
}

/// The layout an MoE will be written in, and the MoE as written.
#[derive(Debug, Clone)]
pub struct LayoutChoice {
    /// The layout.
    pub layout: &'static dyn MoeLayout,
    /// Why no public layout was used (`auto` falling back to the studio
    /// layout): one reason per public layout.
    pub reason: Option<String>,
    /// The MoE as it goes into `config.json`: temperatures are 1 where the
    /// layout folds `1 / T` into the router weight (exact: `(W / T) x =
    /// (W x) / T`).
    pub written: MoeConfig,
    /// Per-layer factor on router weights (`1 / T_l` when folded, else 1).
    pub router_scale: Vec<f64>,
    /// Notes for the user (loader caveats; the reason of a fallback).
    pub warnings: Vec<String>,
    /// How the routed experts are stored (`--experts-format`; default per
    /// expert). Set with [`LayoutChoice::with_experts`].
    pub experts: ExpertsFormat,
}

impl LayoutChoice {
    /// The layout's registry name.
    pub fn name(&self) -> &'static str {
        self.layout.name()
    }

    /// The on-disk name of the canonical tensor `name` in this layout.
    pub fn disk_name(&self, name: &str) -> String {
        self.layout.disk_name(&names::parse(name))
    }

    /// The writer's plan: `canonical` renamed to the layout's names, then
    /// the layout's zero tensors (each in the dtype of the layer's first
    /// expert, else of `canonical[0]`, else F32). The first
    /// `canonical.len()` entries line up with `canonical`; the rest are
    /// written by [`LayoutSink::finish`].
    pub fn disk_plan(&self, base: &ModelConfig, canonical: &[PlannedTensor]) -> Vec<PlannedTensor> {
        let mut out: Vec<PlannedTensor> = canonical
            .iter()
            .map(|p| PlannedTensor { name: self.layout.disk_name(&names::parse(&p.name)), ..p.clone() })
            .collect();
        let default = canonical.first().map(|p| p.dtype).unwrap_or(DType::F32);
        for (role, shape) in self.layout.zero_tensors(base, &self.written) {
            let dtype = role
                .layer()
                .and_then(|l| {
                    let e0 = names::expert_weight_name(l, 0, Proj::Gate);
                    canonical.iter().find(|p| p.name == e0).map(|p| p.dtype)
                })
                .unwrap_or(default);
            out.push(PlannedTensor { name: self.layout.disk_name(&role), dtype, shape });
        }
        out
    }

    /// This choice with the routed experts stored as `experts`.
    pub fn with_experts(mut self, experts: ExpertsFormat) -> Self {
        self.experts = experts;
        self
    }

    /// The tensors as the file holds them: `planned` (a [`Self::disk_plan`])
    /// itself for per-expert storage, else with each MoE layer's experts
    /// packed ([`packed::Packing`]). This is the plan to create the writer
    /// with; the methods keep streaming `planned`'s tensors through
    /// [`Self::sink`].
    ///
    /// # Errors
    /// Those of [`packed::Packing::new`].
    pub fn file_plan(&self, planned: &[PlannedTensor]) -> Result<Vec<PlannedTensor>> {
        match self.experts {
            ExpertsFormat::PerExpert => Ok(planned.to_vec()),
            ExpertsFormat::Packed => Ok(packed::Packing::new(self.layout, planned)?.file_plan().to_vec()),
        }
    }

    /// The sink to put between the methods' output (a [`LayoutSink`],
    /// which writes `planned`'s names) and `inner` (a writer created with
    /// [`Self::file_plan`]): it packs the routed experts when
    /// [`Self::experts`] says so, else passes everything through.
    ///
    /// # Errors
    /// Those of [`packed::Packing::new`].
    pub fn packing_sink<'a>(
        &self,
        inner: &'a mut dyn crate::tensor_io::sink::TensorSink,
        planned: &[PlannedTensor],
    ) -> Result<packed::PackingSink<'a>> {
        let packing = match self.experts {
            ExpertsFormat::PerExpert => None,
            ExpertsFormat::Packed => Some(packed::Packing::new(self.layout, planned)?),
        };
        Ok(packed::PackingSink::new(inner, packing))
    }
}

/// Temperatures folded (`T := 1`, router scale `1 / T`) or kept.
fn fold(moe: &MoeConfig, keep: bool) -> (MoeConfig, Vec<f64>) {
    let mut written = moe.clone();
    let mut scale = Vec::with_capacity(moe.layers.len());
    for spec in written.layers.iter_mut() {
        match spec {
            Some(s) if !keep => {
                scale.push(1.0 / s.temperature);
                s.temperature = 1.0;
            }
            _ => scale.push(1.0),
        }
    }
    (written, scale)
}

/// The public layouts that hold `moe` on `base` exactly.
pub fn holding(base: &ModelConfig, moe: &MoeConfig) -> Vec<&'static str> {
    REGISTRY.iter().filter(|l| l.public() && l.check(base, moe).is_ok()).map(|l| l.name()).collect()
}

/// Picks the layout for `moe` on `base` (see [`LayoutRequest`]) and folds
/// temperatures where the layout does.
///
/// # Errors
/// [`StudioError::Config`] (source `--layout`) when a named layout cannot
/// hold the model: the field, why, and the layouts that can.
pub fn choose(base: &ModelConfig, moe: &MoeConfig, request: LayoutRequest) -> Result<LayoutChoice> {
    let (layout, reason) = match request {
        LayoutRequest::Named(l) => {
            if let Err(b) = l.check(base, moe) {
                let mut can = holding(base, moe);
                can.push(studio::Studio.name());
                return Err(StudioError::config(
                    "--layout",
                    format!(
                        "the `{}` layout cannot hold this model exactly: {b}; layouts that can: {}",
                        l.name(),
                        can.join(", ")
                    ),
                ));
            }
            (l, None)
        }
        LayoutRequest::Auto => match REGISTRY.iter().copied().find(|l| l.public() && l.check(base, moe).is_ok()) {
            Some(l) => (l, None),
            None => {
                let why: Vec<String> = REGISTRY
                    .iter()
                    .filter(|l| l.public())
                    .filter_map(|l| l.check(base, moe).err().map(|b| format!("{}: {b}", l.name())))
                    .collect();
                (&studio::Studio as &'static dyn MoeLayout, Some(why.join("; ")))
            }
        },
    };
    let (written, router_scale) = fold(moe, layout.keeps_temperature());
    let mut warnings = Vec::new();
    if let Some(r) = &reason {
        warnings.push(format!(
            "written in the studio layout (model_type: moe_studio), which transformers cannot load, because no public layout holds it exactly: {r}"
        ));
    }
    if layout.public() {
        // mergekit warns the same for its Mixtral output.
        warnings.extend(llama_cpp_expert_count_warnings(moe));
    }
    Ok(LayoutChoice { layout, reason, written, router_scale, warnings, experts: ExpertsFormat::PerExpert })
}

/// The largest expert count llama.cpp's CUDA fused top-k MoE kernel is
/// instantiated for (`ggml-cuda/topk-moe.cu`: powers of two up to 512).
pub const LLAMA_CPP_FUSED_TOPK_MAX_EXPERTS: usize = 512;

/// Warnings for expert counts llama.cpp's backends handle badly, one per
/// distinct count, as mergekit warns for its Mixtral output ("not a power
/// of two ... will not be usable in llama.cpp"). In the llama.cpp that
/// llama-cpp-python 0.3.36 vendors the CPU backend computes any count
/// (checked by the compatibility matrix), but the CUDA fused top-k MoE
/// kernel (`ggml_cuda_should_use_topk_moe`) takes only powers of two up to
/// [`LLAMA_CPP_FUSED_TOPK_MAX_EXPERTS`] (and two model-specific counts), so
/// other counts take the slower unfused path there, and older llama.cpp
/// builds refused them. A warning, never a refusal: the export is exact.
pub fn llama_cpp_expert_count_warnings(moe: &MoeConfig) -> Vec<String> {
    let mut counts: Vec<usize> = moe.layers.iter().flatten().map(|s| s.num_experts).collect();
    counts.sort_unstable();
    counts.dedup();
    counts
        .into_iter()
        .filter(|e| !e.is_power_of_two() || *e > LLAMA_CPP_FUSED_TOPK_MAX_EXPERTS)
        .map(|e| {
            format!(
                "{e} experts per layer is not a power of two up to {LLAMA_CPP_FUSED_TOPK_MAX_EXPERTS}: llama.cpp \
                 backends handle such counts badly (its CUDA fused top-k MoE kernel takes powers of two only; older \
                 builds refuse them), as mergekit warns; the export is exact and llama.cpp's CPU backend reads it"
            )
        })
        .collect()
}

/// Reads the layout, dense base and MoE of a `config.json`; `None` for a
/// dense model (a `model_type` no layout reads).
///
/// # Errors
/// Malformed JSON and the errors of [`MoeLayout::read_config`].
pub fn read_config_json(
    bytes: &[u8],
    source_name: &str,
) -> Result<Option<(&'static dyn MoeLayout, ModelConfig, MoeConfig)>> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| StudioError::format(source_name, "config.json", e.to_string()))?;
    let ty = v.get("model_type").and_then(|t| t.as_str()).unwrap_or("");
    let Some(layout) = REGISTRY.iter().copied().find(|l| l.model_type() == Some(ty)) else { return Ok(None) };
    let (base, moe) = layout.read_config(&v, source_name)?;
    moe.validate(&base, source_name)?;
    Ok(Some((layout, base, moe)))
}

// ---------------------------------------------------------------------------
// Helpers the layout files share.
// ---------------------------------------------------------------------------

/// `config.json` of the dense base with the `moe_studio` object every
/// layout carries: `version`, `layout`, `base_model_type` and
/// `frozen_experts` (one list per layer, empty for dense layers), which
/// transformers ignores.
pub(crate) fn base_config(base: &ModelConfig, moe: &MoeConfig, layout: &str) -> serde_json::Value {
    let mut v = base.to_config_json(None);
    let frozen: Vec<Vec<usize>> =
        moe.layers.iter().map(|s| s.as_ref().map(|s| s.frozen.clone()).unwrap_or_default()).collect();
    let obj = v.as_object_mut().expect("a config serialises to an object");
    obj.insert("router_aux_loss_coef".into(), moe.router_aux_loss_coef.into());
    let mut studio = serde_json::json!({
        "version": 1,
        "layout": layout,
        "base_model_type": base.architecture.model_type(),
        "frozen_experts": frozen,
    });
    let shared_frozen: Vec<bool> = moe.layers.iter().map(|s| s.as_ref().is_some_and(|s| s.shared_frozen)).collect();
    if shared_frozen.iter().any(|&f| f) {
        studio["shared_frozen"] = serde_json::json!(shared_frozen);
    }
    obj.insert("moe_studio".into(), studio);
    v
}

/// The dense base of an MoE `config.json`: the same keys read as a dense
/// config of `model_type: base_type`.
pub(crate) fn read_base(v: &serde_json::Value, base_type: &str, source_name: &str) -> Result<ModelConfig> {
    let mut dense = v.clone();
    dense["model_type"] = base_type.into();
    let hf: HfConfig =
        serde_json::from_value(dense).map_err(|e| StudioError::format(source_name, "config.json", e.to_string()))?;
    hf.to_model_config(source_name)
}

/// `moe_studio.base_model_type`, if recorded.
pub(crate) fn recorded_base_type(v: &serde_json::Value) -> Option<&str> {
    v.get("moe_studio").and_then(|s| s.get("base_model_type")).and_then(|t| t.as_str())
}

/// `moe_studio.frozen_experts`: one list per layer (empty when absent).
///
/// # Errors
/// [`StudioError::Config`] naming `source_name` when it is present but
/// not a list of `layers` lists of expert indices: a malformed or short
/// record would otherwise leave experts unfrozen without a word (training
/// would then update the original FFN that DeltaMoE keeps frozen).
pub(crate) fn recorded_frozen(v: &serde_json::Value, layers: usize, source_name: &str) -> Result<Vec<Vec<usize>>> {
    match v.get("moe_studio").and_then(|s| s.get("frozen_experts")) {
        Some(f) => frozen_record(f.clone(), layers, source_name, "`moe_studio.frozen_experts`"),
        None => Ok(Vec::new()),
    }
}

/// A frozen-experts record (`record`, named `key` in messages: config.json's
/// `moe_studio.frozen_experts` or the same GGUF metadata) read for a model
/// of `layers` layers: one index list per layer, each deduplicated (freezing
/// is a set: a checkpoint an earlier version wrote with `--frozen 0,0` reads
/// as `[0]`).
///
/// # Errors
/// [`StudioError::Config`] naming `source_name` and `key` when it is not a
/// list of index lists or does not have one per layer.
pub(crate) fn frozen_record(
    record: serde_json::Value,
    layers: usize,
    source_name: &str,
    key: &str,
) -> Result<Vec<Vec<usize>>> {
    let frozen: Vec<Vec<usize>> = serde_json::from_value(record)
        .map_err(|e| StudioError::config(source_name, format!("{key} is not a list of index lists: {e}")))?;
    if frozen.len() != layers {
        return Err(StudioError::config(
            source_name,
            format!("{key} lists {} layers, the model has {layers} (one list per layer, empty for none)", frozen.len()),
        ));
    }
    Ok(frozen.into_iter().map(dedup).collect())
}

/// `v` without its repeated entries, first occurrences kept in order.
fn dedup(v: Vec<usize>) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::with_capacity(v.len());
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// `moe_studio.shared_frozen` of layer `l` (false when absent).
pub(crate) fn recorded_shared_frozen(v: &serde_json::Value, l: usize) -> bool {
    v.get("moe_studio")
        .and_then(|s| s.get("shared_frozen"))
        .and_then(|f| f.get(l))
        .and_then(|f| f.as_bool())
        .unwrap_or(false)
}

/// An unsigned integer field of a `config.json`.
pub(crate) fn get_usize(v: &serde_json::Value, key: &str, source_name: &str, layout: &str) -> Result<usize> {
    v.get(key)
        .and_then(|x| x.as_u64())
        .map(|x| x as usize)
        .ok_or_else(|| StudioError::config(source_name, format!("{layout} config lacks `{key}` (an integer)")))
}

/// The one expert count and top-k of an MoE whose MoE layers all agree, or
/// the blocker naming the first layer that differs (or has a router bias).
pub(crate) fn uniform(moe: &MoeConfig, what: &str) -> std::result::Result<Option<(usize, usize)>, Blocker> {
    let mut first: Option<(usize, usize, usize)> = None;
    for (l, s) in moe.layers.iter().enumerate() {
        let Some(s) = s else { continue };
        if s.router_bias {
            return Err(Blocker::new(
                "router_bias",
                format!("layer {l}'s router has a bias, which {what} has no place for"),
            ));
        }
        match first {
            None => first = Some((l, s.num_experts, s.top_k)),
            Some((l0, e, _)) if s.num_experts != e => {
                return Err(Blocker::new(
                    "num_experts",
                    format!(
                        "layer {l} has {} experts and layer {l0} has {e}: {what} has one expert count for all layers (per-layer counts need the studio layout)",
                        s.num_experts
                    ),
                ))
            }
            Some((l0, _, k)) if s.top_k != k => {
                return Err(Blocker::new(
                    "top_k",
                    format!("layer {l} routes to {} experts and layer {l0} to {k}: {what} has one top-k", s.top_k),
                ))
            }
            _ => {}
        }
    }
    Ok(first.map(|(_, e, k)| (e, k)))
}

/// The first MoE layer whose spec satisfies `bad`.
fn first_layer(moe: &MoeConfig, bad: impl Fn(&MoeLayerSpec) -> bool) -> Option<usize> {
    moe.layers.iter().position(|s| s.as_ref().is_some_and(&bad))
}

/// Refuses shared experts (a layout with no place for them; methods.md §5).
pub(crate) fn no_shared_experts(moe: &MoeConfig, what: &str) -> std::result::Result<(), Blocker> {
    match first_layer(moe, |s| s.shared_experts > 0) {
        Some(l) => Err(Blocker::new(
            "shared_experts",
            format!(
                "layer {l} has {} shared expert(s), which {what} has no place for (qwen2_moe holds one gated shared \
                 expert, the studio layout any)",
                moe.layers[l].as_ref().map_or(0, |s| s.shared_experts)
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses a base whose blocks are not Llama's (q/k norms, GeGLU, Gemma's
/// norms: [`crate::config::family::Family::not_llama_blocks`]) for a layout
/// built on Llama's blocks (they would be dropped, changing the model).
pub(crate) fn no_qk_norm(base: &ModelConfig, what: &str) -> std::result::Result<(), Blocker> {
    if let Some(why) = base.architecture.family().not_llama_blocks() {
        return Err(Blocker::new("architecture", format!("{why}, and {what}'s blocks are Llama's")));
    }
    Ok(())
}

/// Refuses the aux-loss-free selection bias (DeepSeek-V3 §2.1.2), which
/// only the studio layout holds.
pub(crate) fn no_selection_bias(moe: &MoeConfig, what: &str) -> std::result::Result<(), Blocker> {
    match first_layer(moe, |s| s.selection_bias) {
        Some(l) => Err(Blocker::new(
            "selection_bias",
            format!(
                "layer {l}'s router has an aux-loss-free selection bias (`e_score_correction_bias`), which {what} has \
                 no place for (only the studio layout holds it)"
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses un-normalised top-k weights (`norm_topk_prob: false`) in a
/// layout that always renormalises over the top-k and has no
/// `norm_topk_prob` (Mixtral).
pub(crate) fn renormalised_top_k(moe: &MoeConfig, what: &str) -> std::result::Result<(), Blocker> {
    match first_layer(moe, |s| !s.norm_topk_prob) {
        Some(l) => Err(Blocker::new(
            "norm_topk_prob",
            format!(
                "layer {l} weighs its chosen experts by the softmax over all experts (norm_topk_prob false) and {what} \
                 always renormalises over the top-k (it has no `norm_topk_prob`; qwen2_moe and the studio layout \
                 hold it)"
            ),
        )),
        None => Ok(()),
    }
}

/// The one `norm_topk_prob` of all MoE layers (`true` when there is no MoE
/// layer), or the blocker naming the first layer that differs.
pub(crate) fn one_norm_topk(moe: &MoeConfig, what: &str) -> std::result::Result<bool, Blocker> {
    let mut specs = moe.layers.iter().enumerate().filter_map(|(l, s)| s.as_ref().map(|s| (l, s)));
    let Some((l0, first)) = specs.next() else { return Ok(true) };
    match specs.find(|(_, s)| s.norm_topk_prob != first.norm_topk_prob) {
        Some((l, s)) => Err(Blocker::new(
            "norm_topk_prob",
            format!(
                "layer {l} has norm_topk_prob {} and layer {l0} {}: {what} has one `norm_topk_prob` for all layers",
                s.norm_topk_prob, first.norm_topk_prob
            ),
        )),
        None => Ok(first.norm_topk_prob),
    }
}

/// The one routed-expert width of all MoE layers (`None` when there is no
/// MoE layer), or the blocker naming the first layer that differs; `key` is
/// the layout's config key for it.
pub(crate) fn one_expert_width(
    base: &ModelConfig,
    moe: &MoeConfig,
    what: &str,
    key: &str,
) -> std::result::Result<Option<usize>, Blocker> {
    let mut specs = moe.layers.iter().enumerate().filter_map(|(l, s)| s.as_ref().map(|s| (l, s.expert_width(base))));
    let Some((l0, w0)) = specs.next() else { return Ok(None) };
    match specs.find(|&(_, w)| w != w0) {
        Some((l, w)) => Err(Blocker::new(
            "expert_intermediate_size",
            format!(
                "layer {l}'s experts are {w} units wide and layer {l0}'s {w0}: {what} has one expert width (`{key}`)"
            ),
        )),
        None => Ok(Some(w0)),
    }
}

/// The checks of a "plain" MoE — every layer one expert count, top-k and
/// expert width, renormalised top-k, no router bias, no shared experts, no
/// selection bias — shared by the Mixtral layout and llama.cpp's `llama`
/// MoE (the GGUF writer): the `(E, k, expert width)` of its MoE layers
/// (`None` when there is none).
///
/// # Errors
/// The first [`Blocker`] found, naming the field.
pub fn plain_moe(
    base: &ModelConfig,
    moe: &MoeConfig,
    what: &str,
    width_key: &str,
) -> std::result::Result<Option<(usize, usize, usize)>, Blocker> {
    let counts = uniform(moe, what)?;
    no_shared_experts(moe, what)?;
    renormalised_top_k(moe, what)?;
    no_selection_bias(moe, what)?;
    let width = one_expert_width(base, moe, what, width_key)?;
    Ok(counts.zip(width).map(|((e, k), w)| (e, k, w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_the_registry_model_types() {
        assert_eq!(readable_model_types(), crate::config::moe::MOE_MODEL_TYPES.join(", "));
    }

    pub(crate) fn base(arch: &str) -> ModelConfig {
        let json = format!(
            r#"{{"model_type":"{arch}","vocab_size":32,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":2,
            "num_attention_heads":2,"num_key_value_heads":1,"tie_word_embeddings":true}}"#
        );
        HfConfig::from_json(json.as_bytes(), "c").unwrap().to_model_config("c").unwrap()
    }

    pub(crate) fn spec(e: usize, k: usize) -> MoeLayerSpec {
        MoeLayerSpec { num_experts: e, top_k: k, frozen: vec![0], ..Default::default() }
    }

    #[test]
    fn every_registered_layout_round_trips_what_it_holds() {
        for arch in ["llama", "qwen2"] {
            let b = base(arch);
            for moe in [
                MoeConfig::uniform(2, spec(4, 2)),
                MoeConfig { layers: vec![Some(spec(3, 1)), None], router_aux_loss_coef: 0.02 },
                MoeConfig {
                    layers: vec![
                        Some(spec(2, 1)),
                        Some(MoeLayerSpec { router_bias: true, temperature: 0.5, ..spec(3, 2) }),
                    ],
                    router_aux_loss_coef: 0.01,
                },
                // issue 15's variants (methods.md §5)
                MoeConfig::uniform(2, MoeLayerSpec { expert_intermediate_size: Some(3), ..spec(8, 4) }),
                MoeConfig::uniform(2, MoeLayerSpec { norm_topk_prob: false, ..spec(4, 2) }),
                MoeConfig::uniform(
                    2,
                    MoeLayerSpec { shared_experts: 1, shared_expert_gate: true, shared_frozen: true, ..spec(4, 2) },
                ),
                MoeConfig {
                    layers: vec![
                        Some(MoeLayerSpec {
                            shared_experts: 2,
                            shared_expert_gate: true,
                            selection_bias: true,
                            norm_topk_prob: false,
                            expert_intermediate_size: Some(6),
                            ..spec(4, 2)
                        }),
                        Some(MoeLayerSpec { shared_experts: 1, shared_frozen: true, ..spec(3, 1) }),
                    ],
                    router_aux_loss_coef: 0.02,
                },
            ] {
                assert!(studio::Studio.check(&b, &moe).is_ok());
                for l in REGISTRY {
                    if l.check(&b, &moe).is_err() {
                        continue;
                    }
                    let (written, _) = fold(&moe, l.keeps_temperature());
                    let json = serde_json::to_vec(&l.write_config(&b, &written)).unwrap();
                    let (layout, b2, m2) = read_config_json(&json, "c").unwrap().unwrap();
                    assert_eq!(layout.name(), l.name());
                    assert_eq!(m2, written, "{} {arch}", l.name());
                    assert_eq!((b2.hidden_size, b2.attention_bias, b2.tie_word_embeddings), (8, arch == "qwen2", true));
                }
            }
        }
    }

    #[test]
    fn auto_prefers_public_layouts_and_says_why_not() {
        let moe = MoeConfig::uniform(2, spec(4, 2));
        assert_eq!(choose(&base("llama"), &moe, LayoutRequest::Auto).unwrap().name(), "mixtral");
        assert_eq!(choose(&base("qwen2"), &moe, LayoutRequest::Auto).unwrap().name(), "qwen2_moe");
        let per_layer = MoeConfig { layers: vec![Some(spec(2, 1)), Some(spec(3, 1))], router_aux_loss_coef: 0.01 };
        let c = choose(&base("llama"), &per_layer, LayoutRequest::Auto).unwrap();
        assert_eq!(c.name(), "moe_studio");
        let r = c.reason.unwrap();
        assert!(r.contains("mixtral:") && r.contains("qwen2_moe:") && r.contains("`num_experts`"), "{r}");
    }

    #[test]
    fn named_layouts_that_cannot_hold_the_model_are_refused_with_the_field_and_alternatives() {
        let biased = MoeConfig::uniform(2, MoeLayerSpec { router_bias: true, ..spec(4, 2) });
        let e = choose(&base("llama"), &biased, LayoutRequest::parse("mixtral").unwrap()).unwrap_err().to_string();
        assert!(e.contains("`router_bias`") && e.contains("layouts that can: moe_studio"), "{e}");
        let per_layer = MoeConfig { layers: vec![Some(spec(2, 1)), Some(spec(3, 1))], router_aux_loss_coef: 0.01 };
        let e = choose(&base("qwen2"), &per_layer, LayoutRequest::parse("qwen2_moe").unwrap()).unwrap_err().to_string();
        assert!(e.contains("`num_experts`") && e.contains("moe_studio"), "{e}");
        let e = choose(&base("qwen2"), &MoeConfig::uniform(2, spec(4, 2)), LayoutRequest::parse("mixtral").unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`attention_bias`") && e.contains("layouts that can: qwen2_moe, moe_studio"), "{e}");
        assert!(LayoutRequest::parse("gpt").unwrap_err().to_string().contains("mixtral, qwen2_moe"));
        assert_eq!(by_name("studio").unwrap().name(), "moe_studio");
    }

    #[test]
    fn temperatures_fold_except_in_the_studio_layout() {
        let moe = MoeConfig::uniform(2, MoeLayerSpec { temperature: 0.5, ..spec(4, 2) });
        let c = choose(&base("llama"), &moe, LayoutRequest::Auto).unwrap();
        assert_eq!(c.router_scale, vec![2.0, 2.0]);
        assert!(c.written.layers.iter().flatten().all(|s| s.temperature == 1.0));
        let c = choose(&base("llama"), &moe, LayoutRequest::Named(&studio::Studio)).unwrap();
        assert_eq!(c.router_scale, vec![1.0, 1.0]);
        assert_eq!(c.written, moe);
    }
}
