//! The Mixtral layout (`MixtralForCausalLM`; Jiang et al., "Mixtral of
//! Experts", 2024, §2; transformers' `MixtralConfig`).
//!
//! `config.json`: `model_type: "mixtral"`, `architectures:
//! ["MixtralForCausalLM"]`, `num_local_experts`, `num_experts_per_tok`,
//! `router_aux_loss_coef`, `output_router_logits: false`, `sliding_window:
//! null`, plus the dense Llama keys and the `moe_studio` object (frozen
//! experts). Tensors: the canonical names of [`super::names`] (they are
//! Mixtral's): `model.layers.{l}.block_sparse_moe.gate.weight [E, d]` and
//! `...experts.{e}.{w1,w3,w2}.weight`. Read also under transformers 5's
//! `mlp.` prefix, and with packed experts (`mlp.experts.gate_up_proj
//! [E, 2f, d]`, `mlp.experts.down_proj [E, d, f]`; [`super::packed`]), as
//! mergekit-moe 0.1.5 writes them; `--experts-format packed` writes that
//! form (router `mlp.gate.weight`).
//!
//! Routing: softmax over the `E` router logits, top-k, renormalised over
//! the `k` — the studio's softmax over the top-k logits (Mixtral has no
//! `norm_topk_prob`: un-normalised weights are refused). Holds: every layer
//! MoE with one `E`, `k` and expert width, no router bias, a Llama/Mistral
//! attention (no q/k/v bias); no shared experts and no selection bias
//! (methods.md §5). A temperature is folded into the gate weight.
//!
//! Granular experts (width `f / G`, methods.md §5 "Granular upcycling"):
//! every layer is MoE here, so `intermediate_size` is the expert width; the
//! dense `f` is kept in `moe_studio.dense_intermediate_size` (transformers
//! ignores it) so that the studio reads back the same configuration.

use super::names::{self, split_layer, TensorRole};
use super::{
    base_config, get_usize, no_qk_norm, plain_moe, read_base, recorded_base_type, recorded_frozen, Blocker, MoeLayout,
    SharedExperts,
};
use crate::config::{Architecture, ModelConfig, MoeConfig, MoeLayerSpec};
use crate::error::Result;

/// The Mixtral layout.
pub struct Mixtral;

impl MoeLayout for Mixtral {
    fn name(&self) -> &'static str {
        "mixtral"
    }

    fn loaders(&self) -> &'static str {
        "transformers MixtralForCausalLM, candle mixtral, vLLM, llama.cpp (via convert --to gguf)"
    }

    fn shared_experts(&self) -> SharedExperts {
        SharedExperts::None
    }

    fn check(&self, base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<(), Blocker> {
        if base.attention_bias {
            return Err(Blocker::new("attention_bias", "the q/k/v projections have biases, which Mixtral has not"));
        }
        no_qk_norm(base, "Mixtral")?;
        if !matches!(base.architecture, Architecture::Llama | Architecture::Mistral) {
            return Err(Blocker::new(
                "architecture",
                format!("the base is {} and Mixtral's attention is Llama's", base.architecture.model_type()),
            ));
        }
        if let Some(l) = moe.layers.iter().position(Option::is_none) {
            return Err(Blocker::new(
                "experts_per_layer",
                format!("layer {l} stays dense and Mixtral makes every layer MoE"),
            ));
        }
        plain_moe(base, moe, "Mixtral", "intermediate_size")?;
        Ok(())
    }

    fn write_config(&self, base: &ModelConfig, moe: &MoeConfig) -> serde_json::Value {
        let mut v = base_config(base, moe, self.name());
        let (e, k, width) = plain_moe(base, moe, "Mixtral", "intermediate_size").ok().flatten().unwrap_or((
            0,
            0,
            base.intermediate_size,
        ));
        if width != base.intermediate_size {
            v["intermediate_size"] = width.into();
            v["moe_studio"]["dense_intermediate_size"] = base.intermediate_size.into();
        }
        let obj = v.as_object_mut().expect("object");
        obj.insert("model_type".into(), "mixtral".into());
        obj.insert("architectures".into(), serde_json::json!(["MixtralForCausalLM"]));
        obj.insert("num_local_experts".into(), e.into());
        obj.insert("num_experts_per_tok".into(), k.into());
        obj.insert("output_router_logits".into(), false.into());
        obj.insert("sliding_window".into(), serde_json::Value::Null);
        obj.remove("attention_bias");
        v
    }

    fn model_type(&self) -> Option<&'static str> {
        Some("mixtral")
    }

    fn read_config(&self, v: &serde_json::Value, source_name: &str) -> Result<(ModelConfig, MoeConfig)> {
        let mut base = read_base(v, recorded_base_type(v).unwrap_or("mistral"), source_name)?;
        // Granular experts: the experts have `intermediate_size`, the dense
        // FFN the recorded width.
        let expert_intermediate_size =
            match v.get("moe_studio").and_then(|s| s.get("dense_intermediate_size")).and_then(|x| x.as_u64()) {
                Some(f) if f as usize != base.intermediate_size => {
                    let w = base.intermediate_size;
                    base.intermediate_size = f as usize;
                    Some(w)
                }
                _ => None,
            };
        let e = get_usize(v, "num_local_experts", source_name, "mixtral")?;
        let k = get_usize(v, "num_experts_per_tok", source_name, "mixtral")?;
        let frozen = recorded_frozen(v, base.num_layers, source_name)?;
        let layers = (0..base.num_layers)
            .map(|l| {
                Some(MoeLayerSpec {
                    num_experts: e,
                    top_k: k,
                    frozen: frozen.get(l).cloned().unwrap_or_default(),
                    expert_intermediate_size,
                    ..Default::default()
                })
            })
            .collect();
        let coef = v.get("router_aux_loss_coef").and_then(|x| x.as_f64()).unwrap_or(0.01);
        Ok((base, MoeConfig { layers, router_aux_loss_coef: coef }))
    }

    /// The canonical role of an on-disk name; transformers 5's module names
    /// are accepted too: it renames `.block_sparse_moe.` to `.mlp.` before
    /// loading a Mixtral checkpoint (`conversion_mapping.py`, `"mixtral"`),
    /// so `model.layers.{l}.mlp.gate.weight` is the router and
    /// `mlp.experts.{e}.{w1,w3,w2}.weight` are experts (mergekit-moe 0.1.5
    /// writes the router there).
    fn role_of(&self, disk: &str) -> TensorRole {
        if let Some((l, rest)) = split_layer(disk) {
            if let Some(r) = rest.strip_prefix("mlp.") {
                let role = names::parse(&format!("model.layers.{l}.block_sparse_moe.{r}"));
                if !matches!(role, TensorRole::Other(_)) {
                    return role;
                }
            }
        }
        names::parse(disk)
    }

    /// transformers 5's `mlp.` first (what it and mergekit-moe 0.1.5 write;
    /// the router moves there too), then `block_sparse_moe.` (which
    /// transformers also loads).
    fn packed_prefixes(&self, layer: usize) -> Vec<String> {
        vec![format!("model.layers.{layer}.mlp"), format!("model.layers.{layer}.block_sparse_moe")]
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{base, spec};
    use super::*;

    #[test]
    fn config_has_the_mixtral_keys() {
        let v = Mixtral.write_config(&base("llama"), &MoeConfig::uniform(2, spec(4, 2)));
        assert_eq!(v["model_type"], "mixtral");
        assert_eq!(v["num_local_experts"], 4);
        assert_eq!(v["num_experts_per_tok"], 2);
        assert_eq!(v["moe_studio"]["frozen_experts"], serde_json::json!([[0], [0]]));
        assert!(v.get("attention_bias").is_none());
        // A frozen record that does not describe every layer, or is not index lists, is refused
        // by name (layers past its end were read as unfrozen: training updated expert 0 there).
        for (bad, says) in
            [(serde_json::json!([[0]]), "lists 1 layers, the model has 2"), (serde_json::json!("0"), "not a list")]
        {
            let mut w = v.clone();
            w["moe_studio"]["frozen_experts"] = bad;
            let e = Mixtral.read_config(&w, "m/config.json").unwrap_err().to_string();
            assert!(e.contains("m/config.json") && e.contains("moe_studio.frozen_experts") && e.contains(says), "{e}");
        }
        // Freezing is a set: an expert recorded twice (an earlier `--frozen 0,0`) reads once.
        let mut w = v.clone();
        w["moe_studio"]["frozen_experts"] = serde_json::json!([[0, 0], [1, 0, 1]]);
        let (_, m) = Mixtral.read_config(&w, "c").unwrap();
        assert_eq!(
            (m.layers[0].as_ref().unwrap().frozen.clone(), m.layers[1].as_ref().unwrap().frozen.clone()),
            (vec![0], vec![1, 0])
        );
    }

    #[test]
    fn blocks_dense_layers_bias_and_qwen2() {
        let b = base("llama");
        let dense = MoeConfig { layers: vec![Some(spec(4, 2)), None], router_aux_loss_coef: 0.01 };
        assert_eq!(Mixtral.check(&b, &dense).unwrap_err().field, "experts_per_layer");
        assert_eq!(
            Mixtral.check(&base("qwen2"), &MoeConfig::uniform(2, spec(4, 2))).unwrap_err().field,
            "attention_bias"
        );
        // frozen experts never block
        let frozen = MoeConfig::uniform(2, MoeLayerSpec { frozen: vec![0, 1, 2], ..spec(4, 2) });
        assert!(Mixtral.check(&b, &frozen).is_ok());
    }

    #[test]
    fn issue_15_features_mixtral_cannot_hold_are_blocked_by_field() {
        let b = base("llama");
        for (s, field, says) in [
            (MoeLayerSpec { shared_experts: 1, shared_expert_gate: true, ..spec(4, 2) }, "shared_experts", "qwen2_moe"),
            (MoeLayerSpec { shared_experts: 2, ..spec(4, 2) }, "shared_experts", "studio"),
            (MoeLayerSpec { norm_topk_prob: false, ..spec(4, 2) }, "norm_topk_prob", "renormalises"),
            (MoeLayerSpec { selection_bias: true, ..spec(4, 2) }, "selection_bias", "e_score_correction_bias"),
        ] {
            let blk = Mixtral.check(&b, &MoeConfig::uniform(2, s)).unwrap_err();
            assert_eq!(blk.field, field, "{blk}");
            let msg = blk.to_string();
            assert!(msg.contains(&format!("`{field}`")) && msg.contains("Mixtral") && msg.contains(says), "{msg}");
        }
    }

    #[test]
    fn granular_experts_are_the_intermediate_size_and_read_back_with_the_dense_width() {
        let b = base("llama");
        let moe = MoeConfig::uniform(2, MoeLayerSpec { expert_intermediate_size: Some(3), ..spec(16, 8) });
        Mixtral.check(&b, &moe).unwrap();
        let v = Mixtral.write_config(&b, &moe);
        assert_eq!(
            (v["intermediate_size"].as_u64(), v["moe_studio"]["dense_intermediate_size"].as_u64()),
            (Some(3), Some(12))
        );
        let (b2, m2) = Mixtral.read_config(&v, "c").unwrap();
        assert_eq!((b2.intermediate_size, m2), (12, moe));
        // a foreign Mixtral (no record) reads its experts as the dense width
        let mut foreign = v.clone();
        foreign["moe_studio"] = serde_json::Value::Null;
        let (b3, m3) = Mixtral.read_config(&foreign, "c").unwrap();
        assert_eq!((b3.intermediate_size, m3.layers[0].as_ref().unwrap().expert_intermediate_size), (3, None));
        let mixed = MoeConfig {
            layers: vec![Some(MoeLayerSpec { expert_intermediate_size: Some(6), ..spec(4, 2) }), Some(spec(4, 2))],
            router_aux_loss_coef: 0.01,
        };
        let blk = Mixtral.check(&b, &mixed).unwrap_err();
        assert_eq!(blk.field, "expert_intermediate_size");
        assert!(blk.to_string().contains("intermediate_size"), "{blk}");
    }
}
