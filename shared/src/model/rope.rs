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

    /// Tables for positions `start..start+len` (see [`RopeTables`]).
    pub fn tables<B: Backend>(&self, start: usize, len: usize, device: &B::Device) -> RopeTables<B> {
        let hd = self.head_dim;
        let half = hd / 2;
        let mut cos = Vec::with_capacity(len * hd);
        let mut sin = Vec::with_capacity(len * hd);
        for p in start..start + len {
            // f32 arithmetic mirrors transformers (positions and inv_freq in f32).
            let row: Vec<f32> = self.inv_freq.iter().map(|f| (p as f32) * (*f as f32)).collect();
            for _ in 0..2 {
                cos.extend(row.iter().map(|a| a.cos()));
            }
            // rotate_half(x) = [-x2, x1], so rotate_half(x) * sin =
            // [x2, x1] * [-sin, sin]: the sign lives in the table.
            sin.extend(row.iter().map(|a| -a.sin()));
            sin.extend(row.iter().map(|a| a.sin()));
        }
        debug_assert_eq!(cos.len(), len * 2 * half);
        RopeTables {
            cos: Tensor::from_data(TensorData::new(cos, [1, len * hd]), device),
            sin: Tensor::from_data(TensorData::new(sin, [1, len * hd]), device),
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
    /// Number of positions.
    pub len: usize,
}
