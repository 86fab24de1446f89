//! Rotary position embedding (RoPE), Hugging Face "rotate_half" convention.
//!
//! Source: Su et al., "RoFormer" (2021), §3.4; frequency scaling as in
//! transformers `modeling_rope_utils.py` (`default`, `linear`, `llama3`);
//! llama.cpp's per-frequency factors (`rope_freqs.weight`, what its
//! `convert_hf_to_gguf.py` writes for a `llama3` scaling) as
//! [`RopeScaling::FreqFactors`], with [`crate::config::rope::llama3_freq_factors`] /
//! [`crate::config::rope::llama3_from_freq_factors`] converting between the two forms.
//! llama2.c and llama.cpp use the interleaved convention; their loaders
//! permute q/k weights into this layout.

use burn::tensor::{backend::Backend, Tensor, TensorData};

use crate::config::{ModelConfig, RopeScaling};

/// Inverse frequencies of RoPE for one head, `[head_dim / 2]`, after
/// scaling.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
    head_dim: usize,
    /// LongRoPE: the inverse frequencies for positions at or past
    /// `original` (long factors), `original`, and the cos/sin scale.
    long: Option<(Vec<f64>, usize, f64)>,
}

impl Rope {
    /// Builds the inverse frequencies `theta^(-2i/head_dim)` and applies the
    /// configured scaling.
    pub fn new(config: &ModelConfig) -> Self {
        let hd = config.head_dim;
        let base = config.rope_theta;
        let mut inv_freq: Vec<f64> = (0..hd / 2).map(|i| 1.0 / base.powf((2 * i) as f64 / hd as f64)).collect();
        match &config.rope_scaling {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let old = *original_max_position_embeddings as f64;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::FreqFactors { factors } => {
                inv_freq.iter_mut().zip(factors).for_each(|(f, d)| *f /= d);
            }
            RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, attention_factor } => {
                let long = inv_freq.iter().zip(long_factor).map(|(f, d)| f / d).collect();
                inv_freq.iter_mut().zip(short_factor).for_each(|(f, d)| *f /= d);
                let long = Some((long, *original_max_position_embeddings, *attention_factor));
                return Rope { inv_freq, head_dim: hd, long };
            }
        }
        Rope { inv_freq, head_dim: hd, long: None }
    }

    /// The RoPE of the sliding-window layers when the family gives them their
    /// own base (Gemma 3's `rope_local_base_freq`: unscaled, base
    /// [`crate::config::family::FamilyParams::rope_local_theta`]), else `None`
    /// (every layer uses [`Rope::new`]).
    pub fn local(config: &ModelConfig) -> Option<Self> {
        let theta = config.family_params.rope_local_theta?;
        let c = ModelConfig { rope_theta: theta, rope_scaling: RopeScaling::Default, ..config.clone() };
        Some(Rope::new(&c))
    }

    /// Tables for positions `start..start+len` (see [`RopeTables`]).
    pub fn tables<B: Backend>(&self, start: usize, len: usize, device: &B::Device) -> RopeTables<B> {
        let hd = self.head_dim;
        let half = hd / 2;
        let mut cos = Vec::with_capacity(len * hd);
        let mut sin = Vec::with_capacity(len * hd);
        // LongRoPE: long factors once the call reaches `original` (its last
        // position is `start + len - 1`), and cos/sin scaled.
        let (inv_freq, scale) = match &self.long {
            Some((long, original, a)) if start + len > *original => (long, *a as f32),
            Some((_, _, a)) => (&self.inv_freq, *a as f32),
            None => (&self.inv_freq, 1.0f32),
        };
        for p in start..start + len {
            // f32 arithmetic mirrors transformers (positions and inv_freq in f32).
            let row: Vec<f32> = inv_freq.iter().map(|f| (p as f32) * (*f as f32)).collect();
            for _ in 0..2 {
                cos.extend(row.iter().map(|a| a.cos() * scale));
            }
            // rotate_half(x) = [-x2, x1], so rotate_half(x) * sin =
            // [x2, x1] * [-sin, sin]: the sign lives in the table.
            sin.extend(row.iter().map(|a| -a.sin() * scale));
            sin.extend(row.iter().map(|a| a.sin() * scale));
        }
        debug_assert_eq!(cos.len(), len * 2 * half);
        RopeTables {
            cos: Tensor::from_data(TensorData::new(cos.clone(), [1, len * hd]), device),
            sin: Tensor::from_data(TensorData::new(sin.clone(), [1, len * hd]), device),
            cos_host: cos.into(),
            sin_host: sin.into(),
            len,
        }
    }

    /// Applies RoPE to `x` of shape `[batch, heads, seq, head_dim]` with
    /// tables from [`Rope::tables`] (`seq` positions): transformers'
    /// `q * cos + rotate_half(q) * sin`. Returns a contiguous tensor.
    ///
    /// The work runs on `[batch * heads, seq * head_dim]` rows, so both
    /// products broadcast one shared row over all rows (the backends' fast
    /// path) instead of a strided `[1, 1, seq, head_dim]` broadcast.
    pub fn apply<B: Backend>(x: Tensor<B, 4>, t: &RopeTables<B>) -> Tensor<B, 4> {
        let [b, h, s, hd] = x.dims();
        assert_eq!(s, t.len, "RoPE tables for {} positions, input has {s}", t.len);
        let half = hd / 2;
        let rows = x.reshape([b * h * s, 2, half]);
        let swapped = Tensor::cat(vec![rows.clone().narrow(1, 1, 1), rows.clone().narrow(1, 0, 1)], 1);
        let x = rows.reshape([b * h, s * hd]);
        let swapped = swapped.reshape([b * h, s * hd]);
        (x * t.cos.clone() + swapped * t.sin.clone()).reshape([b, h, s, hd])
    }
}

/// RoPE tables for `len` consecutive positions, each `[1, len * head_dim]`
/// (position-major): `cos` is the half-size table repeated twice per
/// position, `sin` is `[-sin, sin]` (rotate_half's sign folded in).
#[derive(Debug, Clone)]
pub struct RopeTables<B: Backend> {
    /// `cos(p * inv_freq)`, twice per position.
    pub cos: Tensor<B, 2>,
    /// `[-sin(p * inv_freq), sin(p * inv_freq)]` per position.
    pub sin: Tensor<B, 2>,
    /// `cos` on the host, `[len * head_dim]`, for the CPU kernels
    /// ([`super::cpu_ops::rope_rows`]).
    pub cos_host: std::sync::Arc<[f32]>,
    /// `sin` (sign included) on the host, `[len * head_dim]`.
    pub sin_host: std::sync::Arc<[f32]>,
    /// Number of positions.
    pub len: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rope::{llama3_freq_factors, llama3_from_freq_factors};

    fn llama3(factor: f64, old: usize) -> RopeScaling {
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: old,
        }
    }

    /// Llama 3.1-8B (head_dim 128, theta 500000, factor 8, original 8192)
    /// and the tiny fixture's setting (head_dim 16, original 64: one
    /// smoothed frequency) round-trip through the f32 factors GGUF stores.
    #[test]
    fn llama3_factors_round_trip() {
        for (hd, theta, factor, old) in
            [(128, 500000.0, 8.0, 8192), (16, 500000.0, 8.0, 64), (64, 500000.0, 32.0, 8192)]
        {
            let f = llama3_freq_factors(hd, theta, factor, 1.0, 4.0, old);
            let stored: Vec<f64> = f.iter().map(|&x| x as f32 as f64).collect();
            assert!(stored.iter().any(|&x| x > 1.0 && x < factor), "{hd}: no smoothed frequency");
            assert_eq!(llama3_from_freq_factors(&stored, hd, theta), llama3(factor, old), "head_dim {hd}");
        }
        assert_eq!(llama3_from_freq_factors(&[1.0; 8], 16, 1e4), RopeScaling::Default);
    }

    /// Factors no Llama 3 setting makes are kept as they are, and applying
    /// Llama 3 factors as divisors gives transformers' llama3 frequencies.
    #[test]
    fn freq_factors_divide_inverse_frequencies() {
        let mut f = llama3_freq_factors(16, 500000.0, 8.0, 1.0, 4.0, 64);
        let mut cfg = crate::config::ModelConfig {
            architecture: crate::config::Architecture::Llama,
            vocab_size: 4,
            hidden_size: 32,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: 2,
            num_kv_heads: 2,
            head_dim: 16,
            rms_norm_eps: 1e-6,
            rope_theta: 500000.0,
            rope_scaling: llama3(8.0, 64),
            max_position_embeddings: 256,
            tie_word_embeddings: true,
            attention_bias: false,
            bos_token_id: None,
            eos_token_id: None,
            family_params: Default::default(),
        };
        let want = Rope::new(&cfg).inv_freq;
        cfg.rope_scaling = RopeScaling::FreqFactors { factors: f.clone() };
        let got = Rope::new(&cfg).inv_freq;
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-12 * b, "{a} vs {b}");
        }
        // frequency 1 is the smoothed one (divisor 2.44...): nudge it off.
        assert!(f[1] > 2.4 && f[1] < 2.5, "{f:?}");
        f[1] *= 1.01;
        assert_eq!(llama3_from_freq_factors(&f, 16, 500000.0), RopeScaling::FreqFactors { factors: f.clone() });
    }

    /// LongRoPE: short factors and the attention factor while the call
    /// stays under `original`, long factors once it reaches it
    /// (transformers' `longrope_frequency_update` per forward call).
    #[test]
    fn longrope_switches_to_long_factors_at_the_original_length() {
        use burn::tensor::Tensor;
        type B = crate::CpuBackend;
        let mut cfg = crate::config::ModelConfig {
            architecture: crate::config::Architecture::Phi3,
            vocab_size: 4,
            hidden_size: 8,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 64,
            tie_word_embeddings: false,
            attention_bias: false,
            bos_token_id: None,
            eos_token_id: None,
            family_params: Default::default(),
        };
        cfg.rope_scaling = RopeScaling::LongRope {
            short_factor: vec![1.0, 2.0],
            long_factor: vec![4.0, 8.0],
            original_max_position_embeddings: 16,
            attention_factor: 1.5,
        };
        let r = Rope::new(&cfg);
        let cos_at = |start: usize, len: usize, p: usize| -> Vec<f32> {
            let t: Tensor<B, 2> = r.tables::<B>(start, len, &Default::default()).cos;
            let v: Vec<f32> = t.into_data().to_vec().unwrap();
            v[(p - start) * 4..(p - start) * 4 + 2].to_vec()
        };
        let inv = [1.0f64, 1.0 / 100.0];
        let want = |p: usize, f: [f64; 2]| -> Vec<f32> {
            (0..2).map(|i| ((p as f32) * ((inv[i] / f[i]) as f32)).cos() * 1.5).collect()
        };
        assert_eq!(cos_at(0, 16, 5), want(5, [1.0, 2.0]));
        assert_eq!(cos_at(14, 3, 15), want(15, [4.0, 8.0]));
    }
}
