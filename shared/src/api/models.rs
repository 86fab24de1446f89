//! What `moe-studio inspect` reports about a model: [`ModelSummary`] and
//! its parts.

use serde::{Deserialize, Serialize};

use crate::checkpoint::ModelFormat;
use crate::config::{ModelConfig, MoeConfig};
use crate::tensor_io::TensorSource;

/// One tensor in a model summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSummary {
    /// Hugging Face name.
    pub name: String,
    /// Storage dtype (e.g. "BF16", "Q4_1").
    pub dtype: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
}

/// What `moe-studio inspect` reports about a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSummary {
    /// Path or name of the model.
    pub path: String,
    /// File format.
    pub format: ModelFormat,
    /// The validated configuration.
    pub config: ModelConfig,
    /// Parameters counted from the tensors present.
    pub parameters: usize,
    /// Count of tensors per storage dtype.
    pub dtypes: std::collections::BTreeMap<String, usize>,
    /// Every tensor.
    pub tensors: Vec<TensorSummary>,
    /// Vocabulary size of the tokenizer, when one was found.
    pub tokenizer_vocab: Option<usize>,
    /// The MoE structure, for MoE checkpoints (absent for dense models and
    /// in summaries stored before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSummary>,
}

/// The MoE structure of a model in a [`ModelSummary`]; per-layer lists have
/// one entry per decoder layer (`null` / empty / `false` for a dense layer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeSummary {
    /// The on-disk layout (a [`crate::layout::REGISTRY`] name: `mixtral`,
    /// `qwen2_moe`, ..., `moe_studio`): the one it was read in, else the one
    /// `auto` would write.
    pub layout: String,
    /// Why no public layout holds it (studio layout only): one reason per
    /// public layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub studio_reason: Option<String>,
    /// The public layouts that hold it exactly (`convert --layout` targets).
    #[serde(default)]
    pub public_layouts: Vec<String>,
    /// Experts per layer `E_l` (`null` = dense FFN).
    pub experts_per_layer: Vec<Option<usize>>,
    /// Experts per token `k_l` (`null` = dense FFN).
    pub top_k_per_layer: Vec<Option<usize>>,
    /// Frozen experts per layer (DeltaMoE: `[0]`).
    pub frozen_experts: Vec<Vec<usize>>,
    /// Whether each layer's router has a bias (DUME's ridge router).
    pub router_bias: Vec<bool>,
    /// Router temperature per layer (`null` = dense FFN; 1 in the Mixtral
    /// layout, where it is folded into the router weight).
    pub temperature_per_layer: Vec<Option<f64>>,
    /// Shared experts per layer (DeepSeekMoE / Qwen2-MoE); empty when no
    /// layer has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_experts_per_layer: Vec<usize>,
    /// Routed expert width per layer (`null` = dense FFN); empty when every
    /// expert has the FFN's width (granular upcycling narrows them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expert_width_per_layer: Vec<Option<usize>>,
    /// Layers whose chosen experts are weighed by the softmax over all
    /// experts (`norm_topk_prob: false`); empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unnormalised_top_k_layers: Vec<usize>,
    /// Layers with an aux-loss-free selection bias; empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selection_bias_layers: Vec<usize>,
    /// Total parameters ([`MoeConfig::num_parameters`]).
    pub total_parameters: usize,
    /// Parameters used per token ([`MoeConfig::num_active_parameters`]).
    pub active_parameters_per_token: usize,
    /// How the checkpoint stores its routed experts (`per-expert` or
    /// `packed`, [`crate::layout::packed`]), when read from safetensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_format: Option<crate::layout::ExpertsFormat>,
}

impl MoeSummary {
    /// Summarises `moe` on the dense `base`, read in `layout` (`None`: the
    /// layout `auto` would pick).
    pub fn new(base: &ModelConfig, moe: &MoeConfig, layout: Option<&dyn crate::layout::MoeLayout>) -> Self {
        let auto = crate::layout::choose(base, moe, crate::layout::LayoutRequest::Auto).ok();
        let name = layout.map(|l| l.name()).or(auto.as_ref().map(|c| c.name())).unwrap_or("moe_studio");
        let public = crate::layout::holding(base, moe);
        let studio_reason = if public.is_empty() { auto.and_then(|c| c.reason) } else { None };
        MoeSummary {
            layout: name.to_string(),
            studio_reason,
            public_layouts: public.iter().map(|s| s.to_string()).collect(),
            experts_per_layer: moe.layers.iter().map(|s| s.as_ref().map(|s| s.num_experts)).collect(),
            top_k_per_layer: moe.layers.iter().map(|s| s.as_ref().map(|s| s.top_k)).collect(),
            frozen_experts: moe
                .layers
                .iter()
                .map(|s| s.as_ref().map(|s| s.frozen.clone()).unwrap_or_default())
                .collect(),
            router_bias: moe.layers.iter().map(|s| s.as_ref().is_some_and(|s| s.router_bias)).collect(),
            temperature_per_layer: moe.layers.iter().map(|s| s.as_ref().map(|s| s.temperature)).collect(),
            shared_experts_per_layer: {
                let v: Vec<usize> = moe.layers.iter().map(|s| s.as_ref().map_or(0, |s| s.shared_experts)).collect();
                if v.iter().all(|&n| n == 0) {
                    Vec::new()
                } else {
                    v
                }
            },
            expert_width_per_layer: {
                let v: Vec<Option<usize>> =
                    moe.layers.iter().map(|s| s.as_ref().map(|s| s.expert_width(base))).collect();
                if v.iter().flatten().all(|&w| w == base.intermediate_size) {
                    Vec::new()
                } else {
                    v
                }
            },
            unnormalised_top_k_layers: layers_where(moe, |s| !s.norm_topk_prob),
            selection_bias_layers: layers_where(moe, |s| s.selection_bias),
            total_parameters: moe.num_parameters(base),
            active_parameters_per_token: moe.num_active_parameters(base),
            experts_format: None,
        }
    }
}

/// The MoE layers of `moe` whose spec satisfies `f`.
fn layers_where(moe: &MoeConfig, f: impl Fn(&crate::config::MoeLayerSpec) -> bool) -> Vec<usize> {
    moe.layers.iter().enumerate().filter(|(_, s)| s.as_ref().is_some_and(&f)).map(|(l, _)| l).collect()
}

impl ModelSummary {
    /// Summarises a model's tensors.
    pub fn new(
        path: &str,
        format: ModelFormat,
        config: &ModelConfig,
        src: &dyn TensorSource,
        tokenizer_vocab: Option<usize>,
    ) -> Self {
        let tensors: Vec<TensorSummary> = src
            .tensors()
            .into_iter()
            .map(|t| TensorSummary { name: t.name, dtype: t.dtype.to_string(), shape: t.shape })
            .collect();
        let mut dtypes = std::collections::BTreeMap::new();
        for t in &tensors {
            *dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
        }
        let parameters = tensors.iter().map(|t| t.shape.iter().product::<usize>()).sum();
        ModelSummary {
            path: path.into(),
            format,
            config: config.clone(),
            parameters,
            dtypes,
            tensors,
            tokenizer_vocab,
            moe: None,
        }
    }

    /// Adds the MoE structure of `moe`, read in `layout` (a no-op for
    /// `None`, a dense model).
    pub fn with_moe(mut self, moe: Option<&MoeConfig>, layout: Option<&dyn crate::layout::MoeLayout>) -> Self {
        self.moe = moe.map(|m| MoeSummary::new(&self.config, m, layout));
        self
    }

    /// Experts of each MoE layer, read from the routers' shapes (`[E, d]`;
    /// summaries list canonical names whatever the on-disk layout, parsed by
    /// [`crate::layout::names`]); empty for a dense model.
    pub fn router_experts(&self) -> Vec<usize> {
        use crate::layout::names::{parse, TensorRole};
        self.tensors
            .iter()
            .filter(|t| matches!(parse(&t.name), TensorRole::Router { .. }))
            .filter_map(|t| t.shape.first().copied())
            .collect()
    }

    /// How `other`'s tensors differ from these (names and shapes; dtypes
    /// may differ), or `None` when they match: what a merge of the two
    /// needs.
    pub fn tensor_mismatch(&self, other: &ModelSummary) -> Option<String> {
        let shapes = |m: &ModelSummary| -> std::collections::HashMap<String, Vec<usize>> {
            m.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect()
        };
        let (sa, sb) = (shapes(self), shapes(other));
        for t in &self.tensors {
            match sb.get(&t.name) {
                None => return Some(format!("it has no tensor `{}`", t.name)),
                Some(s) if *s != t.shape => {
                    return Some(format!("tensor `{}` is {s:?}, expected {:?}", t.name, t.shape));
                }
                _ => {}
            }
        }
        other.tensors.iter().find(|t| !sa.contains_key(&t.name)).map(|t| format!("it has an extra tensor `{}`", t.name))
    }

    /// Records how the MoE's experts are stored (a no-op for a dense model).
    pub fn with_experts_format(mut self, format: Option<crate::layout::ExpertsFormat>) -> Self {
        if let Some(m) = self.moe.as_mut() {
            m.experts_format = format;
        }
        self
    }
}
