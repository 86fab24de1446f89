//! RoPE scaling settings that llama.cpp stores as per-frequency divisors
//! (`rope_freqs.weight`): Llama 3.1's frequency-dependent scaling in both
//! directions, so a GGUF file's divisors become a `config.json`
//! `rope_scaling` transformers reads, and back (transformers
//! `modeling_rope_utils._compute_llama3_parameters`; llama.cpp
//! `convert_hf_to_gguf.py` `LlamaModel.generate_extra_tensors`).

use super::RopeScaling;

/// llama.cpp's per-frequency RoPE divisors of a Llama 3.1 scaling,
/// `[head_dim / 2]` (the `rope_freqs.weight` tensor that
/// `convert_hf_to_gguf.py`'s `LlamaModel.generate_extra_tensors` writes):
/// for inverse frequency `f_i = theta^(-2i/head_dim)` with wavelength
/// `w = 2π / f_i`, the divisor is 1 when `w < old / high_freq_factor`,
/// `factor` when `w > old / low_freq_factor`, else `1 / ((1 - s) / factor + s)`
/// with `s = (old / w - low_freq_factor) / (high_freq_factor - low_freq_factor)`.
/// `inv_freq / divisor` equals transformers' `_compute_llama3_parameters`.
pub fn llama3_freq_factors(
    head_dim: usize,
    theta: f64,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position_embeddings: usize,
) -> Vec<f64> {
    let old = original_max_position_embeddings as f64;
    let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
    (0..head_dim / 2)
        .map(|i| {
            let wavelen = 2.0 * std::f64::consts::PI * theta.powf((2 * i) as f64 / head_dim as f64);
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let s = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                1.0 / ((1.0 - s) / factor + s)
            }
        })
        .collect()
}

/// The [`RopeScaling`] behind llama.cpp's per-frequency divisors
/// (`rope_freqs.weight`, `[head_dim / 2]`): [`RopeScaling::Default`] when
/// every divisor is 1, the [`RopeScaling::Llama3`] setting whose
/// [`llama3_freq_factors`] reproduce them (relative error ≤ 1e-5; GGUF does
/// not store the setting, so `low_freq_factor` 1 and `high_freq_factor` 4 —
/// Meta's values for every Llama 3.1/3.2/3.3 — are assumed and
/// `original_max_position_embeddings` is solved from a smoothed frequency,
/// else 8192), otherwise [`RopeScaling::FreqFactors`] holding them as they
/// are. The Llama 3 form is what lets a converted checkpoint's
/// `config.json` be read by transformers.
pub fn llama3_from_freq_factors(factors: &[f64], head_dim: usize, theta: f64) -> RopeScaling {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
    if factors.iter().all(|&f| close(f, 1.0)) {
        return RopeScaling::Default;
    }
    let factor = factors.iter().copied().fold(f64::MIN, f64::max);
    let (lo, hi) = (1.0, 4.0);
    let mut candidates: Vec<usize> = factors
        .iter()
        .enumerate()
        .filter(|&(_, &f)| !close(f, 1.0) && !close(f, factor))
        .filter_map(|(i, &f)| {
            let wavelen = 2.0 * std::f64::consts::PI * theta.powf((2 * i) as f64 / head_dim as f64);
            let s = (1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor);
            let old = wavelen * (lo + s * (hi - lo));
            (old.is_finite() && old >= 1.0).then(|| old.round() as usize)
        })
        .collect();
    candidates.push(8192);
    for old in candidates {
        let want = llama3_freq_factors(head_dim, theta, factor, lo, hi, old);
        if want.len() == factors.len() && want.iter().zip(factors).all(|(&w, &f)| close(f, w)) {
            return RopeScaling::Llama3 {
                factor,
                low_freq_factor: lo,
                high_freq_factor: hi,
                original_max_position_embeddings: old,
            };
        }
    }
    RopeScaling::FreqFactors { factors: factors.to_vec() }
}
