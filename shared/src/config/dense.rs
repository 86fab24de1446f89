//! Model configuration: serde mirror of Hugging Face `config.json` (llama,
//! qwen2, mistral) validated into one internal [`ModelConfig`].
//!
//! Source: the `LlamaConfig`, `Qwen2Config` and `MistralConfig` classes of
//! Hugging Face transformers (field names and defaults are theirs).

use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};

/// RoPE scaling variants supported by the model (transformers'
/// `rope_scaling` / `rope_parameters` field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// No scaling (`rope_type: "default"`).
    Default,
    /// Position interpolation: positions divided by `factor`.
    Linear {
        /// Scale factor (> 0).
        factor: f64,
    },
    /// Llama 3.1 frequency-dependent scaling (transformers
    /// `_compute_llama3_parameters`).
    Llama3 {
        /// Overall scale factor.
        factor: f64,
        /// Low-frequency factor (default 1).
        low_freq_factor: f64,
        /// High-frequency factor (default 4).
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// Per-frequency divisors of the inverse frequencies, `[head_dim / 2]`:
    /// `inv_freq[i] / factors[i]` (llama.cpp's `rope_freqs.weight` tensor,
    /// ggml `rope` with `freq_factors`). The GGUF reader gives this only when
    /// the factors are not those of a [`RopeScaling::Llama3`] setting
    /// ([`crate::config::rope::llama3_from_freq_factors`]); transformers has no
    /// equivalent, so a `config.json` holding it is read by the studio only.
    /// Phi-3's LongRoPE (`rope_type: "longrope"`, alias `"su"`):
    /// `inv_freq[i] = 1 / (ext[i] · theta^(2i/hd))` with `ext = short_factor`
    /// while every position is `< original_max_position_embeddings`, else
    /// `long_factor` (transformers' dynamic `longrope_frequency_update`,
    /// decided per forward call from its last position), and cos/sin scaled
    /// by `attention_factor` (default `sqrt(1 + ln(s) / ln(original))` with
    /// `s = max_position_embeddings / original`, 1 when `s <= 1`).
    #[serde(rename = "longrope")]
    LongRope {
        /// Per-frequency divisors for short contexts, `[head_dim / 2]`.
        short_factor: Vec<f64>,
        /// Per-frequency divisors for long contexts, `[head_dim / 2]`.
        long_factor: Vec<f64>,
        /// The pre-training context length.
        original_max_position_embeddings: usize,
        /// The cos/sin scale.
        attention_factor: f64,
    },
    #[serde(rename = "freq_factors")]
    FreqFactors {
        /// One divisor per frequency (> 0).
        factors: Vec<f64>,
    },
}

/// Architecture family of a dense decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama (and llama2.c checkpoints).
    Llama,
    /// Mistral (Llama with an optional sliding window; the window is ignored
    /// for sequences shorter than it).
    Mistral,
    /// Qwen2 (Llama with biases on q/k/v projections).
    Qwen2,
    /// Qwen3 (q/k RMSNorm per head, no q/k/v bias).
    Qwen3,
    /// Gemma 2 (GeGLU, sandwich `(1 + w)` norms, soft-caps, sliding window).
    Gemma2,
    /// Gemma 3 text (Gemma 2's blocks with q/k norm and two RoPE bases).
    Gemma3,
    /// Phi-3 (Llama's blocks, fused qkv / gate-up tensors, longrope).
    Phi3,
}

impl Architecture {
    /// The Hugging Face `model_type` string.
    pub fn model_type(self) -> &'static str {
        self.family().model_type
    }

    /// The family record ([`super::family`]: what its blocks do differently).
    pub fn family(self) -> &'static super::family::Family {
        super::family::of(self)
    }

    /// The Hugging Face model class (`architectures[0]` in `config.json`).
    pub fn hf_class(self) -> &'static str {
        self.family().hf_class
    }
}

/// The validated configuration of a dense decoder-only transformer.
///
/// Shapes follow the notation of `methods.md`: `d = hidden_size`,
/// `f = intermediate_size`, `V = vocab_size`, `L = num_layers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Architecture family.
    pub architecture: Architecture,
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Hidden size `d`.
    pub hidden_size: usize,
    /// FFN intermediate size `f`.
    pub intermediate_size: usize,
    /// Number of decoder layers `L`.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads (grouped-query attention); divides `num_heads`.
    pub num_kv_heads: usize,
    /// Dimension of one head (usually `d / num_heads`).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base `theta`.
    pub rope_theta: f64,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Longest supported context in tokens.
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the token-embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have a bias (Qwen2; `attention_bias`).
    pub attention_bias: bool,
    /// Beginning-of-sequence token id, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token id, if any.
    pub eos_token_id: Option<u32>,
    /// Values only some families have (soft-caps, sliding-window layers,
    /// a second RoPE base; [`super::family::FamilyParams`]).
    #[serde(default, skip_serializing_if = "super::family::FamilyParams::is_empty")]
    pub family_params: super::family::FamilyParams,
}

impl ModelConfig {
    /// Checks internal consistency.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `source_name` and the offending field.
    pub fn validate(&self, source_name: &str) -> Result<()> {
        let err = |what: String| Err(StudioError::config(source_name, what));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return err(format!("`{name}` must be > 0"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return err(format!(
                "`num_attention_heads` ({}) must be a multiple of `num_key_value_heads` ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return err(format!("`head_dim` ({}) must be even for RoPE", self.head_dim));
        }
        let lt = &self.family_params.layer_types;
        if !lt.is_empty() && lt.len() != self.num_layers {
            return err(format!("{} `layer_types` for {} layers", lt.len(), self.num_layers));
        }
        if let RopeScaling::LongRope { short_factor, long_factor, .. } = &self.rope_scaling {
            if short_factor.len() != self.head_dim / 2 || long_factor.len() != self.head_dim / 2 {
                return err(format!(
                    "longrope: {} short and {} long factors for head_dim {} (expected head_dim / 2 = {} each)",
                    short_factor.len(),
                    long_factor.len(),
                    self.head_dim,
                    self.head_dim / 2
                ));
            }
        }
        if let RopeScaling::FreqFactors { factors } = &self.rope_scaling {
            if factors.len() != self.head_dim / 2 {
                return err(format!(
                    "RoPE frequency factors: {} values for head_dim {} (expected head_dim / 2 = {})",
                    factors.len(),
                    self.head_dim,
                    self.head_dim / 2
                ));
            }
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 || self.rope_theta.is_nan() || self.rope_theta <= 0.0
        {
            return err("`rms_norm_eps` and `rope_theta` must be > 0".into());
        }
        Ok(())
    }

    /// Number of parameters of the dense model (embedding, attention, FFN,
    /// norms, LM head when untied).
    pub fn num_parameters(&self) -> usize {
        let d = self.hidden_size;
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let bias = if self.attention_bias { q + 2 * kv } else { 0 };
        let attn = d * q + 2 * d * kv + q * d + bias;
        let ffn = 3 * d * self.intermediate_size;
        let fam = self.architecture.family();
        let qk_norm = if fam.qk_norm { 2 * self.head_dim } else { 0 };
        let norms = if fam.sandwich_norms { 4 * d } else { 2 * d };
        let layer = attn + ffn + norms + qk_norm;
        let head = if self.tie_word_embeddings { 0 } else { self.vocab_size * d };
        self.vocab_size * d + self.num_layers * layer + d + head
    }
}

/// Serde mirror of a Hugging Face `config.json` for the supported dense
/// families. Unknown fields are ignored; missing required ones fail at load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HfConfig {
    /// `model_type`: "llama", "mistral" or "qwen2".
    pub model_type: String,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` (defaults to `num_attention_heads`).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// `head_dim` (defaults to `hidden_size / num_attention_heads`).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// `rms_norm_eps` (default 1e-6).
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    /// `rope_theta` (default 10000).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// `rope_scaling` (transformers < 5) as free-form JSON.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// `rope_parameters` (transformers >= 5) as free-form JSON.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// `max_position_embeddings` (default 2048).
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// `tie_word_embeddings` (default false).
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// `attention_bias` (llama; qwen2 always has q/k/v bias).
    #[serde(default)]
    pub attention_bias: Option<bool>,
    /// `hidden_act` (must be "silu").
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// `bos_token_id`.
    #[serde(default)]
    pub bos_token_id: Option<serde_json::Value>,
    /// `eos_token_id` (an int or a list; the first is used).
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// `torch_dtype` (transformers before v5), informational; written
    /// back under this name.
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// `dtype` (transformers v5's name for `torch_dtype`; a config may
    /// carry both, as transformers v5 reads them), informational: read
    /// only, [`HfConfig::torch_dtype`] is what is written.
    #[serde(default, skip_serializing)]
    pub dtype: Option<String>,
    /// `hidden_activation` (Gemma's name for the FFN activation).
    #[serde(default)]
    pub hidden_activation: Option<String>,
    /// `query_pre_attn_scalar` (Gemma).
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    /// `attn_logit_softcapping` (Gemma; absent = the family's default,
    /// `null` = none).
    #[serde(default, deserialize_with = "present")]
    pub attn_logit_softcapping: Option<serde_json::Value>,
    /// `final_logit_softcapping` (Gemma; absent / `null` as above).
    #[serde(default, deserialize_with = "present")]
    pub final_logit_softcapping: Option<serde_json::Value>,
    /// `sliding_window` (tokens; `null` = none).
    #[serde(default)]
    pub sliding_window: Option<serde_json::Value>,
    /// `layer_types` (`full_attention` / `sliding_attention` per layer).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// `sliding_window_pattern` (Gemma 3 before `layer_types`).
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    /// `_sliding_window_pattern` (the name some transformers versions save
    /// it under, possibly beside `sliding_window_pattern`, which wins);
    /// read only.
    #[serde(default, rename = "_sliding_window_pattern", skip_serializing)]
    pub sliding_window_pattern_private: Option<usize>,
    /// `rope_local_base_freq` (Gemma 3: RoPE base of the sliding layers).
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    /// `partial_rotary_factor` (Phi-3: must be 1).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// `original_max_position_embeddings` (Phi-3's LongRoPE, top level).
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
}

/// Keeps an explicit `null` as `Some(Value::Null)` (absent stays `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

impl HfConfig {
    /// A soft-cap value: absent → `default`, `null` → none, else a positive
    /// number.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `key` for anything else.
    pub fn softcap(
        &self,
        v: &Option<serde_json::Value>,
        default: Option<f64>,
        key: &str,
        src: &str,
    ) -> Result<Option<f64>> {
        match v {
            None => Ok(default),
            Some(serde_json::Value::Null) => Ok(None),
            Some(x) => match x.as_f64().filter(|c| c.is_finite() && *c > 0.0) {
                Some(c) => Ok(Some(c)),
                None => Err(StudioError::config(src, format!("`{key}` must be a positive number or null, found {x}"))),
            },
        }
    }

    /// `sliding_window`: `None` when absent or `null`.
    ///
    /// # Errors
    /// [`StudioError::Config`] when it is not a positive integer.
    pub fn window(&self, src: &str) -> Result<Option<usize>> {
        match &self.sliding_window {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(x) => match x.as_u64().filter(|&w| w > 0) {
                Some(w) => Ok(Some(w as usize)),
                None => {
                    Err(StudioError::config(src, format!("`sliding_window` must be a positive integer, found {x}")))
                }
            },
        }
    }
}

fn first_id(v: &Option<serde_json::Value>) -> Option<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| x as u32),
        Some(serde_json::Value::Array(a)) => a.first().and_then(|x| x.as_u64()).map(|x| x as u32),
        _ => None,
    }
}

fn parse_rope_scaling(v: &serde_json::Value, src: &str) -> Result<RopeScaling> {
    let ty = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
    let num = |k: &str, default: Option<f64>| -> Result<f64> {
        match v.get(k).and_then(|x| x.as_f64()).or(default) {
            Some(x) => Ok(x),
            None => Err(StudioError::config(src, format!("rope scaling `{ty}` needs `{k}`"))),
        }
    };
    match ty {
        "default" => Ok(RopeScaling::Default),
        "linear" => Ok(RopeScaling::Linear { factor: num("factor", None)? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor", None)?,
            low_freq_factor: num("low_freq_factor", Some(1.0))?,
            high_freq_factor: num("high_freq_factor", Some(4.0))?,
            original_max_position_embeddings: num("original_max_position_embeddings", Some(8192.0))? as usize,
        }),
        "longrope" | "su" => {
            let list = |k: &str| -> Result<Vec<f64>> {
                v.get(k)
                    .and_then(|f| f.as_array())
                    .and_then(|a| a.iter().map(|x| x.as_f64().filter(|x| x.is_finite() && *x > 0.0)).collect())
                    .ok_or_else(|| {
                        StudioError::config(src, format!("rope scaling `{ty}` needs `{k}`, a list of positive numbers"))
                    })
            };
            Ok(RopeScaling::LongRope {
                short_factor: list("short_factor")?,
                long_factor: list("long_factor")?,
                // Filled from the top-level keys by `to_model_config` when absent.
                original_max_position_embeddings: v
                    .get("original_max_position_embeddings")
                    .and_then(|x| x.as_u64())
                    .unwrap_or(0) as usize,
                attention_factor: v.get("attention_factor").and_then(|x| x.as_f64()).unwrap_or(0.0),
            })
        }
        "freq_factors" => {
            let factors = v
                .get("factors")
                .and_then(|f| f.as_array())
                .and_then(|a| {
                    a.iter().map(|x| x.as_f64().filter(|x| x.is_finite() && *x > 0.0)).collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| {
                    StudioError::config(src, "rope scaling `freq_factors` needs `factors`, a list of positive numbers")
                })?;
            Ok(RopeScaling::FreqFactors { factors })
        }
        other => Err(StudioError::config(
            src,
            format!(
                "unsupported rope scaling type `{other}` (supported: default, linear, llama3, longrope, freq_factors)"
            ),
        )),
    }
}

impl HfConfig {
    /// Parses `config.json` bytes.
    ///
    /// # Errors
    /// [`StudioError::Format`] naming `source_name` when the JSON is invalid
    /// or a required field is missing.
    pub fn from_json(bytes: &[u8], source_name: &str) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| StudioError::format(source_name, "config.json", e.to_string()))
    }

    /// Validates into a [`ModelConfig`].
    ///
    /// # Errors
    /// [`StudioError::Config`] for an unknown `model_type`, a non-SiLU
    /// activation, an unsupported RoPE scaling or inconsistent sizes.
    pub fn to_model_config(&self, source_name: &str) -> Result<ModelConfig> {
        let Some(family) = super::family::by_model_type(&self.model_type) else {
            return Err(StudioError::config(
                source_name,
                format!(
                    "unknown architecture `model_type: \"{}\"` (supported dense types: {}; MoE checkpoints: {})",
                    self.model_type,
                    super::family::supported_model_types(),
                    super::moe::MOE_MODEL_TYPES.join(", "),
                ),
            ));
        };
        let architecture = family.architecture;
        let want = family.activation;
        for (key, act) in [("hidden_activation", &self.hidden_activation), ("hidden_act", &self.hidden_act)] {
            let Some(act) = act else { continue };
            let ok = match want {
                super::family::GateActivation::Silu => act == "silu",
                super::family::GateActivation::GeluTanh => {
                    matches!(act.as_str(), "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" | "gelu_fast")
                }
            };
            if !ok {
                return Err(StudioError::config(
                    source_name,
                    format!(
                        "`{key}: \"{act}\"` is not supported for {} (its FFN needs \"{}\")",
                        family.model_type,
                        want.hf_name()
                    ),
                ));
            }
            if key == "hidden_activation" {
                break; // Gemma reads hidden_activation first; hidden_act is legacy.
            }
        }
        if self.num_attention_heads == 0 {
            return Err(StudioError::config(source_name, "`num_attention_heads` must be > 0"));
        }
        // transformers 5 nests Gemma 3's per-layer-type RoPE: the global
        // layers' parameters are `rope_parameters.full_attention`.
        let rope_parameters =
            self.rope_parameters.as_ref().map(|p| p.get("full_attention").filter(|f| f.is_object()).unwrap_or(p));
        let rope_theta = self
            .rope_theta
            .or_else(|| rope_parameters.and_then(|p| p.get("rope_theta")).and_then(|x| x.as_f64()))
            .unwrap_or(match family.architecture {
                Architecture::Gemma3 => 1_000_000.0,
                _ => 10000.0,
            });
        let scaling_json = self.rope_scaling.as_ref().or(rope_parameters);
        let mut rope_scaling = match scaling_json {
            Some(v) if !v.is_null() => parse_rope_scaling(v, source_name)?,
            _ => RopeScaling::Default,
        };
        let max_position_embeddings = self.max_position_embeddings.unwrap_or(2048);
        if let RopeScaling::LongRope { original_max_position_embeddings: orig, attention_factor, .. } =
            &mut rope_scaling
        {
            if *orig == 0 {
                *orig = self.original_max_position_embeddings.unwrap_or(max_position_embeddings);
            }
            if *attention_factor <= 0.0 {
                // transformers `_compute_longrope_parameters`.
                let s = max_position_embeddings as f64 / *orig as f64;
                *attention_factor = if s <= 1.0 { 1.0 } else { (1.0 + s.ln() / (*orig as f64).ln()).sqrt() };
            }
        }
        let cfg = ModelConfig {
            architecture,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads),
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            attention_bias: family.qkv_bias || self.attention_bias.unwrap_or(false),
            bos_token_id: first_id(&self.bos_token_id),
            eos_token_id: first_id(&self.eos_token_id),
            family_params: (family.read_params)(self, source_name)?,
        };
        cfg.validate(source_name)?;
        Ok(cfg)
    }

    /// Builds the `config.json` mirror of a [`ModelConfig`] (used when
    /// writing dense checkpoints).
    pub fn from_model_config(c: &ModelConfig) -> Self {
        let rope_scaling = match &c.rope_scaling {
            RopeScaling::Default => None,
            other => serde_json::to_value(other).ok(),
        };
        HfConfig {
            model_type: c.architecture.model_type().into(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_layers,
            num_attention_heads: c.num_heads,
            num_key_value_heads: Some(c.num_kv_heads),
            head_dim: Some(c.head_dim),
            rms_norm_eps: Some(c.rms_norm_eps),
            rope_theta: Some(c.rope_theta),
            rope_scaling,
            rope_parameters: None,
            max_position_embeddings: Some(c.max_position_embeddings),
            tie_word_embeddings: Some(c.tie_word_embeddings),
            attention_bias: Some(c.attention_bias),
            hidden_act: Some("silu".into()),
            bos_token_id: c.bos_token_id.map(|x| x.into()),
            eos_token_id: c.eos_token_id.map(|x| x.into()),
            torch_dtype: None,
            dtype: None,
            hidden_activation: None,
            query_pre_attn_scalar: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            sliding_window: None,
            layer_types: None,
            sliding_window_pattern: None,
            sliding_window_pattern_private: None,
            rope_local_base_freq: None,
            partial_rotary_factor: None,
            original_max_position_embeddings: match &c.rope_scaling {
                RopeScaling::LongRope { original_max_position_embeddings, .. } => {
                    Some(*original_max_position_embeddings)
                }
                _ => None,
            },
        }
    }
}

impl ModelConfig {
    /// The Hugging Face `config.json` of this dense model (the one builder
    /// every dense output uses): [`HfConfig::from_model_config`] with null
    /// fields left out, `architectures` = [`Architecture::hf_class`] and,
    /// when `dtype` is given, `torch_dtype` ([`crate::tensor_io::DType::torch_name`]).
    pub fn to_config_json(&self, dtype: Option<crate::tensor_io::DType>) -> serde_json::Value {
        let mut hf = HfConfig::from_model_config(self);
        hf.torch_dtype = dtype.map(|d| d.torch_name().to_string());
        let mut v = serde_json::to_value(hf).expect("config serialises");
        let obj = v.as_object_mut().expect("a struct serialises to an object");
        obj.retain(|_, x| !x.is_null());
        (self.architecture.family().write_params)(self, obj);
        obj.insert("architectures".into(), serde_json::json!([self.architecture.hf_class()]));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_config_reads() {
        let json = br#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":49152,
            "hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,"num_attention_heads":9,
            "num_key_value_heads":3,"rms_norm_eps":1e-5,"rope_theta":100000,"tie_word_embeddings":true,
            "hidden_act":"silu","max_position_embeddings":8192,"bos_token_id":1,"eos_token_id":2}"#;
        let c = HfConfig::from_json(json, "config.json").unwrap().to_model_config("config.json").unwrap();
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.num_kv_heads, 3);
        assert_eq!(c.rope_theta, 100000.0);
        // SmolLM2-135M has 134,515,008 parameters (tied embeddings).
        assert_eq!(c.num_parameters(), 134_515_008);
        // the config.json we write for it reads back to the same config
        let out = c.to_config_json(Some(crate::tensor_io::DType::BF16));
        assert_eq!(out["architectures"], serde_json::json!(["LlamaForCausalLM"]));
        assert_eq!(out["torch_dtype"], "bfloat16");
        assert!(out.as_object().unwrap().values().all(|v| !v.is_null()), "{out}");
        let bytes = serde_json::to_vec(&out).unwrap();
        assert_eq!(HfConfig::from_json(&bytes, "out").unwrap().to_model_config("out").unwrap(), c);
        assert!(c.to_config_json(None).get("torch_dtype").is_none());
        // transformers v5 writes `dtype`; a config may hold both names (transformers reads it).
        let both = String::from_utf8(json.to_vec())
            .unwrap()
            .replace(r#""eos_token_id":2}"#, r#""eos_token_id":2,"dtype":"bfloat16","torch_dtype":"bfloat16"}"#);
        assert_eq!(HfConfig::from_json(both.as_bytes(), "c").unwrap().to_model_config("c").unwrap(), c);
        let both = String::from_utf8(json.to_vec()).unwrap().replace(
            r#""eos_token_id":2}"#,
            r#""eos_token_id":2,"sliding_window_pattern":6,"_sliding_window_pattern":6}"#,
        );
        assert_eq!(HfConfig::from_json(both.as_bytes(), "c").unwrap().sliding_window_pattern, Some(6));
    }

    /// A zero count is refused by name; `max_position_embeddings: 0` loaded before and left
    /// every context empty (perplexity, `eval --task` and generation then had no window).
    #[test]
    fn a_zero_count_is_refused_by_name() {
        let base = serde_json::json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": 64, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32});
        let read = |v: &serde_json::Value| {
            HfConfig::from_json(v.to_string().as_bytes(), "m/config.json")?.to_model_config("m/config.json")
        };
        assert!(read(&base).is_ok());
        for field in ["vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings"] {
            let mut v = base.clone();
            v[field] = 0.into();
            let e = read(&v).unwrap_err().to_string();
            assert!(e.contains("m/config.json") && e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn unknown_architecture_is_named() {
        let json = br#"{"model_type":"gpt2","vocab_size":10,"hidden_size":8,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":2}"#;
        let e = HfConfig::from_json(json, "m/config.json").unwrap().to_model_config("m/config.json").unwrap_err();
        let s = e.to_string();
        assert!(s.contains("m/config.json") && s.contains("gpt2") && s.contains("llama"), "{s}");
    }

    #[test]
    fn llama3_rope_scaling_parses() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}"#,
        )
        .unwrap();
        assert_eq!(
            parse_rope_scaling(&v, "x").unwrap(),
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            }
        );
        let bad: serde_json::Value = serde_json::from_str(r#"{"rope_type":"yarn","factor":4.0}"#).unwrap();
        assert!(parse_rope_scaling(&bad, "x").unwrap_err().to_string().contains("yarn"));
    }
}
