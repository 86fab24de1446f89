//! Average Precision of every neuron for every language, exactly as
//! scikit-learn's `average_precision_score` (methods.md §3).

use super::PooledActivations;
use crate::error::{Result, StudioError};

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
}
