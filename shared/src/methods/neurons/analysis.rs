//! What the Average Precisions say (methods.md §3): top-N and bottom-N
//! neurons per language, per-layer counts, the union over the new
//! languages that NeuronMoE's allocation reads, layer similarities and the
//! per-expert profiles of the post-training analysis.

use serde::{Deserialize, Serialize};

use super::select::{select_by_ap, weighted_counts, Cutoff, Selection};
use super::{ApTable, ExpertRef, NeuronLayout, PooledActivations};
use crate::error::{Result, StudioError};
use crate::model::Pooling;

/// One neuron and its Average Precision for a language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeuronAp {
    /// Decoder layer.
    pub layer: usize,
    /// Linear map (one of [`COMPONENTS`](super::COMPONENTS), with an `experts.{e}.` or
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
/// fractionally ([`select`](super::select)): a count is whole when no tie reaches the
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
    /// languages, tie-weighted ([`select`](super::select)).
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
/// ([`select`](super::select); without ties, the number of distinct specific neurons).
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
