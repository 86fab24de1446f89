//! MoE layout: which layers are MoE, with how many experts, top-k, frozen
//! experts, router bias and temperature — and its two on-disk forms.
//!
//! **Mixtral layout** (written whenever every layer is MoE with the same
//! expert count and top-k, routers have no bias and the base is llama or
//! mistral): `config.json` with `model_type: "mixtral"`,
//! `num_local_experts`, `num_experts_per_tok`, `router_aux_loss_coef`;
//! tensors `model.layers.{l}.block_sparse_moe.gate.weight [E, d]` and
//! `model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w3}.weight [f, d]`,
//! `.w2.weight [d, f]` (transformers `MixtralForCausalLM`). A router
//! temperature `T` is folded into the gate weight (`W / T`), which is exact.
//!
//! **Studio layout** (anything else): the same tensor names for MoE layers,
//! `model.layers.{l}.block_sparse_moe.gate.bias [E]` when the router has a
//! bias, `model.layers.{l}.mlp.*` for layers that stay dense, and
//! `config.json` with `model_type: "moe_studio"`, `base_model_type` and
//! `moe_layers` (one entry per layer: `null` for dense, else
//! `{num_experts, top_k, frozen, router_bias, temperature}`).
//!
//! Both forms also carry a `moe_studio` object with the studio-only facts
//! (frozen experts per layer), which transformers ignores.
//!
//! Sources: Jiang et al., "Mixtral of Experts" (2024) and transformers'
//! `MixtralConfig`; methods.md "Checkpoint formats".

use serde::{Deserialize, Serialize};

use super::{Architecture, HfConfig, ModelConfig};
use crate::error::{Result, StudioError};

/// One MoE layer's routing and experts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeLayerSpec {
    /// Number of experts `E_l` (>= 1).
    pub num_experts: usize,
    /// Experts per token `k` (1..=E_l).
    pub top_k: usize,
    /// Experts kept frozen in training (DeltaMoE: `[0]`, the original FFN).
    #[serde(default)]
    pub frozen: Vec<usize>,
    /// Whether the router has a bias `b_r` (DUME's ridge router does).
    #[serde(default)]
    pub router_bias: bool,
    /// Router temperature `T` (logits are divided by it before top-k).
    #[serde(default = "one")]
    pub temperature: f64,
    /// Intermediate width of each routed expert (Qwen2-MoE / DeepSeek
    /// `moe_intermediate_size`); `None` = the dense `intermediate_size`.
    /// Granular upcycling makes it `f / G` (methods.md "Granular
    /// upcycling").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_intermediate_size: Option<usize>,
    /// Always-active shared experts beside the routed ones, each a SwiGLU FFN
    /// of the dense width (DeepSeekMoE §3.2; Qwen1.5/2-MoE). Their outputs
    /// are added to the routed output of every token.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_experts: usize,
    /// Whether shared expert `i`'s output is scaled by `sigmoid(g_i · x)`
    /// (Qwen2-MoE's `shared_expert_gate`, one row per shared expert), else
    /// added as it is (DeepSeekMoE).
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared_expert_gate: bool,
    /// Shared experts (and their gate) stay frozen in training.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared_frozen: bool,
    /// Renormalise the chosen experts' weights over the top-k (softmax of
    /// the k chosen logits; Mixtral, Qwen2-MoE `norm_topk_prob: true`), or
    /// weigh each chosen expert by its softmax over ALL experts (`false`:
    /// Switch Transformers §2.1, Qwen2-MoE `norm_topk_prob: false`).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub norm_topk_prob: bool,
    /// Whether the router carries an aux-loss-free selection bias `[E]`
    /// (DeepSeek-V3 §2.1.2 `e_score_correction_bias`): added to the logits
    /// to choose the top-k only, never to the weights.
    #[serde(default, skip_serializing_if = "is_false")]
    pub selection_bias: bool,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

fn is_false(x: &bool) -> bool {
    !*x
}

fn is_true(x: &bool) -> bool {
    *x
}

/// The layouts that can hold shared experts (named in refusals).
pub const SHARED_EXPERT_LAYOUTS: &str =
    "qwen2_moe (one sigmoid-gated shared expert), deepseek_moe (ungated shared experts) or studio (any)";

impl Default for MoeLayerSpec {
    /// One expert, top-1, nothing frozen, no router bias, `T = 1`, experts
    /// of the dense width, no shared experts, renormalised top-k, no
    /// selection bias. Callers set at least `num_experts` and `top_k`.
    fn default() -> Self {
        MoeLayerSpec {
            num_experts: 1,
            top_k: 1,
            frozen: Vec::new(),
            router_bias: false,
            temperature: 1.0,
            expert_intermediate_size: None,
            shared_experts: 0,
            shared_expert_gate: false,
            shared_frozen: false,
            norm_topk_prob: true,
            selection_bias: false,
        }
    }
}

impl MoeLayerSpec {
    /// Intermediate width of this layer's routed experts on `base`.
    pub fn expert_width(&self, base: &ModelConfig) -> usize {
        self.expert_intermediate_size.unwrap_or(base.intermediate_size)
    }

    /// Parameters of this MoE layer's FFN block (routed experts, router,
    /// router bias, shared experts and their gate), in `u64` so that the
    /// browser (32-bit `usize`) counts large models too. The selection
    /// bias is a buffer, not a parameter.
    pub fn block_parameters(&self, base: &ModelConfig) -> u64 {
        let u = |x: usize| x as u64;
        let d = u(base.hidden_size);
        let (e, n) = (u(self.num_experts), u(self.shared_experts));
        e * 3 * d * u(self.expert_width(base))
            + e * d
            + if self.router_bias { e } else { 0 }
            + n * 3 * d * u(base.intermediate_size)
            + if self.shared_expert_gate { n * d } else { 0 }
    }

    /// Parameters of this block that one token does not use: the
    /// `E - k` routed experts top-k routing leaves out.
    pub fn idle_parameters(&self, base: &ModelConfig) -> u64 {
        let idle = self.num_experts.saturating_sub(self.top_k) as u64;
        idle * 3 * base.hidden_size as u64 * self.expert_width(base) as u64
    }
}

/// The MoE layout of a model: one entry per decoder layer, `None` for a
/// layer whose FFN stays dense.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// Per-layer MoE spec (`None` = dense FFN).
    pub layers: Vec<Option<MoeLayerSpec>>,
    /// Load-balancing loss coefficient `alpha` (methods.md: 0.01).
    pub router_aux_loss_coef: f64,
}

impl MoeConfig {
    /// Every layer MoE with the same spec.
    pub fn uniform(num_layers: usize, spec: MoeLayerSpec) -> Self {
        MoeConfig { layers: vec![Some(spec); num_layers], router_aux_loss_coef: 0.01 }
    }

    /// Checks the layout against the dense base.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the layer: wrong layer count, zero
    /// experts, `top_k` outside `1..=E`, a frozen index out of range, a
    /// non-positive temperature.
    pub fn validate(&self, base: &ModelConfig, source_name: &str) -> Result<()> {
        let err = |what: String| Err(StudioError::config(source_name, what));
        if self.layers.len() != base.num_layers {
            return err(format!(
                "the MoE layout has {} layers but the model has {} (give one entry per layer)",
                self.layers.len(),
                base.num_layers
            ));
        }
        for (l, spec) in self.layers.iter().enumerate() {
            let Some(s) = spec else { continue };
            if s.num_experts == 0 {
                return err(format!("layer {l}: an MoE layer needs at least 1 expert (got 0)"));
            }
            if s.top_k == 0 || s.top_k > s.num_experts {
                return err(format!(
                    "layer {l}: top-k {} must be between 1 and the expert count {}",
                    s.top_k, s.num_experts
                ));
            }
            if let Some(f) = s.frozen.iter().find(|&&f| f >= s.num_experts) {
                return err(format!("layer {l}: frozen expert {f} does not exist ({} experts)", s.num_experts));
            }
            if !(s.temperature > 0.0 && s.temperature.is_finite()) {
                return err(format!("layer {l}: router temperature must be > 0 (got {})", s.temperature));
            }
            if s.expert_intermediate_size == Some(0) {
                return err(format!("layer {l}: the expert intermediate size must be at least 1"));
            }
            if s.shared_experts == 0 && (s.shared_expert_gate || s.shared_frozen) {
                return err(format!(
                    "layer {l}: a shared-expert gate or frozen shared experts without shared experts \
                     (give the number of shared experts)"
                ));
            }
        }
        Ok(())
    }

    /// Why this layout cannot be written in the Mixtral layout, or `None`
    /// when it can.
    pub fn mixtral_blocker(&self, base: &ModelConfig) -> Option<String> {
        if !matches!(base.architecture, Architecture::Llama | Architecture::Mistral) {
            return Some(format!(
                "the base architecture is {} (Mixtral has no q/k/v bias)",
                base.architecture.model_type()
            ));
        }
        if base.attention_bias {
            return Some("attention projections have biases".into());
        }
        let first = self.layers.first().and_then(|s| s.as_ref())?;
        for (l, s) in self.layers.iter().enumerate() {
            match s {
                None => return Some(format!("layer {l} stays dense (Mixtral makes every layer MoE)")),
                Some(s) if s.num_experts != first.num_experts => {
                    return Some(format!(
                        "layer {l} has {} experts, layer 0 has {} (Mixtral needs one count)",
                        s.num_experts, first.num_experts
                    ))
                }
                Some(s) if s.top_k != first.top_k => return Some(format!("layer {l} has a different top-k")),
                Some(s) if s.router_bias => return Some(format!("layer {l}'s router has a bias")),
                Some(s) if s.expert_width(base) != first.expert_width(base) => {
                    return Some(format!("layer {l}'s experts have another width than layer 0's"))
                }
                Some(s) if s.shared_experts > 0 => {
                    return Some(format!(
                        "layer {l} has shared experts, which Mixtral cannot hold (layouts that can: {})",
                        SHARED_EXPERT_LAYOUTS
                    ))
                }
                Some(s) if !s.norm_topk_prob => {
                    return Some(format!(
                        "layer {l} weighs experts by the softmax over all experts (norm_topk_prob false); \
                         Mixtral always renormalises over the top-k (layouts that can: qwen2_moe, qwen3_moe, studio)"
                    ))
                }
                Some(s) if s.selection_bias => {
                    return Some(format!(
                        "layer {l}'s router has an aux-loss-free selection bias, which only the studio layout holds"
                    ))
                }
                _ => {}
            }
        }
        None
    }

    /// Total experts over all MoE layers.
    pub fn total_experts(&self) -> usize {
        self.layers.iter().flatten().map(|s| s.num_experts).sum()
    }

    /// Parameter count of the MoE model built on `base`: the dense model
    /// with each MoE layer's FFN replaced by its block
    /// ([`MoeLayerSpec::block_parameters`]: routed experts of their own
    /// width, router, shared experts and gates).
    pub fn num_parameters(&self, base: &ModelConfig) -> usize {
        self.num_parameters_u64(base) as usize
    }

    /// [`MoeConfig::num_parameters`] in `u64` (the browser's `usize` has 32
    /// bits).
    pub fn num_parameters_u64(&self, base: &ModelConfig) -> u64 {
        self.num_parameters_on(base, base.num_parameters() as u64)
    }

    /// [`MoeConfig::num_parameters_u64`] with the dense count `dense` given
    /// (the browser counts it in `u64` itself).
    pub fn num_parameters_on(&self, base: &ModelConfig, dense: u64) -> u64 {
        let ffn = 3 * base.hidden_size as u64 * base.intermediate_size as u64;
        self.layers.iter().flatten().fold(dense, |n, s| n - ffn + s.block_parameters(base))
    }

    /// Parameters one token uses in the MoE model built on `base`: every
    /// parameter except the routed experts top-k routing leaves out, i.e.
    /// [`MoeConfig::num_parameters`] minus `(E_l - k_l)` experts per MoE
    /// layer (embeddings, attention, norms, routers, shared experts and the
    /// LM head all count, as in Mixtral's and DeepSeekMoE's "active
    /// parameters").
    pub fn num_active_parameters(&self, base: &ModelConfig) -> usize {
        self.num_active_parameters_on(base, base.num_parameters() as u64) as usize
    }

    /// [`MoeConfig::num_active_parameters`] in `u64` with the dense count
    /// `dense` given.
    pub fn num_active_parameters_on(&self, base: &ModelConfig, dense: u64) -> u64 {
        let idle: u64 = self.layers.iter().flatten().map(|s| s.idle_parameters(base)).sum();
        self.num_parameters_on(base, dense) - idle
    }

    /// `config.json` for this layout (Mixtral when possible, else studio).
    pub fn to_config_json(&self, base: &ModelConfig) -> serde_json::Value {
        let mut v = base.to_config_json(None);
        let obj = v.as_object_mut().expect("object");
        let frozen: Vec<Vec<usize>> =
            self.layers.iter().map(|s| s.as_ref().map(|s| s.frozen.clone()).unwrap_or_default()).collect();
        obj.insert("router_aux_loss_coef".into(), self.router_aux_loss_coef.into());
        if self.mixtral_blocker(base).is_none() {
            let first = self.layers[0].as_ref().expect("validated");
            obj.insert("model_type".into(), "mixtral".into());
            obj.insert("architectures".into(), serde_json::json!(["MixtralForCausalLM"]));
            obj.insert("num_local_experts".into(), first.num_experts.into());
            // Granular experts: Mixtral's `intermediate_size` is the expert
            // width (every layer is MoE there, so no dense FFN needs f).
            obj.insert("intermediate_size".into(), first.expert_width(base).into());
            obj.insert("num_experts_per_tok".into(), first.top_k.into());
            obj.insert("output_router_logits".into(), false.into());
            obj.insert("sliding_window".into(), serde_json::Value::Null);
            obj.remove("attention_bias");
            obj.insert(
                "moe_studio".into(),
                serde_json::json!({"version": 1, "base_model_type": base.architecture.model_type(), "frozen_experts": frozen}),
            );
        } else {
            obj.insert("model_type".into(), "moe_studio".into());
            // no transformers class loads the per-layer layout
            obj.remove("architectures");
            obj.insert("base_model_type".into(), base.architecture.model_type().into());
            obj.insert("moe_layers".into(), serde_json::to_value(&self.layers).expect("layers"));
            obj.insert(
                "moe_studio".into(),
                serde_json::json!({"version": 1, "base_model_type": base.architecture.model_type(), "frozen_experts": frozen}),
            );
        }
        v
    }

    /// Reads the MoE layout and the dense base from a `config.json` whose
    /// `model_type` is `mixtral` or `moe_studio`; returns `None` for dense
    /// model types.
    ///
    /// # Errors
    /// [`StudioError::Config`] / [`StudioError::Format`] naming `source_name`.
    pub fn from_config_json(bytes: &[u8], source_name: &str) -> Result<Option<(ModelConfig, MoeConfig)>> {
        let v: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| StudioError::format(source_name, "config.json", e.to_string()))?;
        let ty = v.get("model_type").and_then(|t| t.as_str()).unwrap_or("");
        if ty != "mixtral" && ty != "moe_studio" {
            return Ok(None);
        }
        let studio = v.get("moe_studio");
        let base_type = v
            .get("base_model_type")
            .or_else(|| studio.and_then(|s| s.get("base_model_type")))
            .and_then(|t| t.as_str())
            .unwrap_or(if ty == "mixtral" { "mistral" } else { "" })
            .to_string();
        let mut dense = v.clone();
        dense["model_type"] = base_type.clone().into();
        let hf: HfConfig = serde_json::from_value(dense)
            .map_err(|e| StudioError::format(source_name, "config.json", e.to_string()))?;
        let base = hf.to_model_config(source_name)?;
        let coef = v.get("router_aux_loss_coef").and_then(|x| x.as_f64()).unwrap_or(0.01);
        let frozen: Vec<Vec<usize>> = studio
            .and_then(|s| s.get("frozen_experts"))
            .and_then(|f| serde_json::from_value(f.clone()).ok())
            .unwrap_or_default();
        let layers = if ty == "mixtral" {
            let get = |k: &str| {
                v.get(k)
                    .and_then(|x| x.as_u64())
                    .map(|x| x as usize)
                    .ok_or_else(|| StudioError::config(source_name, format!("mixtral config lacks `{k}`")))
            };
            let (e, k) = (get("num_local_experts")?, get("num_experts_per_tok")?);
            (0..base.num_layers)
                .map(|l| {
                    Some(MoeLayerSpec {
                        num_experts: e,
                        top_k: k,
                        frozen: frozen.get(l).cloned().unwrap_or_default(),
                        ..Default::default()
                    })
                })
                .collect()
        } else {
            let raw = v
                .get("moe_layers")
                .ok_or_else(|| StudioError::config(source_name, "moe_studio config lacks `moe_layers`"))?;
            serde_json::from_value(raw.clone())
                .map_err(|e| StudioError::format(source_name, "config.json", format!("`moe_layers`: {e}")))?
        };
        let moe = MoeConfig { layers, router_aux_loss_coef: coef };
        moe.validate(&base, source_name)?;
        Ok(Some((base, moe)))
    }
}

/// Tensor name of layer `l`'s router weight (`[E, d]`).
pub fn router_weight_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.gate.weight")
}

/// Tensor name of layer `l`'s router bias (`[E]`, studio layout only).
pub fn router_bias_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.gate.bias")
}

/// Tensor name of expert `e`'s projection in layer `l`: `w` is `"w1"`
/// (gate, `[f, d]`), `"w3"` (up, `[f, d]`) or `"w2"` (down, `[d, f]`).
pub fn expert_weight_name(l: usize, e: usize, w: &str) -> String {
    format!("model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight")
}

/// Tensor name of shared expert `i`'s projection in layer `l` (studio
/// layout; `w` as in [`expert_weight_name`], every shared expert of the
/// dense width `[f, d]` / `[d, f]`).
pub fn shared_expert_weight_name(l: usize, i: usize, w: &str) -> String {
    format!("model.layers.{l}.block_sparse_moe.shared_experts.{i}.{w}.weight")
}

/// Tensor name of layer `l`'s shared-expert gate (`[N, d]`, one sigmoid gate
/// row per shared expert; studio layout).
pub fn shared_expert_gate_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.shared_expert_gate.weight")
}

/// Tensor name of layer `l`'s aux-loss-free selection bias (`[E]`; the name
/// DeepSeek-V3 gives it in transformers, studio layout).
pub fn selection_bias_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.gate.e_score_correction_bias")
}

/// The Mixtral expert projection that holds a dense `mlp.{proj}`:
/// gate_proj -> w1, up_proj -> w3, down_proj -> w2.
pub fn mixtral_proj(dense_proj: &str) -> &'static str {
    match dense_proj {
        "gate_proj" => "w1",
        "up_proj" => "w3",
        _ => "w2",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> ModelConfig {
        let json =
            br#"{"model_type":"llama","vocab_size":32,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":2,
            "num_attention_heads":2,"num_key_value_heads":1,"tie_word_embeddings":true}"#;
        HfConfig::from_json(json, "c").unwrap().to_model_config("c").unwrap()
    }

    fn spec(e: usize, k: usize) -> MoeLayerSpec {
        MoeLayerSpec { num_experts: e, top_k: k, frozen: vec![0], ..Default::default() }
    }

    #[test]
    fn uniform_layout_round_trips_through_mixtral_config() {
        let b = base();
        let moe = MoeConfig::uniform(2, spec(4, 2));
        let json = serde_json::to_vec(&moe.to_config_json(&b)).unwrap();
        let (b2, m2) = MoeConfig::from_config_json(&json, "c").unwrap().unwrap();
        assert_eq!(b2.hidden_size, 8);
        assert_eq!(m2, moe);
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["model_type"], "mixtral");
        assert_eq!(v["num_local_experts"], 4);
    }

    #[test]
    fn per_layer_layout_uses_the_studio_form_and_round_trips() {
        let b = base();
        let moe = MoeConfig {
            layers: vec![Some(spec(2, 1)), Some(MoeLayerSpec { router_bias: true, temperature: 0.1, ..spec(3, 2) })],
            router_aux_loss_coef: 0.01,
        };
        assert!(moe.mixtral_blocker(&b).unwrap().contains("layer 1"));
        let json = serde_json::to_vec(&moe.to_config_json(&b)).unwrap();
        let (_, m2) = MoeConfig::from_config_json(&json, "c").unwrap().unwrap();
        assert_eq!(m2, moe);
    }

    #[test]
    fn invalid_layouts_are_named() {
        let b = base();
        let e = MoeConfig::uniform(3, spec(4, 2)).validate(&b, "alloc.json").unwrap_err().to_string();
        assert!(e.contains("alloc.json") && e.contains("3 layers") && e.contains("has 2"), "{e}");
        let e = MoeConfig::uniform(2, spec(2, 3)).validate(&b, "x").unwrap_err().to_string();
        assert!(e.contains("top-k 3"), "{e}");
        let e = MoeConfig::uniform(2, MoeLayerSpec { num_experts: 0, ..Default::default() })
            .validate(&b, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1 expert"), "{e}");
    }
}
