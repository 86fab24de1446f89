//! Gemma 3 text (`gemma3_text`, `Gemma3ForCausalLM`; also the text part
//! named `gemma3`): Gemma 2's blocks (GeGLU, `(1 + w)` sandwich RMSNorms,
//! `sqrt(d)` embedding scale, `query_pre_attn_scalar`) without soft-capping
//! by default, plus a `(1 + w)` RMSNorm over each q and k head before RoPE,
//! five sliding-window layers to one global (`layer_types`, else layer `l`
//! global iff `(l + 1) % sliding_window_pattern == 0`, pattern 6) and two
//! RoPE bases: `rope_theta` (default 1e6, with `rope_scaling`) on global
//! layers, `rope_local_base_freq` (default 1e4, unscaled) on sliding ones
//! (transformers 5: `rope_parameters.{full_attention, sliding_attention}`).
//! llama.cpp `gemma3` (`convert_hf_to_gguf.py` `Gemma3Model`: every
//! `*norm.weight`, q/k norms included, stored as `1 + w` and read back as
//! `w`; `rope.freq_base` and `rope.scaling.*` for the global layers, the
//! local base `rope.freq_base_swa` else 10000 as llama.cpp hard-codes it;
//! `query_pre_attn_scalar` derived, [`super::read_gemma_gguf`]).
//! Source: Gemma Team, "Gemma 3 Technical Report" (2025) §2; transformers
//! `modeling_gemma3.py` / `configuration_gemma3.py` (defaults are theirs);
//! llama.cpp `src/llama-model.cpp` (`LLM_ARCH_GEMMA3`).

use super::{layer_types, write_gemma_params, Family, FamilyParams, GateActivation, GEMMA_GGUF_NAMES};
use crate::config::{Architecture, HfConfig, ModelConfig};
use crate::error::Result;

/// The Gemma 3 (text) family.
pub const FAMILY: Family = Family {
    architecture: Architecture::Gemma3,
    model_type: "gemma3_text",
    hf_class: "Gemma3ForCausalLM",
    gguf_arch: Some("gemma3"),
    qkv_bias: false,
    qk_norm: true,
    gguf_permuted_qk: false,
    activation: GateActivation::GeluTanh,
    norm_plus_one: true,
    embed_scale: true,
    fused_projections: false,
    sandwich_norms: true,
    read_params,
    write_params,
    gguf_block_names: GEMMA_GGUF_NAMES,
};

fn read_params(hf: &HfConfig, src: &str) -> Result<FamilyParams> {
    let nested_local = hf
        .rope_parameters
        .as_ref()
        .and_then(|p| p.get("sliding_attention"))
        .and_then(|p| p.get("rope_theta"))
        .and_then(|x| x.as_f64());
    Ok(FamilyParams {
        query_pre_attn_scalar: Some(hf.query_pre_attn_scalar.unwrap_or(256.0)),
        attn_logit_softcapping: hf.softcap(&hf.attn_logit_softcapping, None, "attn_logit_softcapping", src)?,
        final_logit_softcapping: hf.softcap(&hf.final_logit_softcapping, None, "final_logit_softcapping", src)?,
        sliding_window: Some(hf.window(src)?.unwrap_or(4096)),
        layer_types: layer_types(hf, 6, src)?,
        rope_local_theta: Some(hf.rope_local_base_freq.or(nested_local).unwrap_or(10000.0)),
    })
}

fn write_params(c: &ModelConfig, obj: &mut serde_json::Map<String, serde_json::Value>) {
    write_gemma_params(c, obj);
    if let Some(t) = c.family_params.rope_local_theta {
        obj.insert("rope_local_base_freq".into(), t.into());
    }
}
