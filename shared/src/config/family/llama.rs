//! Llama (and llama2.c checkpoints); llama.cpp `llama` (q/k rows permuted by
//! its converter). Source: transformers `modeling_llama.py`.

use super::{no_params, write_no_params, Family, GateActivation};
use crate::config::Architecture;

/// The Llama family.
pub const FAMILY: Family = Family {
    architecture: Architecture::Llama,
    model_type: "llama",
    hf_class: "LlamaForCausalLM",
    gguf_arch: Some("llama"),
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
