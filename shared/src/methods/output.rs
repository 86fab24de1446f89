//! What the MoE-producing methods (upcycle, MoErge) share on the way out:
//! the choice of on-disk layout, the router temperature folding, the
//! tensor plan with output dtypes, `config.json`, and the report.

use serde::{Deserialize, Serialize};

use super::moe_plan::{moe_tensor_plan, MoeTensor, Origin};
use crate::checkpoint::{DType, PlannedTensor, TensorSource};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};

/// The on-disk form of an MoE checkpoint (see `config::moe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// transformers' `MixtralForCausalLM` layout.
    #[serde(rename = "mixtral")]
    Mixtral,
    /// The studio's own layout (`model_type: moe_studio`).
    #[serde(rename = "moe_studio")]
    Studio,
}

/// The layout an MoE config will be written in, and the config as written.
#[derive(Debug, Clone)]
pub struct LayoutChoice {
    /// Mixtral whenever [`MoeConfig::mixtral_blocker`] allows it.
    pub layout: Layout,
    /// Why the Mixtral layout was not possible (studio layout only).
    pub reason: Option<String>,
    /// The MoE config as it goes into `config.json`: in the Mixtral layout
    /// every temperature is 1 because `1 / T` is folded into the router
    /// weight (exact: `(W / T) x = (W x) / T`).
    pub written: MoeConfig,
    /// Per-layer factor applied to router weights (`1 / T_l` in the Mixtral
    /// layout, 1 otherwise).
    pub router_scale: Vec<f64>,
}

/// Picks the layout for `moe` on `base` and folds temperatures if Mixtral.
pub fn choose_layout(base: &ModelConfig, moe: &MoeConfig) -> LayoutChoice {
    match moe.mixtral_blocker(base) {
        None => {
            let mut written = moe.clone();
            let mut router_scale = Vec::with_capacity(moe.layers.len());
            for spec in written.layers.iter_mut() {
                let t = spec.as_ref().map(|s| s.temperature).unwrap_or(1.0);
                router_scale.push(1.0 / t);
                if let Some(s) = spec {
                    s.temperature = 1.0;
                }
            }
            LayoutChoice { layout: Layout::Mixtral, reason: None, written, router_scale }
        }
        Some(reason) => LayoutChoice {
            layout: Layout::Studio,
            reason: Some(reason),
            written: moe.clone(),
            router_scale: vec![1.0; moe.layers.len()],
        },
    }
}

/// Output dtype: `explicit` when given, else the source's float dtype,
/// else F32 (quantised GGUF tensors are written dequantised).
pub fn out_dtype(src: DType, explicit: Option<DType>) -> DType {
    explicit.unwrap_or(if src.float_size().is_some() { src } else { DType::F32 })
}

/// Checks that `src` holds every dense tensor of `base` with the right
/// shape (before any output is created).
///
/// # Errors
/// [`StudioError::Tensor`] naming the source and tensor.
pub fn check_dense_source(src: &dyn TensorSource, base: &ModelConfig) -> Result<()> {
    for (name, shape) in crate::checkpoint::export::dense_tensor_plan(base) {
        let info = src.info(&name).ok_or_else(|| {
            StudioError::tensor(src.source_name(), &name, format!("missing (expected shape {shape:?})"))
        })?;
        if info.shape != shape {
            return Err(StudioError::tensor(
                src.source_name(),
                &name,
                format!("shape {:?} does not match the configuration (expected {shape:?})", info.shape),
            ));
        }
    }
    Ok(())
}

/// The MoE tensors with their output dtypes: each tensor takes the dtype of
/// the dense tensor it comes from (routers: the layer's `mlp.gate_proj`),
/// converted by [`out_dtype`]. `src` must hold every dense tensor (see
/// [`check_dense_source`]).
pub fn planned_tensors(
    src: &dyn TensorSource,
    base: &ModelConfig,
    moe: &MoeConfig,
    explicit: Option<DType>,
) -> (Vec<MoeTensor>, Vec<PlannedTensor>) {
    let tensors = moe_tensor_plan(base, moe);
    let src_dtype = |name: &str| src.info(name).map(|i| i.dtype).unwrap_or(DType::F32);
    let planned = tensors
        .iter()
        .map(|t| {
            let from = match &t.origin {
                Origin::Dense { .. } => src_dtype(&t.name),
                Origin::Expert { dense_name, .. } | Origin::SharedExpert { dense_name, .. } => src_dtype(dense_name),
                Origin::RouterWeight { layer }
                | Origin::RouterBias { layer }
                | Origin::SelectionBias { layer }
                | Origin::SharedGate { layer } => src_dtype(&format!("model.layers.{layer}.mlp.gate_proj.weight")),
            };
            PlannedTensor { name: t.name.clone(), dtype: out_dtype(from, explicit), shape: t.shape.clone() }
        })
        .collect();
    (tensors, planned)
}

/// `config.json` of the output: [`MoeConfig::to_config_json`] plus
/// `torch_dtype` and a `moe_studio.provenance` object (how the checkpoint
/// was made; transformers ignores it).
pub fn config_json(
    base: &ModelConfig,
    written: &MoeConfig,
    dtype: DType,
    provenance: serde_json::Value,
) -> serde_json::Value {
    let mut v = written.to_config_json(base);
    let name = dtype.torch_name();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("torch_dtype".into(), name.into());
        if let Some(studio) = obj.get_mut("moe_studio").and_then(|s| s.as_object_mut()) {
            studio.insert("provenance".into(), provenance);
        }
    }
    v
}

/// Summary of a written MoE checkpoint (printed by the CLI's `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct MoeReport {
    /// `upcycle` or `moerge`.
    pub method: &'static str,
    /// The input model(s).
    pub sources: Vec<String>,
    /// Output directory, when written to disk.
    pub out_dir: Option<String>,
    /// On-disk layout.
    pub layout: Layout,
    /// Why the Mixtral layout was not used.
    pub layout_reason: Option<String>,
    /// Experts per layer (0 = the layer stayed dense).
    pub experts_per_layer: Vec<usize>,
    /// The MoE config as written to `config.json`.
    pub moe: MoeConfig,
    /// Router initialisation (`zeros`, `random`, `hidden`).
    pub router_init: &'static str,
    /// Parameters of the MoE model.
    pub parameters: usize,
    /// Parameters of the dense base.
    pub dense_parameters: usize,
    /// Number of tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written (headers and JSON files excluded).
    pub tensor_bytes: u64,
    /// Output dtype of the token embedding (tensors keep their own dtype
    /// unless one was forced).
    pub dtype: String,
    /// Things the user should know (aligned shapes, tokenizer differences,
    /// layout fallbacks).
    pub warnings: Vec<String>,
}

impl MoeReport {
    /// A report for `planned` tensors written with `choice` on `base`.
    pub fn new(
        method: &'static str,
        sources: Vec<String>,
        base: &ModelConfig,
        choice: &LayoutChoice,
        planned: &[PlannedTensor],
        router_init: &'static str,
        warnings: Vec<String>,
    ) -> Self {
        let dtype = planned.first().map(|p| p.dtype.to_string()).unwrap_or_default();
        MoeReport {
            method,
            sources,
            out_dir: None,
            layout: choice.layout,
            layout_reason: choice.reason.clone(),
            experts_per_layer: choice.written.layers.iter().map(|s| s.as_ref().map_or(0, |s| s.num_experts)).collect(),
            moe: choice.written.clone(),
            router_init,
            parameters: choice.written.num_parameters(base),
            dense_parameters: base.num_parameters(),
            tensors: planned.len(),
            tensor_bytes: planned.iter().map(|p| p.byte_len() as u64).sum(),
            dtype,
            warnings,
        }
    }
}
