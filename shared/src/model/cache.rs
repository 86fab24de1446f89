//! Key/value cache for incremental decoding.

use burn::tensor::{backend::Backend, Tensor};

/// Cached keys and values of every layer, each `[batch, kv_heads, seq, head_dim]`.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        KvCache { layers: vec![None; num_layers] }
    }

    /// Number of cached positions (0 when empty).
    pub fn len(&self) -> usize {
        self.layers.first().and_then(|l| l.as_ref()).map(|(k, _)| k.dims()[2]).unwrap_or(0)
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `k`, `v` (`[batch, kv_heads, new, head_dim]`) to layer
    /// `layer` and returns the full cached keys and values.
    pub fn append(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let merged = match self.layers[layer].take() {
            None => (k, v),
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
        };
        self.layers[layer] = Some(merged.clone());
        merged
    }
}
