//! The MoE structure of a model: which layers are MoE, with how many
//! experts, top-k, frozen experts, router bias and temperature, and the
//! upcycling variants of methods.md §5 (shared experts and their gate,
//! granular expert width, `norm_topk_prob`, the aux-loss-free selection
//! bias).
//!
//! How an MoE is written to disk (Mixtral, Qwen2-MoE, the studio's own
//! form, ...) and read back is the business of [`crate::layout`]; this
//! module only describes and validates the structure.
//!
//! Sources: Jiang et al., "Mixtral of Experts" (2024); methods.md
//! "Checkpoint formats" and §3 (per-layer expert counts).

use serde::{Deserialize, Serialize};

use super::ModelConfig;
use crate::error::{Param, Result, StudioError};

/// The `config.json` `model_type`s of the MoE layouts the studio reads, in
/// the order of [`crate::layout::REGISTRY`] (for the error that refuses an
/// unknown `model_type`). The registry is the authority; a test in
/// `layout` fails when the two disagree, so a new layout adds its name
/// here too.
pub const MOE_MODEL_TYPES: &[&str] = &["mixtral", "qwen2_moe", "qwen3_moe", "deepseek", "moe_studio"];

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
    /// [`StudioError::Param`] naming the layer and the parameter: wrong
    /// layer count or zero experts ([`Param::Experts`]), `top_k` outside
    /// `1..=E`, a frozen index out of range, a non-positive temperature, a
    /// zero expert width, shared-expert options without shared experts.
    pub fn validate(&self, base: &ModelConfig, source_name: &str) -> Result<()> {
        let err = |param: Param, what: String| Err(StudioError::param(source_name, param, what));
        if self.layers.len() != base.num_layers {
            return err(
                Param::Experts,
                format!(
                    "the MoE layout has {} layers but the model has {} (give one entry per layer)",
                    self.layers.len(),
                    base.num_layers
                ),
            );
        }
        for (l, spec) in self.layers.iter().enumerate() {
            let Some(s) = spec else { continue };
            if s.num_experts == 0 {
                return err(Param::Experts, format!("layer {l}: an MoE layer needs at least 1 expert (got 0)"));
            }
            if s.top_k == 0 || s.top_k > s.num_experts {
                return err(
                    Param::TopK,
                    format!("layer {l}: top-k {} must be between 1 and the expert count {}", s.top_k, s.num_experts),
                );
            }
            if let Some(f) = s.frozen.iter().find(|&&f| f >= s.num_experts) {
                return err(
                    Param::Frozen,
                    format!("layer {l}: frozen expert {f} does not exist ({} experts)", s.num_experts),
                );
            }
            if !(s.temperature > 0.0 && s.temperature.is_finite()) {
                return err(
                    Param::Temperature,
                    format!("layer {l}: router temperature must be > 0 (got {})", s.temperature),
                );
            }
            if s.expert_intermediate_size == Some(0) {
                return err(Param::ExpertWidth, format!("layer {l}: the expert intermediate size must be at least 1"));
            }
            if s.shared_experts == 0 && (s.shared_expert_gate || s.shared_frozen) {
                return err(
                    Param::SharedExperts,
                    format!(
                        "layer {l}: a shared-expert gate or frozen shared experts without shared experts \
                     (give the number of shared experts)"
                    ),
                );
            }
        }
        Ok(())
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HfConfig;

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
    fn invalid_layouts_are_named() {
        let b = base();
        let e = MoeConfig::uniform(3, spec(4, 2)).validate(&b, "alloc.json").unwrap_err().to_string();
        assert!(e.contains("alloc.json") && e.contains("3 layers") && e.contains("has 2"), "{e}");
        let e = MoeConfig::uniform(2, spec(2, 3)).validate(&b, "x").unwrap_err();
        assert!(matches!(e, StudioError::Param { param: Param::TopK, .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("top-k 3"), "{e}");
        let frozen = MoeLayerSpec { frozen: vec![7], ..spec(2, 1) };
        let e = MoeConfig::uniform(2, frozen).validate(&b, "x").unwrap_err();
        assert!(matches!(e, StudioError::Param { param: Param::Frozen, .. }), "{e:?}");
        let e = MoeConfig::uniform(2, MoeLayerSpec { num_experts: 0, ..Default::default() })
            .validate(&b, "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1 expert"), "{e}");
    }
}
