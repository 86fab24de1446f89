//! Phi-3 (`phi3`, `Phi3ForCausalLM`): Llama's blocks with the q/k/v
//! projections fused into `self_attn.qkv_proj` (`[(h + 2 kv)·hd, d]`) and
//! gate/up into `mlp.gate_up_proj` (`[2f, d]`), split on read and fused on
//! write ([`crate::checkpoint::fused`]); `rope_scaling` `longrope` (alias
//! `su`: per-frequency `short_factor` / `long_factor` and an attention
//! factor, [`crate::config::RopeScaling::LongRope`]); an optional
//! `sliding_window` over every layer. `partial_rotary_factor` < 1 (Phi-4-mini)
//! is refused. llama.cpp `phi3` (`convert_hf_to_gguf.py` `Phi3MiniModel`):
//! the fused tensors as `blk.N.attn_qkv` / `blk.N.ffn_up` (gate rows first),
//! LongRoPE as the F32 tensors `rope_factors_{short,long}.weight` with
//! `phi3.rope.scaling.original_context_length` and
//! `phi3.rope.scaling.attn_factor`, the window as
//! `phi3.attention.sliding_window` (0: none). Source: Abdin et al., "Phi-3
//! Technical Report" (2024); transformers `modeling_phi3.py`,
//! `modeling_rope_utils.py` (`_compute_longrope_parameters`).

use super::{Family, FamilyParams, GateActivation, LayerType};
use crate::config::{Architecture, HfConfig, ModelConfig};
use crate::error::{Result, StudioError};

/// The Phi-3 family.
pub const FAMILY: Family = Family {
    architecture: Architecture::Phi3,
    model_type: "phi3",
    hf_class: "Phi3ForCausalLM",
    gguf_arch: Some("phi3"),
    qkv_bias: false,
    qk_norm: false,
    gguf_permuted_qk: false,
    activation: GateActivation::Silu,
    norm_plus_one: false,
    embed_scale: false,
    fused_projections: true,
    sandwich_norms: false,
    read_params,
    write_params,
    gguf_block_names: &[("attn_qkv", "self_attn.qkv_proj"), ("ffn_up", "mlp.gate_up_proj")],
};

fn read_params(hf: &HfConfig, src: &str) -> Result<FamilyParams> {
    let nested = hf.rope_parameters.as_ref().and_then(|r| r.get("partial_rotary_factor")).and_then(|x| x.as_f64());
    if let Some(p) = hf.partial_rotary_factor.or(nested).filter(|&p| p != 1.0) {
        return Err(StudioError::config(
            src,
            format!("`partial_rotary_factor: {p}`: partial rotary embeddings are not supported (only 1.0)"),
        ));
    }
    let window = hf.window(src)?;
    Ok(FamilyParams {
        sliding_window: window,
        layer_types: match window {
            Some(_) => vec![LayerType::SlidingAttention; hf.num_hidden_layers],
            None => Vec::new(),
        },
        ..Default::default()
    })
}

fn write_params(c: &ModelConfig, obj: &mut serde_json::Map<String, serde_json::Value>) {
    let w = c.family_params.sliding_window;
    obj.insert("sliding_window".into(), w.map_or(serde_json::Value::Null, |w| w.into()));
}
