//! Gemma 2 (`gemma2`, `Gemma2ForCausalLM`): GeGLU FFN (gelu tanh), `(1 + w)`
//! RMSNorms before and after attention and FFN, embeddings scaled by
//! `sqrt(d)`, attention scores scaled by `query_pre_attn_scalar^-1/2` and
//! soft-capped (`attn_logit_softcapping`, default 50), final logits
//! soft-capped (`final_logit_softcapping`, default 30), sliding-window
//! attention on every other layer (`layer_types`, else layer `l` sliding
//! unless `(l + 1) % 2 == 0`; `sliding_window` default 4096), one RoPE base.
//! llama.cpp `gemma2` (`convert_hf_to_gguf.py` `Gemma2Model`: norms stored
//! as `1 + w`, read back as `w`; `gemma2.attention.sliding_window`,
//! `gemma2.{attn,final}_logit_softcapping`; `query_pre_attn_scalar` not
//! stored, derived as llama.cpp does, [`super::read_gemma_gguf`]).
//! Source: Gemma Team, "Gemma 2" (2024) §2; transformers
//! `modeling_gemma2.py` / `configuration_gemma2.py` (defaults are theirs);
//! llama.cpp `src/llama-model.cpp` (`LLM_ARCH_GEMMA2`).

use super::{layer_types, write_gemma_params, Family, FamilyParams, GateActivation, GEMMA_GGUF_NAMES};
use crate::config::{Architecture, HfConfig};
use crate::error::Result;

/// The Gemma 2 family.
pub const FAMILY: Family = Family {
    architecture: Architecture::Gemma2,
    model_type: "gemma2",
    hf_class: "Gemma2ForCausalLM",
    gguf_arch: Some("gemma2"),
    qkv_bias: false,
    qk_norm: false,
    gguf_permuted_qk: false,
    activation: GateActivation::GeluTanh,
    norm_plus_one: true,
    embed_scale: true,
    fused_projections: false,
    sandwich_norms: true,
    read_params,
    write_params: write_gemma_params,
    gguf_block_names: GEMMA_GGUF_NAMES,
};

fn read_params(hf: &HfConfig, src: &str) -> Result<FamilyParams> {
    Ok(FamilyParams {
        query_pre_attn_scalar: Some(hf.query_pre_attn_scalar.unwrap_or(256.0)),
        attn_logit_softcapping: hf.softcap(&hf.attn_logit_softcapping, Some(50.0), "attn_logit_softcapping", src)?,
        final_logit_softcapping: hf.softcap(&hf.final_logit_softcapping, Some(30.0), "final_logit_softcapping", src)?,
        sliding_window: Some(hf.window(src)?.unwrap_or(4096)),
        layer_types: layer_types(hf, 2, src)?,
        rope_local_theta: None,
    })
}
