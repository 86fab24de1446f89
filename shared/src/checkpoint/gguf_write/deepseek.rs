//! llama.cpp's `deepseek` architecture (DeepSeek-MoE v1:
//! `src/models/deepseek.cpp`; `conversion/deepseek.py` `DeepseekModel`):
//! leading dense layers, ungated shared experts and un-normalised top-k
//! weights on Llama attention. What it computes, and which studio MoEs it
//! holds exactly, is [`crate::layout::deepseek_moe`]
//! ([`deepseek_form`]).
//!
//! Keys: `deepseek.leading_dense_block_count`, `deepseek.expert_count`,
//! `deepseek.expert_used_count`, `deepseek.expert_feed_forward_length`,
//! `deepseek.expert_shared_count`, `deepseek.expert_weights_scale` (1),
//! `deepseek.feed_forward_length` (the dense width), and
//! `moe_studio.shared_experts` (the model's own shared experts; 0 when the
//! shared FFN is the zero stand-in) and `moe_studio.shared_frozen` (JSON,
//! one bool per layer) so the studio reads back the same configuration. Tensors per MoE block: the router and stacked experts
//! ([`super::llama::routed_experts`]) and `blk.N.ffn_{gate,up}_shexp.weight`
//! (`ne [d, W]`), `blk.N.ffn_down_shexp.weight` (`ne [W, d]`), `W =
//! expert_feed_forward_length · expert_shared_count`: the model's shared
//! experts concatenated along their intermediate units, or zeros.

use super::{llama_blocks, From, GgufArch};
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};
use crate::layout::deepseek_moe::deepseek_form;
use crate::layout::names::Proj;
use crate::layout::Blocker;
use crate::tensor_io::gguf::GgufValue;
use crate::tensor_io::DType;

/// llama.cpp's `deepseek` architecture.
pub struct Deepseek;

impl GgufArch for Deepseek {
    fn name(&self) -> &'static str {
        "deepseek"
    }

    fn check(&self, base: &ModelConfig, moe: Option<&MoeConfig>) -> std::result::Result<(), Blocker> {
        llama_blocks(base)?;
        let Some(moe) = moe else {
            return Err(Blocker::new("experts_per_layer", "a dense model is written as llama.cpp's `llama`"));
        };
        deepseek_form(base, moe).map(|_| ())
    }

    fn moe_keys(&self, base: &ModelConfig, moe: &MoeConfig) -> Vec<(String, GgufValue)> {
        let f = deepseek_form(base, moe).expect("checked before writing");
        let u = |x: usize| GgufValue::U32(x as u32);
        // JSON in a string, as `moe_studio.frozen_experts`.
        let shared_frozen: Vec<bool> = moe.layers.iter().map(|s| s.as_ref().is_some_and(|s| s.shared_frozen)).collect();
        vec![
            ("deepseek.leading_dense_block_count".into(), u(f.leading_dense)),
            ("deepseek.expert_count".into(), u(f.num_experts)),
            ("deepseek.expert_used_count".into(), u(f.top_k)),
            ("deepseek.expert_feed_forward_length".into(), u(f.expert_width)),
            ("deepseek.expert_shared_count".into(), u(f.shared_count)),
            ("deepseek.expert_weights_scale".into(), GgufValue::F32(1.0)),
            ("moe_studio.shared_experts".into(), u(f.shared_experts)),
            (
                "moe_studio.shared_frozen".into(),
                GgufValue::String(serde_json::to_string(&shared_frozen).expect("json")),
            ),
        ]
    }

    fn moe_block(
        &self,
        base: &ModelConfig,
        layer: usize,
        spec: &MoeLayerSpec,
        router_scale: f32,
    ) -> Vec<(String, Vec<u64>, From, Option<DType>)> {
        let mut out = super::llama::routed_experts(base, layer, spec, router_scale);
        let d = base.hidden_size as u64;
        // One shared FFN: the model's own shared experts side by side, or a
        // zero stand-in one expert wide.
        let (width, count) = match spec.shared_experts {
            0 => (spec.expert_width(base) as u64, 0),
            n => ((n * base.intermediate_size) as u64, n),
        };
        for (proj, g) in [(Proj::Gate, "ffn_gate_shexp"), (Proj::Up, "ffn_up_shexp"), (Proj::Down, "ffn_down_shexp")] {
            let ne = if proj == Proj::Down { vec![width, d] } else { vec![d, width] };
            let from = if count == 0 { From::Zeros } else { From::Shared { layer, count, proj } };
            out.push((format!("blk.{layer}.{g}.weight"), ne, from, None));
        }
        out
    }
}
