//! The Qwen2-MoE layout (`Qwen2MoeForCausalLM`; Qwen1.5-MoE / Qwen2-MoE,
//! transformers' `Qwen2MoeConfig` and `modeling_qwen2_moe.py`).
//!
//! `config.json`: `model_type: "qwen2_moe"`, `architectures:
//! ["Qwen2MoeForCausalLM"]`, `num_experts`, `num_experts_per_tok`,
//! `norm_topk_prob` (`true`: softmax over all `E`, top-k, renormalised —
//! the studio's default; `false`: each chosen expert weighs its softmax over
//! all `E`, Qwen1.5-MoE's default and the studio's `norm_topk_prob: false`,
//! methods.md §5), `moe_intermediate_size` (the routed experts' width:
//! `intermediate_size`, or `f / G` for granular experts),
//! `shared_expert_intermediate_size` (the dense width for the model's own
//! shared expert, [`ZERO_SHARED_EXPERT_SIZE`] for the zero one),
//! `decoder_sparse_step: 1`, `mlp_only_layers` (the layers that stay
//! dense), `qkv_bias` (the base's attention bias: on for Qwen2, off for
//! Llama), plus the dense keys and the `moe_studio` object (frozen experts,
//! frozen shared experts, and `zero_shared_expert: true` when the shared
//! expert is the zero stand-in).
//!
//! Tensors, per MoE layer `l` (`model.layers.{l}.mlp.` prefix):
//! - `gate.weight [E, d]` — the router;
//! - `experts.{e}.{gate_proj,up_proj,down_proj}.weight` — the experts (or
//!   packed, transformers 5's `experts.gate_up_proj [E, 2f, d]` and
//!   `experts.down_proj [E, d, f]`, [`super::packed`]);
//! - `shared_expert.{gate_proj,up_proj,down_proj}.weight` and
//!   `shared_expert_gate.weight [1, d]` — the shared expert, whose output
//!   `sigmoid(g · x) * down(silu(gate(x)) * up(x))` is added to the routed
//!   experts' sum. The layout requires exactly one in every MoE layer
//!   ([`SharedExperts::Gated`], `required`). A model with one gated shared
//!   expert per MoE layer (`--shared-experts 1 --shared-gate`) is written
//!   with its own (canonical `shared_experts.0.*` and `shared_expert_gate`
//!   `[1, d]`); a model without shared experts gets an exact zero of
//!   intermediate size [`ZERO_SHARED_EXPERT_SIZE`] (every tensor 0, hence
//!   `down(..) = 0` and the layer's output is the routed sum, bit for bit),
//!   marked `moe_studio.zero_shared_expert: true`; on read that marked
//!   shared expert is dropped after checking that its down projection is
//!   exactly zero (and its other projections finite). Every other Qwen2-MoE
//!   checkpoint (Qwen1.5-MoE's own) is read with its shared expert. An
//!   ungated or more than one shared expert per layer cannot be held.
//!
//! Dense layers keep `mlp.{gate,up,down}_proj.weight`
//! (`Qwen2MoeMLP`), listed in `mlp_only_layers`.

use super::names::{split_layer, Proj, TensorRole};
use super::{
    base_config, get_usize, no_qk_norm, no_selection_bias, one_expert_width, one_norm_topk, read_base,
    recorded_base_type, recorded_frozen, recorded_shared_frozen, uniform, Blocker, MoeLayout, SharedExperts,
};
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};
use crate::error::{Result, StudioError};
use crate::tensor_io::TensorSource;

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

/// Whether `moe` has its own shared expert in the Qwen2-MoE form (one
/// sigmoid-gated shared expert in every MoE layer: `true`) or none at all
/// (`false`: the zero one is written).
///
/// # Errors
/// The [`Blocker`] for more than one shared expert per layer
/// (`shared_experts`), an ungated one (`shared_expert_gate`), or MoE layers
/// that differ (`shared_experts`).
fn own_shared_expert(moe: &MoeConfig) -> std::result::Result<bool, Blocker> {
    let mut first: Option<(usize, usize)> = None;
    for (l, s) in moe.layers.iter().enumerate() {
        let Some(s) = s else { continue };
        if s.shared_experts > 1 {
            return Err(Blocker::new(
                "shared_experts",
                format!(
                    "layer {l} has {} shared experts and Qwen2-MoE has one per layer (the studio layout holds any \
                     number)",
                    s.shared_experts
                ),
            ));
        }
        if s.shared_experts == 1 && !s.shared_expert_gate {
            return Err(Blocker::new(
                "shared_expert_gate",
                format!(
                    "layer {l}'s shared expert is ungated and Qwen2-MoE always scales its shared expert by \
                     sigmoid(shared_expert_gate · x) (use --shared-gate, or the studio layout)"
                ),
            ));
        }
        match first {
            None => first = Some((l, s.shared_experts)),
            Some((l0, n0)) if n0 != s.shared_experts => {
                return Err(Blocker::new(
                    "shared_experts",
                    format!(
                        "layer {l} has {} shared expert(s) and layer {l0} {n0}: Qwen2-MoE has one \
                         `shared_expert_intermediate_size` for every MoE layer",
                        s.shared_experts
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(first.is_some_and(|(_, n)| n == 1))
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

    fn check(&self, base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<(), Blocker> {
        uniform(moe, "Qwen2-MoE")?;
        no_qk_norm(base, "Qwen2-MoE")?;
        no_selection_bias(moe, "Qwen2-MoE")?;
        one_norm_topk(moe, "Qwen2-MoE")?;
        one_expert_width(base, moe, "Qwen2-MoE", "moe_intermediate_size")?;
        own_shared_expert(moe)?;
        Ok(())
    }

    fn write_config(&self, base: &ModelConfig, moe: &MoeConfig) -> serde_json::Value {
        let mut v = base_config(base, moe, self.name());
        let (e, k) = uniform(moe, "Qwen2-MoE").ok().flatten().unwrap_or((0, 0));
        let norm_topk = one_norm_topk(moe, "Qwen2-MoE").unwrap_or(true);
        let width = one_expert_width(base, moe, "Qwen2-MoE", "moe_intermediate_size")
            .ok()
            .flatten()
            .unwrap_or(base.intermediate_size);
        let own = own_shared_expert(moe).unwrap_or(false);
        if !own {
            v["moe_studio"]["zero_shared_expert"] = true.into();
        }
        let dense: Vec<usize> = moe.layers.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(l, _)| l).collect();
        let obj = v.as_object_mut().expect("object");
        obj.insert("model_type".into(), "qwen2_moe".into());
        obj.insert("architectures".into(), serde_json::json!(["Qwen2MoeForCausalLM"]));
        obj.insert("num_experts".into(), e.into());
        obj.insert("num_experts_per_tok".into(), k.into());
        obj.insert("norm_topk_prob".into(), norm_topk.into());
        obj.insert("moe_intermediate_size".into(), width.into());
        let shared_size = if own { base.intermediate_size } else { ZERO_SHARED_EXPERT_SIZE };
        obj.insert("shared_expert_intermediate_size".into(), shared_size.into());
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
        let qkv_bias = v.get("qkv_bias").and_then(|b| b.as_bool()).unwrap_or(true);
        let base_type = recorded_base_type(v).unwrap_or(if qkv_bias { "qwen2" } else { "llama" });
        let mut dense = v.clone();
        dense["attention_bias"] = qkv_bias.into();
        let mut base = read_base(&dense, base_type, source_name)?;
        // transformers' Qwen2MoeConfig default: false (Qwen1.5-MoE).
        let norm_topk_prob = v.get("norm_topk_prob").and_then(|b| b.as_bool()).unwrap_or(false);
        let e = get_usize(v, "num_experts", source_name, "qwen2_moe")?;
        let k = get_usize(v, "num_experts_per_tok", source_name, "qwen2_moe")?;
        let step = v.get("decoder_sparse_step").and_then(|x| x.as_u64()).unwrap_or(1).max(1) as usize;
        let only: Vec<usize> = match v.get("mlp_only_layers") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(x) => serde_json::from_value(x.clone())
                .map_err(|e| StudioError::format(source_name, "config.json", format!("`mlp_only_layers`: {e}")))?,
        };
        let is_moe = |l: usize| e > 0 && !only.contains(&l) && (l + 1).is_multiple_of(step);
        let any_dense = (0..base.num_layers).any(|l| !is_moe(l));
        // The shared expert: the zero stand-in the studio writes for a model
        // without one (marked), else the model's own, of the dense width. A
        // foreign shared expert of another width than the dense layers'
        // cannot be held (the studio's shared experts have the dense width),
        // so it is read only if it is exactly zero, like the stand-in
        // (`check_dropped` refuses it otherwise, naming it).
        let marked =
            v.get("moe_studio").and_then(|s| s.get("zero_shared_expert")).and_then(|b| b.as_bool()) == Some(true);
        let fs = get_usize(v, "shared_expert_intermediate_size", source_name, "qwen2_moe")?;
        let zero = marked || (fs != base.intermediate_size && any_dense);
        if !zero {
            // Every layer MoE, or the widths agree: the dense width is the
            // shared expert's.
            base.intermediate_size = fs;
        }
        let moe_f = v.get("moe_intermediate_size").and_then(|x| x.as_u64()).map(|x| x as usize);
        let expert_intermediate_size = moe_f.filter(|&f| f != base.intermediate_size);
        let frozen = recorded_frozen(v, base.num_layers, source_name)?;
        let layers = (0..base.num_layers)
            .map(|l| {
                is_moe(l).then(|| MoeLayerSpec {
                    num_experts: e,
                    top_k: k,
                    frozen: frozen.get(l).cloned().unwrap_or_default(),
                    expert_intermediate_size,
                    shared_experts: usize::from(!zero),
                    shared_expert_gate: !zero,
                    shared_frozen: !zero && recorded_shared_frozen(v, l),
                    norm_topk_prob,
                    ..Default::default()
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
            "shared_expert_gate.weight" => return TensorRole::SharedExpertGate { layer },
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

    /// `model.layers.{l}.mlp` (transformers 5: `mlp.experts.gate_up_proj`,
    /// `mlp.experts.down_proj`, [`super::packed`]).
    fn packed_prefixes(&self, layer: usize) -> Vec<String> {
        vec![format!("model.layers.{layer}.mlp")]
    }

    fn zero_tensors(&self, base: &ModelConfig, moe: &MoeConfig) -> Vec<(TensorRole, Vec<usize>)> {
        let (d, s) = (base.hidden_size, ZERO_SHARED_EXPERT_SIZE);
        let mut out = Vec::new();
        for (layer, spec) in moe.layers.iter().enumerate() {
            // Only a layer without its own shared expert gets the zero one.
            if spec.as_ref().is_none_or(|s| s.shared_experts > 0) {
                continue;
            }
            for proj in Proj::ALL {
                out.push((TensorRole::SharedExpert { layer, index: 0, proj }, proj.shape(d, s)));
            }
            out.push((TensorRole::SharedExpertGate { layer }, vec![1, d]));
        }
        out
    }

    fn check_dropped(&self, src: &dyn TensorSource, base: &ModelConfig, moe: &MoeConfig) -> Result<()> {
        let d = base.hidden_size;
        for (l, spec) in moe.layers.iter().enumerate() {
            if spec.as_ref().is_none_or(|s| s.shared_experts > 0) {
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
                    let f = base.intermediate_size;
                    let width = if proj == Proj::Down { info.shape.get(1) } else { info.shape.first() }.copied();
                    let why = match width {
                        Some(w) if w != f => format!(
                            "it is {w} units wide and moe-studio's shared experts have the dense FFN's width \
                             (intermediate_size {f}, which this checkpoint's dense layers use), so such a shared \
                             expert is read only when it is exactly zero (down projection 0)"
                        ),
                        _ => "it is marked as the zero stand-in (`moe_studio.zero_shared_expert`); remove the mark \
                              to read it as the model's own shared expert"
                            .to_string(),
                    };
                    return Err(StudioError::tensor(
                        src.source_name(),
                        &name,
                        format!(
                            "the shared expert of layer {l} is not zero ({x} found, max |w| = {max}, shape {:?}): {why}",
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
            TensorRole::SharedExpertGate { layer: 1 },
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
    fn norm_topk_prob_false_round_trips_and_is_the_foreign_default() {
        let moe = MoeConfig::uniform(2, MoeLayerSpec { norm_topk_prob: false, ..spec(4, 2) });
        Qwen2Moe.check(&base("qwen2"), &moe).unwrap();
        let mut v = Qwen2Moe.write_config(&base("qwen2"), &moe);
        assert_eq!(v["norm_topk_prob"], false);
        assert_eq!(Qwen2Moe.read_config(&v, "c").unwrap().1, moe);
        v.as_object_mut().unwrap().remove("norm_topk_prob");
        assert!(!Qwen2Moe.read_config(&v, "c").unwrap().1.layers[0].as_ref().unwrap().norm_topk_prob);
        let mixed = MoeConfig {
            layers: vec![Some(spec(4, 2)), Some(MoeLayerSpec { norm_topk_prob: false, ..spec(4, 2) })],
            router_aux_loss_coef: 0.01,
        };
        assert_eq!(Qwen2Moe.check(&base("qwen2"), &mixed).unwrap_err().field, "norm_topk_prob");
    }

    #[test]
    fn the_models_own_gated_shared_expert_is_written_and_read_back() {
        let b = base("qwen2");
        let own = MoeLayerSpec {
            shared_experts: 1,
            shared_expert_gate: true,
            shared_frozen: true,
            expert_intermediate_size: Some(6),
            ..spec(4, 2)
        };
        let moe = MoeConfig { layers: vec![Some(own), None], router_aux_loss_coef: 0.01 };
        Qwen2Moe.check(&b, &moe).unwrap();
        let v = Qwen2Moe.write_config(&b, &moe);
        assert_eq!(v["shared_expert_intermediate_size"], 12);
        assert_eq!(v["moe_intermediate_size"], 6);
        assert!(v["moe_studio"].get("zero_shared_expert").is_none());
        assert_eq!(v["moe_studio"]["shared_frozen"], serde_json::json!([true, false]));
        assert!(Qwen2Moe.zero_tensors(&b, &moe).is_empty(), "no zero stand-in beside the model's own");
        let (b2, m2) = Qwen2Moe.read_config(&v, "c").unwrap();
        assert_eq!((b2.intermediate_size, m2), (12, moe));
        // without shared experts: the marked zero stand-in
        let plain = MoeConfig::uniform(2, spec(4, 2));
        let v = Qwen2Moe.write_config(&b, &plain);
        assert_eq!(
            (v["shared_expert_intermediate_size"].as_u64(), v["moe_studio"]["zero_shared_expert"].as_bool()),
            (Some(1), Some(true))
        );
        assert_eq!(Qwen2Moe.read_config(&v, "c").unwrap().1, plain);
    }

    #[test]
    fn shared_experts_it_cannot_hold_are_blocked_by_field() {
        let b = base("qwen2");
        let with = |s: MoeLayerSpec| MoeConfig::uniform(2, s);
        let two = with(MoeLayerSpec { shared_experts: 2, shared_expert_gate: true, ..spec(4, 2) });
        let ungated = with(MoeLayerSpec { shared_experts: 1, ..spec(4, 2) });
        let mixed = MoeConfig {
            layers: vec![
                Some(MoeLayerSpec { shared_experts: 1, shared_expert_gate: true, ..spec(4, 2) }),
                Some(spec(4, 2)),
            ],
            router_aux_loss_coef: 0.01,
        };
        let biased = with(MoeLayerSpec { selection_bias: true, ..spec(4, 2) });
        let widths = MoeConfig {
            layers: vec![Some(MoeLayerSpec { expert_intermediate_size: Some(6), ..spec(4, 2) }), Some(spec(4, 2))],
            router_aux_loss_coef: 0.01,
        };
        for (moe, field, says) in [
            (two, "shared_experts", "2 shared experts"),
            (ungated, "shared_expert_gate", "ungated"),
            (mixed, "shared_experts", "layer 1 has 0"),
            (biased, "selection_bias", "selection bias"),
            (widths, "expert_intermediate_size", "moe_intermediate_size"),
        ] {
            let blk = Qwen2Moe.check(&b, &moe).unwrap_err();
            assert_eq!(blk.field, field, "{blk}");
            assert!(blk.to_string().contains(says) && blk.to_string().contains(&format!("`{field}`")), "{blk}");
        }
    }

    #[test]
    fn a_foreign_shared_expert_is_the_models_own_unless_its_width_cannot_be_held() {
        let b = base("qwen2");
        let foreign = |layers: Vec<Option<MoeLayerSpec>>, fs: usize| {
            let mut v = Qwen2Moe.write_config(&b, &MoeConfig { layers, router_aux_loss_coef: 0.01 });
            v["moe_studio"] = serde_json::Value::Null;
            v["shared_expert_intermediate_size"] = fs.into();
            Qwen2Moe.read_config(&v, "x/config.json").unwrap()
        };
        // the dense width: the model's own
        let (_, m) = foreign(vec![Some(spec(4, 2)), None], 12);
        let s = m.layers[0].clone().unwrap();
        assert_eq!((s.shared_experts, s.shared_expert_gate), (1, true));
        // another width beside dense layers: read only as an exact zero
        let (b2, m) = foreign(vec![Some(spec(4, 2)), None], 20);
        assert_eq!((b2.intermediate_size, m.layers[0].as_ref().unwrap().shared_experts), (12, 0));
        assert_eq!(Qwen2Moe.zero_tensors(&b2, &m).len(), 4);
        // every layer MoE: the shared width is the model's FFN width
        let (b3, m) = foreign(vec![Some(spec(4, 2)), Some(spec(4, 2))], 20);
        let s = m.layers[0].clone().unwrap();
        assert_eq!((b3.intermediate_size, s.shared_experts, s.expert_intermediate_size), (20, 1, Some(12)));
    }
}
