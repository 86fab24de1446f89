//! Model families: one file per family where it differs (the candle habit),
//! one registry line each ([`FAMILIES`]).
//!
//! A [`Family`] says what the shared blocks (RMSNorm, RoPE, GQA attention,
//! gated FFN; `crate::model`) do differently for it: its Hugging Face
//! `model_type` and class, its llama.cpp GGUF architecture, whether q/k/v
//! always carry a bias, whether each query/key head is RMS-normalised, and
//! whether llama.cpp's converter permuted q/k rows to the interleaved RoPE
//! order. `config.json`, GGUF and the export layouts all look the family up
//! here, so a new family is its own file plus one line below; anything else
//! is refused with the list of [`supported_model_types`].

mod llama;
mod mistral;
mod qwen2;
mod qwen3;

use super::Architecture;

/// What one dense family does differently from the Llama blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// The studio's identifier.
    pub architecture: Architecture,
    /// Hugging Face `model_type` in `config.json`.
    pub model_type: &'static str,
    /// Hugging Face model class (`architectures[0]`).
    pub hf_class: &'static str,
    /// llama.cpp `general.architecture` of its GGUF files, if llama.cpp
    /// defines one the studio reads.
    pub gguf_arch: Option<&'static str>,
    /// q/k/v projections always have a bias (Qwen2), whatever
    /// `attention_bias` says.
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normalised over `head_dim` before RoPE
    /// (`self_attn.q_norm.weight`, `self_attn.k_norm.weight`, `[head_dim]`;
    /// Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// llama.cpp's `convert_hf_to_gguf.py` permutes q/k rows to the
    /// interleaved RoPE order for this family (`LlamaModel.permute`), so the
    /// GGUF reader un-permutes them.
    pub gguf_permuted_qk: bool,
}

/// Every supported dense family, one line each.
pub const FAMILIES: &[&Family] = &[&llama::FAMILY, &mistral::FAMILY, &qwen2::FAMILY, &qwen3::FAMILY];

/// The family of a Hugging Face `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.model_type == model_type)
}

/// The family of a llama.cpp GGUF `general.architecture`.
pub fn by_gguf_arch(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.gguf_arch == Some(arch))
}

/// The family record of `a`.
pub fn of(a: Architecture) -> &'static Family {
    FAMILIES.iter().copied().find(|f| f.architecture == a).expect("every Architecture has a FAMILIES line")
}

/// `"llama, mistral, qwen2, ..."`: the `model_type`s the studio reads.
pub fn supported_model_types() -> String {
    FAMILIES.iter().map(|f| f.model_type).collect::<Vec<_>>().join(", ")
}

/// `"llama, qwen2, ..."`: the GGUF architectures the studio reads.
pub fn supported_gguf_archs() -> String {
    FAMILIES.iter().filter_map(|f| f.gguf_arch).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_consistent() {
        for (i, f) in FAMILIES.iter().enumerate() {
            assert_eq!(of(f.architecture), *f);
            assert_eq!(by_model_type(f.model_type), Some(*f));
            assert!(FAMILIES[..i].iter().all(|g| g.architecture != f.architecture && g.model_type != f.model_type));
        }
        assert_eq!(by_gguf_arch("qwen3").map(|f| f.architecture), Some(Architecture::Qwen3));
        assert!(by_model_type("gpt2").is_none());
        assert!(supported_model_types().contains("qwen3"));
    }
}
