//! Qwen3: no q/k/v bias (unless `attention_bias`), each query and key head
//! RMS-normalised over `head_dim` before RoPE (`self_attn.{q,k}_norm.weight
//! [head_dim]`, eps `rms_norm_eps`), `head_dim` independent of `hidden_size /
//! heads`; llama.cpp `qwen3` (`blk.N.attn_{q,k}_norm.weight`, no q/k
//! permutation). Source: transformers `modeling_qwen3.py` (`Qwen3Attention`),
//! llama.cpp `src/models/qwen3.cpp`.

use super::{no_params, write_no_params, Family, GateActivation};
use crate::config::Architecture;

/// The Qwen3 family.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen3,
    model_type: "qwen3",
    hf_class: "Qwen3ForCausalLM",
    gguf_arch: Some("qwen3"),
    qkv_bias: false,
    qk_norm: true,
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
