//! Tie-aware top-N selection of language-specific neurons, the per-layer
//! counts built from it, and the warnings shown next to them
//! (docs/methods.md §3 "Language-specific neurons"; the rule and its effect
//! on SmolLM2 are in docs/neuronmoe/README.md, "Ties at the cut-off").
//!
//! The top-N by Average Precision is not defined by AP alone when neurons
//! tie at the N-th AP: with a dozen texts per language, hundreds of neurons
//! separate a language perfectly (AP = 1). No neuron of such a tie is
//! chosen by its index. The `slots` places of the N left after the neurons
//! strictly above the cut are shared by the `tied` neurons, each counting
//! `slots / tied` — its probability of being chosen under a uniformly
//! random tie-break — so every count is the expectation over all
//! tie-breaks and cannot depend on the order of the neurons. Neurons
//! strictly above the cut count 1: the exact-AP ranking (scikit-learn's)
//! decides them as before.
//!
//! Union over the new languages (`S_l`): a neuron with weights
//! `w_1 … w_k` in the languages' selections counts `1 − ∏(1 − w_i)`, the
//! probability that it is specific to at least one of them when the
//! tie-breaks of different languages are independent; that is 1 when it is
//! above the cut for any language and the old distinct count when there is
//! no tie. The bottom-N (when counted) is one more selection of the same
//! kind.
//!
//! Counts are summed per (layer, component, set of ties the neuron belongs
//! to) with integer multiplicities and then weighted, in a fixed order, so
//! that the same neurons in another order give bit-identical counts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{LayerCounts, NeuronAp, NeuronLayout, NeuronReport};

/// The tie at a top-N (or bottom-N) cut-off.
///
/// `slots` and `tied` are non-empty only when more neurons share the N-th
/// AP than places are left (`tied.len() > slots`); a tie that fits is
/// simply part of the selection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Cutoff {
    /// The AP of the N-th neuron of the ranking (0 in files written before
    /// version 2).
    pub ap: f64,
    /// Places of the N left to the tied neurons: N − (neurons strictly
    /// beyond the cut).
    pub slots: usize,
    /// Flat indices (ascending) of every neuron whose AP equals `ap`, when
    /// they are more than `slots`.
    pub tied: Vec<usize>,
}

impl Cutoff {
    /// Whether a tie crosses the cut (more tied neurons than places).
    pub fn crosses(&self) -> bool {
        self.tied.len() > self.slots
    }

    /// What each tied neuron counts: `slots / tied` (0 without a tie).
    pub fn weight(&self) -> f64 {
        if self.crosses() {
            self.slots as f64 / self.tied.len() as f64
        } else {
            0.0
        }
    }

    /// Tied neurons beyond the places left (`tied − slots`).
    pub fn left_out(&self) -> usize {
        self.tied.len().saturating_sub(self.slots)
    }
}

/// The tie-aware top-N (`highest`) or bottom-N of `ap` (one AP per flat
/// neuron index; finite values).
///
/// Returns the neurons strictly beyond the cut-off AP — best first, equal
/// APs in flat order (for display only: each counts 1) — and the
/// [`Cutoff`]. `n` is clamped to `1..=ap.len()` by the caller
/// ([`super::analyze`] refuses other values).
pub fn select_by_ap(ap: &[f64], n: usize, highest: bool) -> (Vec<usize>, Cutoff) {
    debug_assert!(n >= 1 && n <= ap.len());
    let better = |a: usize, b: usize| {
        let o = ap[a].total_cmp(&ap[b]);
        if highest {
            o.reverse()
        } else {
            o
        }
    };
    let mut order: Vec<usize> = (0..ap.len()).collect();
    order.sort_unstable_by(|&a, &b| better(a, b).then(a.cmp(&b)));
    let cut = ap[order[n - 1]];
    // The ranking is sorted, so the neurons at the cut AP are one run.
    let first = order.partition_point(|&i| better(i, order[n - 1]).is_lt());
    let last = order.partition_point(|&i| better(i, order[n - 1]).is_le());
    let slots = n - first;
    if last - first == slots {
        return (order[..n].to_vec(), Cutoff { ap: cut, slots: 0, tied: Vec::new() });
    }
    let mut tied = order[first..last].to_vec();
    tied.sort_unstable();
    (order[..first].to_vec(), Cutoff { ap: cut, slots, tied })
}

/// One language's selection (top-N or bottom-N): the neurons that count 1
/// and the tie at its cut.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    /// Neurons strictly beyond the cut.
    pub certain: &'a [NeuronAp],
    /// The tie at the cut.
    pub cut: &'a Cutoff,
}

/// Per-layer counts of the union of `sets` (see the module docs: certain
/// neurons count 1, a neuron in ties only `1 − ∏(1 − w)`), with the
/// tie-weighted part of each layer in [`LayerCounts::tie_weighted`].
pub fn weighted_counts(layout: &NeuronLayout, sets: &[Selection<'_>]) -> Vec<LayerCounts> {
    let n = layout.num_neurons();
    let segs = layout.segments();
    let mut certain = vec![false; n];
    for s in sets {
        for c in s.certain {
            certain[c.index] = true;
        }
    }
    // The ties each uncertain neuron belongs to (tie ids ascending).
    let mut member: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (id, s) in sets.iter().enumerate() {
        if s.cut.crosses() {
            for &i in &s.cut.tied {
                if !certain[i] {
                    member.entry(i).or_default().push(id);
                }
            }
        }
    }
    let weights: Vec<f64> = sets.iter().map(|s| s.cut.weight()).collect();
    let mut groups: BTreeMap<(usize, usize, Vec<usize>), usize> = BTreeMap::new();
    for (i, sig) in member {
        let p = NeuronLayout::locate_in(&segs, i).expect("index in range");
        *groups.entry((p.layer, p.slot, sig)).or_default() += 1;
    }
    let mut tie_part: Vec<Vec<f64>> = layout.layers.iter().map(|c| vec![0.0; c.len()]).collect();
    for ((l, s, sig), count) in groups {
        let miss: f64 = sig.iter().map(|&id| 1.0 - weights[id]).product();
        tie_part[l][s] += count as f64 * (1.0 - miss);
    }
    let mut counts: Vec<LayerCounts> = layout
        .layers
        .iter()
        .map(|c| LayerCounts { per_component: vec![0.0; c.len()], total: 0.0, tie_weighted: 0.0 })
        .collect();
    for &(start, l, s, units) in &segs {
        let sure = certain[start..start + units].iter().filter(|&&b| b).count();
        counts[l].per_component[s] = sure as f64 + tie_part[l][s];
    }
    for (c, t) in counts.iter_mut().zip(&tie_part) {
        c.total = c.per_component.iter().sum();
        c.tie_weighted = t.iter().sum();
    }
    counts
}

// ---------------------------------------------------------------------------
// Warnings

/// A tie that decides more than this share of the N places gets the advice
/// to give more texts or a smaller N.
pub const TIE_SHARE: f64 = 0.05;

/// A language needs enough texts that the neurons expected to separate it
/// perfectly by chance stay below this share of N
/// ([`chance_perfect_neurons`]).
pub const CHANCE_SHARE: f64 = 0.01;

/// `ln C(n, k)`.
fn ln_binomial(n: usize, k: usize) -> f64 {
    let k = k.min(n - k);
    (1..=k).map(|i| ((n - k + i) as f64 / i as f64).ln()).sum()
}

/// The expected number of neurons, out of `neurons`, that rank all
/// `positives` texts of a language above its `negatives` by chance alone —
/// AP = 1 for a neuron unrelated to the language: a random order of the
/// texts puts the positives first with probability `1 / C(p + q, p)`, so
/// `neurons / C(p + q, p)`.
pub fn chance_perfect_neurons(neurons: usize, positives: usize, negatives: usize) -> f64 {
    if positives == 0 || negatives == 0 {
        return neurons as f64;
    }
    neurons as f64 * (-ln_binomial(positives + negatives, positives)).exp()
}

/// The fewest texts per language (every one of `languages` languages with
/// as many) for which [`chance_perfect_neurons`] is at most
/// [`CHANCE_SHARE`] · `top_n`.
pub fn min_texts_per_language(neurons: usize, languages: usize, top_n: usize) -> usize {
    let languages = languages.max(2);
    let limit = CHANCE_SHARE * top_n.max(1) as f64;
    (2..10_000).find(|&k| chance_perfect_neurons(neurons, k, (languages - 1) * k) <= limit).unwrap_or(10_000)
}

/// What a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// A tie at the top-N (or bottom-N) cut decides more than
    /// [`TIE_SHARE`] of the N places.
    Tie,
    /// Too few texts for the AP to tell specific neurons from chance
    /// ([`CHANCE_SHARE`]).
    FewTexts,
}

/// One warning about a language's specific neurons; the CLI prints
/// `message`, the browser shows it above the charts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeuronWarning {
    /// Language code.
    pub language: String,
    /// What it is about.
    pub kind: WarningKind,
    /// Whether the language is one of the new languages (its neurons drive
    /// the allocation).
    pub affects_allocation: bool,
    /// The sentence to show.
    pub message: String,
}

fn tie_message(code: &str, what: &str, n: usize, cut: &Cutoff) -> String {
    format!(
        "`{code}`: {} neurons tie at the {what}-{n} cut-off (AP {:.4}) for the {} places left, so each counts \
         {}/{} = {:.3}; the tie decides {:.0}% of the {what}-{n}. Give more texts per language or a smaller N.",
        cut.tied.len(),
        cut.ap,
        cut.slots,
        cut.slots,
        cut.tied.len(),
        cut.weight(),
        100.0 * cut.slots as f64 / n as f64
    )
}

impl NeuronReport {
    /// The warnings of this analysis: ties that decide more than
    /// [`TIE_SHARE`] of the top-N (and of the bottom-N when it counts), and
    /// languages with too few texts ([`min_texts_per_language`]); new
    /// languages first.
    pub fn warnings(&self) -> Vec<NeuronWarning> {
        self.warnings_for(&self.new_languages)
    }

    /// [`NeuronReport::warnings`] with `new` as the new languages (as
    /// `allocate --new` overrides them).
    pub fn warnings_for(&self, new: &[String]) -> Vec<NeuronWarning> {
        let neurons = self.layout.num_neurons();
        let total: usize = self.languages.iter().map(|l| l.texts).sum();
        let mut out = Vec::new();
        for l in &self.languages {
            let new = new.contains(&l.code);
            let scope = if new { "" } else { " (not a new language: the allocation does not use it)" };
            let mut cuts = vec![("top", &l.top_cut)];
            if self.include_bottom {
                cuts.push(("bottom", &l.bottom_cut));
            }
            for (what, cut) in cuts {
                if cut.crosses() && cut.slots as f64 > TIE_SHARE * self.top_n as f64 {
                    out.push(NeuronWarning {
                        language: l.code.clone(),
                        kind: WarningKind::Tie,
                        affects_allocation: new,
                        message: format!("{}{scope}", tie_message(&l.code, what, self.top_n, cut)),
                    });
                }
            }
            let chance = chance_perfect_neurons(neurons, l.texts, total - l.texts);
            if chance > CHANCE_SHARE * self.top_n as f64 {
                let k = min_texts_per_language(neurons, self.languages.len(), self.top_n);
                out.push(NeuronWarning {
                    language: l.code.clone(),
                    kind: WarningKind::FewTexts,
                    affects_allocation: new,
                    message: format!(
                        "`{}`: {} of {total} texts are too few for the Average Precision: a neuron unrelated to \
                         the language ranks them all first with probability 1/C({total}, {}), so {:.1} of the \
                         {neurons} neurons are expected to reach AP = 1 by chance (more than {}% of N = {}). \
                         Give at least {k} texts per language{scope}.",
                        l.code,
                        l.texts,
                        l.texts,
                        chance,
                        CHANCE_SHARE * 100.0,
                        self.top_n
                    ),
                });
            }
        }
        out.sort_by_key(|w| !w.affects_allocation);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::neurons::ComponentUnits;

    #[test]
    fn selection_splits_at_the_tie() {
        // AP: 0.9 (1), 0.8 (3, 4, 6), 0.5 (rest). Top-3: neuron 1 certain,
        // 2 places for 3 tied.
        let ap = [0.5, 0.9, 0.5, 0.8, 0.8, 0.5, 0.8];
        let (certain, cut) = select_by_ap(&ap, 3, true);
        assert_eq!(certain, vec![1]);
        assert_eq!(cut, Cutoff { ap: 0.8, slots: 2, tied: vec![3, 4, 6] });
        assert!((cut.weight() - 2.0 / 3.0).abs() < 1e-15);
        assert_eq!(cut.left_out(), 1);
        // Top-4: the tie fits.
        let (certain, cut) = select_by_ap(&ap, 4, true);
        assert_eq!(certain, vec![1, 3, 4, 6]);
        assert!(!cut.crosses() && cut.ap == 0.8);
        // Bottom-2 of four 0.5s.
        let (certain, cut) = select_by_ap(&ap, 2, false);
        assert!(certain.is_empty());
        assert_eq!((cut.slots, cut.tied.clone()), (2, vec![0, 2, 5]));
        // N = all neurons: no tie.
        let (certain, cut) = select_by_ap(&ap, 7, true);
        assert_eq!(certain.len(), 7);
        assert!(!cut.crosses());
    }

    fn na(index: usize) -> NeuronAp {
        NeuronAp { layer: 0, component: String::new(), unit: 0, index, ap: 1.0 }
    }

    #[test]
    fn union_weights_combine_as_probabilities() {
        // Two layers of 4 one-component units.
        let layout = NeuronLayout {
            layers: (0..2).map(|_| vec![ComponentUnits { component: "q_proj".into(), units: 4 }]).collect(),
            frozen_experts: Vec::new(),
        };
        let a_certain = [na(0)];
        let a_cut = Cutoff { ap: 1.0, slots: 1, tied: vec![1, 4] }; // w = 1/2
        let b_certain = [na(1)];
        let b_cut = Cutoff { ap: 1.0, slots: 1, tied: vec![4, 5, 6, 7] }; // w = 1/4
        let c = weighted_counts(
            &layout,
            &[Selection { certain: &a_certain, cut: &a_cut }, Selection { certain: &b_certain, cut: &b_cut }],
        );
        // Layer 0: 0 and 1 certain (1 is tied for a but certain for b) -> 2.
        assert_eq!((c[0].total, c[0].tie_weighted), (2.0, 0.0));
        // Layer 1: 4 in both ties: 1 - (1/2)(3/4) = 5/8; 5, 6, 7: 1/4 each.
        assert_eq!(c[1].tie_weighted, 0.625 + 0.75);
        assert_eq!(c[1].total, 1.375);
        // Each language alone sums to its N.
        let a = weighted_counts(&layout, &[Selection { certain: &a_certain, cut: &a_cut }]);
        assert_eq!(a.iter().map(|c| c.total).sum::<f64>(), 2.0);
    }

    #[test]
    fn chance_rule() {
        // C(4, 2) = 6; C(39, 13) = 8_122_425_444.
        assert!((chance_perfect_neurons(600, 2, 2) - 100.0).abs() < 1e-9);
        let e = chance_perfect_neurons(155_520, 13, 26);
        assert!((e - 155_520.0 / 8_122_425_444.0).abs() < 1e-12, "{e}");
        // SmolLM2 (155,520 neurons), 3 languages, N = 100: C(3k, k) >= 155,520
        // first at k = 8 (C(24, 8) = 735,471; C(21, 7) = 116,280).
        assert_eq!(min_texts_per_language(155_520, 3, 100), 8);
        // 2 languages: C(20, 10) = 184,756 >= 155,520 > C(18, 9) = 48,620.
        assert_eq!(min_texts_per_language(155_520, 2, 100), 10);
    }
}
