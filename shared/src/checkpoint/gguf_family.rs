//! The keys and tensors of a llama.cpp GGUF that only some families carry
//! (soft-caps, sliding windows and their layer pattern, a second RoPE base,
//! LongRoPE factors), read as llama.cpp's `llama-model.cpp` reads them
//! (`LLM_ARCH_GEMMA2`, `LLM_ARCH_GEMMA3`, `LLM_ARCH_PHI3`). The families
//! themselves ([`crate::config::family`]) describe only `config.json`; the
//! GGUF reading lives here, beside the container it reads.

use super::gguf::GgufModel;
use crate::config::family::{FamilyParams, LayerType};
use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::error::{Result, StudioError};

/// Completes the configuration read from the common GGUF keys
/// ([`GgufModel::model_config`]) with the family's own keys and tensors.
///
/// # Errors
/// [`StudioError::Config`] naming the file for a missing required or
/// mistyped key, a layer pattern of the wrong length, or LongRoPE factors
/// that come alone or beside another RoPE scaling.
pub(crate) fn read_family_params(g: &GgufModel, c: &mut ModelConfig) -> Result<()> {
    match c.architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 | Architecture::Qwen3 => Ok(()),
        Architecture::Gemma2 => read_gemma2(g, c),
        Architecture::Gemma3 => read_gemma3(g, c),
        Architecture::Phi3 => read_phi3(g, c),
    }
}

/// llama.cpp: every other layer sliding (`set_swa_pattern(2)`), the window
/// required, soft-caps default 50 / 30, 46 layers = the 27B model.
fn read_gemma2(g: &GgufModel, c: &mut ModelConfig) -> Result<()> {
    read_gemma(g, c, 2, true, (Some(50.0), Some(30.0)), 46)
}

/// llama.cpp: five sliding layers to one global (`set_swa_pattern(6)`), no
/// attention soft-cap, a final soft-cap only when the file has one, 62
/// layers = the 27B model; the sliding layers' RoPE base.
fn read_gemma3(g: &GgufModel, c: &mut ModelConfig) -> Result<()> {
    read_gemma(g, c, 6, false, (None, None), 62)?;
    c.family_params.attn_logit_softcapping = None;
    c.family_params.rope_local_theta = Some(g.meta_f64("rope.freq_base_swa")?.unwrap_or(10000.0));
    Ok(())
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
fn read_phi3(g: &GgufModel, c: &mut ModelConfig) -> Result<()> {
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

/// The Gemma 2/3 values a llama.cpp GGUF carries, or that llama.cpp
/// derives (`llama-model.cpp`, `LLM_ARCH_GEMMA2` / `LLM_ARCH_GEMMA3`):
/// `{arch}.attention.sliding_window` (the window; required when
/// `window_required`), the layer pattern `{arch}.attention.sliding_window_pattern`
/// (a period `p`: layer `l` slides unless `(l + 1) % p == 0`, or one bool per
/// layer, `true` = sliding) defaulting to `pattern` (llama.cpp's
/// `set_swa_pattern`), `{arch}.attn_logit_softcapping` /
/// `{arch}.final_logit_softcapping` (defaults `softcaps`), and
/// `query_pre_attn_scalar`, which GGUF does not store: `head_dim`, or
/// `hidden_size / heads` for the 27B models (`big_layers` layers), as
/// llama.cpp sets `f_attention_scale`.
///
/// # Errors
/// [`StudioError::Config`] naming the file for a missing required or
/// mistyped key, or a pattern array of the wrong length.
fn read_gemma(
    g: &GgufModel,
    c: &mut ModelConfig,
    pattern: usize,
    window_required: bool,
    softcaps: (Option<f64>, Option<f64>),
    big_layers: usize,
) -> Result<()> {
    let src = g.file.file_name().to_string();
    let window = g.meta_usize("attention.sliding_window", window_required)?.filter(|&w| w > 0);
    let key = g.meta_key("attention.sliding_window_pattern");
    let n = c.num_layers;
    let by_period = |p: usize| -> Vec<LayerType> {
        (0..n)
            .map(|l| if (l + 1) % p.max(1) == 0 { LayerType::FullAttention } else { LayerType::SlidingAttention })
            .collect()
    };
    let layer_types = match (window, g.file.get(&key)) {
        (None, _) => Vec::new(),
        (Some(_), None) => by_period(pattern),
        (Some(_), Some(v)) => match (v.as_u64(), v.as_array()) {
            (Some(p), _) => by_period(p as usize),
            (None, Some(a)) if a.len() == n => a
                .iter()
                .map(|b| match b.as_bool() {
                    Some(true) => Ok(LayerType::SlidingAttention),
                    Some(false) => Ok(LayerType::FullAttention),
                    None => Err(StudioError::config(&src, format!("GGUF metadata `{key}` must hold bools"))),
                })
                .collect::<Result<_>>()?,
            _ => {
                return Err(StudioError::config(
                    &src,
                    format!("GGUF metadata `{key}` must be a period or one bool per layer ({n}), found {v:?}"),
                ))
            }
        },
    };
    let cap =
        |k: &str, default: Option<f64>| -> Result<Option<f64>> { Ok(g.meta_f64(k)?.or(default).filter(|&x| x > 0.0)) };
    let q = if n == big_layers { c.hidden_size / c.num_heads } else { c.head_dim };
    c.family_params = FamilyParams {
        query_pre_attn_scalar: Some(q as f64),
        attn_logit_softcapping: cap("attn_logit_softcapping", softcaps.0)?,
        final_logit_softcapping: cap("final_logit_softcapping", softcaps.1)?,
        sliding_window: window,
        layer_types,
        rope_local_theta: None,
    };
    Ok(())
}
