//! The MoE structure of a model: which layers are MoE, with how many
//! experts, top-k, frozen experts, router bias and temperature.
//!
//! How an MoE is written to disk (Mixtral, Qwen2-MoE, the studio's own
//! form, ...) and read back is the business of [`crate::layout`]; this
//! module only describes and validates the structure.
//!
//! Sources: Jiang et al., "Mixtral of Experts" (2024); methods.md
//! "Checkpoint formats" and §3 (per-layer expert counts).

use serde::{Deserialize, Serialize};

use super::ModelConfig;
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
}

fn one() -> f64 {
    1.0
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
        }
        Ok(())
    }

    /// Total experts over all MoE layers.
    pub fn total_experts(&self) -> usize {
        self.layers.iter().flatten().map(|s| s.num_experts).sum()
    }

    /// Parameter count of the MoE model built on `base`.
    pub fn num_parameters(&self, base: &ModelConfig) -> usize {
        let ffn = 3 * base.hidden_size * base.intermediate_size;
        let mut n = base.num_parameters();
        for s in self.layers.iter().flatten() {
            n += (s.num_experts - 1) * ffn
                + s.num_experts * base.hidden_size
                + if s.router_bias { s.num_experts } else { 0 };
        }
        n
    }

    /// Parameters one token uses in the MoE model built on `base`: every
    /// parameter except the experts top-k routing leaves out, i.e.
    /// [`MoeConfig::num_parameters`] minus `(E_l - k_l)` FFNs per MoE layer
    /// (embeddings, attention, norms, routers and the LM head all count, as
    /// in Mixtral's "active parameters").
    pub fn num_active_parameters(&self, base: &ModelConfig) -> usize {
        let ffn = 3 * base.hidden_size * base.intermediate_size;
        let idle: usize = self.layers.iter().flatten().map(|s| s.num_experts.saturating_sub(s.top_k) * ffn).sum();
        self.num_parameters(base) - idle
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
        MoeLayerSpec { num_experts: e, top_k: k, frozen: vec![0], router_bias: false, temperature: 1.0 }
    }

    #[test]
    fn invalid_layouts_are_named() {
        let b = base();
        let e = MoeConfig::uniform(3, spec(4, 2)).validate(&b, "alloc.json").unwrap_err().to_string();
        assert!(e.contains("alloc.json") && e.contains("3 layers") && e.contains("has 2"), "{e}");
        let e = MoeConfig::uniform(2, spec(2, 3)).validate(&b, "x").unwrap_err().to_string();
        assert!(e.contains("top-k 3"), "{e}");
        let e = MoeConfig::uniform(
            2,
            MoeLayerSpec { num_experts: 0, top_k: 1, frozen: vec![], router_bias: false, temperature: 1.0 },
        )
        .validate(&b, "x")
        .unwrap_err()
        .to_string();
        assert!(e.contains("at least 1 expert"), "{e}");
    }
}
