//! The decoder stack: embedding, `L` pre-norm blocks, final RMSNorm and the
//! LM head (transformers `LlamaModel` + `LlamaForCausalLM`).

use burn::module::Module;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::{backend::Backend, Int, Tensor};

use super::attention::{causal_mask, Attention};
use super::{KvCache, Rope, SwiGlu};
use crate::config::ModelConfig;

/// One pre-norm decoder block:
/// `h = x + attn(norm1(x)); out = h + mlp(norm2(h))`.
#[derive(Module, Debug)]
pub struct DecoderBlock<B: Backend> {
    /// `input_layernorm` (RMSNorm before attention).
    pub input_layernorm: RmsNorm<B>,
    /// `self_attn`.
    pub self_attn: Attention<B>,
    /// `post_attention_layernorm` (RMSNorm before the FFN; its output is what
    /// an MoE router sees).
    pub post_attention_layernorm: RmsNorm<B>,
    /// `mlp` (SwiGLU).
    pub mlp: SwiGlu<B>,
}

/// A dense decoder-only transformer.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    /// `model.embed_tokens`, weight `[V, d]`.
    pub embed_tokens: Embedding<B>,
    /// `model.layers.{l}`.
    pub layers: Vec<DecoderBlock<B>>,
    /// `model.norm`.
    pub norm: RmsNorm<B>,
    /// `lm_head` (Burn weight `[d, V]`); `None` when tied to the embedding.
    pub lm_head: Option<Linear<B>>,
    /// RoPE frequencies (not a parameter).
    #[module(skip)]
    pub rope: Rope,
    /// The configuration the model was built from.
    #[module(skip)]
    pub config: ModelConfig,
}

impl<B: Backend> Transformer<B> {
    /// Hidden states after the final norm, `[batch, seq, d]`, for `tokens`
    /// `[batch, seq]`. With a cache, positions continue after the cached
    /// ones and the cache is extended.
    pub fn forward_hidden(&self, tokens: Tensor<B, 2, Int>, mut cache: Option<&mut KvCache<B>>) -> Tensor<B, 3> {
        let device = tokens.device();
        let [_, s] = tokens.dims();
        let offset = cache.as_ref().map(|c| c.len()).unwrap_or(0);
        let (cos, sin) = self.rope.tables::<B>(offset, s, &device);
        let mask = causal_mask::<B>(s, offset, &device);
        let mut x = self.embed_tokens.forward(tokens);
        for (l, block) in self.layers.iter().enumerate() {
            let c = cache.as_mut().map(|c| (&mut **c, l));
            let h = x.clone() + block.self_attn.forward(block.input_layernorm.forward(x), &cos, &sin, &mask, c);
            x = h.clone() + block.mlp.forward(block.post_attention_layernorm.forward(h));
        }
        self.norm.forward(x)
    }

    /// Applies the LM head: `[batch, seq, d] -> [batch, seq, V]`.
    pub fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => hidden.matmul(self.embed_tokens.weight.val().transpose().unsqueeze::<3>()),
        }
    }

    /// Logits `[batch, seq, V]` for `tokens` `[batch, seq]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>, cache: Option<&mut KvCache<B>>) -> Tensor<B, 3> {
        self.head(self.forward_hidden(tokens, cache))
    }

    /// Logits of the last position only, `[batch, V]` (generation: the LM
    /// head is applied to one position).
    pub fn forward_last(&self, tokens: Tensor<B, 2, Int>, cache: Option<&mut KvCache<B>>) -> Tensor<B, 2> {
        let h = self.forward_hidden(tokens, cache);
        let [b, s, _] = h.dims();
        let last = h.narrow(1, s - 1, 1);
        self.head(last).reshape([b, self.config.vocab_size])
    }

    /// A new, empty KV cache for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.layers.len())
    }
}
