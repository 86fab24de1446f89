//! The Qwen2-MoE layout (`Qwen2MoeForCausalLM`; Qwen1.5-MoE / Qwen2-MoE,
//! transformers' `Qwen2MoeConfig` and `modeling_qwen2_moe.py`).
//!
//! `config.json`: `model_type: "qwen2_moe"`, `architectures:
//! ["Qwen2MoeForCausalLM"]`, `num_experts`, `num_experts_per_tok`,
//! `norm_topk_prob: true` (softmax over all `E`, top-k, renormalised: the
//! studio's softmax over the top-k logits; `false` is Qwen1.5-MoE's
//! un-normalised weighting), `moe_intermediate_size` (= `intermediate_size`),
//! `shared_expert_intermediate_size`, `decoder_sparse_step: 1`,
//! `mlp_only_layers` (the layers that stay dense), `qkv_bias` (the base's
//! attention bias: on for Qwen2, off for Llama), plus the dense keys and the
//! `moe_studio` object (frozen experts).
//!
//! Tensors, per MoE layer `l` (`model.layers.{l}.mlp.` prefix):
//! - `gate.weight [E, d]` — the router;
//! - `experts.{e}.{gate_proj,up_proj,down_proj}.weight` — the experts;
//! - `shared_expert.{gate_proj,up_proj,down_proj}.weight` and
//!   `shared_expert_gate.weight [1, d]` — the shared expert, whose output
//!   `sigmoid(g · x) * down(silu(gate(x)) * up(x))` is added to the routed
//!   experts' sum. The layout requires it ([`SharedExperts::Gated`],
//!   `required`). The studio's MoE has no shared expert yet, so it is
//!   written as an exact zero of intermediate size
//!   [`ZERO_SHARED_EXPERT_SIZE`] (every tensor 0, hence `down(..) = 0` and
//!   the layer's output is the routed sum, bit for bit), and on read a
//!   shared expert whose down projection is exactly zero (and whose other
//!   projections are finite) is dropped, any other refused.
//!
//! Dense layers keep `mlp.{gate,up,down}_proj.weight`
//! (`Qwen2MoeMLP`), listed in `mlp_only_layers`.

use super::names::{split_layer, Proj, TensorRole};
use super::{
    base_config, get_usize, read_base, recorded_base_type, recorded_frozen, uniform, Blocker, MoeLayout, SharedExperts,
};
use crate::checkpoint::TensorSource;
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};
use crate::error::{Result, StudioError};

/// Intermediate size of the zero shared expert written when the model has
/// none (the smallest the layout allows: one unit, `d` + `d` + `d` + `d`
/// zeros per layer).
pub const ZERO_SHARED_EXPERT_SIZE: usize = 1;

/// The Qwen2-MoE layout.
pub struct Qwen2Moe;

/// On-disk name of shared-expert projection `proj` of layer `l`.
pub fn shared_expert_name(l: usize, proj: Proj) -> String {
    format!("model.layers.{l}.mlp.shared_expert.{}.weight", proj.hf())
}

/// On-disk name of layer `l`'s shared-expert gate `[1, d]`.
pub fn shared_expert_gate_name(l: usize) -> String {
    format!("model.layers.{l}.mlp.shared_expert_gate.weight")
}

impl MoeLayout for Qwen2Moe {
    fn name(&self) -> &'static str {
        "qwen2_moe"
    }

    fn loaders(&self) -> &'static str {
        "transformers Qwen2MoeForCausalLM, candle qwen2_moe, vLLM"
    }

    fn shared_experts(&self) -> SharedExperts {
        SharedExperts::Gated { count: 1, required: true }
    }

    fn check(&self, _base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<(), Blocker> {
        uniform(moe, "Qwen2-MoE")?;
        Ok(())
    }

    fn write_config(&self, base: &ModelConfig, moe: &MoeConfig) -> serde_json::Value {
        let mut v = base_config(base, moe, self.name());
        let (e, k) = uniform(moe, "Qwen2-MoE").ok().flatten().unwrap_or((0, 0));
        let dense: Vec<usize> = moe.layers.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(l, _)| l).collect();
        let obj = v.as_object_mut().expect("object");
        obj.insert("model_type".into(), "qwen2_moe".into());
        obj.insert("architectures".into(), serde_json::json!(["Qwen2MoeForCausalLM"]));
        obj.insert("num_experts".into(), e.into());
        obj.insert("num_experts_per_tok".into(), k.into());
        obj.insert("norm_topk_prob".into(), true.into());
        obj.insert("moe_intermediate_size".into(), base.intermediate_size.into());
        obj.insert("shared_expert_intermediate_size".into(), ZERO_SHARED_EXPERT_SIZE.into());
        obj.insert("decoder_sparse_step".into(), 1.into());
        obj.insert("mlp_only_layers".into(), serde_json::json!(dense));
        obj.insert("qkv_bias".into(), base.attention_bias.into());
        obj.insert("use_sliding_window".into(), false.into());
        obj.insert("output_router_logits".into(), false.into());
        obj.remove("attention_bias");
        v
    }

    fn model_type(&self) -> Option<&'static str> {
        Some("qwen2_moe")
    }

    fn read_config(&self, v: &serde_json::Value, source_name: &str) -> Result<(ModelConfig, MoeConfig)> {
        let err = |what: String| StudioError::config(source_name, what);
        let qkv_bias = v.get("qkv_bias").and_then(|b| b.as_bool()).unwrap_or(true);
        let base_type = recorded_base_type(v).unwrap_or(if qkv_bias { "qwen2" } else { "llama" });
        let mut dense = v.clone();
        dense["attention_bias"] = qkv_bias.into();
        let mut base = read_base(&dense, base_type, source_name)?;
        if !v.get("norm_topk_prob").and_then(|b| b.as_bool()).unwrap_or(false) {
            return Err(err(
                "qwen2_moe `norm_topk_prob` is false (or absent: Qwen1.5-MoE's default): its routing weights are the \
                 full softmax of the top-k, not renormalised, which moe-studio's router does not compute \
                 (it needs `norm_topk_prob: true`)"
                    .into(),
            ));
        }
        let e = get_usize(v, "num_experts", source_name, "qwen2_moe")?;
        let k = get_usize(v, "num_experts_per_tok", source_name, "qwen2_moe")?;
        let step = v.get("decoder_sparse_step").and_then(|x| x.as_u64()).unwrap_or(1).max(1) as usize;
        let only: Vec<usize> = match v.get("mlp_only_layers") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(x) => serde_json::from_value(x.clone())
                .map_err(|e| StudioError::format(source_name, "config.json", format!("`mlp_only_layers`: {e}")))?,
        };
        let is_moe = |l: usize| e > 0 && !only.contains(&l) && (l + 1).is_multiple_of(step);
        let moe_f = v.get("moe_intermediate_size").and_then(|x| x.as_u64()).map(|x| x as usize);
        let any_dense = (0..base.num_layers).any(|l| !is_moe(l));
        match moe_f {
            Some(f) if f != base.intermediate_size && any_dense => {
                return Err(err(format!(
                    "qwen2_moe `moe_intermediate_size` {f} differs from `intermediate_size` {} of its dense layers: \
                     moe-studio's experts have the dense FFN's size",
                    base.intermediate_size
                )))
            }
            Some(f) => base.intermediate_size = f,
            None => {}
        }
        let frozen = recorded_frozen(v);
        let layers = (0..base.num_layers)
            .map(|l| {
                is_moe(l).then(|| MoeLayerSpec {
                    num_experts: e,
                    top_k: k,
                    frozen: frozen.get(l).cloned().unwrap_or_default(),
                    router_bias: false,
                    temperature: 1.0,
                })
            })
            .collect();
        let coef = v.get("router_aux_loss_coef").and_then(|x| x.as_f64()).unwrap_or(0.001);
        Ok((base, MoeConfig { layers, router_aux_loss_coef: coef }))
    }

    fn disk_name(&self, role: &TensorRole) -> String {
        match role {
            TensorRole::Router { layer } => format!("model.layers.{layer}.mlp.gate.weight"),
            TensorRole::RouterBias { layer } => format!("model.layers.{layer}.mlp.gate.bias"),
            TensorRole::Expert { layer, expert, proj } => {
                format!("model.layers.{layer}.mlp.experts.{expert}.{}.weight", proj.hf())
            }
            TensorRole::SharedExpert { layer, proj, .. } => shared_expert_name(*layer, *proj),
            TensorRole::SharedExpertGate { layer, .. } => shared_expert_gate_name(*layer),
            other => super::names::canonical(other),
        }
    }

    fn role_of(&self, disk: &str) -> TensorRole {
        let other = || TensorRole::Other(disk.to_string());
        let Some((layer, rest)) = split_layer(disk) else { return other() };
        let Some(rest) = rest.strip_prefix("mlp.") else { return other() };
        match rest {
            "gate.weight" => return TensorRole::Router { layer },
            "gate.bias" => return TensorRole::RouterBias { layer },
            "shared_expert_gate.weight" => return TensorRole::SharedExpertGate { layer, index: 0 },
            _ => {}
        }
        let proj_of = |s: &str| s.strip_suffix(".weight").and_then(Proj::from_hf);
        if let Some(p) = rest.strip_prefix("shared_expert.").and_then(proj_of) {
            return TensorRole::SharedExpert { layer, index: 0, proj: p };
        }
        if let Some(r) = rest.strip_prefix("experts.") {
            let Some((e, tail)) = r.split_once('.') else { return other() };
            let (Ok(expert), Some(proj)) = (e.parse::<usize>(), proj_of(tail)) else { return other() };
            return TensorRole::Expert { layer, expert, proj };
        }
        match proj_of(rest) {
            Some(proj) => TensorRole::DenseFfn { layer, proj },
            None => other(),
        }
    }

    fn renames(&self) -> bool {
        true
    }

    fn zero_tensors(&self, base: &ModelConfig, moe: &MoeConfig) -> Vec<(TensorRole, Vec<usize>)> {
        let (d, s) = (base.hidden_size, ZERO_SHARED_EXPERT_SIZE);
        let mut out = Vec::new();
        for (layer, spec) in moe.layers.iter().enumerate() {
            if spec.is_none() {
                continue;
            }
            for proj in Proj::ALL {
                out.push((TensorRole::SharedExpert { layer, index: 0, proj }, proj.shape(d, s)));
            }
            out.push((TensorRole::SharedExpertGate { layer, index: 0 }, vec![1, d]));
        }
        out
    }

    fn check_dropped(&self, src: &dyn TensorSource, base: &ModelConfig, moe: &MoeConfig) -> Result<()> {
        let d = base.hidden_size;
        for (l, spec) in moe.layers.iter().enumerate() {
            if spec.is_none() {
                continue;
            }
            let gate = shared_expert_gate_name(l);
            let g = src.info(&gate).ok_or_else(|| {
                StudioError::tensor(
                    src.source_name(),
                    &gate,
                    "missing: Qwen2-MoE requires a shared expert in every MoE layer",
                )
            })?;
            if g.shape != [1, d] {
                return Err(StudioError::tensor(
                    src.source_name(),
                    &gate,
                    format!("shape {:?}, expected [1, {d}]", g.shape),
                ));
            }
            for proj in Proj::ALL {
                let name = shared_expert_name(l, proj);
                let info = src.info(&name).ok_or_else(|| {
                    StudioError::tensor(
                        src.source_name(),
                        &name,
                        "missing: Qwen2-MoE requires a shared expert in every MoE layer",
                    )
                })?;
                let values = src.read_f32(&name)?;
                let bad = |x: &f32| if proj == Proj::Down { *x != 0.0 } else { !x.is_finite() };
                if let Some(x) = values.iter().find(|x| bad(x)) {
                    let max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
                    return Err(StudioError::tensor(
                        src.source_name(),
                        &name,
                        format!(
                            "the shared expert of layer {l} is not zero ({x} found, max |w| = {max}, shape {:?}): \
                             moe-studio's MoE has no shared expert yet, so it reads only Qwen2-MoE checkpoints whose \
                             shared expert is exactly zero (down projection 0), as it writes them",
                            info.shape
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::names;
    use super::super::tests::{base, spec};
    use super::*;

    #[test]
    fn names_map_both_ways() {
        let roles = [
            TensorRole::Router { layer: 2 },
            TensorRole::Expert { layer: 0, expert: 3, proj: Proj::Up },
            TensorRole::SharedExpert { layer: 1, index: 0, proj: Proj::Down },
            TensorRole::SharedExpertGate { layer: 1, index: 0 },
            TensorRole::DenseFfn { layer: 5, proj: Proj::Gate },
            TensorRole::Other("model.layers.0.self_attn.q_proj.bias".into()),
        ];
        for r in roles {
            assert_eq!(Qwen2Moe.role_of(&Qwen2Moe.disk_name(&r)), r);
        }
        assert_eq!(
            Qwen2Moe.disk_name(&names::parse("model.layers.3.block_sparse_moe.experts.1.w2.weight")),
            "model.layers.3.mlp.experts.1.down_proj.weight"
        );
        assert_eq!(
            Qwen2Moe.disk_name(&names::parse("model.layers.3.block_sparse_moe.gate.weight")),
            "model.layers.3.mlp.gate.weight"
        );
    }

    #[test]
    fn config_lists_dense_layers_and_keeps_the_bias_choice() {
        let moe = MoeConfig { layers: vec![Some(spec(4, 2)), None], router_aux_loss_coef: 0.01 };
        let v = Qwen2Moe.write_config(&base("llama"), &moe);
        assert_eq!(v["model_type"], "qwen2_moe");
        assert_eq!(v["mlp_only_layers"], serde_json::json!([1]));
        assert_eq!(v["qkv_bias"], false);
        assert_eq!(v["norm_topk_prob"], true);
        assert_eq!(v["num_experts"], 4);
        assert_eq!(Qwen2Moe.write_config(&base("qwen2"), &moe)["qkv_bias"], true);
        let zeros = Qwen2Moe.zero_tensors(&base("qwen2"), &moe);
        assert_eq!(zeros.len(), 4, "one shared expert (3 projections + gate) in the one MoE layer");
    }

    #[test]
    fn un_normalised_top_k_is_refused_on_read() {
        let moe = MoeConfig::uniform(2, spec(4, 2));
        let mut v = Qwen2Moe.write_config(&base("qwen2"), &moe);
        v["norm_topk_prob"] = false.into();
        let e = Qwen2Moe.read_config(&v, "x/config.json").unwrap_err().to_string();
        assert!(e.contains("x/config.json") && e.contains("norm_topk_prob"), "{e}");
    }
}
