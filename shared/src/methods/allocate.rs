//! NeuronMoE's per-layer expert allocation (methods.md §3) and its two
//! baselines, written as the allocation file `upcycle --allocation` reads
//! ([`super::allocation`], key `new_experts_per_layer`).
//!
//! - NeuronMoE: with `S_l` the distinct specific neurons of layer `l` (union
//!   over the new languages, [`super::neurons::union_counts`]), `S_min` the
//!   smallest non-zero `S_l` and `S_max` the largest,
//!   `E_l = E_min + floor((S_l − S_min) / (S_max − S_min) · (E_max − E_min))`,
//!   clamped to `[E_min, E_max]`; `S_l = 0` gives `E_min`. When
//!   `S_max == S_min` every layer gets `E_min` (every non-zero layer is an
//!   `S_min` layer, which the formula maps to `E_min`). `S_l` may be
//!   fractional: neurons tied at the top-N cut-off count `slots / tied`
//!   ([`super::neurons::select`]). `S_min` is then the smallest positive
//!   `S_l`, however small (a layer reached only by a tie is a non-zero
//!   layer), and the quotient is computed in f64 and floored after adding
//!   1e-9, so that a quotient that is an integer up to rounding counts as
//!   that integer. For whole counts this is the exact integer result: the
//!   product `(S_l − S_min) · (E_max − E_min)` is exact, the division is
//!   correctly rounded (an integer quotient comes out exact), and a
//!   non-integer quotient is at least `1 / (S_max − S_min)` away from the
//!   next integer, far more than 1e-9 for any real neuron count.
//! - Uniform: the same count in every layer, with **exactly** NeuronMoE's
//!   total by default ([`uniform_with_total`]: `floor(T / L)` everywhere and
//!   one more in `T mod L` evenly spaced layers), so the two differ only in
//!   where the experts go — methods.md's claim is "cut the added parameters
//!   ... at equal quality", a comparison at a matched budget; an explicit
//!   per-layer count can still be given.
//! - Shuffled and inverted (placement controls, issue 35 item 5): NeuronMoE's
//!   own counts — the same multiset, so the same total and the same
//!   parameters — placed at random ([`shuffled_allocation`], seeded) or in
//!   the reverse order of `S_l` ([`inverted_allocation`]: the layer with the
//!   most specific neurons gets the fewest experts). If NeuronMoE's claim is
//!   about placement, not capacity, both should do worse than NeuronMoE.
//! - LayerMoE-style (after LayerMoE, "Less, but Better", ACL 2025): per
//!   layer, the mean cosine similarity between each new language's and each
//!   original language's mean hidden state ([`layermoe_similarity`]); more
//!   similar layers get fewer experts:
//!   `E_l = E_min + floor((sim_max − sim_l) / (sim_max − sim_min) · (E_max − E_min))`
//!   (`E_min` everywhere when all similarities are equal).

use serde::{Deserialize, Serialize};

use super::allocation::AllocationFile;
use super::neurons::{union_counts, LayerSimilarity, NeuronReport};
use crate::error::{Result, StudioError};

/// The allowed new experts per layer, `[E_min, E_max]` (reference 1 and 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertRange {
    /// `E_min`.
    pub min: usize,
    /// `E_max`.
    pub max: usize,
}

impl ExpertRange {
    /// A checked range.
    ///
    /// # Errors
    /// [`StudioError::Config`] when `min > max`.
    pub fn new(min: usize, max: usize) -> Result<Self> {
        if min > max {
            return Err(StudioError::config(
                "arguments",
                format!("E_min ({min}) is greater than E_max ({max}): give --min <= --max"),
            ));
        }
        Ok(ExpertRange { min, max })
    }
}

/// NeuronMoE's `E_l` from the per-layer counts `S_l` (see the module docs;
/// fractional counts come from ties at the top-N cut-off).
///
/// # Errors
/// As [`ExpertRange::new`]; [`StudioError::Invalid`] for no layers or a
/// negative or non-finite count.
pub fn neuronmoe_allocation(counts: &[f64], range: ExpertRange) -> Result<Vec<usize>> {
    let range = ExpertRange::new(range.min, range.max)?;
    if counts.is_empty() {
        return Err(StudioError::Invalid("no layers to allocate experts to".into()));
    }
    if let Some(l) = counts.iter().position(|s| !s.is_finite() || *s < 0.0) {
        return Err(StudioError::Invalid(format!(
            "layer {l}: specific-neuron count {} (expected a finite count >= 0)",
            counts[l]
        )));
    }
    let s_max = counts.iter().copied().fold(0.0, f64::max);
    let Some(s_min) = counts.iter().copied().filter(|&s| s > 0.0).min_by(f64::total_cmp) else {
        return Ok(vec![range.min; counts.len()]);
    };
    let span = (range.max - range.min) as f64;
    Ok(counts
        .iter()
        .map(|&s| {
            if s == 0.0 || s_max == s_min {
                return range.min;
            }
            let extra = ((s - s_min) * span / (s_max - s_min) + 1e-9).floor() as usize;
            (range.min + extra).clamp(range.min, range.max)
        })
        .collect())
}

/// The uniform baseline: `experts` new experts in each of `num_layers`
/// layers.
pub fn uniform_allocation(num_layers: usize, experts: usize) -> Vec<usize> {
    vec![experts; num_layers]
}

/// A uniform allocation of exactly `total` new experts over `num_layers`
/// layers: `floor(total / L)` in every layer and one more in `total mod L`
/// layers spaced evenly (layer `floor((i + 1/2) · L / r)` for `i < r`),
/// each clamped to `range` (which can only move the total when `range`
/// cannot hold it).
pub fn uniform_with_total(num_layers: usize, total: usize, range: ExpertRange) -> Vec<usize> {
    if num_layers == 0 {
        return Vec::new();
    }
    let (base, rem) = (total / num_layers, total % num_layers);
    let mut e = vec![base; num_layers];
    for i in 0..rem {
        e[((2 * i + 1) * num_layers) / (2 * rem)] += 1;
    }
    e.into_iter().map(|x| x.clamp(range.min, range.max)).collect()
}

/// `counts` (a multiset of per-layer counts) placed so that the layer with
/// the largest `key` gets the largest count, the next the next, ... (ties
/// in `key` broken by layer index, ascending).
fn place_by(counts: &[usize], key: &[f64]) -> Vec<usize> {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut order: Vec<usize> = (0..key.len()).collect();
    order.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
    let mut out = vec![0; key.len()];
    for (rank, &l) in order.iter().enumerate() {
        out[l] = sorted[rank];
    }
    out
}

/// NeuronMoE's counts `neuronmoe` placed in the reverse order of the
/// specific-neuron counts `specific` (`S_l`): the layer with the most
/// specific neurons gets the smallest count (a placement control: same
/// multiset, same total).
pub fn inverted_allocation(neuronmoe: &[usize], specific: &[f64]) -> Vec<usize> {
    place_by(neuronmoe, &specific.iter().map(|s| -s).collect::<Vec<_>>())
}

/// NeuronMoE's counts permuted across layers by a Fisher-Yates shuffle
/// seeded with `seed` ([`crate::train::data::SplitMix64`]): a placement
/// control with the same multiset and total.
pub fn shuffled_allocation(neuronmoe: &[usize], seed: u64) -> Vec<usize> {
    let mut v = neuronmoe.to_vec();
    let mut r = crate::train::data::SplitMix64::new(seed ^ 0x6e65_7572_6f6e_6d6f);
    for i in (1..v.len()).rev() {
        let j = r.below(i + 1);
        v.swap(i, j);
    }
    v
}

/// The LayerMoE-style allocation from per-layer similarities (higher = more
/// similar = fewer experts); see the module docs.
///
/// # Errors
/// As [`ExpertRange::new`]; [`StudioError::Invalid`] for no layers or a
/// non-finite similarity.
pub fn layermoe_allocation(similarity: &[f64], range: ExpertRange) -> Result<Vec<usize>> {
    let range = ExpertRange::new(range.min, range.max)?;
    if similarity.is_empty() {
        return Err(StudioError::Invalid("no layers to allocate experts to".into()));
    }
    if let Some(l) = similarity.iter().position(|s| !s.is_finite()) {
        return Err(StudioError::Invalid(format!("layer {l}: similarity {} is not finite", similarity[l])));
    }
    let hi = similarity.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lo = similarity.iter().copied().fold(f64::INFINITY, f64::min);
    let span = (range.max - range.min) as f64;
    Ok(similarity
        .iter()
        .map(|&s| {
            if hi == lo {
                return range.min;
            }
            let extra = ((hi - s) / (hi - lo) * span).floor().max(0.0) as usize;
            (range.min + extra).clamp(range.min, range.max)
        })
        .collect())
}

/// Per layer, the mean over (new, original) language pairs of the cosine
/// similarity of their mean hidden states; the original languages are
/// those of `sim` not in `new`.
///
/// # Errors
/// [`StudioError::Invalid`] for an empty `new`, a code `sim` lacks, or no
/// original language left.
pub fn layermoe_similarity(sim: &LayerSimilarity, new: &[String]) -> Result<Vec<f64>> {
    if new.is_empty() {
        return Err(StudioError::Invalid("no new languages given".into()));
    }
    let idx = |c: &String| {
        sim.languages.iter().position(|x| x == c).ok_or_else(|| {
            StudioError::Invalid(format!("language `{c}` is not in the analysis ({})", sim.languages.join(", ")))
        })
    };
    let new_idx: Vec<usize> = new.iter().map(idx).collect::<Result<_>>()?;
    let old_idx: Vec<usize> = (0..sim.languages.len()).filter(|i| !new_idx.contains(i)).collect();
    if old_idx.is_empty() {
        return Err(StudioError::Invalid(format!(
            "the LayerMoE baseline compares new languages with original ones, but every analysed language ({}) is new",
            sim.languages.join(", ")
        )));
    }
    Ok(sim
        .cosine
        .iter()
        .map(|m| {
            let mut s = 0.0;
            for &a in &new_idx {
                for &b in &old_idx {
                    s += m[a][b];
                }
            }
            s / (new_idx.len() * old_idx.len()) as f64
        })
        .collect())
}

/// Which allocation a file carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocationMethod {
    /// From specific-neuron counts.
    NeuronMoe,
    /// Same count everywhere.
    Uniform,
    /// From hidden-state similarity.
    LayerMoe,
    /// NeuronMoE's counts permuted at random.
    Shuffled,
    /// NeuronMoE's counts in the reverse order of `S_l`.
    Inverted,
    /// NeuronMoE's counts placed by LayerMoE's dissimilarity order.
    LayerMoePlaced,
}

impl AllocationMethod {
    /// The name written to the file's `method`.
    pub fn name(self) -> &'static str {
        match self {
            AllocationMethod::NeuronMoe => "neuronmoe",
            AllocationMethod::Uniform => "uniform",
            AllocationMethod::LayerMoe => "layermoe",
            AllocationMethod::Shuffled => "shuffled",
            AllocationMethod::Inverted => "inverted",
            AllocationMethod::LayerMoePlaced => "layermoe-placed",
        }
    }

    /// Every method, in the order `allocate --baseline` lists them.
    pub const ALL: [AllocationMethod; 6] = [
        AllocationMethod::NeuronMoe,
        AllocationMethod::Uniform,
        AllocationMethod::LayerMoe,
        AllocationMethod::Shuffled,
        AllocationMethod::Inverted,
        AllocationMethod::LayerMoePlaced,
    ];

    /// The method named `name` ([`AllocationMethod::name`]).
    pub fn parse(name: &str) -> Option<AllocationMethod> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// The three allocations side by side for one analysis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocationComparison {
    /// `[E_min, E_max]`.
    pub range: ExpertRange,
    /// New languages of the union.
    pub new_languages: Vec<String>,
    /// Original languages (the others analysed).
    pub original_languages: Vec<String>,
    /// `S_l` per layer (tie-weighted, so possibly fractional).
    pub specific_counts: Vec<f64>,
    /// NeuronMoE `E_l`.
    pub neuronmoe: Vec<usize>,
    /// Uniform `E_l`.
    pub uniform: Vec<usize>,
    /// LayerMoE-style similarity per layer (`None` without original
    /// languages).
    pub layermoe_similarity: Option<Vec<f64>>,
    /// LayerMoE-style `E_l`.
    pub layermoe: Option<Vec<usize>>,
    /// NeuronMoE's `E_l` shuffled across layers ([`shuffled_allocation`]).
    #[serde(default)]
    pub shuffled: Vec<usize>,
    /// NeuronMoE's `E_l` in reverse `S_l` order ([`inverted_allocation`]).
    #[serde(default)]
    pub inverted: Vec<usize>,
    /// NeuronMoE's `E_l` placed by LayerMoE's order: the least similar layer
    /// gets the largest count (`None` without original languages).
    #[serde(default)]
    pub layermoe_placed: Option<Vec<usize>>,
}

impl AllocationComparison {
    /// The allocation of `method`.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for LayerMoE without original languages.
    pub fn get(&self, method: AllocationMethod) -> Result<&[usize]> {
        fn layermoe(v: &Option<Vec<usize>>) -> Result<&[usize]> {
            v.as_deref().ok_or_else(|| {
                StudioError::Invalid(
                    "the LayerMoE baseline needs at least one original (non-new) language in the analysis".into(),
                )
            })
        }
        match method {
            AllocationMethod::NeuronMoe => Ok(&self.neuronmoe),
            AllocationMethod::Uniform => Ok(&self.uniform),
            AllocationMethod::LayerMoe => layermoe(&self.layermoe),
            AllocationMethod::Shuffled => Ok(&self.shuffled),
            AllocationMethod::Inverted => Ok(&self.inverted),
            AllocationMethod::LayerMoePlaced => layermoe(&self.layermoe_placed),
        }
    }

    /// Re-draws [`AllocationComparison::shuffled`] with another seed.
    pub fn reshuffle(&mut self, seed: u64) {
        self.shuffled = shuffled_allocation(&self.neuronmoe, seed);
    }

    /// The allocation file of `method` (new experts per layer) with a
    /// comment giving the totals.
    ///
    /// # Errors
    /// As [`AllocationComparison::get`].
    pub fn file(&self, method: AllocationMethod) -> Result<AllocationFile> {
        let e = self.get(method)?;
        let total = |v: &[usize]| v.iter().sum::<usize>();
        let mut comment = format!(
            "{} new experts per layer for new languages {} (E in [{}, {}]); totals: neuronmoe {}, uniform {}",
            method.name(),
            self.new_languages.join(","),
            self.range.min,
            self.range.max,
            total(&self.neuronmoe),
            total(&self.uniform)
        );
        if let Some(l) = &self.layermoe {
            comment.push_str(&format!(", layermoe {}", total(l)));
        }
        Ok(AllocationFile {
            experts_per_layer: None,
            new_experts_per_layer: Some(e.iter().map(|&x| Some(x)).collect()),
            method: Some(method.name().to_string()),
            comment: Some(comment),
        })
    }
}

/// Computes all three allocations from a neurons report.
///
/// `new` overrides the report's new languages (the union is recomputed);
/// `uniform` is the per-layer count of the uniform baseline; `None` gives
/// exactly NeuronMoE's total ([`uniform_with_total`]). The shuffled
/// control uses seed 0 ([`AllocationComparison::reshuffle`] for others).
///
/// # Errors
/// As [`ExpertRange::new`] and [`union_counts`]; [`StudioError::Invalid`]
/// for the report of an MoE model (the post-training analysis, methods.md
/// §3.7: its counts include every expert copy, not a dense model's `S_l`).
pub fn compare_allocations(
    report: &NeuronReport,
    new: Option<&[String]>,
    range: ExpertRange,
    uniform: Option<usize>,
) -> Result<AllocationComparison> {
    if report.layout.layers.iter().flatten().any(|c| c.expert().is_some()) {
        return Err(StudioError::Invalid(
            "this neurons report is of an MoE model (its counts include every expert's neurons, methods.md §3.7); \
             NeuronMoE's allocation reads the dense model's: run `neurons` on the dense model before upcycling"
                .into(),
        ));
    }
    let range = ExpertRange::new(range.min, range.max)?;
    let new: Vec<String> = new.map(<[String]>::to_vec).unwrap_or_else(|| report.new_languages.clone());
    let counts: Vec<f64> = union_counts(report, &new)?.iter().map(|c| c.total).collect();
    let neuronmoe = neuronmoe_allocation(&counts, range)?;
    let original: Vec<String> = report.codes().into_iter().filter(|c| !new.contains(c)).collect();
    let (sim, layermoe, placed) = if original.is_empty() {
        (None, None, None)
    } else {
        let s = layermoe_similarity(&report.similarity, &new)?;
        let e = layermoe_allocation(&s, range)?;
        let placed = place_by(&neuronmoe, &s.iter().map(|x| -x).collect::<Vec<_>>());
        (Some(s), Some(e), Some(placed))
    };
    let total: usize = neuronmoe.iter().sum();
    Ok(AllocationComparison {
        range,
        new_languages: new,
        original_languages: original,
        uniform: match uniform {
            Some(n) => uniform_allocation(counts.len(), n),
            None => uniform_with_total(counts.len(), total, range),
        },
        shuffled: shuffled_allocation(&neuronmoe, 0),
        inverted: inverted_allocation(&neuronmoe, &counts),
        specific_counts: counts,
        neuronmoe,
        layermoe_similarity: sim,
        layermoe,
        layermoe_placed: placed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(a: usize, b: usize) -> ExpertRange {
        ExpertRange::new(a, b).unwrap()
    }

    fn f(v: &[u32]) -> Vec<f64> {
        v.iter().map(|&x| f64::from(x)).collect()
    }

    #[test]
    fn formula_by_hand() {
        // S = [0, 10, 20, 30, 110]: S_min = 10, S_max = 110, E in [1, 6].
        // 10 -> 1; 20 -> 1 + floor(10/100*5) = 1; 30 -> 1 + floor(1.0) = 2; 110 -> 6.
        assert_eq!(neuronmoe_allocation(&f(&[0, 10, 20, 30, 110]), r(1, 6)).unwrap(), vec![1, 1, 1, 2, 6]);
        // Exact floor at boundaries: (S - S_min)/(S_max - S_min) * 5 = 3 exactly.
        assert_eq!(neuronmoe_allocation(&f(&[1, 61, 101]), r(1, 6)).unwrap(), vec![1, 4, 6]);
    }

    #[test]
    fn edge_cases() {
        // All zero: E_min everywhere.
        assert_eq!(neuronmoe_allocation(&f(&[0, 0, 0]), r(1, 6)).unwrap(), vec![1, 1, 1]);
        // S_max == S_min: E_min everywhere.
        assert_eq!(neuronmoe_allocation(&f(&[0, 7, 7]), r(1, 6)).unwrap(), vec![1, 1, 1]);
        // Single layer.
        assert_eq!(neuronmoe_allocation(&f(&[5]), r(2, 4)).unwrap(), vec![2]);
        // E_min == E_max.
        assert_eq!(neuronmoe_allocation(&f(&[0, 3, 900]), r(3, 3)).unwrap(), vec![3, 3, 3]);
        // E_min = 0 allowed.
        assert_eq!(neuronmoe_allocation(&f(&[1, 2]), r(0, 2)).unwrap(), vec![0, 2]);
        let e = ExpertRange::new(6, 1).unwrap_err().to_string();
        assert!(e.contains("E_min (6) is greater than E_max (1)"), "{e}");
        let e = neuronmoe_allocation(&f(&[1, 2]), ExpertRange { min: 6, max: 1 }).unwrap_err().to_string();
        assert!(e.contains("E_min (6)"), "{e}");
        assert!(neuronmoe_allocation(&f(&[]), r(1, 6)).is_err());
    }

    #[test]
    fn fractional_counts() {
        // Tie-weighted counts: S_min = 0.25 (a layer reached only by a tie),
        // S_max = 10.25. 5.25 -> 1 + floor(5/10*5) = 3 (exactly 2.5 -> 2);
        // 8.25 -> 1 + floor(4) = 5, an integer quotient from fractions.
        let e = neuronmoe_allocation(&[0.0, 0.25, 5.25, 8.25, 10.25], r(1, 6)).unwrap();
        assert_eq!(e, vec![1, 1, 3, 5, 6]);
        // A quotient that is an integer only up to rounding: S_max = 0.1 + 0.2
        // (0.30000000000000004), S_min 0.1; the layer with S = 0.3 is S_max
        // up to rounding: 4.999999999999998 in f64, which counts as 5 -> 6
        // (a plain floor gives 5).
        let e = neuronmoe_allocation(&[0.1, 0.1 + 0.2, 0.3, 0.2], r(1, 6)).unwrap();
        assert_eq!(e, vec![1, 6, 6, 3]);
        let err = neuronmoe_allocation(&[1.0, f64::NAN], r(1, 6)).unwrap_err().to_string();
        assert!(err.contains("layer 1") && err.contains("NaN"), "{err}");
        assert!(neuronmoe_allocation(&[-1.0, 2.0], r(1, 6)).is_err());
    }

    #[test]
    fn layermoe_inverts_similarity() {
        let e = layermoe_allocation(&[0.9, 0.5, 0.7, 0.99], r(1, 6)).unwrap();
        // sim_max 0.99, sim_min 0.5: 0.9 -> 1 + floor(0.09/0.49*5) = 1; 0.5 -> 6;
        // 0.7 -> 1 + floor(0.29/0.49*5) = 3; 0.99 -> 1.
        assert_eq!(e, vec![1, 6, 3, 1]);
        assert_eq!(layermoe_allocation(&[0.5, 0.5], r(1, 6)).unwrap(), vec![1, 1]);
        assert!(layermoe_allocation(&[f64::NAN], r(1, 6)).is_err());
    }

    #[test]
    fn similarity_pairs() {
        let sim = LayerSimilarity {
            languages: vec!["en".into(), "hu".into(), "el".into()],
            cosine: vec![vec![vec![1.0, 0.8, 0.6], vec![0.8, 1.0, 0.5], vec![0.6, 0.5, 1.0]]],
        };
        let s = layermoe_similarity(&sim, &["hu".into(), "el".into()]).unwrap();
        assert!((s[0] - 0.7).abs() < 1e-12);
        let e = layermoe_similarity(&sim, &["en".into(), "hu".into(), "el".into()]).unwrap_err().to_string();
        assert!(e.contains("every analysed language"), "{e}");
        assert!(layermoe_similarity(&sim, &["xx".into()]).is_err());
    }

    #[test]
    fn placement_controls_keep_the_multiset() {
        let e = [6, 1, 1, 2, 4];
        let s = [500.0, 10.0, 12.0, 40.0, 300.0];
        // Inverted: the most specific layer (0) gets the smallest count, ...
        assert_eq!(inverted_allocation(&e, &s), vec![1, 6, 4, 2, 1]);
        let sh = shuffled_allocation(&e, 3);
        let mut a = sh.clone();
        a.sort();
        assert_eq!(a, vec![1, 1, 2, 4, 6]);
        assert_eq!(shuffled_allocation(&e, 3), sh, "seeded");
        assert_ne!(
            (0..8).map(|k| shuffled_allocation(&e, k)).collect::<Vec<_>>().iter().filter(|x| **x == e).count(),
            8
        );
        // Uniform with exactly the total: 14 over 5 layers = 2,3,3,3,3 spread.
        let u = uniform_with_total(5, 14, r(1, 6));
        assert_eq!(u.iter().sum::<usize>(), 14);
        assert!(u.iter().all(|&x| x == 2 || x == 3), "{u:?}");
        assert_eq!(uniform_with_total(30, 51, r(1, 6)).iter().sum::<usize>(), 51);
        assert_eq!(uniform_with_total(4, 8, r(1, 6)), vec![2, 2, 2, 2]);
        for m in AllocationMethod::ALL {
            assert_eq!(AllocationMethod::parse(m.name()), Some(m));
        }
    }
}
