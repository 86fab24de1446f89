//! Per-dataset evaluation: perplexity (the strided windows that
//! [`super::perplexity`] also uses — it calls [`evaluate`]) together with the routing load of MoE layers, under
//! learned, forced (oracle) or random routing; and DUME's retention.
//!
//! Retention (DUME, methods.md §2): perplexity of a domain's own dense
//! expert divided by the MoE's perplexity on that domain, in percent.

use burn::module::Param;
use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::{PerplexityOptions, PerplexityReport};
use crate::error::{Result, StudioError};
use crate::model::transformer::Mlp;
use crate::model::{ForwardOptions, Padding, Routing, Trace, Transformer};

/// Rows of hidden states sent through the LM head at once.
const HEAD_ROWS: usize = 512;

/// Perplexity and routing load of one dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetEval {
    /// Tokens, mean NLL, perplexity.
    pub report: PerplexityReport,
    /// Per layer, the fraction of routed token slots each expert received
    /// over the scored windows (`None` for dense layers).
    pub load: Vec<Option<Vec<f64>>>,
}

impl DatasetEval {
    /// The per-expert load averaged over MoE layers with the same expert
    /// count as the first one (`None` for a dense model).
    pub fn mean_load(&self) -> Option<Vec<f64>> {
        let layers: Vec<&Vec<f64>> = self.load.iter().flatten().collect();
        let e = layers.first()?.len();
        let same: Vec<&&Vec<f64>> = layers.iter().filter(|l| l.len() == e).collect();
        let mut m = vec![0.0; e];
        for l in &same {
            m.iter_mut().zip(l.iter()).for_each(|(a, b)| *a += b);
        }
        m.iter_mut().for_each(|x| *x /= same.len() as f64);
        Some(m)
    }
}

/// Evaluates `model` on `ids` with `routing`: perplexity over the windows of
/// [`super::perplexity`] (so the numbers are the same for learned routing)
/// and the expert load of every MoE layer over all window positions.
/// `opts.batch` windows run as one right-padded batch (the last window is
/// usually shorter); padding is routed nowhere and scored nowhere.
///
/// # Errors
/// As [`super::perplexity`]: fewer than 2 tokens, a bad stride, a window
/// beyond the model's context, a batch of 0.
pub fn evaluate<B: Backend>(
    model: &Transformer<B>,
    ids: &[u32],
    opts: PerplexityOptions,
    routing: Routing,
    device: &B::Device,
    mut on_window: impl FnMut(usize, usize),
) -> Result<DatasetEval> {
    let ids = match opts.max_tokens {
        Some(m) => &ids[..ids.len().min(m)],
        None => ids,
    };
    let n = ids.len();
    if n < 2 {
        return Err(StudioError::Invalid(format!("evaluation needs at least 2 tokens, the text has {n}")));
    }
    if opts.stride == 0 || opts.stride > opts.window {
        return Err(StudioError::Invalid(format!("stride ({}) must be in 1..=window ({})", opts.stride, opts.window)));
    }
    if opts.window > model.config.max_position_embeddings {
        return Err(StudioError::Invalid(format!(
            "window {} exceeds the model's context {}",
            opts.window, model.config.max_position_embeddings
        )));
    }
    if opts.batch == 0 {
        return Err(StudioError::Invalid("batch (windows per forward pass) must be >= 1".into()));
    }
    if let Routing::Forced(e) = routing {
        // The oracle sends dataset i to expert i: a layer without expert i
        // would send it to another expert's FFN without a word.
        let fewest = model
            .layers
            .iter()
            .filter_map(|b| match &b.mlp {
                crate::model::Mlp::Moe(m) => Some(m.num_experts()),
                _ => None,
            })
            .min();
        if let Some(n) = fewest.filter(|&n| e >= n) {
            return Err(StudioError::Invalid(format!(
                "oracle routing sends dataset {} to expert {e}, but the model has {n} experts in a layer: give at \
                 most {n} datasets, in expert order",
                e + 1
            )));
        }
    }
    // The windows: `[begin, end)` tokens, scoring targets `first..end`.
    let mut windows: Vec<(usize, usize, usize)> = Vec::new();
    let (mut prev_end, mut begin) = (0usize, 0usize);
    while begin < n {
        let end = (begin + opts.window).min(n);
        windows.push((begin, end, prev_end.max(begin + 1)));
        prev_end = end;
        if end == n {
            break;
        }
        begin += opts.stride;
    }
    let total_windows = windows.len();
    let v = model.config.vocab_size;
    let (mut sum, mut count, mut done) = (0f64, 0usize, 0usize);
    let mut counts: Vec<Option<Vec<usize>>> = vec![None; model.layers.len()];
    for group in windows.chunks(opts.batch) {
        let texts: Vec<&[u32]> = group.iter().map(|&(b, e, _)| &ids[b..e]).collect();
        let (tokens, padding) = Padding::pad_tensor::<B>(&texts, 0, device)?;
        let seq = padding.seq();
        let mut trace = Trace::default();
        let fo = ForwardOptions { routing, ..Default::default() };
        let hidden = model.forward_hidden_masked(tokens, Some(&padding), None, fo, Some(&mut trace));
        for (acc, r) in counts.iter_mut().zip(&trace.routing) {
            if let Some(r) = r {
                let a = acc.get_or_insert_with(|| vec![0; r.counts.len()]);
                a.iter_mut().zip(&r.counts).for_each(|(x, y)| *x += y);
            }
        }
        // Hidden rows that predict a scored target (position `t - 1 - begin`
        // of its window predicts token `t`), and the targets.
        let (mut rows, mut targets) = (Vec::new(), Vec::new());
        for (j, &(b, e, first)) in group.iter().enumerate() {
            for (t, &id) in ids.iter().enumerate().take(e).skip(first) {
                rows.push((j * seq + t - 1 - b) as i64);
                targets.push(i64::from(id));
            }
        }
        let d = model.config.hidden_size;
        let flat = hidden.reshape([group.len() * seq, d]);
        // The LM head and its log-softmax on at most HEAD_ROWS rows at a time
        // (`[rows, V]` floats: 100 MB for SmolLM2's 49,152-entry vocabulary).
        for (r, t) in rows.chunks(HEAD_ROWS).zip(targets.chunks(HEAD_ROWS)) {
            let m = r.len();
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(r.to_vec(), [m]), device);
            let h = flat.clone().select(0, idx).reshape([1, m, d]);
            let logp = log_softmax(model.head(h), 2).reshape([m, v]);
            let tgt = Tensor::<B, 2, Int>::from_data(TensorData::new(t.to_vec(), [m, 1]), device);
            let picked: Vec<f32> = logp.gather(1, tgt).into_data().convert::<f32>().to_vec().expect("f32");
            sum -= picked.iter().map(|&x| x as f64).sum::<f64>();
            count += m;
        }
        for _ in group {
            done += 1;
            on_window(done, total_windows);
        }
    }
    let nll = sum / count as f64;
    let load = counts
        .into_iter()
        .map(|c| {
            c.map(|c| {
                let t = c.iter().sum::<usize>().max(1) as f64;
                c.iter().map(|&x| x as f64 / t).collect()
            })
        })
        .collect();
    Ok(DatasetEval { report: PerplexityReport { tokens: count, nll, ppl: nll.exp() }, load })
}

/// Replaces every router by a seeded Gaussian one (`N(0, 1/d)` entries,
/// no bias): the "random routing" baseline of DUME. Routing then depends on
/// the token but carries no domain knowledge.
pub fn randomize_routers<B: Backend>(mut model: Transformer<B>, seed: u64) -> Transformer<B> {
    for (l, block) in model.layers.iter_mut().enumerate() {
        if let Mlp::Moe(m) = &mut block.mlp {
            let [d, e] = m.gate.weight.val().dims();
            let mut rng = crate::rng::NormalRng::for_tensor(seed, &format!("random-router-{l}"));
            let std = 1.0 / (d as f64).sqrt();
            let w: Vec<f32> = (0..d * e).map(|_| (rng.next_normal() * std) as f32).collect();
            let device = m.gate.weight.val().device();
            m.gate.weight = Param::from_tensor(Tensor::from_data(TensorData::new(w, [d, e]), &device));
            m.gate.bias = None;
        }
    }
    model
}

/// DUME retention in percent: `100 * ppl_dense_expert / ppl_moe`.
pub fn retention(ppl_dense_expert: f64, ppl_moe: f64) -> f64 {
    100.0 * ppl_dense_expert / ppl_moe
}
