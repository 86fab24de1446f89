//! Mistral: Llama with an optional sliding window (ignored for sequences
//! shorter than it). llama.cpp converts Mistral to `llama`, so its GGUF files
//! read as llama. Source: transformers `modeling_mistral.py`.

use super::{no_params, write_no_params, Family, GateActivation};
use crate::config::Architecture;

/// The Mistral family.
pub const FAMILY: Family = Family {
    architecture: Architecture::Mistral,
    model_type: "mistral",
    hf_class: "MistralForCausalLM",
    gguf_arch: None,
    qkv_bias: false,
    qk_norm: false,
    gguf_permuted_qk: true,
    activation: GateActivation::Silu,
    norm_plus_one: false,
    embed_scale: false,
    fused_projections: false,
    sandwich_norms: false,
    read_params: no_params,
    write_params: write_no_params,
    gguf_block_names: &[],
};
