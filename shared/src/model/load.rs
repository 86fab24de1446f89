//! Builds a [`Transformer`] from any [`TensorSource`] with Hugging Face
//! tensor names, checking every shape against the configuration.

use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::{backend::Backend, Tensor, TensorData};

use super::linear::linear_from_hf_as;
use super::moe::MoeLayer;
use super::transformer::Mlp;
use super::weights::{weight_tensor, WeightsDtype};
use super::{Attention, DecoderBlock, Rope, SwiGlu, Transformer};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};
use crate::layout::names::{
    expert_weight_name, router_bias_name, router_weight_name, selection_bias_name, shared_expert_gate_name,
    shared_expert_weight_name, Proj,
};
use crate::tensor_io::TensorSource;

/// Reads tensor `name`, checking that its shape is `shape` and that every
/// value is finite.
///
/// # Errors
/// [`StudioError::Tensor`] naming the source, the tensor and the expected
/// vs found shape (or that it is missing), or the count of NaN / infinite
/// values it holds.
pub fn read_checked(src: &dyn TensorSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let info = src
        .info(name)
        .ok_or_else(|| StudioError::tensor(src.source_name(), name, format!("missing (expected shape {shape:?})")))?;
    if info.shape != shape {
        return Err(StudioError::tensor(
            src.source_name(),
            name,
            format!("shape {:?} does not match the configuration (expected {shape:?})", info.shape),
        ));
    }
    let v = src.read_f32(name)?;
    if v.len() != shape.iter().product::<usize>() {
        return Err(StudioError::tensor(src.source_name(), name, "decoded element count does not match its shape"));
    }
    // A NaN or infinite weight makes every output NaN (generate printed nothing, perplexity
    // reported NaN and succeeded): refused by name, as a checkpoint that cannot be computed with.
    let bad = v.iter().filter(|x| !x.is_finite()).count();
    if bad > 0 {
        return Err(StudioError::tensor(
            src.source_name(),
            name,
            format!(
                "holds {bad} non-finite value(s) (NaN or infinity): the checkpoint is damaged or comes from a run \
                 that diverged, and every output computed with it would be NaN"
            ),
        ));
    }
    Ok(v)
}

/// An RMSNorm of width `d`; `plus_one` for the families that store `w` and
/// apply `1 + w` (Gemma), so the module holds `1 + w`.
fn rms<B: Backend>(
    src: &dyn TensorSource,
    name: &str,
    d: usize,
    eps: f64,
    plus_one: bool,
    device: &B::Device,
) -> Result<RmsNorm<B>> {
    let mut g = read_checked(src, name, &[d])?;
    if plus_one {
        g.iter_mut().for_each(|w| *w += 1.0);
    }
    Ok(RmsNorm { gamma: Param::from_tensor(Tensor::from_data(TensorData::new(g, [d]), device)), epsilon: eps })
}

fn lin<B: Backend>(
    src: &dyn TensorSource,
    prefix: &str,
    out: usize,
    inp: usize,
    bias: bool,
    dtype: WeightsDtype,
    device: &B::Device,
) -> Result<Linear<B>> {
    let b = if bias { Some(format!("{prefix}.bias")) } else { None };
    hf_linear(src, &format!("{prefix}.weight"), b.as_deref(), out, inp, dtype, device)
}

fn hf_linear<B: Backend>(
    src: &dyn TensorSource,
    weight: &str,
    bias: Option<&str>,
    out: usize,
    inp: usize,
    dtype: WeightsDtype,
    device: &B::Device,
) -> Result<Linear<B>> {
    let w = read_checked(src, weight, &[out, inp])?;
    let b = match bias {
        Some(b) => Some(read_checked(src, b, &[out])?),
        None => None,
    };
    linear_from_hf_as(&w, out, inp, b, dtype, src.source_name(), weight, device)
}

/// Loads a transformer with dense configuration `config` and, for MoE
/// checkpoints, the layout `moe`, from `src`.
///
/// `src` has canonical names ([`crate::layout::names`]; an on-disk layout
/// that renames is read through [`crate::layout::LayoutSource`]).
/// Tensors: `model.embed_tokens.weight [V, d]`,
/// `model.layers.{l}.{input,post_attention}_layernorm.weight [d]`,
/// `model.layers.{l}.self_attn.{q,k,v,o}_proj.weight` (`[out, in]`, q/k/v
/// `.bias` when `attention_bias`; `self_attn.{q,k}_norm.weight [head_dim]`
/// when the family normalises q/k heads; Gemma's `pre_feedforward_layernorm`
/// and `post_feedforward_layernorm`, its norms read as `1 + w`),
/// `model.layers.{l}.mlp.{gate,up,down}_proj.weight`,
/// `model.norm.weight [d]`, `lm_head.weight [V, d]` unless tied. MoE layers
/// read, instead of `mlp.*`, `model.layers.{l}.block_sparse_moe.gate.weight
/// [E, d]` (with `.bias` when the router has one, and
/// `.e_score_correction_bias [E]` with a selection bias),
/// `...experts.{e}.{w1,w3}.weight [f_e, d]` and `.w2.weight [d, f_e]`
/// (`f_e` the expert width), and when the spec has them
/// `...shared_experts.{i}.{w1,w3,w2}.weight` (dense width) and
/// `...shared_expert_gate.weight [N, d]`.
///
/// # Errors
/// [`StudioError::Tensor`] for a missing tensor or a shape that disagrees
/// with `config`; conversion errors from the source.
pub fn load_transformer<B: Backend>(
    config: &ModelConfig,
    moe: Option<&MoeConfig>,
    src: &dyn TensorSource,
    device: &B::Device,
) -> Result<Transformer<B>> {
    load_transformer_as(config, moe, src, device, WeightsDtype::F32)
}

/// [`load_transformer`] with the projections, experts, untied LM head and
/// token embedding held in `weights` ([`super::weights`]: 16 bits halve
/// their memory; norms, routers and biases stay f32). Each tensor is read
/// and converted on its own, so the load never holds a second copy of the
/// model in f32. For forward work only: training needs f32 parameters.
///
/// # Errors
/// As [`load_transformer`]; with [`WeightsDtype::F16`], a weight holding a
/// value past f16's range ([`super::weights::weight_tensor`]).
pub fn load_transformer_as<B: Backend>(
    config: &ModelConfig,
    moe: Option<&MoeConfig>,
    src: &dyn TensorSource,
    device: &B::Device,
    weights: WeightsDtype,
) -> Result<Transformer<B>> {
    let wd = weights;
    if let Some(m) = moe {
        m.validate(config, src.source_name())?;
    }
    let (d, f, v) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let (h, kvh, hd) = (config.num_heads, config.num_kv_heads, config.head_dim);
    let eps = config.rms_norm_eps;
    let fam = config.architecture.family();
    let (qk_norm, one, act) = (fam.qk_norm, fam.norm_plus_one, fam.activation);
    let fp = &config.family_params;
    let emb = read_checked(src, "model.embed_tokens.weight", &[v, d])?;
    let emb = weight_tensor(emb, [v, d], wd, src.source_name(), "model.embed_tokens.weight", device)?;
    let embed_tokens = Embedding { weight: Param::from_tensor(emb) };
    let mut layers = Vec::with_capacity(config.num_layers);
    for l in 0..config.num_layers {
        let p = format!("model.layers.{l}");
        let bias = config.attention_bias;
        layers.push(DecoderBlock {
            input_layernorm: rms(src, &format!("{p}.input_layernorm.weight"), d, eps, one, device)?,
            self_attn: Attention {
                q_proj: lin(src, &format!("{p}.self_attn.q_proj"), h * hd, d, bias, wd, device)?,
                k_proj: lin(src, &format!("{p}.self_attn.k_proj"), kvh * hd, d, bias, wd, device)?,
                v_proj: lin(src, &format!("{p}.self_attn.v_proj"), kvh * hd, d, bias, wd, device)?,
                o_proj: lin(src, &format!("{p}.self_attn.o_proj"), d, h * hd, false, wd, device)?,
                q_norm: match qk_norm {
                    true => Some(rms(src, &format!("{p}.self_attn.q_norm.weight"), hd, eps, one, device)?),
                    false => None,
                },
                k_norm: match qk_norm {
                    true => Some(rms(src, &format!("{p}.self_attn.k_norm.weight"), hd, eps, one, device)?),
                    false => None,
                },
                scale: fp.query_pre_attn_scalar.map(|q| 1.0 / q.sqrt()),
                softcap: fp.attn_logit_softcapping,
                sliding_window: fp.window_of(l),
                num_heads: h,
                num_kv_heads: kvh,
                head_dim: hd,
            },
            // Gemma's sandwich: `post_attention_layernorm` normalises the
            // attention output and `pre_feedforward_layernorm` the FFN input
            // (the norm every family has, held in `post_attention_layernorm`).
            post_attention_layernorm: rms(
                src,
                &format!(
                    "{p}.{}.weight",
                    if fam.sandwich_norms { "pre_feedforward_layernorm" } else { "post_attention_layernorm" }
                ),
                d,
                eps,
                one,
                device,
            )?,
            attn_out_norm: match fam.sandwich_norms {
                true => Some(rms(src, &format!("{p}.post_attention_layernorm.weight"), d, eps, one, device)?),
                false => None,
            },
            ffn_out_norm: match fam.sandwich_norms {
                true => Some(rms(src, &format!("{p}.post_feedforward_layernorm.weight"), d, eps, one, device)?),
                false => None,
            },
            mlp: match moe.and_then(|m| m.layers[l].as_ref()) {
                None => Mlp::Dense(SwiGlu {
                    gate_proj: lin(src, &format!("{p}.mlp.gate_proj"), f, d, false, wd, device)?,
                    up_proj: lin(src, &format!("{p}.mlp.up_proj"), f, d, false, wd, device)?,
                    down_proj: lin(src, &format!("{p}.mlp.down_proj"), d, f, false, wd, device)?,
                    activation: act,
                }),
                Some(spec) => {
                    let e = spec.num_experts;
                    let bias = router_bias_name(l);
                    let gate = hf_linear(
                        src,
                        &router_weight_name(l),
                        spec.router_bias.then_some(bias.as_str()),
                        e,
                        d,
                        WeightsDtype::F32,
                        device,
                    )?;
                    let swiglu = |name: &dyn Fn(Proj) -> String, f: usize| -> Result<SwiGlu<B>> {
                        Ok(SwiGlu {
                            gate_proj: hf_linear(src, &name(Proj::Gate), None, f, d, wd, device)?,
                            up_proj: hf_linear(src, &name(Proj::Up), None, f, d, wd, device)?,
                            down_proj: hf_linear(src, &name(Proj::Down), None, d, f, wd, device)?,
                            activation: act,
                        })
                    };
                    let fe = spec.expert_width(config);
                    let experts =
                        (0..e).map(|x| swiglu(&|w| expert_weight_name(l, x, w), fe)).collect::<Result<Vec<_>>>()?;
                    let n = spec.shared_experts;
                    let shared_experts = (0..n)
                        .map(|i| swiglu(&|w| shared_expert_weight_name(l, i, w), f))
                        .collect::<Result<Vec<_>>>()?;
                    let shared_expert_gate = if spec.shared_expert_gate {
                        Some(hf_linear(src, &shared_expert_gate_name(l), None, n, d, WeightsDtype::F32, device)?)
                    } else {
                        None
                    };
                    let selection_bias = if spec.selection_bias {
                        Some(read_checked(src, &selection_bias_name(l), &[e])?)
                    } else {
                        None
                    };
                    Mlp::Moe(MoeLayer {
                        gate,
                        experts,
                        shared_experts,
                        shared_expert_gate,
                        top_k: spec.top_k,
                        temperature: spec.temperature,
                        frozen: spec.frozen.clone(),
                        shared_frozen: spec.shared_frozen,
                        norm_topk_prob: spec.norm_topk_prob,
                        selection_bias,
                    })
                }
            },
        });
    }
    let norm = rms(src, "model.norm.weight", d, eps, one, device)?;
    let lm_head = if config.tie_word_embeddings { None } else { Some(lin(src, "lm_head", v, d, false, wd, device)?) };
    Ok(Transformer {
        embed_tokens,
        layers,
        norm,
        lm_head,
        rope: Rope::new(config),
        rope_local: Rope::local(config),
        config: config.clone(),
    })
}

/// Loads the model of a [`crate::checkpoint::LoadedModel`] (dense or MoE).
///
/// # Errors
/// As [`load_transformer`].
pub fn load_model<B: Backend>(m: &crate::checkpoint::LoadedModel, device: &B::Device) -> Result<Transformer<B>> {
    load_transformer(&m.config, m.moe.as_ref(), m.source.as_ref(), device)
}

/// [`load_model`] with the large weights in `weights` ([`load_transformer_as`]).
///
/// # Errors
/// As [`load_transformer_as`].
pub fn load_model_as<B: Backend>(
    m: &crate::checkpoint::LoadedModel,
    device: &B::Device,
    weights: WeightsDtype,
) -> Result<Transformer<B>> {
    load_transformer_as(&m.config, m.moe.as_ref(), m.source.as_ref(), device, weights)
}
