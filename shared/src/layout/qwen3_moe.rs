//! The Qwen3-MoE layout (`Qwen3MoeForCausalLM`; transformers'
//! `Qwen3MoeConfig` / `modeling_qwen3_moe.py`): the MoE layout of qwen3
//! bases.
//!
//! Qwen3's attention normalises each query and key head with its own
//! RMSNorm (`self_attn.q_norm.weight`, `self_attn.k_norm.weight`, `[head_dim]`)
//! before RoPE. A Llama / Qwen2 attention has no such norm, and `RMSNorm(q)`
//! is not `q` for any weight, so [`Qwen3Moe::check`] holds qwen3 bases only;
//! and a qwen3 base goes nowhere else among the public layouts (Mixtral and
//! Qwen2-MoE have no q/k norm).
//!
//! `config.json`: `model_type: "qwen3_moe"`, `architectures:
//! ["Qwen3MoeForCausalLM"]`, `num_experts`, `num_experts_per_tok`,
//! `norm_topk_prob` (true or false, one for all layers),
//! `moe_intermediate_size` (the expert width; `f / G` for granular
//! experts), `decoder_sparse_step:
//! 1`, `mlp_only_layers`, plus the dense keys and `moe_studio`. Tensors:
//! `model.layers.{l}.mlp.gate.weight [E, d]`,
//! `model.layers.{l}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight`
//! (Qwen2-MoE's names without the shared expert, which Qwen3-MoE has not),
//! or packed: `mlp.experts.gate_up_proj [E, 2f, d]` and
//! `mlp.experts.down_proj [E, d, f]` (transformers 5's own layout,
//! [`super::packed`]).

use super::names::TensorRole;
use super::qwen2_moe::Qwen2Moe;
use super::{
    base_config, get_usize, no_selection_bias, no_shared_experts, one_expert_width, one_norm_topk, read_base,
    recorded_frozen, uniform, Blocker, MoeLayout, SharedExperts,
};
use crate::config::{Architecture, ModelConfig, MoeConfig, MoeLayerSpec};
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
        if base.architecture != Architecture::Qwen3 {
            return Err(Blocker::new(
                "architecture",
                format!(
                    "the base is {}; Qwen3-MoE's attention RMS-normalises every q and k head (q_norm/k_norm), which a \
                     {} attention does not have (Qwen3-MoE holds qwen3 bases)",
                    base.architecture.model_type(),
                    base.architecture.model_type()
                ),
            ));
        }
        Ok(())
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
        v
    }

    fn model_type(&self) -> Option<&'static str> {
        Some("qwen3_moe")
    }

    /// Reads a `qwen3_moe` `config.json`: the qwen3 base from the same keys,
    /// `num_experts` (or transformers 5's `num_local_experts`) experts of width `moe_intermediate_size` with top
    /// `num_experts_per_tok` in every layer `l` with `(l + 1) %
    /// decoder_sparse_step == 0` not in `mlp_only_layers` (the others dense
    /// of width `intermediate_size`), `norm_topk_prob` (transformers'
    /// default false), `router_aux_loss_coef` (default 0.001).
    fn read_config(&self, v: &serde_json::Value, source_name: &str) -> Result<(ModelConfig, MoeConfig)> {
        let base = read_base(v, "qwen3", source_name)?;
        let norm_topk_prob = v.get("norm_topk_prob").and_then(|b| b.as_bool()).unwrap_or(false);
        // Hub files say `num_experts`; transformers 5 writes its attribute
        // name `num_local_experts` (`Qwen3MoeConfig.attribute_map`).
        let experts_key = if v.get("num_experts").is_none() && v.get("num_local_experts").is_some() {
            "num_local_experts"
        } else {
            "num_experts"
        };
        let e = get_usize(v, experts_key, source_name, "qwen3_moe")?;
        let k = get_usize(v, "num_experts_per_tok", source_name, "qwen3_moe")?;
        let step = v.get("decoder_sparse_step").and_then(|x| x.as_u64()).unwrap_or(1).max(1) as usize;
        let only: Vec<usize> = match v.get("mlp_only_layers") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(x) => serde_json::from_value(x.clone())
                .map_err(|e| StudioError::format(source_name, "config.json", format!("`mlp_only_layers`: {e}")))?,
        };
        let moe_f = v.get("moe_intermediate_size").and_then(|x| x.as_u64()).map(|x| x as usize);
        let expert_intermediate_size = moe_f.filter(|&f| f != base.intermediate_size);
        let frozen = recorded_frozen(v, base.num_layers, source_name)?;
        let layers = (0..base.num_layers)
            .map(|l| {
                (e > 0 && !only.contains(&l) && (l + 1).is_multiple_of(step)).then(|| MoeLayerSpec {
                    num_experts: e,
                    top_k: k,
                    frozen: frozen.get(l).cloned().unwrap_or_default(),
                    expert_intermediate_size,
                    norm_topk_prob,
                    ..Default::default()
                })
            })
            .collect();
        let coef = v.get("router_aux_loss_coef").and_then(|x| x.as_f64()).unwrap_or(0.001);
        Ok((base, MoeConfig { layers, router_aux_loss_coef: coef }))
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

    fn packed_prefixes(&self, layer: usize) -> Vec<String> {
        Qwen2Moe.packed_prefixes(layer)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{base, spec};
    use super::*;

    #[test]
    fn holds_qwen3_bases_only_and_reads_back_what_it_writes() {
        let moe = MoeConfig::uniform(2, spec(8, 2));
        for arch in ["llama", "qwen2"] {
            let b = Qwen3Moe.check(&base(arch), &moe).unwrap_err();
            assert_eq!(b.field, "architecture");
            assert!(b.why.contains("q_norm"), "{}", b.why);
        }
        let q3 = base("qwen3");
        Qwen3Moe.check(&q3, &moe).unwrap();
        let v = Qwen3Moe.write_config(&q3, &moe);
        assert_eq!((v["model_type"].as_str(), v["num_experts"].as_u64()), (Some("qwen3_moe"), Some(8)));
        let (b2, m2) = Qwen3Moe.read_config(&v, "c").unwrap();
        assert_eq!(b2, q3);
        assert_eq!(m2, moe);
        let granular = MoeConfig {
            layers: vec![
                Some(crate::config::MoeLayerSpec {
                    expert_intermediate_size: Some(3),
                    norm_topk_prob: false,
                    ..spec(8, 2)
                }),
                None,
            ],
            router_aux_loss_coef: 0.02,
        };
        let v = Qwen3Moe.write_config(&q3, &granular);
        assert_eq!((v["moe_intermediate_size"].as_u64(), v["norm_topk_prob"].as_bool()), (Some(3), Some(false)));
        assert_eq!(v["mlp_only_layers"], serde_json::json!([1]));
        assert_eq!(Qwen3Moe.read_config(&v, "c").unwrap().1, granular);
    }

    #[test]
    fn issue_15_features_it_cannot_hold_are_named_before_the_architecture() {
        use crate::config::MoeLayerSpec;
        let b = base("qwen3");
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
