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
use crate::checkpoint::gguf::GgufModel;
use crate::config::{Architecture, HfConfig, ModelConfig, RopeScaling};
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
    read_gguf,
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

/// The window (one for every layer, as `config.json` gives it; llama.cpp
/// itself currently ignores Phi-3's window) and LongRoPE of a llama.cpp
/// `phi3` file.
///
/// # Errors
/// [`StudioError::Config`] naming the file when only one of the two factor
/// tensors is there, the original context length is missing, or another
/// RoPE scaling is given as well; [`StudioError::Tensor`] for factors of the
/// wrong length or not positive.
fn read_gguf(g: &GgufModel, c: &mut ModelConfig) -> Result<()> {
    let src = g.file.file_name().to_string();
    let window = g.meta_usize("attention.sliding_window", false)?.filter(|&w| w > 0);
    c.family_params = FamilyParams {
        sliding_window: window,
        layer_types: match window {
            Some(_) => vec![LayerType::SlidingAttention; c.num_layers],
            None => Vec::new(),
        },
        ..Default::default()
    };
    let half = c.head_dim / 2;
    let long = g.positive_factors("rope_factors_long.weight", half)?;
    let short = g.positive_factors("rope_factors_short.weight", half)?;
    let (short_factor, long_factor) = match (short, long) {
        (None, None) => return Ok(()),
        (Some(s), Some(l)) => (s, l),
        _ => {
            return Err(StudioError::config(
                &src,
                "LongRoPE needs both `rope_factors_short.weight` and `rope_factors_long.weight`; the file has one",
            ))
        }
    };
    if c.rope_scaling != RopeScaling::Default {
        return Err(StudioError::config(
            &src,
            format!(
                "the file has `{}` and LongRoPE factor tensors: two RoPE scalings at once are not supported",
                g.meta_key("rope.scaling.type")
            ),
        ));
    }
    let orig = g.meta_usize("rope.scaling.original_context_length", true)?.unwrap_or(0).max(1);
    let s = c.max_position_embeddings as f64 / orig as f64;
    let default = if s <= 1.0 { 1.0 } else { (1.0 + s.ln() / (orig as f64).ln()).sqrt() };
    c.rope_scaling = RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: orig,
        attention_factor: g.meta_f64("rope.scaling.attn_factor")?.unwrap_or(default),
    };
    Ok(())
}
