//! The teaching view: which expert each token goes to at one layer, and the
//! load per expert.

use moe_shared::model::{ForwardOptions, Trace};

use super::{cpu_model, encode, tokens};
use crate::store::Picked;
use crate::Cpu;

/// Routing of a text at one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// `(token text, top-1 expert)` per token.
    pub tokens: Vec<(String, usize)>,
    /// Experts of the layer.
    pub experts: usize,
    /// Fraction of routed slots (top-k) per expert.
    pub load: Vec<f64>,
    /// Number of MoE layers; `layer` is clamped into them.
    pub moe_layers: Vec<usize>,
}

/// Routes `text` through `src` and reads layer `layer`'s choices.
///
/// # Errors
/// A dense model, no tokenizer, an empty text, a dense layer.
pub fn inspect(src: &Picked, text: &str, layer: usize) -> Result<Inspection, String> {
    let m = src.model();
    let moe = m
        .moe
        .as_ref()
        .ok_or_else(|| format!("{} is dense: pick an MoE (upcycle, route or MoErge first)", src.name()))?;
    let moe_layers: Vec<usize> = moe.layers.iter().enumerate().filter(|(_, s)| s.is_some()).map(|(l, _)| l).collect();
    if !moe_layers.contains(&layer) {
        return Err(format!("layer {layer} is not an MoE layer (MoE layers: {moe_layers:?})"));
    }
    let mut ids = encode(m, text, false)?;
    ids.truncate(m.config.max_position_embeddings.min(512));
    if ids.is_empty() {
        return Err("type some text to route".into());
    }
    let model = cpu_model(m)?;
    let mut trace: Trace<Cpu> = Trace::default();
    let _ = model.forward_hidden_with(tokens(&ids), None, ForwardOptions::default(), Some(&mut trace));
    let r = trace.routing.get(layer).and_then(|r| r.as_ref()).ok_or("no routing recorded for this layer")?;
    let tok = m.tokenizer.as_ref().ok_or("no tokenizer")?;
    let toks = ids
        .iter()
        .enumerate()
        .map(|(t, &id)| (tok.decode(&[id]).unwrap_or_else(|_| format!("<{id}>")), r.chosen[t * r.top_k] as usize))
        .collect();
    let total = r.counts.iter().sum::<usize>().max(1) as f64;
    Ok(Inspection {
        tokens: toks,
        experts: r.counts.len(),
        load: r.counts.iter().map(|&c| c as f64 / total).collect(),
        moe_layers,
    })
}
