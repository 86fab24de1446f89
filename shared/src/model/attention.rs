//! Grouped-query causal self-attention with RoPE and an optional KV cache.
//!
//! Source: Ainslie et al., "GQA" (2023); transformers `LlamaAttention`.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{activation::softmax, backend::Backend, Tensor, TensorData};

use super::rope::Rope;

/// Multi-head attention where `num_heads` query heads share
/// `num_kv_heads` key/value heads.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// `q_proj`: `d -> num_heads * head_dim` (bias for Qwen2).
    pub q_proj: Linear<B>,
    /// `k_proj`: `d -> num_kv_heads * head_dim`.
    pub k_proj: Linear<B>,
    /// `v_proj`: `d -> num_kv_heads * head_dim`.
    pub v_proj: Linear<B>,
    /// `o_proj`: `num_heads * head_dim -> d`.
    pub o_proj: Linear<B>,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads.
    pub num_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

/// Additive causal mask `[1, 1, s, total]`: 0 where query `i` (absolute
/// position `offset + i`) may see key `j`, a large negative number
/// elsewhere.
pub fn causal_mask<B: Backend>(s: usize, offset: usize, device: &B::Device) -> Tensor<B, 4> {
    let total = offset + s;
    let mut m = vec![0f32; s * total];
    for i in 0..s {
        for j in (offset + i + 1)..total {
            m[i * total + j] = f32::NEG_INFINITY;
        }
    }
    Tensor::from_data(TensorData::new(m, [1, 1, s, total]), device)
}

impl<B: Backend> Attention<B> {
    /// `x: [batch, seq, d]` -> `[batch, seq, d]`.
    ///
    /// `cos`/`sin` are RoPE tables for the new positions (`[seq, head_dim]`),
    /// `mask` the additive causal mask `[1, 1, seq, cached + seq]`; with a
    /// cache, keys/values are appended to layer `layer` of it.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        mask: &Tensor<B, 4>,
        cache: Option<(&mut super::KvCache<B>, usize)>,
    ) -> Tensor<B, 3> {
        self.forward_capture(x, cos, sin, mask, cache, None)
    }

    /// [`Attention::forward`] that also hands the projection outputs
    /// (`q_proj`, `k_proj`, `v_proj` before RoPE, and `o_proj`, each
    /// `[batch, seq, units]`) to `capture` (neuron analysis).
    pub fn forward_capture(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        mask: &Tensor<B, 4>,
        cache: Option<(&mut super::KvCache<B>, usize)>,
        mut capture: Option<&mut dyn FnMut(&'static str, Tensor<B, 3>)>,
    ) -> Tensor<B, 3> {
        let [b, s, _] = x.dims();
        let (h, kvh, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = self.q_proj.forward(x.clone());
        let k = self.k_proj.forward(x.clone());
        let v = self.v_proj.forward(x);
        if let Some(c) = capture.as_mut() {
            c("q_proj", q.clone());
            c("k_proj", k.clone());
            c("v_proj", v.clone());
        }
        let q = q.reshape([b, s, h, hd]).swap_dims(1, 2);
        let k = k.reshape([b, s, kvh, hd]).swap_dims(1, 2);
        let v = v.reshape([b, s, kvh, hd]).swap_dims(1, 2);
        let q = Rope::apply(q, cos, sin);
        let k = Rope::apply(k, cos, sin);
        let (k, v) = match cache {
            Some((c, layer)) => c.append(layer, k, v),
            None => (k, v),
        };
        let t = k.dims()[2];
        let rep = h / kvh;
        let (k, v) = if rep > 1 {
            (
                k.reshape([b, kvh, 1, t, hd]).repeat_dim(2, rep).reshape([b, h, t, hd]),
                v.reshape([b, kvh, 1, t, hd]).repeat_dim(2, rep).reshape([b, h, t, hd]),
            )
        } else {
            (k, v)
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale) + mask.clone();
        let probs = softmax(scores, 3);
        let out = probs.matmul(v).swap_dims(1, 2).reshape([b, s, h * hd]);
        let out = self.o_proj.forward(out);
        if let Some(c) = capture.as_mut() {
            c("o_proj", out.clone());
        }
        out
    }
}
