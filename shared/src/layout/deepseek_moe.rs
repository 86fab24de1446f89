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
//! When the model gains un-normalised top-k routing (the methods issue's
//! `norm_topk_prob: false`) and shared experts, the llama.cpp `deepseek`
//! GGUF form becomes exact and this file gets its writer; until then the
//! check refuses with the reasons above, and `auto` never picks it.

use super::{Blocker, MoeLayout, SharedExperts};
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

    fn check(&self, _base: &ModelConfig, _moe: &MoeConfig) -> std::result::Result<(), Blocker> {
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
