//! Grouped-query causal self-attention with RoPE and an optional KV cache.
//!
//! Source: Ainslie et al., "GQA" (2023); transformers `LlamaAttention`;
//! the per-head q/k RMSNorm of `Qwen3Attention` when the family has one
//! ([`crate::config::family::Family::qk_norm`]); Gemma's
//! `query_pre_attn_scalar` scale, score soft-cap and sliding-window layers
//! (a boolean mask on top of the causal one).
//! The score/softmax/value product is Burn's fused
//! [`burn::tensor::module::attention`] with `is_causal`: the CPU backend
//! (burn-flex) runs it as one kernel (two gemm calls per head for short
//! sequences, tiled flash attention with an online softmax beyond 256K
//! scores per head), other backends and autodiff as their own fused
//! kernel or Burn's reference composition (matmul, mask, softmax, matmul).
//! The causal boundary is aligned bottom-right, so with a KV cache the new
//! query `i` (absolute position `cached + i`) sees keys `0..=cached + i`.

use burn::module::Module;
use burn::nn::{Linear, RmsNorm};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{backend::Backend, Tensor};

use super::cpu_ops::rms_norm;
use super::linear::forward_rows;
use super::rope::{Rope, RopeTables};

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
    /// `q_norm`: RMSNorm over `head_dim` of every query head, before RoPE
    /// (Qwen3; `None` for Llama-style attention).
    pub q_norm: Option<RmsNorm<B>>,
    /// `k_norm`: RMSNorm over `head_dim` of every key head, before RoPE.
    pub k_norm: Option<RmsNorm<B>>,
    /// Score scale (`query_pre_attn_scalar^-1/2` for Gemma); `None`:
    /// `head_dim^-1/2`.
    #[module(skip)]
    pub scale: Option<f64>,
    /// Soft-cap `c` of the scores, `c * tanh(s / c)` (Gemma 2).
    #[module(skip)]
    pub softcap: Option<f64>,
    /// Sliding window: query at absolute position `i` sees keys `j` with
    /// `i - j < window` (transformers' `sliding_window_overlay`); `None`:
    /// every earlier key.
    #[module(skip)]
    pub sliding_window: Option<usize>,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads.
    pub num_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl<B: Backend> Attention<B> {
    /// `x: [batch, seq, d]` -> `[batch, seq, d]`, causal.
    ///
    /// `rope` holds the RoPE tables of the new positions
    /// ([`Rope::tables`]); with a cache, keys/values are appended to layer
    /// `layer` of it and the queries attend to every cached position.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        rope: &RopeTables<B>,
        cache: Option<(&mut super::KvCache<B>, usize)>,
    ) -> Tensor<B, 3> {
        self.forward_capture(x, rope, cache, None)
    }

    /// [`Attention::forward`] that also hands the projection outputs
    /// (`q_proj`, `k_proj`, `v_proj` before RoPE, and `o_proj`, each
    /// `[batch, seq, units]`) to `capture` (neuron analysis).
    pub fn forward_capture(
        &self,
        x: Tensor<B, 3>,
        rope: &RopeTables<B>,
        cache: Option<(&mut super::KvCache<B>, usize)>,
        mut capture: Option<&mut dyn FnMut(&'static str, Tensor<B, 3>)>,
    ) -> Tensor<B, 3> {
        let [b, s, _] = x.dims();
        let (h, kvh, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = forward_rows(&self.q_proj, x.clone());
        let k = forward_rows(&self.k_proj, x.clone());
        let v = forward_rows(&self.v_proj, x);
        if let Some(c) = capture.as_mut() {
            c("q_proj", q.clone());
            c("k_proj", k.clone());
            c("v_proj", v.clone());
        }
        let (q, k) = (q.reshape([b, s, h, hd]), k.reshape([b, s, kvh, hd]));
        let q = match &self.q_norm {
            Some(n) => rms_norm(n, q),
            None => q,
        };
        let k = match &self.k_norm {
            Some(n) => rms_norm(n, k),
            None => k,
        };
        // No cache, no soft-cap, no active window, CPU backend: RoPE and
        // attention in one kernel on the projections' row layout
        // (cpu_attention::causal_attention_rows), no transposes.
        let (q, k, v) = if cache.is_none() && self.softcap.is_none() && self.sliding_window.is_none_or(|w| s <= w) {
            let (q, k) = (q.reshape([b, s, h * hd]), k.reshape([b, s, kvh * hd]));
            let (q, k, v) = match super::cpu_attention::causal_attention_rows(q, k, v, rope, h, kvh, self.scale) {
                Ok(out) => return self.project_out(out, capture),
                Err(qkv) => qkv,
            };
            // Training on the CPU: the same kernel as one autodiff node
            // with its own backward (cpu_grad::attention_rows).
            #[cfg(not(target_arch = "wasm32"))]
            let (q, k, v) = match super::cpu_grad::attention_rows(q, k, v, rope, h, kvh, self.scale) {
                Ok(out) => return self.project_out(out, capture),
                Err(qkv) => qkv,
            };
            (q.reshape([b, s, h, hd]), k.reshape([b, s, kvh, hd]), v)
        } else {
            (q, k, v)
        };
        let q = Rope::apply(q.swap_dims(1, 2), rope);
        let k = Rope::apply(k.swap_dims(1, 2), rope);
        let v = v.reshape([b, s, kvh, hd]).swap_dims(1, 2);
        let (k, v) = match cache {
            Some((c, layer)) => c.append(layer, k, v),
            None => (k, v),
        };
        let t = k.dims()[2];
        // The CPU backend's threaded causal GQA kernel (cpu_attention.rs)
        // reads the shared kv heads in place and writes `[b, s, h * hd]`;
        // soft-capped scores and an active sliding window take Burn's path.
        let (q, k, v) = if self.softcap.is_none() && self.sliding_window.is_none_or(|w| t <= w) {
            match super::cpu_attention::causal_attention(q, k, v, self.scale) {
                Ok(out) => return self.project_out(out, capture),
                Err(qkv) => qkv,
            }
        } else {
            (q, k, v)
        };
        let rep = h / kvh;
        let (k, v) = if rep > 1 {
            (
                k.reshape([b, kvh, 1, t, hd]).repeat_dim(2, rep).reshape([b, h, t, hd]),
                v.reshape([b, kvh, 1, t, hd]).repeat_dim(2, rep).reshape([b, h, t, hd]),
            )
        } else {
            (k, v)
        };
        let opts = AttentionModuleOptions { scale: self.scale, softcap: self.softcap, is_causal: true };
        // Keys `t - s` positions before the first query are cached; with a
        // window, mask the keys more than `window - 1` positions back.
        let mask = self.sliding_window.filter(|&w| t > w).map(|w| {
            let past = t - s;
            let m: Vec<bool> = (0..s).flat_map(|i| (0..t).map(move |j| past + i >= j + w)).collect();
            let m =
                Tensor::<B, 2, burn::tensor::Bool>::from_data(burn::tensor::TensorData::new(m, [s, t]), &q.device());
            m.reshape([1, 1, s, t]).expand([b, h, s, t])
        });
        let out = attention(q, k, v, mask, None, opts).swap_dims(1, 2).reshape([b, s, h * hd]);
        self.project_out(out, capture)
    }

    /// `o_proj` of the heads' outputs `[batch, seq, heads * head_dim]`,
    /// handed to `capture` as `o_proj`.
    fn project_out(
        &self,
        heads: Tensor<B, 3>,
        mut capture: Option<&mut dyn FnMut(&'static str, Tensor<B, 3>)>,
    ) -> Tensor<B, 3> {
        let out = forward_rows(&self.o_proj, heads);
        if let Some(c) = capture.as_mut() {
            c("o_proj", out.clone());
        }
        out
    }
}
