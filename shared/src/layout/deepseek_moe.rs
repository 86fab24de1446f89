//! DeepSeek-MoE (`n_shared_experts` ungated shared experts,
//! `first_k_dense_replace` leading dense layers; Dai et al., "DeepSeekMoE",
//! 2024): a documented absence.
//!
//! No loader available here reads a studio MoE in this form exactly:
//! - transformers loads DeepSeek-MoE v1 (`model_type: "deepseek"`) only
//!   through the checkpoint's own remote code, which is not available
//!   offline; its native `deepseek_v2` / `deepseek_v3` classes use
//!   Multi-head Latent Attention (low-rank compressed keys and values with an
//!   RMSNorm on the latent and decoupled RoPE dimensions), which cannot hold a
//!   Llama / Qwen2 attention exactly;
//! - llama.cpp's `deepseek` GGUF architecture (DeepSeek-MoE v1: Llama
//!   attention, `blk.N.ffn_{gate,up,down}_exps`, `blk.N.ffn_gate_inp`,
//!   shared experts `blk.N.ffn_{gate,up,down}_shexp`,
//!   `deepseek.leading_dense_block_count`, `deepseek.expert_shared_count`,
//!   `deepseek.expert_weights_scale`) weights the chosen experts by the
//!   softmax over **all** `E` logits without renormalising the top-k
//!   (`build_moe_ffn(..., norm_w = false, ...)` in
//!   `src/models/deepseek.cpp`), so for `k < E` it differs from the
//!   studio's softmax over the top-k.
//!
//! The model now has un-normalised top-k routing (`norm_topk_prob: false`)
//! and ungated shared experts (methods.md §5), so a studio MoE with
//! `norm_topk_prob: false`, ungated shared experts of the dense width and
//! no router or selection bias is what llama.cpp's `deepseek` GGUF form
//! computes; its GGUF writer is not written yet. Until it is, the check
//! names first what this form could never hold (a sigmoid-gated shared
//! expert: DeepSeek's are ungated; the selection bias; renormalised top-k
//! weights; per-layer counts; a router bias), then refuses with the
//! reasons above, and `auto` never picks it.

use super::{no_selection_bias, uniform, Blocker, MoeLayout, SharedExperts};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};

/// DeepSeek-MoE (no writer; see the module docs).
pub struct DeepseekMoe;

const WHY: &str = "no loader available here holds it exactly: transformers reads DeepSeek-MoE only through remote \
                   code (deepseek_v2/v3 use MLA attention, which cannot hold a Llama/Qwen2 attention), and \
                   llama.cpp's `deepseek` architecture does not renormalise the top-k weights";

impl MoeLayout for DeepseekMoe {
    fn name(&self) -> &'static str {
        "deepseek_moe"
    }

    fn loaders(&self) -> &'static str {
        "none here (see shared/src/layout/deepseek_moe.rs)"
    }

    fn shared_experts(&self) -> SharedExperts {
        SharedExperts::Ungated
    }

    fn check(&self, _base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<(), Blocker> {
        uniform(moe, "DeepSeek-MoE")?;
        if let Some(l) = moe.layers.iter().position(|s| s.as_ref().is_some_and(|s| s.shared_expert_gate)) {
            return Err(Blocker::new(
                "shared_expert_gate",
                format!(
                    "layer {l}'s shared experts are sigmoid-gated and DeepSeek-MoE adds its shared experts ungated \
                     (qwen2_moe holds one gated shared expert, the studio layout any)"
                ),
            ));
        }
        no_selection_bias(moe, "DeepSeek-MoE")?;
        if let Some(l) =
            moe.layers.iter().position(|s| s.as_ref().is_some_and(|s| s.norm_topk_prob && s.top_k < s.num_experts))
        {
            return Err(Blocker::new(
                "norm_topk_prob",
                format!(
                    "layer {l} renormalises its top-k weights and llama.cpp's `deepseek` architecture does not \
                     (it needs norm_topk_prob false)"
                ),
            ));
        }
        Err(Blocker::new("layout", WHY))
    }

    fn write_config(&self, base: &ModelConfig, moe: &MoeConfig) -> serde_json::Value {
        super::base_config(base, moe, self.name())
    }

    fn model_type(&self) -> Option<&'static str> {
        Some("deepseek")
    }

    fn read_config(&self, _v: &serde_json::Value, source_name: &str) -> Result<(ModelConfig, MoeConfig)> {
        Err(StudioError::config(
            source_name,
            format!(
                "a DeepSeek-MoE checkpoint (`model_type: \"deepseek\"`): moe-studio does not read it, because {WHY}"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{base, spec};
    use super::*;
    use crate::config::MoeLayerSpec;

    #[test]
    fn gated_shared_experts_and_the_selection_bias_are_named_then_the_missing_loader() {
        let b = base("llama");
        let check = |s: MoeLayerSpec| DeepseekMoe.check(&b, &MoeConfig::uniform(2, s)).unwrap_err();
        let gated =
            check(MoeLayerSpec { shared_experts: 1, shared_expert_gate: true, norm_topk_prob: false, ..spec(4, 2) });
        assert_eq!(gated.field, "shared_expert_gate");
        assert!(gated.to_string().contains("ungated"), "{gated}");
        assert_eq!(
            check(MoeLayerSpec { selection_bias: true, norm_topk_prob: false, ..spec(4, 2) }).field,
            "selection_bias"
        );
        assert_eq!(check(spec(4, 2)).field, "norm_topk_prob");
        let ungated = check(MoeLayerSpec { shared_experts: 2, norm_topk_prob: false, ..spec(4, 2) });
        assert_eq!(ungated.field, "layout");
    }
}
