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

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};
use crate::model::{ForwardOptions, Mlp, Padding, Pooling, Trace, Transformer};

pub mod select;
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

/// Options of the collection pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectOptions {
    /// How a neuron's activations are pooled over a text's tokens (reference:
    /// mean).
    pub pooling: Pooling,
    /// Each text is truncated to its first `max_tokens` tokens (>= 1).
    pub max_tokens: usize,
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions { pooling: Pooling::Mean, max_tokens: 256 }
    }
}

/// The pooled matrix and what belongs to it.
#[derive(Debug, Clone)]
pub struct PooledActivations {
    /// Neuron layout (columns).
    pub layout: NeuronLayout,
    /// Language codes; `labels` index into this.
    pub languages: Vec<String>,
    /// Language of each text (row).
    pub labels: Vec<usize>,
    /// Row-major `[texts, neurons]`: text `t`'s pooled score of neuron `n`
    /// at `t * num_neurons + n`.
    pub data: Vec<f32>,
    /// Tokens used per language (after truncation).
    pub tokens: Vec<usize>,
    /// Per language, the mean over its texts of each layer's token-mean FFN
    /// input (the post-attention RMSNorm output, what a router sees),
    /// `[L * d]` layer-major.
    pub hidden_means: Vec<Vec<f64>>,
    /// Hidden size `d`.
    pub hidden_size: usize,
    /// The options the matrix was collected with.
    pub options: CollectOptions,
}

impl PooledActivations {
    /// Number of texts (rows).
    pub fn num_texts(&self) -> usize {
        self.labels.len()
    }

    /// Texts per language.
    pub fn texts_per_language(&self) -> Vec<usize> {
        let mut n = vec![0; self.languages.len()];
        for &l in &self.labels {
            n[l] += 1;
        }
        n
    }

    /// One neuron's scores over all texts (a strided copy; for tests and
    /// dumps).
    pub fn column(&self, neuron: usize) -> Vec<f32> {
        let n = self.layout.num_neurons();
        (0..self.num_texts()).map(|t| self.data[t * n + neuron]).collect()
    }

    /// Checks what the Average Precision needs: at least two languages,
    /// each with at least two texts.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] naming the language concerned.
    pub fn validate(&self) -> Result<()> {
        if self.languages.len() < 2 {
            return Err(StudioError::Invalid(format!(
                "language-specific neurons need at least 2 languages (texts of the other languages are the negatives); got {}",
                if self.languages.is_empty() { "none".to_string() } else { format!("only `{}`", self.languages[0]) }
            )));
        }
        for (code, n) in self.languages.iter().zip(self.texts_per_language()) {
            if n < 2 {
                return Err(StudioError::Invalid(format!(
                    "language `{code}` has {n} text(s); the Average Precision needs at least 2 per language \
                     (reference: ~500; give more non-empty lines)"
                )));
            }
        }
        Ok(())
    }
}

/// Streams labelled texts through a model and builds [`PooledActivations`]
/// (one forward pass per text; memory = the pooled matrix plus one pass).
pub struct NeuronCollector<'a, B: Backend> {
    model: &'a Transformer<B>,
    layout: NeuronLayout,
    languages: Vec<String>,
    options: CollectOptions,
    labels: Vec<usize>,
    data: Vec<f32>,
    tokens: Vec<usize>,
    hidden_sums: Vec<Vec<f64>>,
    device: B::Device,
}

impl<'a, B: Backend> NeuronCollector<'a, B> {
    /// A collector for texts of `languages` (codes; each text is added with
    /// its index in this list).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for no languages, a repeated or empty code, or
    /// `max_tokens == 0`.
    pub fn new(model: &'a Transformer<B>, languages: Vec<String>, options: CollectOptions) -> Result<Self> {
        if languages.is_empty() {
            return Err(StudioError::Invalid("no languages given".into()));
        }
        for (i, c) in languages.iter().enumerate() {
            if c.trim().is_empty() {
                return Err(StudioError::Invalid(format!("language {i} has an empty code")));
            }
            if languages[..i].contains(c) {
                return Err(StudioError::Invalid(format!("language `{c}` is given twice (merge its files instead)")));
            }
        }
        if options.max_tokens == 0 {
            return Err(StudioError::Invalid("max_tokens must be >= 1".into()));
        }
        let layout = NeuronLayout::of_model(model);
        let d = model.config.hidden_size;
        let nl = languages.len();
        let device = model.embed_tokens.weight.val().device();
        Ok(NeuronCollector {
            layout,
            hidden_sums: vec![vec![0.0; model.layers.len() * d]; nl],
            tokens: vec![0; nl],
            languages,
            options,
            labels: Vec::new(),
            data: Vec::new(),
            model,
            device,
        })
    }

    /// The neuron layout (columns).
    pub fn layout(&self) -> &NeuronLayout {
        &self.layout
    }

    /// Reserves the pooled matrix for `texts` more rows up front (avoids the
    /// transient double allocation of a growing vector).
    pub fn reserve(&mut self, texts: usize) {
        self.data.reserve_exact(texts * self.layout.num_neurons());
        self.labels.reserve_exact(texts);
    }

    /// Texts added so far.
    pub fn num_texts(&self) -> usize {
        self.labels.len()
    }

    /// Runs one text (token ids, truncated to `max_tokens`) and appends its
    /// pooled row. Returns the number of tokens used.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for an unknown language index, an empty text
    /// or a capture that disagrees with the layout.
    pub fn add_text(&mut self, language: usize, ids: &[u32]) -> Result<usize> {
        self.add_texts(&[(language, ids)])
    }

    /// [`NeuronCollector::add_text`] for several texts in one right-padded
    /// forward pass (pooling runs over each text's own tokens, so the rows
    /// equal one-by-one rows up to float summation order); rows are appended
    /// in the given order. Returns the number of tokens used.
    ///
    /// # Errors
    /// As [`NeuronCollector::add_text`], for any of the texts (then none is
    /// added).
    pub fn add_texts(&mut self, texts: &[(usize, &[u32])]) -> Result<usize> {
        if texts.is_empty() {
            return Ok(0);
        }
        let rows = self.pooled_rows(texts)?;
        let n = self.layout.num_neurons();
        let width = rows.len() / texts.len();
        let mut used_total = 0;
        for (&(language, ids), row) in texts.iter().zip(rows.chunks(width)) {
            self.data.extend_from_slice(&row[..n]);
            for (s, v) in self.hidden_sums[language].iter_mut().zip(&row[n..]) {
                *s += f64::from(*v);
            }
            self.labels.push(language);
            let used = ids.len().min(self.options.max_tokens);
            self.tokens[language] += used;
            used_total += used;
        }
        Ok(used_total)
    }

    /// One capture pass over `texts`: `[texts, neurons + L*d]` row-major
    /// (pooled neurons, then each layer's token-mean FFN input).
    fn pooled_rows(&self, texts: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        for &(language, ids) in texts {
            if language >= self.languages.len() {
                return Err(StudioError::Invalid(format!(
                    "language index {language} out of range ({} languages)",
                    self.languages.len()
                )));
            }
            if ids.is_empty() {
                return Err(StudioError::Invalid(format!(
                    "an empty text (0 tokens) for language `{}`",
                    self.languages[language]
                )));
            }
        }
        let cut: Vec<&[u32]> = texts.iter().map(|(_, ids)| &ids[..ids.len().min(self.options.max_tokens)]).collect();
        let (t, padding) = Padding::pad_tensor::<B>(&cut, 0, &self.device)?;
        let opts = ForwardOptions {
            capture_neurons: Some(self.options.pooling),
            capture_ffn_inputs: true,
            ..Default::default()
        };
        let mut trace = Trace::default();
        let _ = self.model.forward_hidden_masked(t, Some(&padding), None, opts, Some(&mut trace));
        if trace.neurons.len() != self.layout.num_layers() || trace.ffn_inputs.len() != self.layout.num_layers() {
            return Err(StudioError::Invalid(format!(
                "the capture returned {} layers of neurons for a {}-layer model",
                trace.neurons.len(),
                self.layout.num_layers()
            )));
        }
        let (b, d) = (padding.batch(), self.model.config.hidden_size);
        let mut parts: Vec<Tensor<B, 2>> = Vec::with_capacity(8 * self.layout.num_layers());
        for (l, (layer, comps)) in trace.neurons.into_iter().zip(&self.layout.layers).enumerate() {
            let names: Vec<&str> = layer.iter().map(|(n, _)| n.as_str()).collect();
            let want: Vec<&str> = comps.iter().map(|c| c.component.as_str()).collect();
            if names != want {
                return Err(StudioError::Invalid(format!("layer {l}: captured {names:?}, expected {want:?}")));
            }
            parts.extend(layer.into_iter().map(|(_, t)| t));
        }
        // Token means of the FFN inputs over each text's real positions.
        let keep = padding.position_weights::<B>(&self.device);
        let lengths: Vec<f32> = padding.lengths().iter().map(|&l| l as f32).collect();
        let lengths = Tensor::<B, 2>::from_data(TensorData::new(lengths, [b, 1]), &self.device);
        for x in trace.ffn_inputs {
            parts.push((x * keep.clone()).sum_dim(1).reshape([b, d]) / lengths.clone());
        }
        let rows = Tensor::cat(parts, 1).into_data().convert::<f32>();
        rows.to_vec::<f32>().map_err(|e| StudioError::Invalid(format!("reading pooled activations: {e:?}")))
    }

    /// Runs one text through a plain forward pass (no capture) with the same
    /// truncation; for measuring the capture overhead.
    pub fn plain_forward(&self, ids: &[u32]) {
        let ids = &ids[..ids.len().min(self.options.max_tokens)];
        if ids.is_empty() {
            return;
        }
        let t = Tensor::<B, 2, Int>::from_data(
            TensorData::new(ids.iter().map(|&x| i64::from(x)).collect::<Vec<_>>(), [1, ids.len()]),
            &self.device,
        );
        let h = self.model.forward_hidden(t, None);
        let _ = h.into_data();
    }

    /// The collected matrix.
    ///
    /// # Errors
    /// As [`PooledActivations::validate`].
    pub fn finish(self) -> Result<PooledActivations> {
        let counts = {
            let mut n = vec![0usize; self.languages.len()];
            for &l in &self.labels {
                n[l] += 1;
            }
            n
        };
        let hidden_means = self
            .hidden_sums
            .into_iter()
            .zip(&counts)
            .map(|(s, &n)| s.into_iter().map(|x| x / n.max(1) as f64).collect())
            .collect();
        let p = PooledActivations {
            layout: self.layout,
            languages: self.languages,
            labels: self.labels,
            data: self.data,
            tokens: self.tokens,
            hidden_means,
            hidden_size: self.model.config.hidden_size,
            options: self.options,
        };
        p.validate()?;
        Ok(p)
    }
}

// ---------------------------------------------------------------------------
// Average Precision

/// Order-preserving map of an `f32` to a `u32` (ascending); `-0.0` and
/// `+0.0` map to the same key, as they compare equal in NumPy.
fn ascending_key(x: f32) -> u32 {
    let x = if x == 0.0 { 0.0 } else { x };
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Reusable buffers of the per-neuron AP computation.
#[derive(Debug, Default, Clone)]
pub struct ApScratch {
    keys: Vec<u64>,
    tp: Vec<u64>,
    group: Vec<u64>,
    acc: Vec<f64>,
}

/// The Average Precision of one score column for every label at once:
/// `out[c]` = AP of ranking the texts by `scores` (descending) with the
/// texts of label `c` as positives, exactly as scikit-learn's
/// `average_precision_score`:
/// `AP = Σ_k (R_k − R_{k−1}) · P_k` over the distinct score thresholds `k`
/// (descending; tied scores form one threshold), `P_k`/`R_k` the precision
/// and recall of "score >= threshold k".
///
/// One sort of `scores` serves every label. `positives[c]` = number of texts
/// with label `c` (> 0 for every label whose AP is wanted; a label with no
/// texts gets `NaN`). Scores must be finite (checked by callers);
/// `-0.0 == +0.0`.
pub fn average_precision_per_label(
    scores: &[f32],
    labels: &[usize],
    positives: &[usize],
    out: &mut [f64],
    scratch: &mut ApScratch,
) {
    let n = scores.len();
    debug_assert_eq!(labels.len(), n);
    debug_assert!(n < u32::MAX as usize);
    let nl = positives.len();
    scratch.keys.clear();
    // Descending score = ascending !key; the low 32 bits carry the text.
    scratch.keys.extend(scores.iter().enumerate().map(|(i, &s)| (u64::from(!ascending_key(s)) << 32) | i as u64));
    scratch.keys.sort_unstable();
    scratch.tp.clear();
    scratch.tp.resize(nl, 0);
    scratch.group.clear();
    scratch.group.resize(nl, 0);
    scratch.acc.clear();
    scratch.acc.resize(nl, 0.0);
    let keys = &scratch.keys;
    let (tp, group, acc) = (&mut scratch.tp, &mut scratch.group, &mut scratch.acc);
    let mut i = 0;
    while i < n {
        let k = keys[i] >> 32;
        let mut j = i + 1;
        while j < n && keys[j] >> 32 == k {
            j += 1;
        }
        // Threshold at this score: every text with index < j is predicted
        // positive (`seen = tp + fp`).
        let seen = j as f64;
        if j - i == 1 {
            let c = labels[(keys[i] & 0xffff_ffff) as usize];
            tp[c] += 1;
            acc[c] += tp[c] as f64 / seen;
        } else {
            for key in &keys[i..j] {
                group[labels[(key & 0xffff_ffff) as usize]] += 1;
            }
            for c in 0..nl {
                let g = group[c];
                if g > 0 {
                    tp[c] += g;
                    // ΔR = g / P, precision = tp / seen.
                    acc[c] += g as f64 * (tp[c] as f64 / seen);
                    group[c] = 0;
                }
            }
        }
        i = j;
    }
    for c in 0..nl {
        out[c] = if positives[c] == 0 { f64::NAN } else { acc[c] / positives[c] as f64 };
    }
}

/// scikit-learn's `average_precision_score(positive, scores)` for one
/// binary labelling.
///
/// # Errors
/// [`StudioError::Invalid`] for different lengths, no texts, no positives
/// or a non-finite score.
pub fn average_precision(scores: &[f32], positive: &[bool]) -> Result<f64> {
    if scores.len() != positive.len() {
        return Err(StudioError::Invalid(format!("{} scores but {} labels", scores.len(), positive.len())));
    }
    if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
        return Err(StudioError::Invalid(format!("score {i} is {} (scores must be finite)", scores[i])));
    }
    let p = positive.iter().filter(|&&b| b).count();
    if p == 0 {
        return Err(StudioError::Invalid("no positive texts: the Average Precision is undefined".into()));
    }
    let labels: Vec<usize> = positive.iter().map(|&b| usize::from(b)).collect();
    let mut out = [0.0; 2];
    average_precision_per_label(scores, &labels, &[scores.len() - p, p], &mut out, &mut ApScratch::default());
    Ok(out[1])
}

/// Every neuron's Average Precision for every language.
#[derive(Debug, Clone, PartialEq)]
pub struct ApTable {
    /// Language codes (rows of `ap`).
    pub languages: Vec<String>,
    /// `ap[lang][neuron]` (flat neuron index).
    pub ap: Vec<Vec<f64>>,
    /// `base_rate[lang]`: the fraction of texts in that language, the AP of
    /// a random ranking.
    pub base_rate: Vec<f64>,
}

/// Columns gathered per block (transposes the row-major matrix in
/// cache-friendly tiles).
const BLOCK: usize = 64;

fn ap_range(p: &PooledActivations, positives: &[usize], range: std::ops::Range<usize>) -> Result<Vec<Vec<f64>>> {
    let n = p.layout.num_neurons();
    let t = p.num_texts();
    let nl = p.languages.len();
    let mut out = vec![Vec::with_capacity(range.len()); nl];
    let mut tile = vec![0f32; BLOCK * t];
    let mut scratch = ApScratch::default();
    let mut ap = vec![0f64; nl];
    let mut start = range.start;
    while start < range.end {
        let w = BLOCK.min(range.end - start);
        for r in 0..t {
            let row = &p.data[r * n + start..r * n + start + w];
            for (c, &v) in row.iter().enumerate() {
                tile[c * t + r] = v;
            }
        }
        for c in 0..w {
            let col = &tile[c * t..(c + 1) * t];
            if let Some(r) = col.iter().position(|v| !v.is_finite()) {
                let pos = p.layout.locate(start + c).expect("in range");
                return Err(StudioError::Invalid(format!(
                    "text {r} ({}): neuron layer {} {} unit {} is {} (non-finite activations; check the model)",
                    p.languages[p.labels[r]],
                    pos.layer,
                    p.layout.layers[pos.layer][pos.slot].component,
                    pos.unit,
                    col[r]
                )));
            }
            average_precision_per_label(col, &p.labels, positives, &mut ap, &mut scratch);
            for (o, a) in out.iter_mut().zip(&ap) {
                o.push(*a);
            }
        }
        start += w;
    }
    Ok(out)
}

/// Computes [`ApTable`] for the pooled matrix, splitting the neurons over
/// `threads` threads natively (1 on wasm32).
///
/// # Errors
/// As [`PooledActivations::validate`]; [`StudioError::Invalid`] for a
/// non-finite activation, naming the text and neuron.
pub fn average_precision_table(p: &PooledActivations, threads: usize) -> Result<ApTable> {
    p.validate()?;
    let n = p.layout.num_neurons();
    let t = p.num_texts();
    if p.data.len() != n * t {
        return Err(StudioError::Invalid(format!(
            "pooled matrix has {} values, expected {t} texts x {n} neurons",
            p.data.len()
        )));
    }
    let positives = p.texts_per_language();
    let base_rate = positives.iter().map(|&c| c as f64 / t as f64).collect();
    let threads = if cfg!(target_arch = "wasm32") { 1 } else { threads.clamp(1, 64) };
    let parts: Vec<Vec<Vec<f64>>> = if threads == 1 || n < 2 * BLOCK {
        vec![ap_range(p, &positives, 0..n)?]
    } else {
        let chunk = n.div_ceil(threads).div_ceil(BLOCK) * BLOCK;
        let ranges: Vec<_> = (0..n).step_by(chunk).map(|s| s..(s + chunk).min(n)).collect();
        run_parallel(p, &positives, ranges)?
    };
    let mut ap = vec![Vec::with_capacity(n); p.languages.len()];
    for part in parts {
        for (a, v) in ap.iter_mut().zip(part) {
            a.extend(v);
        }
    }
    Ok(ApTable { languages: p.languages.clone(), ap, base_rate })
}

#[cfg(not(target_arch = "wasm32"))]
fn run_parallel(
    p: &PooledActivations,
    positives: &[usize],
    ranges: Vec<std::ops::Range<usize>>,
) -> Result<Vec<Vec<Vec<f64>>>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranges.into_iter().map(|r| s.spawn(move || ap_range(p, positives, r))).collect();
        handles.into_iter().map(|h| h.join().expect("AP worker panicked")).collect()
    })
}

#[cfg(target_arch = "wasm32")]
fn run_parallel(
    p: &PooledActivations,
    positives: &[usize],
    ranges: Vec<std::ops::Range<usize>>,
) -> Result<Vec<Vec<Vec<f64>>>> {
    ranges.into_iter().map(|r| ap_range(p, positives, r)).collect()
}

// ---------------------------------------------------------------------------
// Specific neurons and counts

/// One neuron and its Average Precision for a language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeuronAp {
    /// Decoder layer.
    pub layer: usize,
    /// Linear map (one of [`COMPONENTS`], with an `experts.{e}.` or
    /// `shared_experts.{i}.` prefix in an MoE layer).
    pub component: String,
    /// Output unit of that map.
    pub unit: usize,
    /// Flat index (layer-major, [`NeuronLayout`]).
    pub index: usize,
    /// Average Precision for the language.
    pub ap: f64,
}

/// Specific-neuron counts of one layer. Neurons tied at a cut-off count
/// fractionally ([`select`]): a count is whole when no tie reaches the
/// layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerCounts {
    /// Per component, aligned with `layout.layers[l]`.
    pub per_component: Vec<f64>,
    /// Sum over components.
    pub total: f64,
    /// The part of `total` that comes from neurons tied at a cut-off
    /// (weighted); `total − tie_weighted` neurons are certain.
    #[serde(default)]
    pub tie_weighted: f64,
}

/// The analysis of one language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LanguageNeurons {
    /// Language code.
    pub code: String,
    /// Texts (positives).
    pub texts: usize,
    /// Tokens used (after truncation).
    pub tokens: usize,
    /// [`crate::corpus::stream_sha256`] of the language's texts' ids
    /// concatenated before truncation ([`stream_sha256_of_texts`]): equal to
    /// the stream `eval` and `train` report for the same file when every
    /// document of it is used. Empty in reports written before it was
    /// recorded.
    #[serde(default)]
    pub stream_sha256: String,
    /// Fraction of all texts in this language: a random ranking's AP.
    pub base_rate: f64,
    /// Mean AP over all neurons.
    pub mean_ap: f64,
    /// The neurons of the top-N (highest AP) that are above the cut-off
    /// AP, best first (equal APs in flat order, for display only). With no
    /// tie across the cut these are all N.
    pub top: Vec<NeuronAp>,
    /// The tie at the top-N cut-off: `top.len() + top_cut.slots == N`.
    #[serde(default)]
    pub top_cut: Cutoff,
    /// The same for the bottom-N (lowest AP).
    pub bottom: Vec<NeuronAp>,
    /// The tie at the bottom-N cut-off.
    #[serde(default)]
    pub bottom_cut: Cutoff,
    /// Per layer, the counts of this language's specific neurons (`top` and
    /// its tie, plus `bottom` and its tie when `include_bottom`).
    pub counts: Vec<LayerCounts>,
}

impl LanguageNeurons {
    /// The selections that make this language's specific set: the top-N,
    /// plus the bottom-N when `include_bottom`.
    pub fn selections(&self, include_bottom: bool) -> Vec<Selection<'_>> {
        let mut v = vec![Selection { certain: &self.top, cut: &self.top_cut }];
        if include_bottom {
            v.push(Selection { certain: &self.bottom, cut: &self.bottom_cut });
        }
        v
    }
}

/// Cosine similarity of the languages' mean FFN inputs per layer (the
/// LayerMoE-style baseline's input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerSimilarity {
    /// Language codes (both axes).
    pub languages: Vec<String>,
    /// `cosine[l][a][b]`: cosine similarity at layer `l` of language `a`'s and
    /// `b`'s mean FFN input (mean over texts of the token mean).
    pub cosine: Vec<Vec<Vec<f64>>>,
}

/// Options of [`analyze`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnalysisOptions {
    /// Specific neurons per language (reference 1000).
    pub top_n: usize,
    /// Count the bottom-N (neurons off for the language) as specific too.
    pub include_bottom: bool,
    /// The new languages whose union drives the allocation.
    pub new_languages: Vec<String>,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions { top_n: 1000, include_bottom: false, new_languages: Vec::new() }
    }
}

/// Everything the analysis found; the `neurons.json` that `allocate` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeuronReport {
    /// File format version: 2 (tie-aware counts; 1, read too, broke ties
    /// at the cut by flat index).
    pub version: u32,
    /// Pooling over tokens.
    pub pooling: Pooling,
    /// Truncation per text.
    pub max_tokens: usize,
    /// N of top-N / bottom-N.
    pub top_n: usize,
    /// Whether bottom-N neurons count as specific.
    pub include_bottom: bool,
    /// The neuron layout.
    pub layout: NeuronLayout,
    /// Per language.
    pub languages: Vec<LanguageNeurons>,
    /// The new languages of `union_counts`.
    pub new_languages: Vec<String>,
    /// `S_l` per layer: specific neurons of the union over the new
    /// languages, tie-weighted ([`select`]).
    pub union_counts: Vec<LayerCounts>,
    /// Mean-hidden-state similarity per layer.
    pub similarity: LayerSimilarity,
}

/// Sets each language's [`LanguageNeurons::stream_sha256`] from its texts'
/// ids (`texts`: `(language index, ids)` in any order, each text's full
/// [`crate::corpus::document_ids`]); the CLI's `neurons` and the tab call it.
pub fn stream_sha256_of_texts(report: &mut NeuronReport, texts: &[(usize, Vec<u32>)]) {
    for (i, l) in report.languages.iter_mut().enumerate() {
        let ids: Vec<u32> = texts.iter().filter(|(li, _)| *li == i).flat_map(|(_, ids)| ids.iter().copied()).collect();
        l.stream_sha256 = crate::corpus::stream_sha256(&ids);
    }
}

fn neuron_ap(layout: &NeuronLayout, segs: &[(usize, usize, usize, usize)], index: usize, ap: f64) -> NeuronAp {
    let p = NeuronLayout::locate_in(segs, index).expect("index in range");
    NeuronAp { layer: p.layer, component: layout.layers[p.layer][p.slot].component.clone(), unit: p.unit, index, ap }
}

/// The cosine similarities of the languages' mean FFN inputs per layer.
pub fn layer_similarity(p: &PooledActivations) -> LayerSimilarity {
    let d = p.hidden_size;
    let nl = p.languages.len();
    let cosine = (0..p.layout.num_layers())
        .map(|l| {
            (0..nl)
                .map(|a| {
                    (0..nl)
                        .map(|b| {
                            let x = &p.hidden_means[a][l * d..(l + 1) * d];
                            let y = &p.hidden_means[b][l * d..(l + 1) * d];
                            let dot: f64 = x.iter().zip(y).map(|(u, v)| u * v).sum();
                            let nx: f64 = x.iter().map(|u| u * u).sum::<f64>().sqrt();
                            let ny: f64 = y.iter().map(|u| u * u).sum::<f64>().sqrt();
                            if nx == 0.0 || ny == 0.0 {
                                0.0
                            } else {
                                dot / (nx * ny)
                            }
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    LayerSimilarity { languages: p.languages.clone(), cosine }
}

/// `S_l`: per layer, the specific neurons of the union over `new`
/// (language codes of the report): a neuron counts 1 when it is above a
/// cut-off for any of them, else `1 − ∏(1 − w)` over the ties it is in
/// ([`select`]; without ties, the number of distinct specific neurons).
///
/// # Errors
/// [`StudioError::Invalid`] for an empty list or a code the report lacks.
pub fn union_counts(report: &NeuronReport, new: &[String]) -> Result<Vec<LayerCounts>> {
    if new.is_empty() {
        return Err(StudioError::Invalid("no new languages given for the union of specific neurons".into()));
    }
    let mut sets = Vec::new();
    for code in new {
        let lang = report.languages.iter().find(|l| &l.code == code).ok_or_else(|| {
            let known: Vec<&str> = report.languages.iter().map(|l| l.code.as_str()).collect();
            StudioError::Invalid(format!("new language `{code}` was not analysed (languages: {})", known.join(", ")))
        })?;
        sets.extend(lang.selections(report.include_bottom));
    }
    Ok(weighted_counts(&report.layout, &sets))
}

/// Specific neurons of one expert of an MoE layer (its `gate_proj`,
/// `up_proj` and `down_proj` units).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertCount {
    /// Decoder layer.
    pub layer: usize,
    /// Routed expert index, or the shared expert index when `shared`.
    pub expert: usize,
    /// An always-active shared expert.
    pub shared: bool,
    /// A routed expert excluded from training
    /// ([`NeuronLayout::frozen_experts`]; the studio's upcycled models
    /// freeze copy 0, the original FFN). Always `false` for a shared
    /// expert (the layout does not record `shared_frozen`).
    pub frozen: bool,
    /// The expert's neurons (`2 f_e + d`).
    pub units: usize,
    /// Its specific neurons (tie-weighted as [`LayerCounts`]).
    pub specific: f64,
}

/// Per expert of every MoE layer, the specific neurons among `counts`
/// (one language's [`LanguageNeurons::counts`] or [`NeuronReport::union_counts`]),
/// layer-major, routed experts then shared ones. Empty for a dense model;
/// layers past the end of `counts` are left out.
/// NeuronMoE's post-training analysis (methods.md §3.7): where the trained
/// new experts' language-specific neurons sit.
pub fn expert_counts(layout: &NeuronLayout, counts: &[LayerCounts]) -> Vec<ExpertCount> {
    let mut out: Vec<ExpertCount> = Vec::new();
    for (l, (comps, c)) in layout.layers.iter().zip(counts).enumerate() {
        for (comp, n) in comps.iter().zip(&c.per_component) {
            let Some(e) = comp.expert() else { continue };
            let (expert, shared) = match e {
                ExpertRef::Routed(e) => (e, false),
                ExpertRef::Shared(i) => (i, true),
            };
            match out.last_mut() {
                Some(x) if x.layer == l && x.expert == expert && x.shared == shared => {
                    x.units += comp.units;
                    x.specific += n;
                }
                _ => out.push(ExpertCount {
                    layer: l,
                    expert,
                    shared,
                    frozen: !shared && layout.is_frozen(l, expert),
                    units: comp.units,
                    specific: *n,
                }),
            }
        }
    }
    out
}

/// One layer's specific neurons (of one language's counts or the union's):
/// the mean per trainable routed expert, the mean per frozen routed expert
/// and the attention total (0 where a layer has none of a kind).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertLayerMeans {
    /// Mean over the layer's trainable routed experts.
    pub trainable: f64,
    /// Mean over its frozen routed experts.
    pub frozen: f64,
    /// q/k/v/o together.
    pub attention: f64,
}

/// [`ExpertLayerMeans`] per layer of `layout` from `counts` (as
/// [`expert_counts`]; layers past the end of `counts` are left out). The
/// per-expert profile of NeuronMoE's post-training analysis (methods.md
/// §3.7): layers with more experts do not count more.
pub fn expert_layer_means(layout: &NeuronLayout, counts: &[LayerCounts]) -> Vec<ExpertLayerMeans> {
    let experts = expert_counts(layout, counts);
    let mean = |l: usize, frozen: bool| {
        let v: Vec<f64> =
            experts.iter().filter(|e| e.layer == l && !e.shared && e.frozen == frozen).map(|e| e.specific).collect();
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    layout
        .layers
        .iter()
        .zip(counts)
        .enumerate()
        .map(|(l, (comps, c))| ExpertLayerMeans {
            trainable: mean(l, false),
            frozen: mean(l, true),
            attention: comps
                .iter()
                .zip(&c.per_component)
                .filter(|(x, _)| x.expert().is_none() && !matches!(x.base(), "gate_proj" | "up_proj" | "down_proj"))
                .map(|(_, n)| n)
                .sum(),
        })
        .collect()
}

/// Top-N / bottom-N per language, per-layer counts, the union over the new
/// languages and the layer similarities.
///
/// `new_languages` empty means every language but the first (the first is
/// taken as the original language).
///
/// # Errors
/// [`StudioError::Invalid`] for `top_n == 0`, `top_n` above the number of
/// neurons, an unknown new language, or a table that does not match.
pub fn analyze(p: &PooledActivations, table: &ApTable, opts: &AnalysisOptions) -> Result<NeuronReport> {
    let n = p.layout.num_neurons();
    if opts.top_n == 0 || opts.top_n > n {
        return Err(StudioError::Invalid(format!(
            "top_n must be in 1..={n} (the model has {n} neurons); got {}",
            opts.top_n
        )));
    }
    if table.languages != p.languages || table.ap.iter().any(|a| a.len() != n) {
        return Err(StudioError::Invalid("the AP table does not belong to this pooled matrix".into()));
    }
    let segs = p.layout.segments();
    let per_lang = p.texts_per_language();
    let mut languages = Vec::new();
    for (c, code) in p.languages.iter().enumerate() {
        let ap = &table.ap[c];
        let list = |ids: Vec<usize>| -> Vec<NeuronAp> {
            ids.into_iter().map(|i| neuron_ap(&p.layout, &segs, i, ap[i])).collect()
        };
        let (top, top_cut) = select_by_ap(ap, opts.top_n, true);
        let (bottom, bottom_cut) = select_by_ap(ap, opts.top_n, false);
        let mut lang = LanguageNeurons {
            code: code.clone(),
            texts: per_lang[c],
            tokens: p.tokens[c],
            stream_sha256: String::new(),
            base_rate: table.base_rate[c],
            mean_ap: ap.iter().sum::<f64>() / n as f64,
            top: list(top),
            top_cut,
            bottom: list(bottom),
            bottom_cut,
            counts: Vec::new(),
        };
        lang.counts = weighted_counts(&p.layout, &lang.selections(opts.include_bottom));
        languages.push(lang);
    }
    let new_languages =
        if opts.new_languages.is_empty() { p.languages[1..].to_vec() } else { opts.new_languages.clone() };
    let mut report = NeuronReport {
        version: 2,
        pooling: p.options.pooling,
        max_tokens: p.options.max_tokens,
        top_n: opts.top_n,
        include_bottom: opts.include_bottom,
        layout: p.layout.clone(),
        languages,
        new_languages: new_languages.clone(),
        union_counts: Vec::new(),
        similarity: layer_similarity(p),
    };
    report.union_counts = union_counts(&report, &new_languages)?;
    Ok(report)
}

impl NeuronReport {
    /// Reads a `neurons.json`.
    ///
    /// # Errors
    /// [`StudioError::Format`] naming `source_name`.
    pub fn from_json(bytes: &[u8], source_name: &str) -> Result<Self> {
        let r: NeuronReport = serde_json::from_slice(bytes).map_err(|e| {
            StudioError::format(
                source_name,
                "neurons JSON",
                format!("{e} (expected the neurons.json written by `moe-studio neurons`)"),
            )
        })?;
        if !(1..=2).contains(&r.version) {
            return Err(StudioError::format(
                source_name,
                "neurons JSON",
                format!("version {} (this build reads 1 and 2)", r.version),
            ));
        }
        if r.union_counts.len() != r.layout.num_layers() {
            return Err(StudioError::format(
                source_name,
                "neurons JSON",
                format!("{} union counts for {} layers", r.union_counts.len(), r.layout.num_layers()),
            ));
        }
        Ok(r)
    }

    /// The language codes in order.
    pub fn codes(&self) -> Vec<String> {
        self.languages.iter().map(|l| l.code.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, written the way scikit-learn does it (sort, distinct
    /// thresholds, cumulative counts).
    fn naive_ap(scores: &[f32], pos: &[bool]) -> f64 {
        let mut idx: Vec<usize> = (0..scores.len()).collect();
        idx.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap());
        let p = pos.iter().filter(|&&b| b).count() as f64;
        let (mut tp, mut prev_r, mut ap) = (0.0, 0.0, 0.0);
        for (k, &i) in idx.iter().enumerate() {
            if pos[i] {
                tp += 1.0;
            }
            let last_of_group = k + 1 == idx.len() || scores[idx[k + 1]] != scores[i];
            if last_of_group {
                let r = tp / p;
                ap += (r - prev_r) * tp / (k + 1) as f64;
                prev_r = r;
            }
        }
        ap
    }

    #[test]
    fn hand_examples() {
        // sklearn docs: average_precision_score([0,0,1,1], [0.1,0.4,0.35,0.8]) = 0.8333...
        let ap = average_precision(&[0.1, 0.4, 0.35, 0.8], &[false, false, true, true]).unwrap();
        assert!((ap - 0.833_333_333_333_333_4).abs() < 1e-15, "{ap}");
        // All tied: AP = base rate.
        let ap = average_precision(&[1.0; 4], &[true, false, false, false]).unwrap();
        assert_eq!(ap, 0.25);
        // -0.0 ties with +0.0.
        let a = average_precision(&[-0.0, 0.0, 1.0], &[true, false, false]).unwrap();
        assert_eq!(a, average_precision(&[0.0, 0.0, 1.0], &[true, false, false]).unwrap());
        assert!(average_precision(&[1.0, f32::NAN], &[true, false]).is_err());
        assert!(average_precision(&[1.0, 2.0], &[false, false]).is_err());
    }

    #[test]
    fn per_label_matches_naive_with_ties() {
        let mut state = 12345u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for trial in 0..50 {
            let n = 5 + (next() % 200) as usize;
            let levels = if trial % 2 == 0 { 4 } else { 1_000_000 };
            let scores: Vec<f32> = (0..n).map(|_| (next() % levels) as f32 * 0.25 - 0.5).collect();
            let labels: Vec<usize> = (0..n).map(|_| (next() % 3) as usize).collect();
            let mut pos = vec![0; 3];
            for &l in &labels {
                pos[l] += 1;
            }
            let mut out = vec![0.0; 3];
            average_precision_per_label(&scores, &labels, &pos, &mut out, &mut ApScratch::default());
            for c in 0..3 {
                if pos[c] == 0 {
                    assert!(out[c].is_nan());
                    continue;
                }
                let b: Vec<bool> = labels.iter().map(|&l| l == c).collect();
                let want = naive_ap(&scores, &b);
                assert!((out[c] - want).abs() < 1e-12, "trial {trial} label {c}: {} vs {want}", out[c]);
            }
        }
    }

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
