//! The studio layout (`model_type: "moe_studio"`): the fallback for what no
//! public layout can express — per-layer expert counts (NeuronMoE), per-layer
//! top-k, router biases (DUME's ridge router), router temperatures kept
//! as such, and every upcycling variant of methods.md §5: any number of
//! shared experts, gated or not; per-layer expert widths (granular
//! experts); `norm_topk_prob: false`; the aux-loss-free selection bias.
//! Only moe-studio loads it.
//!
//! `config.json`: the dense keys, `model_type: "moe_studio"` (no
//! `architectures`: no transformers class loads it), `base_model_type`,
//! `moe_layers` (one entry per layer: `null` for a dense layer, else
//! `{num_experts, top_k, frozen, router_bias, temperature}` plus, when set,
//! `expert_intermediate_size`, `shared_experts`, `shared_expert_gate`,
//! `shared_frozen`, `norm_topk_prob`, `selection_bias` — the serde form of
//! [`crate::config::MoeLayerSpec`]) and the `moe_studio` object. Tensors:
//! the canonical names of [`super::names`] (`block_sparse_moe.gate.bias
//! [E]` when the router has a bias, `gate.e_score_correction_bias [E]`,
//! `shared_experts.{i}.*`, `shared_expert_gate.weight [N, d]`, `mlp.*` for
//! dense layers).

use super::{base_config, read_base, recorded_base_type, Blocker, MoeLayout, SharedExperts};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};

/// The studio layout.
pub struct Studio;

impl MoeLayout for Studio {
    fn name(&self) -> &'static str {
        "moe_studio"
    }

    fn loaders(&self) -> &'static str {
        "moe-studio"
    }

    fn public(&self) -> bool {
        false
    }

    fn shared_experts(&self) -> SharedExperts {
        SharedExperts::Any
    }

    fn keeps_temperature(&self) -> bool {
        true
    }

    fn check(&self, _base: &ModelConfig, _moe: &MoeConfig) -> std::result::Result<(), Blocker> {
        Ok(())
    }

    fn write_config(&self, base: &ModelConfig, moe: &MoeConfig) -> serde_json::Value {
        let mut v = base_config(base, moe, self.name());
        let obj = v.as_object_mut().expect("object");
        obj.insert("model_type".into(), "moe_studio".into());
        obj.remove("architectures");
        obj.insert("base_model_type".into(), base.architecture.model_type().into());
        obj.insert("moe_layers".into(), serde_json::to_value(&moe.layers).expect("layers serialise"));
        v
    }

    fn model_type(&self) -> Option<&'static str> {
        Some("moe_studio")
    }

    fn read_config(&self, v: &serde_json::Value, source_name: &str) -> Result<(ModelConfig, MoeConfig)> {
        let base_type = v
            .get("base_model_type")
            .and_then(|t| t.as_str())
            .or_else(|| recorded_base_type(v))
            .ok_or_else(|| StudioError::config(source_name, "moe_studio config lacks `base_model_type`"))?;
        let base = read_base(v, base_type, source_name)?;
        let raw = v
            .get("moe_layers")
            .ok_or_else(|| StudioError::config(source_name, "moe_studio config lacks `moe_layers`"))?;
        let layers = serde_json::from_value(raw.clone())
            .map_err(|e| StudioError::format(source_name, "config.json", format!("`moe_layers`: {e}")))?;
        let coef = v.get("router_aux_loss_coef").and_then(|x| x.as_f64()).unwrap_or(0.01);
        Ok((base, MoeConfig { layers, router_aux_loss_coef: coef }))
    }
}
