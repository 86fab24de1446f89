//! llama.cpp's `llama` architecture (`src/models/llama.cpp`;
//! `convert_hf_to_gguf.py` `LlamaModel`): dense Llama / Mistral / Qwen2
//! models (q/k/v biases read when present) and the plain MoE.
//!
//! Its MoE (`build_moe_ffn(.., norm_w = true, .., SOFTMAX)`) weighs the
//! top-k by the softmax over all `E` logits renormalised over the `k`: the
//! studio's softmax over the top-k logits (Mixtral's routing). It holds
//! every layer MoE with one `E`, `k` and expert width, no router bias, no
//! shared experts (the file may carry `ffn_*_shexp`, but the graph never
//! adds them), no selection bias and renormalised top-k weights
//! ([`crate::layout::plain_moe`]); granular experts are written with
//! `llama.feed_forward_length` = their width (every layer is MoE, so no
//! dense FFN needs the dense width). Keys: `llama.expert_count`,
//! `llama.expert_used_count`. It reads `rope_freqs.weight` (Llama 3.1
//! scaling).

use super::{llama_blocks, From, GgufArch};
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};
use crate::layout::names::{self, Proj};
use crate::layout::Blocker;
use crate::tensor_io::gguf::GgufValue;
use crate::tensor_io::DType;

/// llama.cpp's `llama` architecture.
pub struct Llama;

impl GgufArch for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn check(&self, base: &ModelConfig, moe: Option<&MoeConfig>) -> std::result::Result<(), Blocker> {
        llama_blocks(base)?;
        let Some(moe) = moe else { return Ok(()) };
        if let Some(l) = moe.layers.iter().position(Option::is_none) {
            return Err(Blocker::new(
                "experts_per_layer",
                format!("layer {l} stays dense: llama.cpp's llama architecture makes every layer MoE"),
            ));
        }
        crate::layout::plain_moe(base, moe, "llama.cpp's llama MoE", "llama.feed_forward_length").map_err(|b| {
            Blocker::new(
                b.field,
                format!(
                    "{} (llama.cpp's llama MoE has one `llama.expert_count`, `llama.expert_used_count` and expert \
                     width, renormalised top-k weights, no router bias, no shared experts and no selection bias)",
                    b.why
                ),
            )
        })?;
        Ok(())
    }

    /// The experts' width in an MoE (every layer is MoE, so granular
    /// experts of width `f / G` are held exactly), else the dense width.
    fn feed_forward_length(&self, base: &ModelConfig, moe: Option<&MoeConfig>) -> usize {
        moe.and_then(|m| m.layers.iter().flatten().next()).map_or(base.intermediate_size, |s| s.expert_width(base))
    }

    fn reads_rope_freqs(&self) -> bool {
        true
    }

    fn moe_keys(&self, _base: &ModelConfig, moe: &MoeConfig) -> Vec<(String, GgufValue)> {
        let s = moe.layers.iter().flatten().next().expect("an MoE has an MoE layer");
        vec![
            ("llama.expert_count".into(), GgufValue::U32(s.num_experts as u32)),
            ("llama.expert_used_count".into(), GgufValue::U32(s.top_k as u32)),
        ]
    }

    fn moe_block(
        &self,
        base: &ModelConfig,
        layer: usize,
        spec: &MoeLayerSpec,
        router_scale: f32,
    ) -> Vec<(String, Vec<u64>, From, Option<DType>)> {
        routed_experts(base, layer, spec, router_scale)
    }
}

/// The router (`blk.N.ffn_gate_inp.weight`, F32, scaled by `router_scale`)
/// and the stacked routed experts `blk.N.ffn_{gate,up,down}_exps.weight` of
/// MoE block `layer`: llama.cpp's names in every architecture.
pub(crate) fn routed_experts(
    base: &ModelConfig,
    layer: usize,
    spec: &MoeLayerSpec,
    router_scale: f32,
) -> Vec<(String, Vec<u64>, From, Option<DType>)> {
    let (d, e, f) = (base.hidden_size as u64, spec.num_experts as u64, spec.expert_width(base) as u64);
    let b = format!("blk.{layer}");
    let mut out = vec![(
        format!("{b}.ffn_gate_inp.weight"),
        vec![d, e],
        From::Tensor { name: names::router_weight_name(layer), permute: None, scale: router_scale },
        Some(DType::F32),
    )];
    for (proj, g) in [(Proj::Gate, "ffn_gate_exps"), (Proj::Up, "ffn_up_exps"), (Proj::Down, "ffn_down_exps")] {
        let ne = if proj == Proj::Down { vec![f, d, e] } else { vec![d, f, e] };
        out.push((format!("{b}.{g}.weight"), ne, From::Experts { layer, experts: spec.num_experts, proj }, None));
    }
    out
}
