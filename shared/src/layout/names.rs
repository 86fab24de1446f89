//! The studio's canonical MoE tensor names, and the one parser of them.
//!
//! Inside the studio (the model, the methods, the browser, the server)
//! every MoE checkpoint is seen through these names, whatever its on-disk
//! layout: a layout renames at the border (see [`super::MoeLayout`] and
//! [`super::LayoutSource`] / [`super::LayoutSink`]), as the GGUF reader
//! renames llama.cpp's names to Hugging Face's.
//!
//! The canonical names are transformers' Mixtral names
//! (`MixtralForCausalLM`), plus the things Mixtral lacks (methods.md §5):
//! - `model.layers.{l}.block_sparse_moe.gate.weight` `[E, d]`: the router;
//! - `model.layers.{l}.block_sparse_moe.gate.bias` `[E]`: its bias (DUME);
//! - `model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`:
//!   expert `e`'s gate `[f, d]`, up `[f, d]` and down `[d, f]` projections;
//! - `model.layers.{l}.block_sparse_moe.gate.e_score_correction_bias` `[E]`:
//!   the aux-loss-free selection bias (DeepSeek-V3 §2.1.2; transformers'
//!   DeepSeek-V3 name), added to the router logits to choose the top-k only;
//! - `model.layers.{l}.block_sparse_moe.shared_experts.{s}.{w1,w3,w2}.weight`:
//!   shared expert `s` (always chosen; the dense width `[f, d]` / `[d, f]`;
//!   DeepSeekMoE §3.2, Qwen2-MoE), and
//!   `model.layers.{l}.block_sparse_moe.shared_expert_gate.weight` `[N, d]`:
//!   one sigmoid gate row per shared expert (Qwen2-MoE's
//!   `shared_expert_gate`; DeepSeek's shared experts are ungated);
//! - a layer that stays dense keeps `model.layers.{l}.mlp.{gate,up,down}_proj.weight`.
//!
//! Every other name (embeddings, attention, norms, LM head) is the dense
//! Hugging Face name and is the same in every layout.

/// One projection of a SwiGLU FFN: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proj {
    /// `gate_proj` / Mixtral `w1`, `[f, d]`.
    Gate,
    /// `up_proj` / Mixtral `w3`, `[f, d]`.
    Up,
    /// `down_proj` / Mixtral `w2`, `[d, f]`.
    Down,
}

impl Proj {
    /// The three projections in Hugging Face order (gate, up, down).
    pub const ALL: [Proj; 3] = [Proj::Gate, Proj::Up, Proj::Down];

    /// Mixtral's name: `w1`, `w3`, `w2`.
    pub fn mixtral(self) -> &'static str {
        match self {
            Proj::Gate => "w1",
            Proj::Up => "w3",
            Proj::Down => "w2",
        }
    }

    /// The dense / Qwen name: `gate_proj`, `up_proj`, `down_proj`.
    pub fn hf(self) -> &'static str {
        match self {
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    /// Parses a Mixtral name (`w1`, `w3`, `w2`).
    pub fn from_mixtral(s: &str) -> Option<Proj> {
        Some(match s {
            "w1" => Proj::Gate,
            "w3" => Proj::Up,
            "w2" => Proj::Down,
            _ => return None,
        })
    }

    /// Parses a dense name (`gate_proj`, `up_proj`, `down_proj`).
    pub fn from_hf(s: &str) -> Option<Proj> {
        Some(match s {
            "gate_proj" => Proj::Gate,
            "up_proj" => Proj::Up,
            "down_proj" => Proj::Down,
            _ => return None,
        })
    }

    /// Shape `[out, in]` of this projection for hidden size `d` and FFN
    /// size `f`.
    pub fn shape(self, d: usize, f: usize) -> Vec<usize> {
        match self {
            Proj::Gate | Proj::Up => vec![f, d],
            Proj::Down => vec![d, f],
        }
    }
}

/// What a canonical tensor name stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// Router weight `[E, d]` of MoE layer `layer`.
    Router {
        /// Decoder layer.
        layer: usize,
    },
    /// Router bias `[E]` of MoE layer `layer`.
    RouterBias {
        /// Decoder layer.
        layer: usize,
    },
    /// Projection `proj` of routed expert `expert` of MoE layer `layer`.
    Expert {
        /// Decoder layer.
        layer: usize,
        /// Expert index within the layer.
        expert: usize,
        /// Which projection.
        proj: Proj,
    },
    /// Aux-loss-free selection bias `[E]` of MoE layer `layer` (a buffer:
    /// it moves the top-k choice, never the weights).
    SelectionBias {
        /// Decoder layer.
        layer: usize,
    },
    /// Projection `proj` of shared expert `index` of MoE layer `layer`.
    SharedExpert {
        /// Decoder layer.
        layer: usize,
        /// Shared expert index within the layer.
        index: usize,
        /// Which projection.
        proj: Proj,
    },
    /// The sigmoid gates `[N, d]` of layer `layer`'s `N` shared experts (row
    /// `i` gates shared expert `i`).
    SharedExpertGate {
        /// Decoder layer.
        layer: usize,
    },
    /// Projection `proj` of the FFN of a layer that stays dense.
    DenseFfn {
        /// Decoder layer.
        layer: usize,
        /// Which projection.
        proj: Proj,
    },
    /// Anything else (embeddings, attention, norms, LM head): the same name
    /// in every layout.
    Other(String),
}

impl TensorRole {
    /// The decoder layer of an FFN-side tensor (`None` for [`TensorRole::Other`]).
    pub fn layer(&self) -> Option<usize> {
        match self {
            TensorRole::Router { layer }
            | TensorRole::RouterBias { layer }
            | TensorRole::SelectionBias { layer }
            | TensorRole::Expert { layer, .. }
            | TensorRole::SharedExpert { layer, .. }
            | TensorRole::SharedExpertGate { layer }
            | TensorRole::DenseFfn { layer, .. } => Some(*layer),
            TensorRole::Other(_) => None,
        }
    }

    /// Whether it is a router weight, bias or selection bias.
    pub fn is_router(&self) -> bool {
        matches!(self, TensorRole::Router { .. } | TensorRole::RouterBias { .. } | TensorRole::SelectionBias { .. })
    }
}

/// Splits `model.layers.{l}.{rest}` into `(l, rest)`.
pub fn split_layer(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) || (l.len() > 1 && l.starts_with('0')) {
        return None;
    }
    Some((l.parse().ok()?, rest))
}

fn index(s: &str) -> Option<usize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

/// Parses a canonical name (the one parser of MoE tensor names: the
/// methods, the server and the browser call it).
pub fn parse(name: &str) -> TensorRole {
    let other = || TensorRole::Other(name.to_string());
    let Some((layer, rest)) = split_layer(name) else { return other() };
    if let Some(proj) = rest.strip_prefix("mlp.").and_then(|r| r.strip_suffix(".weight")).and_then(Proj::from_hf) {
        return TensorRole::DenseFfn { layer, proj };
    }
    let Some(rest) = rest.strip_prefix("block_sparse_moe.") else { return other() };
    match rest {
        "gate.weight" => return TensorRole::Router { layer },
        "gate.bias" => return TensorRole::RouterBias { layer },
        "gate.e_score_correction_bias" => return TensorRole::SelectionBias { layer },
        "shared_expert_gate.weight" => return TensorRole::SharedExpertGate { layer },
        _ => {}
    }
    let (shared, rest) = if let Some(r) = rest.strip_prefix("experts.") {
        (false, r)
    } else if let Some(r) = rest.strip_prefix("shared_experts.") {
        (true, r)
    } else {
        return other();
    };
    let Some((e, tail)) = rest.split_once('.') else { return other() };
    let Some(e) = index(e) else { return other() };
    let Some(proj) = tail.strip_suffix(".weight").and_then(Proj::from_mixtral) else { return other() };
    if shared {
        TensorRole::SharedExpert { layer, index: e, proj }
    } else {
        TensorRole::Expert { layer, expert: e, proj }
    }
}

/// The canonical name of a role (the inverse of [`parse`]).
pub fn canonical(role: &TensorRole) -> String {
    match role {
        TensorRole::Router { layer } => router_weight_name(*layer),
        TensorRole::RouterBias { layer } => router_bias_name(*layer),
        TensorRole::Expert { layer, expert, proj } => expert_weight_name(*layer, *expert, *proj),
        TensorRole::SelectionBias { layer } => selection_bias_name(*layer),
        TensorRole::SharedExpert { layer, index, proj } => shared_expert_weight_name(*layer, *index, *proj),
        TensorRole::SharedExpertGate { layer } => shared_expert_gate_name(*layer),
        TensorRole::DenseFfn { layer, proj } => dense_ffn_name(*layer, *proj),
        TensorRole::Other(n) => n.clone(),
    }
}

/// Canonical name of layer `l`'s router weight (`[E, d]`).
pub fn router_weight_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.gate.weight")
}

/// Canonical name of layer `l`'s router bias (`[E]`).
pub fn router_bias_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.gate.bias")
}

/// Canonical name of expert `e`'s projection `proj` in layer `l`.
pub fn expert_weight_name(l: usize, e: usize, proj: Proj) -> String {
    format!("model.layers.{l}.block_sparse_moe.experts.{e}.{}.weight", proj.mixtral())
}

/// Canonical name of layer `l`'s aux-loss-free selection bias (`[E]`;
/// DeepSeek-V3's `e_score_correction_bias` in transformers).
pub fn selection_bias_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.gate.e_score_correction_bias")
}

/// Canonical name of shared expert `i`'s projection `proj` in layer `l`
/// (every shared expert has the dense width: `[f, d]` / `[d, f]`).
pub fn shared_expert_weight_name(l: usize, i: usize, proj: Proj) -> String {
    format!("model.layers.{l}.block_sparse_moe.shared_experts.{i}.{}.weight", proj.mixtral())
}

/// Canonical name of layer `l`'s shared-expert gates (`[N, d]`, one sigmoid
/// gate row per shared expert).
pub fn shared_expert_gate_name(l: usize) -> String {
    format!("model.layers.{l}.block_sparse_moe.shared_expert_gate.weight")
}

/// Name of the dense FFN projection `proj` of layer `l`
/// (`model.layers.{l}.mlp.{gate,up,down}_proj.weight`).
pub fn dense_ffn_name(l: usize, proj: Proj) -> String {
    format!("model.layers.{l}.mlp.{}.weight", proj.hf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_canonical_are_inverse() {
        let roles = [
            TensorRole::Router { layer: 3 },
            TensorRole::RouterBias { layer: 0 },
            TensorRole::Expert { layer: 12, expert: 7, proj: Proj::Down },
            TensorRole::SelectionBias { layer: 2 },
            TensorRole::SharedExpert { layer: 1, index: 0, proj: Proj::Up },
            TensorRole::SharedExpertGate { layer: 1 },
            TensorRole::DenseFfn { layer: 4, proj: Proj::Gate },
            TensorRole::Other("model.layers.0.self_attn.q_proj.bias".into()),
            TensorRole::Other("lm_head.weight".into()),
        ];
        for r in roles {
            assert_eq!(parse(&canonical(&r)), r, "{}", canonical(&r));
        }
        assert_eq!(
            canonical(&TensorRole::Expert { layer: 2, expert: 1, proj: Proj::Gate }),
            "model.layers.2.block_sparse_moe.experts.1.w1.weight"
        );
        for odd in [
            "model.layers.01.block_sparse_moe.gate.weight",
            "model.layers.1.block_sparse_moe.experts.x.w1.weight",
            "model.layers.1.block_sparse_moe.experts.1.w4.weight",
            "model.layers.1.mlp.gate.weight",
        ] {
            assert_eq!(parse(odd), TensorRole::Other(odd.into()), "{odd}");
        }
    }
}
