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

mod gemma2;
mod gemma3;
mod llama;
mod mistral;
mod phi3;
mod qwen2;
mod qwen3;

use serde::{Deserialize, Serialize};

use super::{Architecture, HfConfig, ModelConfig};
use crate::error::{Result, StudioError};

/// The gate activation of the FFN (and of every expert of an MoE made from
/// it: the expert type follows the family).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateActivation {
    /// SwiGLU: `silu(gate(x)) * up(x)` (`hidden_act: "silu"`).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU:
    /// `gelu_tanh(gate(x)) * up(x)` (`hidden_activation: "gelu_pytorch_tanh"`;
    /// Gemma).
    GeluTanh,
}

impl GateActivation {
    /// The transformers activation name.
    pub fn hf_name(self) -> &'static str {
        match self {
            GateActivation::Silu => "silu",
            GateActivation::GeluTanh => "gelu_pytorch_tanh",
        }
    }
}

/// The attention kind of one layer (transformers' `layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Causal attention over every earlier position (`full_attention`).
    FullAttention,
    /// Causal attention over the last `sliding_window` positions, the
    /// query's own included (`sliding_attention`; transformers'
    /// `sliding_window_overlay`: key `j` is seen from query `i` iff
    /// `i - j < sliding_window`).
    SlidingAttention,
}

/// Configuration values only some families have (all `None` / empty for
/// Llama, Mistral, Qwen2, Qwen3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FamilyParams {
    /// `query_pre_attn_scalar`: attention scores are scaled by
    /// `query_pre_attn_scalar^-1/2` instead of `head_dim^-1/2` (Gemma).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_pre_attn_scalar: Option<f64>,
    /// `attn_logit_softcapping`: scores become `c * tanh(scores / c)`
    /// before the softmax (Gemma 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcapping: Option<f64>,
    /// `final_logit_softcapping`: logits become `c * tanh(logits / c)`
    /// (Gemma 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f64>,
    /// `sliding_window` (tokens) of the [`LayerType::SlidingAttention`] layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// One [`LayerType`] per layer (empty: every layer full attention).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_types: Vec<LayerType>,
    /// RoPE base of the sliding-window layers, which use unscaled RoPE
    /// (Gemma 3's `rope_local_base_freq`; `None`: every layer uses
    /// `rope_theta` and `rope_scaling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_theta: Option<f64>,
}

impl FamilyParams {
    /// Whether every value is unset (Llama-style models).
    pub fn is_empty(&self) -> bool {
        *self == FamilyParams::default()
    }

    /// The sliding window of layer `l`, `None` for a full-attention layer.
    pub fn window_of(&self, l: usize) -> Option<usize> {
        match self.layer_types.get(l) {
            Some(LayerType::SlidingAttention) => self.sliding_window,
            _ => None,
        }
    }
}

/// What one dense family does differently from the Llama blocks.
#[derive(Debug, Clone, Copy)]
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
    /// The FFN gate activation.
    pub activation: GateActivation,
    /// RMSNorm weights are stored as `w` and applied as `1 + w` (Gemma's
    /// `Gemma2RMSNorm`: `x / rms(x) * (1 + w)`); the model holds `1 + w`.
    pub norm_plus_one: bool,
    /// Token embeddings are multiplied by `sqrt(hidden_size)` (Gemma).
    pub embed_scale: bool,
    /// Norms after attention and after the FFN as well as before
    /// (`post_attention_layernorm` on the attention output,
    /// `pre_feedforward_layernorm` before the FFN, `post_feedforward_layernorm`
    /// on its output; Gemma 2/3).
    pub sandwich_norms: bool,
    /// q/k/v and gate/up are stored fused (`self_attn.qkv_proj`,
    /// `mlp.gate_up_proj`; Phi-3): split on read, fused on write
    /// ([`crate::checkpoint::fused`]).
    pub fused_projections: bool,
    /// Reads the family's own `config.json` values.
    pub read_params: fn(&HfConfig, &str) -> Result<FamilyParams>,
    /// Writes them back into a `config.json` object.
    pub write_params: fn(&ModelConfig, &mut serde_json::Map<String, serde_json::Value>),
    /// llama.cpp block-tensor modules whose Hugging Face name differs from
    /// the Llama mapping ([`crate::checkpoint::gguf::hf_name`]), as
    /// `(GGUF module, HF module)`: Gemma's `ffn_norm` is
    /// `pre_feedforward_layernorm`, Phi-3's `attn_qkv` is `self_attn.qkv_proj`
    /// (gguf-py `constants.py` `MODEL_TENSORS`, `tensor_mapping.py`).
    pub gguf_block_names: &'static [(&'static str, &'static str)],
}

impl Family {
    /// Why a Llama-style block (pre-norm, SwiGLU, plain RMSNorm, no q/k norm,
    /// full causal attention) cannot hold this family, or `None` when it can:
    /// what layouts and writers built on Llama's blocks check.
    pub fn not_llama_blocks(&self) -> Option<String> {
        let mut what = Vec::new();
        if self.qk_norm {
            what.push("RMS-normalises every q and k head (q_norm/k_norm)");
        }
        if self.activation != GateActivation::Silu {
            what.push("has a GeGLU (gelu tanh) FFN");
        }
        if self.norm_plus_one || self.sandwich_norms {
            what.push("has (1 + w) RMSNorms before and after attention and FFN");
        }
        if self.fused_projections {
            what.push("stores fused qkv_proj / gate_up_proj tensors");
        }
        if self.embed_scale {
            what.push("scales embeddings by sqrt(d)");
        }
        (!what.is_empty()).then(|| format!("the base is {}, which {}", self.model_type, what.join(", ")))
    }
}

/// [`Family::read_params`] of the Llama-style families: nothing of their own.
pub(crate) fn no_params(_: &HfConfig, _: &str) -> Result<FamilyParams> {
    Ok(FamilyParams::default())
}

/// [`Family::write_params`] of the Llama-style families.
pub(crate) fn write_no_params(_: &ModelConfig, _: &mut serde_json::Map<String, serde_json::Value>) {}

/// Gemma's llama.cpp block names: the sandwich norms (`post_attention_norm`,
/// `ffn_norm` before the FFN, `post_ffw_norm`).
pub(crate) const GEMMA_GGUF_NAMES: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

/// Gemma's `layer_types`: the given list (checked against the layer count
/// and the known names), else every `pattern`-th layer full and the others
/// sliding (`sliding_window_pattern`; Gemma 2: 2, Gemma 3: 6).
pub(crate) fn layer_types(hf: &HfConfig, pattern: usize, src: &str) -> Result<Vec<LayerType>> {
    let n = hf.num_hidden_layers;
    match &hf.layer_types {
        Some(v) => {
            if v.len() != n {
                return Err(StudioError::config(
                    src,
                    format!("`layer_types` has {} entries for {n} layers (`num_hidden_layers`)", v.len()),
                ));
            }
            v.iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(LayerType::FullAttention),
                    "sliding_attention" => Ok(LayerType::SlidingAttention),
                    other => Err(StudioError::config(
                        src,
                        format!("`layer_types` entry `{other}` (supported: full_attention, sliding_attention)"),
                    )),
                })
                .collect()
        }
        None => {
            let p = hf.sliding_window_pattern.or(hf.sliding_window_pattern_private).unwrap_or(pattern).max(1);
            Ok((0..n)
                .map(|l| if (l + 1) % p == 0 { LayerType::FullAttention } else { LayerType::SlidingAttention })
                .collect())
        }
    }
}

/// Writes the Gemma keys shared by Gemma 2 and 3.
pub(crate) fn write_gemma_params(c: &ModelConfig, obj: &mut serde_json::Map<String, serde_json::Value>) {
    let p = &c.family_params;
    obj.remove("hidden_act");
    obj.insert("hidden_activation".into(), c.architecture.family().activation.hf_name().into());
    let opt = |x: Option<f64>| x.map_or(serde_json::Value::Null, |x| x.into());
    obj.insert("query_pre_attn_scalar".into(), opt(p.query_pre_attn_scalar));
    obj.insert("attn_logit_softcapping".into(), opt(p.attn_logit_softcapping));
    obj.insert("final_logit_softcapping".into(), opt(p.final_logit_softcapping));
    obj.insert("sliding_window".into(), p.sliding_window.map_or(serde_json::Value::Null, |x| x.into()));
    obj.insert("layer_types".into(), serde_json::to_value(&p.layer_types).expect("layer types serialise"));
}

/// Every supported dense family, one line each.
pub const FAMILIES: &[&Family] = &[
    &llama::FAMILY,
    &mistral::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &gemma2::FAMILY,
    &gemma3::FAMILY,
    &phi3::FAMILY,
];

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
            assert_eq!(of(f.architecture).model_type, f.model_type);
            assert_eq!(by_model_type(f.model_type).map(|g| g.architecture), Some(f.architecture));
            assert!(FAMILIES[..i].iter().all(|g| g.architecture != f.architecture && g.model_type != f.model_type));
        }
        assert_eq!(by_gguf_arch("qwen3").map(|f| f.architecture), Some(Architecture::Qwen3));
        assert!(by_model_type("gpt2").is_none());
        assert!(supported_model_types().contains("qwen3"));
    }
}
