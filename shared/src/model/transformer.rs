//! The decoder stack: embedding, `L` pre-norm blocks (each FFN dense or
//! MoE), final RMSNorm and the LM head (transformers `LlamaModel` +
//! `LlamaForCausalLM`; `MixtralForCausalLM` when FFNs are MoE).

use burn::module::Module;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::{backend::Backend, Int, Tensor};

use super::attention::Attention;
use super::cpu_ops::rms_norm;
use super::moe::{MoeLayer, Routing, RoutingTrace};
use super::{KvCache, Padding, Rope, SwiGlu};
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};

/// A block's FFN: dense SwiGLU or an MoE layer.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer; boxing would complicate the Module derive
pub enum Mlp<B: Backend> {
    /// `mlp.{gate,up,down}_proj`.
    Dense(SwiGlu<B>),
    /// `block_sparse_moe.{gate,experts}`.
    Moe(MoeLayer<B>),
}

/// One pre-norm decoder block:
/// `h = x + attn(norm1(x)); out = h + mlp(norm2(h))`; with Gemma's sandwich
/// norms `h = x + norm_a(attn(norm1(x))); out = h + norm_f(mlp(norm2(h)))`.
#[derive(Module, Debug)]
pub struct DecoderBlock<B: Backend> {
    /// `input_layernorm` (RMSNorm before attention).
    pub input_layernorm: RmsNorm<B>,
    /// `self_attn`.
    pub self_attn: Attention<B>,
    /// `post_attention_layernorm` (RMSNorm before the FFN; its output is what
    /// an MoE router sees). Gemma's is `pre_feedforward_layernorm` on disk.
    pub post_attention_layernorm: RmsNorm<B>,
    /// Gemma's norm of the attention output before the residual add
    /// (`post_attention_layernorm` on disk); `None` for Llama-style blocks.
    pub attn_out_norm: Option<RmsNorm<B>>,
    /// Gemma's norm of the FFN output before the residual add
    /// (`post_feedforward_layernorm`).
    pub ffn_out_norm: Option<RmsNorm<B>>,
    /// The FFN.
    pub mlp: Mlp<B>,
}

/// How a neuron's activations are pooled over a text's tokens (`mean`,
/// `max` on the command line and in job specs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// Mean over tokens (NeuronMoE reference).
    #[default]
    Mean,
    /// Maximum over tokens.
    Max,
}

/// Pooled outputs of one layer's linear maps: `(component, [batch, units])`
/// for `q_proj`, `k_proj`, `v_proj`, `o_proj`, then for a dense FFN
/// `gate_proj`, `up_proj`, `down_proj`, or for an MoE FFN
/// `experts.{e}.{gate,up,down}_proj` for every routed expert `e` followed by
/// `shared_experts.{i}.{gate,up,down}_proj` (each expert computed on every
/// token, whether or not the router chose it: the expert's own response).
pub type LayerNeurons<B> = Vec<(String, Tensor<B, 2>)>;

/// What a forward pass records besides its output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwardOptions {
    /// How MoE layers route.
    pub routing: Routing,
    /// Record every layer's FFN input (the post-attention-norm hidden state,
    /// what the router sees), `[batch, seq, d]` — ridge statistics.
    pub capture_ffn_inputs: bool,
    /// Record every linear map's outputs pooled over tokens (NeuronMoE's
    /// neuron activations; see [`LayerNeurons`] for MoE layers).
    pub capture_neurons: Option<Pooling>,
}

/// Per-layer records of a forward pass.
#[derive(Debug, Clone)]
pub struct Trace<B: Backend> {
    /// FFN inputs per layer, `[batch, seq, d]` (when captured). Under
    /// [`Padding`] the padded rows hold meaningless values: take
    /// [`Padding::select_valid`].
    pub ffn_inputs: Vec<Tensor<B, 3>>,
    /// Routing per layer (`None` for dense layers). Under [`Padding`] it
    /// covers the real tokens only, in [`Padding::valid_rows`] order.
    pub routing: Vec<Option<RoutingTrace<B>>>,
    /// Pooled neuron activations per layer (when captured; under
    /// [`Padding`] pooled over each text's real tokens).
    pub neurons: Vec<LayerNeurons<B>>,
}

impl<B: Backend> Default for Trace<B> {
    fn default() -> Self {
        Trace { ffn_inputs: Vec::new(), routing: Vec::new(), neurons: Vec::new() }
    }
}

/// Pools `x: [batch, seq, units]` over positions; with padding, over each
/// text's real positions only (`keep` = [`PadTensors::keep`]).
fn pool<B: Backend>(x: Tensor<B, 3>, how: Pooling, pad: Option<&PadTensors<B>>) -> Tensor<B, 2> {
    let [b, _, u] = x.dims();
    match (how, pad) {
        (Pooling::Mean, None) => x.mean_dim(1).reshape([b, u]),
        (Pooling::Max, None) => x.max_dim(1).reshape([b, u]),
        (Pooling::Mean, Some(p)) => (x * p.keep.clone()).sum_dim(1).reshape([b, u]) / p.lengths.clone(),
        (Pooling::Max, Some(p)) => {
            let [_, s, _] = x.dims();
            x.mask_fill(p.padded.clone().expand([b, s, u]), f32::NEG_INFINITY).max_dim(1).reshape([b, u])
        }
    }
}

/// Device tensors of a [`Padding`] used inside one forward pass.
struct PadTensors<B: Backend> {
    /// `[batch, seq, 1]`: 1 at real positions, 0 at padding.
    keep: Tensor<B, 3>,
    /// `[batch, seq, 1]`: true at padding.
    padded: Tensor<B, 3, burn::tensor::Bool>,
    /// `[batch, 1]`: real tokens per text.
    lengths: Tensor<B, 2>,
    /// `[num_valid]`: flat rows of the real tokens.
    rows: Tensor<B, 1, Int>,
}

impl<B: Backend> PadTensors<B> {
    fn new(p: &Padding, device: &B::Device) -> Self {
        let keep = p.position_weights::<B>(device);
        let lens: Vec<f32> = p.lengths().iter().map(|&l| l as f32).collect();
        PadTensors {
            padded: keep.clone().equal_elem(0.0),
            keep,
            lengths: Tensor::from_data(burn::tensor::TensorData::new(lens, [p.batch(), 1]), device),
            rows: p.valid_rows_tensor::<B>(device),
        }
    }
}

/// A decoder-only transformer (dense or MoE).
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
    /// RoPE of the sliding-window layers when they have their own base
    /// (Gemma 3), else `None`.
    #[module(skip)]
    pub rope_local: Option<Rope>,
    /// The dense configuration the model was built from.
    #[module(skip)]
    pub config: ModelConfig,
}

impl<B: Backend> Transformer<B> {
    /// Hidden states after the final norm, `[batch, seq, d]`, for `tokens`
    /// `[batch, seq]`. With a cache, positions continue after the cached
    /// ones and the cache is extended.
    pub fn forward_hidden(&self, tokens: Tensor<B, 2, Int>, cache: Option<&mut KvCache<B>>) -> Tensor<B, 3> {
        self.forward_hidden_with(tokens, cache, ForwardOptions::default(), None)
    }

    /// [`Transformer::forward_hidden`] with routing options and an optional
    /// trace to fill (FFN inputs, router logits, chosen experts, counts).
    pub fn forward_hidden_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
        opts: ForwardOptions,
        trace: Option<&mut Trace<B>>,
    ) -> Tensor<B, 3> {
        self.forward_hidden_masked(tokens, None, cache, opts, trace)
    }

    /// [`Transformer::forward_hidden_with`] for a right-padded batch of
    /// texts of different lengths (`padding`, see [`Padding`] for what is
    /// excluded): row `b` of the output at positions `< lengths[b]` equals
    /// the unbatched forward of that text (up to float summation order);
    /// the padded positions hold meaningless values. `padding: None` (or a
    /// full one) is the plain forward.
    ///
    /// # Panics
    /// If `padding` does not match `tokens`' `[batch, seq]`, or is combined
    /// with a KV cache (generation runs one text at a time).
    pub fn forward_hidden_masked(
        &self,
        tokens: Tensor<B, 2, Int>,
        padding: Option<&Padding>,
        mut cache: Option<&mut KvCache<B>>,
        opts: ForwardOptions,
        mut trace: Option<&mut Trace<B>>,
    ) -> Tensor<B, 3> {
        let device = tokens.device();
        let [batch, s] = tokens.dims();
        let padding = padding.filter(|p| !p.is_full());
        if let Some(p) = padding {
            assert_eq!(
                [p.batch(), p.seq()],
                [batch, s],
                "padding of a [{}, {}] batch for tokens {:?}",
                p.batch(),
                p.seq(),
                [batch, s]
            );
            assert!(cache.is_none(), "a padded batch cannot extend a KV cache");
        }
        let pad = padding.map(|p| PadTensors::<B>::new(p, &device));
        let offset = cache.as_ref().map(|c| c.len()).unwrap_or(0);
        let rope = self.rope.tables::<B>(offset, s, &device);
        let rope_local = self.rope_local.as_ref().map(|r| r.tables::<B>(offset, s, &device));
        // A 16-bit embedding table ([`super::weights`]) gives 16-bit rows:
        // the activations are f32.
        let mut x = super::weights::weight_f32(self.embed_tokens.forward(tokens));
        if self.config.architecture.family().embed_scale {
            // transformers: `* torch.tensor(hidden_size ** 0.5, dtype)`.
            x = x * ((self.config.hidden_size as f64).sqrt() as f32);
        }
        for (l, block) in self.layers.iter().enumerate() {
            let c = cache.as_mut().map(|c| (&mut **c, l));
            let mut pooled: LayerNeurons<B> = Vec::new();
            let how = opts.capture_neurons;
            // Pools one captured output under `prefix` (empty for attention
            // and a dense FFN, `experts.{e}.` for an expert).
            let mut grab = |prefix: &str, name: &'static str, t: Tensor<B, 3>| {
                if let Some(how) = how {
                    pooled.push((format!("{prefix}{name}"), pool(t, how, pad.as_ref())));
                }
            };
            let layer_rope = match (&rope_local, block.self_attn.sliding_window) {
                (Some(local), Some(_)) => local,
                _ => &rope,
            };
            let mut attn_grab = |name: &'static str, t: Tensor<B, 3>| grab("", name, t);
            let attn_capture: Option<&mut dyn FnMut(&'static str, Tensor<B, 3>)> =
                if how.is_some() { Some(&mut attn_grab) } else { None };
            let attn = block.self_attn.forward_capture(
                rms_norm(&block.input_layernorm, x.clone()),
                layer_rope,
                c,
                attn_capture,
            );
            let attn = match &block.attn_out_norm {
                Some(n) => rms_norm(n, attn),
                None => attn,
            };
            let h = x + attn;
            let ffn_in = rms_norm(&block.post_attention_layernorm, h.clone());
            if let Some(t) = trace.as_mut() {
                if opts.capture_ffn_inputs {
                    t.ffn_inputs.push(ffn_in.clone());
                }
            }
            let ffn_out = match &block.mlp {
                Mlp::Dense(m) => {
                    if let Some(t) = trace.as_mut() {
                        t.routing.push(None);
                    }
                    if how.is_some() {
                        m.forward_capture(ffn_in, &mut |name, t| grab("", name, t))
                    } else {
                        m.forward(ffn_in)
                    }
                }
                Mlp::Moe(m) => {
                    if how.is_some() {
                        // Every expert's response to every token (NeuronMoE's
                        // post-training analysis, methods.md §3.7); the
                        // layer's output below is the routed one.
                        let groups = [("experts", &m.experts), ("shared_experts", &m.shared_experts)];
                        for (group, experts) in groups {
                            for (e, expert) in experts.iter().enumerate() {
                                let prefix = format!("{group}.{e}.");
                                let _ = expert.forward_capture(ffn_in.clone(), &mut |name, t| grab(&prefix, name, t));
                            }
                        }
                    }
                    // Under padding only the real tokens are routed (and
                    // counted); the padded rows of the output stay zero.
                    let (y, r) = match &pad {
                        None => m.forward(ffn_in, opts.routing),
                        Some(p) => {
                            let d = ffn_in.dims()[2];
                            let n = p.rows.dims()[0];
                            let real = ffn_in.reshape([batch * s, d]).select(0, p.rows.clone());
                            let (y, r) = m.forward(real.reshape([1, n, d]), opts.routing);
                            let full = Tensor::<B, 2>::zeros([batch * s, d], &device).select_assign(
                                0,
                                p.rows.clone(),
                                y.reshape([n, d]),
                                burn::tensor::IndexingUpdateOp::Add,
                            );
                            (full.reshape([batch, s, d]), r)
                        }
                    };
                    if let Some(t) = trace.as_mut() {
                        t.routing.push(Some(r));
                    }
                    y
                }
            };
            if let Some(t) = trace.as_mut() {
                if how.is_some() {
                    t.neurons.push(pooled);
                }
            }
            let ffn_out = match &block.ffn_out_norm {
                Some(n) => rms_norm(n, ffn_out),
                None => ffn_out,
            };
            x = h + ffn_out;
        }
        rms_norm(&self.norm, x)
    }

    /// Applies the LM head (and the final soft-cap of families that have
    /// one): `[batch, seq, d] -> [batch, seq, V]` (one
    /// `[batch * seq, d] x [d, V]` product; a tied head multiplies by the
    /// embedding's transpose in place).
    pub fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let logits = self.head_raw(hidden);
        match self.config.family_params.final_logit_softcapping {
            // Gemma 2: `c * tanh(logits / c)`.
            Some(c) => (logits / c).tanh() * c,
            None => logits,
        }
    }

    fn head_raw(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.lm_head {
            Some(head) => super::linear::forward_rows(head, hidden),
            None => {
                let [b, s, d] = hidden.dims();
                let e = self.embed_tokens.weight.val();
                #[cfg(not(target_arch = "wasm32"))]
                if b * s <= super::weights::SMALL_ROWS && e.dtype() != hidden.dtype() && super::cpu_ops::is_cpu::<B>() {
                    // A decoding step on a 16-bit embedding: no f32 copy of it.
                    let x = super::cpu_ops::contiguous(super::cpu_ops::to_flex(hidden.clone()));
                    let ef = super::cpu_ops::to_flex(e.clone());
                    if let Some(v) =
                        x.as_slice::<f32>().and_then(|xs| super::weights::small_rows_product_t(xs, b * s, &ef))
                    {
                        let v = super::cpu_ops::flex_from_vec(v, &[b, s, self.config.vocab_size]);
                        return super::cpu_ops::from_flex(v);
                    }
                }
                let h = hidden.reshape([b * s, d]);
                #[cfg(not(target_arch = "wasm32"))]
                let (h, e) = match super::cpu_grad::frozen_product(h, e, true) {
                    Ok(logits) => return logits.reshape([b, s, self.config.vocab_size]),
                    Err(he) => he,
                };
                let logits = h.matmul(super::weights::weight_f32(e).transpose());
                logits.reshape([b, s, self.config.vocab_size])
            }
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

    /// The MoE layout of this model (`None` when every FFN is dense).
    pub fn moe_config(&self) -> Option<MoeConfig> {
        let layers: Vec<Option<MoeLayerSpec>> = self
            .layers
            .iter()
            .map(|b| match &b.mlp {
                Mlp::Dense(_) => None,
                Mlp::Moe(m) => {
                    // Burn's gate_proj weight is [d, f_e].
                    let fe = m.experts.first().map(|e| e.gate_proj.weight.dims()[1]);
                    Some(MoeLayerSpec {
                        num_experts: m.num_experts(),
                        top_k: m.top_k,
                        frozen: m.frozen.clone(),
                        router_bias: m.gate.bias.is_some(),
                        temperature: m.temperature,
                        expert_intermediate_size: fe.filter(|&f| f != self.config.intermediate_size),
                        shared_experts: m.shared_experts.len(),
                        shared_expert_gate: m.shared_expert_gate.is_some(),
                        shared_frozen: m.shared_frozen,
                        norm_topk_prob: m.norm_topk_prob,
                        selection_bias: m.selection_bias.is_some(),
                    })
                }
            })
            .collect();
        if layers.iter().all(|l| l.is_none()) {
            None
        } else {
            Some(MoeConfig { layers, router_aux_loss_coef: 0.01 })
        }
    }
}
