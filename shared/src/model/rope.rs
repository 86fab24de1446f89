//! Rotary position embedding (RoPE), Hugging Face "rotate_half" convention.
//!
//! Source: Su et al., "RoFormer" (2021), §3.4; frequency scaling as in
//! transformers `modeling_rope_utils.py` (`default`, `linear`, `llama3`).
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
        }
        Rope { inv_freq, head_dim: hd }
    }

    /// `cos` and `sin` tables for positions `start..start+len`, each
    /// `[len, head_dim]` (the half-size table repeated twice).
    pub fn tables<B: Backend>(&self, start: usize, len: usize, device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let hd = self.head_dim;
        let mut cos = Vec::with_capacity(len * hd);
        let mut sin = Vec::with_capacity(len * hd);
        for p in start..start + len {
            // f32 arithmetic mirrors transformers (positions and inv_freq in f32).
            let row: Vec<f32> = self.inv_freq.iter().map(|f| (p as f32) * (*f as f32)).collect();
            for _ in 0..2 {
                cos.extend(row.iter().map(|a| a.cos()));
                sin.extend(row.iter().map(|a| a.sin()));
            }
        }
        (
            Tensor::from_data(TensorData::new(cos, [len, hd]), device),
            Tensor::from_data(TensorData::new(sin, [len, hd]), device),
        )
    }

    /// Applies RoPE to `x` of shape `[batch, heads, seq, head_dim]` with
    /// tables from [`Rope::tables`] (`[seq, head_dim]`).
    pub fn apply<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Tensor<B, 4> {
        let [b, h, s, hd] = x.dims();
        let half = hd / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        let cos = cos.clone().reshape([1, 1, s, hd]);
        let sin = sin.clone().reshape([1, 1, s, hd]);
        let _ = (b, h);
        x * cos + rotated * sin
    }
}
