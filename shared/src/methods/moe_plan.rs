//! The tensor plan of an MoE checkpoint built on a dense base: every output
//! tensor's name, shape and where its values come from.
//!
//! The order is the dense order of [`dense_tensor_plan`] with each MoE
//! layer's `mlp.{gate,up,down}_proj.weight` replaced, in place, by the router
//! (`block_sparse_moe.gate.weight [E, d]`, `.gate.bias [E]` when the router
//! has one) and then the experts **projection-major**: `w1` of experts
//! `0..E` (from `gate_proj`), then `w3` (from `up_proj`), then `w2` (from
//! `down_proj`). Projection-major order lets a writer read one dense FFN
//! tensor and emit its `E` copies before reading the next, so upcycling holds
//! one source tensor at a time. Readers look tensors up by name, so the order
//! is invisible to them. Names are the canonical ones of
//! [`crate::layout::names`]; a layout renames them on the way out.

use crate::checkpoint::export::dense_tensor_plan;
use crate::config::{ModelConfig, MoeConfig};
use crate::layout::names::{self, expert_weight_name, router_bias_name, router_weight_name, Proj, TensorRole};

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
        }
        for e in 0..e_count {
            out.push(MoeTensor {
                name: expert_weight_name(l, e, proj),
                shape: shape.clone(),
                origin: Origin::Expert { layer: l, expert: e, dense_name: name.clone() },
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
        let spec = MoeLayerSpec { num_experts: 2, top_k: 1, frozen: vec![0], router_bias: true, temperature: 1.0 };
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
}
