//! The Qwen3-MoE layout (`Qwen3MoeForCausalLM`; transformers'
//! `Qwen3MoeConfig` / `modeling_qwen3_moe.py`), ready for qwen3 bases.
//!
//! Qwen3's attention normalises each query and key head with its own
//! RMSNorm (`self_attn.q_norm.weight`, `self_attn.k_norm.weight`, `[head_dim]`)
//! before RoPE, and has no q/k/v bias. A Llama / Qwen2 attention has no such
//! norm, and `RMSNorm(q)` is not `q` for any weight, so a Llama / Qwen2 base
//! cannot be held exactly: [`Qwen3Moe::check`] refuses every base until the
//! model has a Qwen3 family (`config::Architecture`), at which point the
//! check becomes "the base is qwen3" and the writer below is complete.
//!
//! `config.json`: `model_type: "qwen3_moe"`, `architectures:
//! ["Qwen3MoeForCausalLM"]`, `num_experts`, `num_experts_per_tok`,
//! `norm_topk_prob` (true or false, one for all layers),
//! `moe_intermediate_size` (the expert width; `f / G` for granular
//! experts), `decoder_sparse_step:
//! 1`, `mlp_only_layers`, plus the dense keys and `moe_studio`. Tensors:
//! `model.layers.{l}.mlp.gate.weight [E, d]`,
//! `model.layers.{l}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight`
//! (Qwen2-MoE's names without the shared expert, which Qwen3-MoE has not).

use super::names::TensorRole;
use super::qwen2_moe::Qwen2Moe;
use super::{
    base_config, no_selection_bias, no_shared_experts, one_expert_width, one_norm_topk, uniform, Blocker, MoeLayout,
    SharedExperts,
};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};

/// The Qwen3-MoE layout.
pub struct Qwen3Moe;

impl MoeLayout for Qwen3Moe {
    fn name(&self) -> &'static str {
        "qwen3_moe"
    }

    fn loaders(&self) -> &'static str {
        "transformers Qwen3MoeForCausalLM, llama.cpp qwen3moe, vLLM"
    }

    fn shared_experts(&self) -> SharedExperts {
        SharedExperts::None
    }

    fn check(&self, base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<(), Blocker> {
        uniform(moe, "Qwen3-MoE")?;
        no_shared_experts(moe, "Qwen3-MoE")?;
        no_selection_bias(moe, "Qwen3-MoE")?;
        one_norm_topk(moe, "Qwen3-MoE")?;
        one_expert_width(base, moe, "Qwen3-MoE", "moe_intermediate_size")?;
        Err(Blocker::new(
            "architecture",
            format!(
                "the base is {}; Qwen3-MoE's attention RMS-normalises every q and k head (q_norm/k_norm), which a {} \
                 attention cannot express exactly (Qwen3-MoE holds qwen3 bases, once that family is supported)",
                base.architecture.model_type(),
                base.architecture.model_type()
            ),
        ))
    }

    fn write_config(&self, base: &ModelConfig, moe: &MoeConfig) -> serde_json::Value {
        let mut v = base_config(base, moe, self.name());
        let (e, k) = uniform(moe, "Qwen3-MoE").ok().flatten().unwrap_or((0, 0));
        let norm_topk = one_norm_topk(moe, "Qwen3-MoE").unwrap_or(true);
        let width = one_expert_width(base, moe, "Qwen3-MoE", "moe_intermediate_size")
            .ok()
            .flatten()
            .unwrap_or(base.intermediate_size);
        let dense: Vec<usize> = moe.layers.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(l, _)| l).collect();
        let obj = v.as_object_mut().expect("object");
        obj.insert("model_type".into(), "qwen3_moe".into());
        obj.insert("architectures".into(), serde_json::json!(["Qwen3MoeForCausalLM"]));
        obj.insert("num_experts".into(), e.into());
        obj.insert("num_experts_per_tok".into(), k.into());
        obj.insert("norm_topk_prob".into(), norm_topk.into());
        obj.insert("moe_intermediate_size".into(), width.into());
        obj.insert("decoder_sparse_step".into(), 1.into());
        obj.insert("mlp_only_layers".into(), serde_json::json!(dense));
        obj.insert("output_router_logits".into(), false.into());
        obj.remove("attention_bias");
        v
    }

    fn model_type(&self) -> Option<&'static str> {
        Some("qwen3_moe")
    }

    fn read_config(&self, _v: &serde_json::Value, source_name: &str) -> Result<(ModelConfig, MoeConfig)> {
        Err(StudioError::config(
            source_name,
            "a qwen3_moe checkpoint: its base is a Qwen3 model (attention with q_norm/k_norm), a family moe-studio \
             does not support yet (supported dense types: llama, mistral, qwen2)",
        ))
    }

    fn disk_name(&self, role: &TensorRole) -> String {
        Qwen2Moe.disk_name(role)
    }

    fn role_of(&self, disk: &str) -> TensorRole {
        Qwen2Moe.role_of(disk)
    }

    fn renames(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{base, spec};
    use super::*;

    #[test]
    fn writer_is_ready_but_no_current_base_is_held() {
        let moe = MoeConfig::uniform(2, spec(8, 2));
        let v = Qwen3Moe.write_config(&base("qwen2"), &moe);
        assert_eq!((v["model_type"].as_str(), v["num_experts"].as_u64()), (Some("qwen3_moe"), Some(8)));
        for arch in ["llama", "qwen2"] {
            let b = Qwen3Moe.check(&base(arch), &moe).unwrap_err();
            assert_eq!(b.field, "architecture");
            assert!(b.why.contains("q_norm"), "{}", b.why);
        }
        let granular = MoeConfig::uniform(
            2,
            crate::config::MoeLayerSpec { expert_intermediate_size: Some(3), norm_topk_prob: false, ..spec(8, 2) },
        );
        let v = Qwen3Moe.write_config(&base("qwen2"), &granular);
        assert_eq!((v["moe_intermediate_size"].as_u64(), v["norm_topk_prob"].as_bool()), (Some(3), Some(false)));
    }

    #[test]
    fn issue_15_features_it_cannot_hold_are_named_before_the_architecture() {
        use crate::config::MoeLayerSpec;
        let b = base("qwen2");
        for (s, field) in [
            (MoeLayerSpec { shared_experts: 1, shared_expert_gate: true, ..spec(4, 2) }, "shared_experts"),
            (MoeLayerSpec { selection_bias: true, ..spec(4, 2) }, "selection_bias"),
        ] {
            let blk = Qwen3Moe.check(&b, &MoeConfig::uniform(2, s)).unwrap_err();
            assert_eq!(blk.field, field, "{blk}");
            assert!(blk.to_string().contains("Qwen3-MoE"), "{blk}");
        }
    }
}
