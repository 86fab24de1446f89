//! NeuronMoE's language-specific neurons (methods.md §3, after Kojima et
//! al., "On the Multilingual Ability of Decoder-based Pre-trained Language
//! Models: Finding and Controlling Language-Specific Neurons", NAACL 2024).
//!
//! Pipeline:
//! 1. [`NeuronCollector`]: run labelled texts through a model (a few texts
//!    per right-padded forward pass), capturing every output unit of every
//!    linear map (`q_proj`, `k_proj`, `v_proj` before RoPE, `o_proj`,
//!    `gate_proj`, `up_proj`, `down_proj`; in an MoE layer those of every
//!    expert, each computed on every token: the post-training analysis,
//!    methods.md §3.7) pooled over each text's own tokens (mean or max).
//!    Each text adds one row to the pooled matrix `[texts, neurons]`
//!    ([`PooledActivations`]); nothing else grows with the number of texts.
//!    The same pass accumulates each language's mean FFN input per layer
//!    (for the LayerMoE-style baseline, [`LayerSimilarity`]).
//! 2. [`average_precision_table`]: for each neuron and language, the Average
//!    Precision of ranking all texts by the neuron's score with that
//!    language's texts as positives, exactly as scikit-learn's
//!    `average_precision_score` (one threshold per distinct score; tied
//!    scores share one threshold). Each neuron's column is sorted once and
//!    the APs of all languages are read off that one order.
//! 3. [`analyze`]: top-N (highest AP) and bottom-N (lowest AP) neurons per
//!    language, per-layer counts of specific neurons per component, and the
//!    union over the new languages ([`union_counts`]) that NeuronMoE's
//!    allocation ([`super::allocate`]) maps to experts. Neurons tied at the
//!    N-th AP share the places left instead of being taken in index order
//!    ([`select`]), and [`NeuronReport::warnings`] says when a tie or too
//!    few texts make the counts uncertain.
//!
//! Neurons are indexed flat, layer-major, then component in
//! [`COMPONENTS`] order (in an MoE layer: attention, then each routed
//! expert's gate/up/down, then each shared expert's), then unit
//! ([`NeuronLayout`]).

//!
//! One file per step: [`collect`] (the pass and the pooled matrix), [`ap`]
//! (Average Precision), [`analysis`] (top/bottom-N, counts, the union and
//! the per-expert profiles), [`select`] (cut-offs and ties); this file holds
//! the neuron layout they share. Every item is re-exported here.

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::model::{Mlp, Transformer};

pub mod analysis;
pub mod ap;
pub mod collect;
pub mod select;
pub use analysis::*;
pub use ap::*;
pub use collect::*;
pub use select::{
    chance_perfect_neurons, min_texts_per_language, select_by_ap, weighted_counts, Cutoff, NeuronWarning, Selection,
    WarningKind, CHANCE_SHARE, TIE_SHARE,
};

/// The linear maps whose output units are neurons, in capture order
/// (attention first, then the dense FFN).
pub const COMPONENTS: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// One linear map of a layer and its number of output units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentUnits {
    /// One of [`COMPONENTS`]; in an MoE layer the FFN maps are
    /// `experts.{e}.{gate,up,down}_proj` and
    /// `shared_experts.{i}.{gate,up,down}_proj` ([`ComponentUnits::expert`]).
    pub component: String,
    /// Output units (neurons): `h*hd` for q, `kvh*hd` for k/v, `d` for o and
    /// down, `f` for gate and up.
    pub units: usize,
}

/// Which expert of an MoE layer a component belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExpertRef {
    /// Routed expert `e` (`experts.{e}.*`).
    Routed(usize),
    /// Always-active shared expert `i` (`shared_experts.{i}.*`).
    Shared(usize),
}

impl ComponentUnits {
    /// The expert this component belongs to (`None` for attention and a
    /// dense FFN).
    pub fn expert(&self) -> Option<ExpertRef> {
        let (group, rest) = self.component.split_once('.')?;
        let e: usize = rest.split_once('.')?.0.parse().ok()?;
        match group {
            "experts" => Some(ExpertRef::Routed(e)),
            "shared_experts" => Some(ExpertRef::Shared(e)),
            _ => None,
        }
    }

    /// The linear map without its expert prefix (one of [`COMPONENTS`]).
    pub fn base(&self) -> &str {
        self.component.rsplit('.').next().unwrap_or(&self.component)
    }
}

/// Which neurons exist: per layer, the captured components in
/// [`COMPONENTS`] order. In an MoE layer the FFN's neurons are those of
/// every routed expert, then every shared expert (each computed on every
/// token: what the expert responds to, not what the router sent it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeuronLayout {
    /// `layers[l]`: the components of layer `l` with their unit counts.
    pub layers: Vec<Vec<ComponentUnits>>,
    /// `frozen_experts[l]`: the routed experts of layer `l` excluded from
    /// training (`MoeLayer::frozen`; the studio's upcycling freezes copy 0,
    /// the original FFN: expert 0, or experts `0..G` with granularity `G`);
    /// empty for a dense model and in files written before MoE layouts
    /// existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen_experts: Vec<Vec<usize>>,
}

/// Where a flat neuron index points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeuronPos {
    /// Decoder layer.
    pub layer: usize,
    /// Index into `layout.layers[layer]` (component position).
    pub slot: usize,
    /// Output unit of that linear map.
    pub unit: usize,
}

impl NeuronLayout {
    /// The layout of `model`: for every layer q/k/v/o, then gate/up/down of
    /// a dense FFN, or of every expert of an MoE FFN (routed experts, then
    /// shared experts; each expert's own width).
    pub fn of_model<B: Backend>(model: &Transformer<B>) -> Self {
        let c = &model.config;
        let (q, kv, d, f) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size);
        let unit = |n: String, u: usize| ComponentUnits { component: n, units: u };
        let ffn = |prefix: &str, width: usize| {
            [("gate_proj", width), ("up_proj", width), ("down_proj", d)].map(|(n, u)| unit(format!("{prefix}{n}"), u))
        };
        let mut frozen_experts = Vec::with_capacity(model.layers.len());
        let layers = model
            .layers
            .iter()
            .map(|b| {
                let mut v: Vec<ComponentUnits> = [("q_proj", q), ("k_proj", kv), ("v_proj", kv), ("o_proj", d)]
                    .into_iter()
                    .map(|(n, u)| unit(n.to_string(), u))
                    .collect();
                match &b.mlp {
                    Mlp::Dense(_) => {
                        v.extend(ffn("", f));
                        frozen_experts.push(Vec::new());
                    }
                    Mlp::Moe(m) => {
                        // Burn's gate_proj weight is [d, width].
                        for (e, x) in m.experts.iter().enumerate() {
                            v.extend(ffn(&format!("experts.{e}."), x.gate_proj.weight.dims()[1]));
                        }
                        for (i, x) in m.shared_experts.iter().enumerate() {
                            v.extend(ffn(&format!("shared_experts.{i}."), x.gate_proj.weight.dims()[1]));
                        }
                        frozen_experts.push(m.frozen.clone());
                    }
                }
                v
            })
            .collect();
        if frozen_experts.iter().all(Vec::is_empty) {
            frozen_experts.clear();
        }
        NeuronLayout { layers, frozen_experts }
    }

    /// Whether routed expert `expert` of `layer` was excluded from training.
    pub fn is_frozen(&self, layer: usize, expert: usize) -> bool {
        self.frozen_experts.get(layer).is_some_and(|f| f.contains(&expert))
    }

    /// Number of layers `L`.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Total neurons (columns of the pooled matrix).
    pub fn num_neurons(&self) -> usize {
        self.layers.iter().flatten().map(|c| c.units).sum()
    }

    /// Contiguous segments `(first flat index, layer, slot, units)` in flat
    /// order.
    pub fn segments(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut out = Vec::new();
        let mut start = 0;
        for (l, comps) in self.layers.iter().enumerate() {
            for (s, c) in comps.iter().enumerate() {
                out.push((start, l, s, c.units));
                start += c.units;
            }
        }
        out
    }

    /// Resolves flat indices with a precomputed [`NeuronLayout::segments`]
    /// list; `None` past the end.
    pub fn locate_in(segments: &[(usize, usize, usize, usize)], flat: usize) -> Option<NeuronPos> {
        let i = segments.partition_point(|s| s.0 <= flat).checked_sub(1)?;
        let (start, layer, slot, units) = segments[i];
        (flat < start + units).then_some(NeuronPos { layer, slot, unit: flat - start })
    }

    /// Resolves one flat index (`None` past the end).
    pub fn locate(&self, flat: usize) -> Option<NeuronPos> {
        Self::locate_in(&self.segments(), flat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `neurons.json` layout written before MoE layouts existed (no
    /// `frozen_experts`) still loads, and a dense layout writes none.
    #[test]
    fn layouts_without_frozen_experts_load() {
        let old = r#"{"layers":[[{"component":"q_proj","units":2}]]}"#;
        let layout: NeuronLayout = serde_json::from_str(old).unwrap();
        assert!(layout.frozen_experts.is_empty() && !layout.is_frozen(0, 0));
        assert_eq!(serde_json::to_string(&layout).unwrap(), old);
    }

    #[test]
    fn layout_locate() {
        let layout = NeuronLayout {
            layers: vec![
                vec![
                    ComponentUnits { component: "q_proj".into(), units: 3 },
                    ComponentUnits { component: "k_proj".into(), units: 2 },
                ],
                vec![ComponentUnits { component: "q_proj".into(), units: 4 }],
            ],
            frozen_experts: Vec::new(),
        };
        assert_eq!(layout.num_neurons(), 9);
        assert_eq!(layout.locate(0), Some(NeuronPos { layer: 0, slot: 0, unit: 0 }));
        assert_eq!(layout.locate(4), Some(NeuronPos { layer: 0, slot: 1, unit: 1 }));
        assert_eq!(layout.locate(5), Some(NeuronPos { layer: 1, slot: 0, unit: 0 }));
        assert_eq!(layout.locate(8), Some(NeuronPos { layer: 1, slot: 0, unit: 3 }));
        assert_eq!(layout.locate(9), None);
    }
}
