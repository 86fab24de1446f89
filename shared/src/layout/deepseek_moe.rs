//! DeepSeek-MoE (Dai et al., "DeepSeekMoE", 2024, §3: `n_shared_experts`
//! ungated shared experts, `first_k_dense_replace` leading dense layers,
//! softmax over all routed experts without renormalising the top-k).
//!
//! **Written as a llama.cpp GGUF, not as a Hugging Face directory.** No
//! Hugging Face loader available here reads DeepSeek-MoE: transformers
//! loads DeepSeek-MoE v1 (`model_type: "deepseek"`) only through the
//! checkpoint's own remote code (not available offline), and its native
//! `deepseek_v2` / `deepseek_v3` classes use Multi-head Latent Attention
//! (low-rank compressed keys and values with an RMSNorm on the latent and
//! decoupled RoPE dimensions), which cannot hold a Llama / Qwen2 attention
//! exactly. So [`DeepseekMoe::check`] always refuses the safetensors
//! layout, naming first what the DeepSeek-MoE form itself could not hold.
//!
//! llama.cpp's `deepseek` GGUF architecture (DeepSeek-MoE v1;
//! `src/models/deepseek.cpp` of the llama.cpp that llama-cpp-python 0.3.36
//! vendors) does read it exactly, and `moe-studio convert --to gguf` writes
//! it there ([`crate::checkpoint::gguf_write`]) when [`deepseek_form`]
//! holds. Its graph, per layer `l`:
//! - Llama attention (`create_tensor_qkv(.., n_embd, n_embd, ..)`: q/k/v
//!   biases read when present; the query width must be `hidden_size`), RoPE
//!   in llama's interleaved order with no `rope_freqs` tensor (so no Llama
//!   3.1 scaling);
//! - `l < leading_dense_block_count`: a dense SwiGLU of `feed_forward_length`;
//! - else `build_moe_ffn(.., norm_w = false, w_scale = expert_weights_scale,
//!   LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX)`: softmax over all `E` router
//!   logits, top-k, each chosen expert weighted by its probability, not
//!   renormalised (the studio's `norm_topk_prob: false`; for `k = E` the
//!   same as renormalised), times `expert_weights_scale` unless it is 0 or 1
//!   (written as 1); no router bias, no selection bias (`exp_probs_b` is
//!   null);
//! - plus, ungated, one SwiGLU `ffn_{gate,up,down}_shexp` of width
//!   `expert_feed_forward_length · expert_shared_count` (required in every
//!   MoE layer). `N` shared experts of the dense width `f` are that FFN
//!   exactly (their intermediate units concatenated: `Σ_i down_i ·
//!   h_i = [down_1 … down_N] · [h_1; …; h_N]`) when `N · f` is a multiple of
//!   the expert width; a model without shared experts gets one zero shared
//!   expert of the expert width (down projection 0: its output is exactly 0).
//!
//! (mergekit's DeepSeek output, `mergekit/moe/deepseek.py`, writes
//! `norm_topk_prob: true` with top-k < E, which llama.cpp's `deepseek` graph
//! does not honour; the studio refuses renormalised top-k for this form,
//! naming `norm_topk_prob`.)
//!
//! Sources: llama.cpp `src/models/deepseek.cpp`, `src/llama-graph.cpp`
//! (`build_moe_ffn`), `conversion/deepseek.py` (`DeepseekModel`: keys and
//! q/k permutation); mergekit `mergekit/moe/deepseek.py`.

use super::{no_qk_norm, no_selection_bias, one_expert_width, uniform, Blocker, MoeLayout, SharedExperts};
use crate::config::{Architecture, ModelConfig, MoeConfig, RopeScaling};
use crate::error::{Result, StudioError};

/// DeepSeek-MoE (refused as safetensors; see the module docs).
pub struct DeepseekMoe;

const WHY: &str = "no Hugging Face loader here reads DeepSeek-MoE (transformers reads it only through the \
                   checkpoint's remote code; its deepseek_v2/v3 use MLA attention, which cannot hold a Llama/Qwen2 \
                   attention): write the model in the studio layout and `moe-studio convert --to gguf` it, which \
                   writes llama.cpp's `deepseek` architecture exactly";

/// The DeepSeek-MoE form of an MoE ([`deepseek_form`]): what llama.cpp's
/// `deepseek` GGUF records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeepseekForm {
    /// Leading dense layers (`first_k_dense_replace`,
    /// `deepseek.leading_dense_block_count`); every later layer is MoE.
    pub leading_dense: usize,
    /// Routed experts `E` (`deepseek.expert_count`).
    pub num_experts: usize,
    /// Experts per token `k` (`deepseek.expert_used_count`).
    pub top_k: usize,
    /// Width of each routed expert (`deepseek.expert_feed_forward_length`).
    pub expert_width: usize,
    /// The model's own shared experts per MoE layer, each of the dense
    /// width (0: a zero shared expert is written).
    pub shared_experts: usize,
    /// `deepseek.expert_shared_count`: the shared FFN's width in units of
    /// `expert_width` (`shared_experts · f / expert_width`, or 1 for the
    /// zero shared expert).
    pub shared_count: usize,
}

/// Whether `moe` on `base` is computed exactly by llama.cpp's `deepseek`
/// graph (module docs), and its form.
///
/// # Errors
/// The first [`Blocker`] found, naming the field: `router_bias`,
/// `num_experts`, `top_k`, `shared_expert_gate`, `selection_bias`,
/// `norm_topk_prob`, `experts_per_layer`, `expert_intermediate_size`,
/// `shared_experts`, `architecture`, `head_dim`, `rope_scaling`.
pub fn deepseek_form(base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<DeepseekForm, Blocker> {
    const WHAT: &str = "DeepSeek-MoE (llama.cpp's `deepseek`)";
    let Some((num_experts, top_k)) = uniform(moe, WHAT)? else {
        return Err(Blocker::new("experts_per_layer", "no layer is MoE"));
    };
    let specs = || moe.layers.iter().enumerate().filter_map(|(l, s)| s.as_ref().map(|s| (l, s)));
    if let Some((l, _)) = specs().find(|(_, s)| s.shared_experts > 0 && s.shared_expert_gate) {
        return Err(Blocker::new(
            "shared_expert_gate",
            format!(
                "layer {l}'s shared experts are sigmoid-gated and DeepSeek-MoE adds its shared experts ungated \
                 (qwen2_moe holds one gated shared expert, the studio layout any)"
            ),
        ));
    }
    no_selection_bias(moe, WHAT)?;
    if let Some((l, _)) = specs().find(|(_, s)| s.norm_topk_prob && s.top_k < s.num_experts) {
        return Err(Blocker::new(
            "norm_topk_prob",
            format!(
                "layer {l} renormalises its top-k weights and llama.cpp's `deepseek` architecture does not (it \
                 weighs each chosen expert by its softmax over all experts: norm_topk_prob false; mixtral, qwen2_moe \
                 and llama.cpp's `llama` MoE renormalise)"
            ),
        ));
    }
    let leading_dense = moe.layers.iter().position(Option::is_some).unwrap_or(moe.layers.len());
    if let Some(l) = moe.layers[leading_dense..].iter().position(Option::is_none) {
        return Err(Blocker::new(
            "experts_per_layer",
            format!(
                "layer {} stays dense after MoE layer {leading_dense}: DeepSeek-MoE's dense layers are the first \
                 `first_k_dense_replace` ones",
                leading_dense + l
            ),
        ));
    }
    let expert_width = one_expert_width(base, moe, WHAT, "moe_intermediate_size")?.unwrap_or(base.intermediate_size);
    let (l0, first) = specs().next().expect("an MoE layer exists");
    if let Some((l, s)) = specs().find(|(_, s)| s.shared_experts != first.shared_experts) {
        return Err(Blocker::new(
            "shared_experts",
            format!(
                "layer {l} has {} shared expert(s) and layer {l0} {}: DeepSeek-MoE has one `n_shared_experts`",
                s.shared_experts, first.shared_experts
            ),
        ));
    }
    let shared_width = first.shared_experts * base.intermediate_size;
    if !shared_width.is_multiple_of(expert_width) {
        return Err(Blocker::new(
            "shared_experts",
            format!(
                "{} shared expert(s) of width {} are not a whole number of experts of width {expert_width}: \
                 DeepSeek-MoE's shared FFN is `n_shared_experts` x `moe_intermediate_size` wide",
                first.shared_experts, base.intermediate_size
            ),
        ));
    }
    no_qk_norm(base, WHAT)?;
    if !matches!(base.architecture, Architecture::Llama | Architecture::Mistral | Architecture::Qwen2) {
        return Err(Blocker::new(
            "architecture",
            format!("the base is {} and DeepSeek-MoE's attention is Llama's", base.architecture.model_type()),
        ));
    }
    if base.num_heads * base.head_dim != base.hidden_size {
        return Err(Blocker::new(
            "head_dim",
            format!(
                "{} heads of head_dim {} make queries {} wide and llama.cpp's `deepseek` needs them hidden_size = {} \
                 wide",
                base.num_heads,
                base.head_dim,
                base.num_heads * base.head_dim,
                base.hidden_size
            ),
        ));
    }
    if !matches!(base.rope_scaling, RopeScaling::Default | RopeScaling::Linear { .. }) {
        return Err(Blocker::new(
            "rope_scaling",
            "the RoPE scaling needs per-frequency factors (`rope_freqs`), which llama.cpp's `deepseek` does not read",
        ));
    }
    Ok(DeepseekForm {
        leading_dense,
        num_experts,
        top_k,
        expert_width,
        shared_experts: first.shared_experts,
        shared_count: if shared_width == 0 { 1 } else { shared_width / expert_width },
    })
}

impl MoeLayout for DeepseekMoe {
    fn name(&self) -> &'static str {
        "deepseek_moe"
    }

    fn loaders(&self) -> &'static str {
        "none as safetensors; llama.cpp `deepseek` through `convert --to gguf`"
    }

    fn shared_experts(&self) -> SharedExperts {
        SharedExperts::Ungated
    }

    fn check(&self, base: &ModelConfig, moe: &MoeConfig) -> std::result::Result<(), Blocker> {
        deepseek_form(base, moe)?;
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
            "a DeepSeek-MoE Hugging Face checkpoint (`model_type: \"deepseek\"`): moe-studio does not read it (no \
             Hugging Face loader here runs DeepSeek-MoE to check a reader against; its llama.cpp GGUF form, \
             architecture `deepseek`, is read)",
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
        assert!(ungated.to_string().contains("convert --to gguf"), "{ungated}");
    }

    #[test]
    fn the_deepseek_form_is_leading_dense_layers_ungated_shared_experts_and_unnormalised_top_k() {
        let b = base("qwen2");
        let s = MoeLayerSpec { shared_experts: 2, norm_topk_prob: false, ..spec(4, 2) };
        let moe = MoeConfig { layers: vec![None, Some(s.clone())], router_aux_loss_coef: 0.01 };
        let f = deepseek_form(&b, &moe).unwrap();
        assert_eq!(
            f,
            DeepseekForm {
                leading_dense: 1,
                num_experts: 4,
                top_k: 2,
                expert_width: 12,
                shared_experts: 2,
                shared_count: 2
            }
        );
        // granular experts: 1 shared expert of width 12 is 4 of width 3; none is one zero expert
        let granular = |shared| {
            MoeConfig::uniform(
                2,
                MoeLayerSpec {
                    shared_experts: shared,
                    expert_intermediate_size: Some(3),
                    norm_topk_prob: false,
                    ..spec(8, 2)
                },
            )
        };
        assert_eq!(deepseek_form(&b, &granular(1)).unwrap().shared_count, 4);
        assert_eq!(
            (
                deepseek_form(&b, &granular(0)).unwrap().shared_count,
                deepseek_form(&b, &granular(0)).unwrap().shared_experts
            ),
            (1, 0)
        );
        // top-k = E: renormalising changes nothing, so it is held
        assert!(deepseek_form(&b, &MoeConfig::uniform(2, spec(2, 2))).is_ok());
        let blocked = |b: &ModelConfig, moe: &MoeConfig| deepseek_form(b, moe).unwrap_err().field;
        let dense_last = MoeConfig { layers: vec![Some(s.clone()), None], router_aux_loss_coef: 0.01 };
        assert_eq!(blocked(&b, &dense_last), "experts_per_layer");
        let five = MoeConfig::uniform(
            2,
            MoeLayerSpec { shared_experts: 1, expert_intermediate_size: Some(5), norm_topk_prob: false, ..spec(4, 2) },
        );
        assert_eq!(blocked(&b, &five), "shared_experts");
        let counts = MoeConfig {
            layers: vec![Some(s.clone()), Some(MoeLayerSpec { shared_experts: 1, ..s.clone() })],
            router_aux_loss_coef: 0.01,
        };
        assert_eq!(blocked(&b, &counts), "shared_experts");
        let mut wide = base("llama");
        wide.head_dim = 8;
        assert_eq!(blocked(&wide, &MoeConfig::uniform(2, s.clone())), "head_dim");
        let mut scaled = base("llama");
        scaled.rope_scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        assert_eq!(blocked(&scaled, &MoeConfig::uniform(2, s.clone())), "rope_scaling");
        assert_eq!(blocked(&base("qwen3"), &MoeConfig::uniform(2, s)), "architecture");
    }
}
