//! The tensor plan: the one list of a checkpoint's tensor names and shapes,
//! dense ([`dense_tensor_plan`], family-aware) and MoE ([`moe_tensor_plan`],
//! built on it: every output tensor's name, shape and where its values come
//! from). Loading checks, saving, export and random initialisation all read
//! it.
//!
//! The order is the dense order of [`dense_tensor_plan`] with each MoE
//! layer's `mlp.{gate,up,down}_proj.weight` replaced, in place, by the router
//! (`block_sparse_moe.gate.weight [E, d]`, `.gate.bias [E]` when the router
//! has one, `.gate.e_score_correction_bias [E]` with a selection bias), the
//! shared-expert gate (`block_sparse_moe.shared_expert_gate.weight [N, d]`)
//! and then the experts **projection-major**: `w1` of experts `0..E` and of
//! shared experts `0..N` (from `gate_proj`), then `w3` (from `up_proj`),
//! then `w2` (from `down_proj`). Routed experts have the spec's expert width
//! (`[f_e, d]`, `[d, f_e]`), shared experts the dense width.
//! Projection-major order lets a writer read one dense FFN tensor and emit
//! its copies before reading the next, so upcycling holds one source tensor
//! at a time. Readers look tensors up by name, so the order
//! is invisible to them. Names are the canonical ones of
//! [`crate::layout::names`]; a layout renames them on the way out.

use crate::config::{ModelConfig, MoeConfig};
use crate::layout::names::{
    self, expert_weight_name, router_bias_name, router_weight_name, selection_bias_name, shared_expert_gate_name,
    shared_expert_weight_name, Proj, TensorRole,
};

/// The Hugging Face tensor names and shapes of a dense model of `c`, in the
/// order transformers writes them: `[out, in]` for linear weights (q
/// `[heads * head_dim, hidden]`, k/v `[kv_heads * head_dim, hidden]`, o
/// `[hidden, heads * head_dim]`, gate/up `[ffn, hidden]`, down `[hidden,
/// ffn]`), `[vocab, hidden]` for the embedding and an untied `lm_head`,
/// `[hidden]` for the RMSNorm gains, `[out]` for q/k/v biases
/// (`attention_bias`), `[head_dim]` for the q/k norms of the families that
/// have them (Qwen3, Gemma 3), and Gemma's sandwich norms. Fused storage
/// (Phi-3's `qkv_proj`, `gate_up_proj`) is a file form
/// ([`crate::checkpoint::fused`]): the plan lists the split tensors the
/// model holds. The element count is [`ModelConfig::num_parameters`].
pub fn dense_tensor_plan(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (d, f, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![d]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, d]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, d]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, d]));
        if c.attention_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![d, q]));
        if c.architecture.family().qk_norm {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![c.head_dim]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![c.head_dim]));
        }
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        if c.architecture.family().sandwich_norms {
            out.push((format!("{p}.pre_feedforward_layernorm.weight"), vec![d]));
            out.push((format!("{p}.post_feedforward_layernorm.weight"), vec![d]));
        }
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![d, f]));
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, d]));
    }
    out
}

/// Where the values of one output tensor come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A dense tensor of the same name (embeddings, attention, norms, LM
    /// head, and the FFN of a layer that stays dense).
    Dense {
        /// Whether it is an FFN projection of a dense layer.
        ffn: bool,
    },
    /// Expert `expert` of MoE layer `layer`, made from the dense tensor
    /// `dense_name` (`model.layers.{layer}.mlp.{proj}.weight`).
    Expert {
        /// Decoder layer.
        layer: usize,
        /// Expert index within the layer.
        expert: usize,
        /// Name of the dense FFN projection it derives from.
        dense_name: String,
    },
    /// Router weight `[E, d]` of MoE layer `layer`.
    RouterWeight {
        /// Decoder layer.
        layer: usize,
    },
    /// Router bias `[E]` of MoE layer `layer`.
    RouterBias {
        /// Decoder layer.
        layer: usize,
    },
    /// Aux-loss-free selection bias `[E]` of MoE layer `layer`.
    SelectionBias {
        /// Decoder layer.
        layer: usize,
    },
    /// Shared-expert gate `[N, d]` of MoE layer `layer`.
    SharedGate {
        /// Decoder layer.
        layer: usize,
    },
    /// Shared expert `index` of MoE layer `layer`, made from the dense
    /// tensor `dense_name`.
    SharedExpert {
        /// Decoder layer.
        layer: usize,
        /// Shared expert index within the layer.
        index: usize,
        /// Name of the dense FFN projection it derives from.
        dense_name: String,
    },
}

/// One tensor of the MoE checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeTensor {
    /// Output tensor name.
    pub name: String,
    /// Output shape (PyTorch order, `[out, in]` for linear weights).
    pub shape: Vec<usize>,
    /// Where its values come from.
    pub origin: Origin,
}

/// The MoE checkpoint's tensors in write order (see the module docs).
///
/// `moe` must have been validated against `base` (one entry per layer).
pub fn moe_tensor_plan(base: &ModelConfig, moe: &MoeConfig) -> Vec<MoeTensor> {
    let d = base.hidden_size;
    let mut out = Vec::new();
    for (name, shape) in dense_tensor_plan(base) {
        let TensorRole::DenseFfn { layer: l, proj } = names::parse(&name) else {
            out.push(MoeTensor { name, shape, origin: Origin::Dense { ffn: false } });
            continue;
        };
        let Some(spec) = moe.layers.get(l).and_then(|s| s.as_ref()) else {
            out.push(MoeTensor { name, shape, origin: Origin::Dense { ffn: true } });
            continue;
        };
        let e_count = spec.num_experts;
        if proj == Proj::Gate {
            out.push(MoeTensor {
                name: router_weight_name(l),
                shape: vec![e_count, d],
                origin: Origin::RouterWeight { layer: l },
            });
            if spec.router_bias {
                out.push(MoeTensor {
                    name: router_bias_name(l),
                    shape: vec![e_count],
                    origin: Origin::RouterBias { layer: l },
                });
            }
            if spec.selection_bias {
                out.push(MoeTensor {
                    name: selection_bias_name(l),
                    shape: vec![e_count],
                    origin: Origin::SelectionBias { layer: l },
                });
            }
            if spec.shared_expert_gate {
                out.push(MoeTensor {
                    name: shared_expert_gate_name(l),
                    shape: vec![spec.shared_experts, d],
                    origin: Origin::SharedGate { layer: l },
                });
            }
        }
        // The dense shape with the intermediate axis (rows of gate/up,
        // columns of down) at the expert width.
        let fe = spec.expert_width(base);
        let expert_shape = if proj == Proj::Down { vec![shape[0], fe] } else { vec![fe, shape[1]] };
        for e in 0..e_count {
            out.push(MoeTensor {
                name: expert_weight_name(l, e, proj),
                shape: expert_shape.clone(),
                origin: Origin::Expert { layer: l, expert: e, dense_name: name.clone() },
            });
        }
        for i in 0..spec.shared_experts {
            out.push(MoeTensor {
                name: shared_expert_weight_name(l, i, proj),
                shape: shape.clone(),
                origin: Origin::SharedExpert { layer: l, index: i, dense_name: name.clone() },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HfConfig, MoeLayerSpec};

    fn base() -> ModelConfig {
        let json =
            br#"{"model_type":"llama","vocab_size":32,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":2,
            "num_attention_heads":2,"num_key_value_heads":1,"tie_word_embeddings":true}"#;
        HfConfig::from_json(json, "c").unwrap().to_model_config("c").unwrap()
    }

    #[test]
    fn experts_replace_the_ffn_projection_major() {
        let spec = MoeLayerSpec { num_experts: 2, top_k: 1, frozen: vec![0], router_bias: true, ..Default::default() };
        let moe = MoeConfig { layers: vec![Some(spec), None], router_aux_loss_coef: 0.01 };
        let plan = moe_tensor_plan(&base(), &moe);
        let names: Vec<&str> = plan.iter().map(|t| t.name.as_str()).collect();
        let i = names.iter().position(|n| *n == "model.layers.0.block_sparse_moe.gate.weight").unwrap();
        assert_eq!(
            &names[i..i + 8],
            &[
                "model.layers.0.block_sparse_moe.gate.weight",
                "model.layers.0.block_sparse_moe.gate.bias",
                "model.layers.0.block_sparse_moe.experts.0.w1.weight",
                "model.layers.0.block_sparse_moe.experts.1.w1.weight",
                "model.layers.0.block_sparse_moe.experts.0.w3.weight",
                "model.layers.0.block_sparse_moe.experts.1.w3.weight",
                "model.layers.0.block_sparse_moe.experts.0.w2.weight",
                "model.layers.0.block_sparse_moe.experts.1.w2.weight",
            ]
        );
        assert_eq!(plan[i].shape, vec![2, 8]);
        assert_eq!(plan[i + 6].shape, vec![8, 12]);
        assert!(names.contains(&"model.layers.1.mlp.down_proj.weight"));
        assert!(!names.iter().any(|n| n.starts_with("model.layers.0.mlp")));
    }

    #[test]
    fn granular_and_shared_experts_have_their_widths() {
        let spec = MoeLayerSpec {
            num_experts: 4,
            top_k: 2,
            expert_intermediate_size: Some(3),
            shared_experts: 1,
            shared_expert_gate: true,
            selection_bias: true,
            ..Default::default()
        };
        let moe = MoeConfig { layers: vec![Some(spec), None], router_aux_loss_coef: 0.01 };
        let plan = moe_tensor_plan(&base(), &moe);
        let shape = |n: &str| plan.iter().find(|t| t.name == n).unwrap().shape.clone();
        let p = "model.layers.0.block_sparse_moe";
        assert_eq!(shape(&format!("{p}.experts.3.w1.weight")), vec![3, 8]);
        assert_eq!(shape(&format!("{p}.experts.0.w2.weight")), vec![8, 3]);
        assert_eq!(shape(&format!("{p}.shared_experts.0.w3.weight")), vec![12, 8]);
        assert_eq!(shape(&format!("{p}.shared_experts.0.w2.weight")), vec![8, 12]);
        assert_eq!(shape(&format!("{p}.shared_expert_gate.weight")), vec![1, 8]);
        assert_eq!(shape(&format!("{p}.gate.e_score_correction_bias")), vec![4]);
        let numel: u64 = plan.iter().map(|t| t.shape.iter().product::<usize>() as u64).sum();
        // The plan holds every parameter plus the selection bias (a buffer).
        assert_eq!(numel, moe.num_parameters_u64(&base()) + 4);
    }
}
