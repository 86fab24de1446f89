//! Qwen2: Llama with biases on the q/k/v projections; llama.cpp `qwen2` (no q/k
//! permutation). Source: transformers `modeling_qwen2.py`.

use super::{no_params, write_no_params, Family, GateActivation};
use crate::config::Architecture;

/// The Qwen2 family.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen2,
    model_type: "qwen2",
    hf_class: "Qwen2ForCausalLM",
    gguf_arch: Some("qwen2"),
    qkv_bias: true,
    qk_norm: false,
    gguf_permuted_qk: false,
    activation: GateActivation::Silu,
    norm_plus_one: false,
    embed_scale: false,
    fused_projections: false,
    sandwich_norms: false,
    read_params: no_params,
    write_params: write_no_params,
    gguf_block_names: &[],
};
