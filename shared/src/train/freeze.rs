//! Which parameters a training stage updates (methods.md §1-2).
//!
//! - [`Stage::Experts`] — DeltaMoE phase 1 / MoE-LPR stage 1: the routers
//!   and every expert that is not in its layer's `frozen` list train, and
//!   the shared experts with their gate unless the layer's `shared_frozen`;
//!   expert 0 (the original FFN), attention, embeddings, norms, the LM head
//!   and dense FFNs stay frozen.
//! - [`Stage::Router`] — MoE-LPR stage 2, DUME+, BTX: only the routers
//!   (not the shared-expert gates: they belong to the shared experts).
//! - [`Stage::Dense`] — ordinary fine-tuning of a dense model: everything.
//! - [`Stage::Ffn`] — a dense model's FFNs only (gate/up/down of every
//!   layer); attention, norms, embeddings and the LM head stay frozen. The
//!   dense counterpart of [`Stage::Experts`] (DeltaMoE's "only the FFN is
//!   extended" comparison) and DUME's domain experts whose shared weights
//!   stay the base model's, so that MoErging averages nothing that moved.
//! - [`Stage::All`] — an MoE model's every parameter except the frozen
//!   experts (attention, norms, embeddings, LM head, routers, shared and
//!   trainable experts): the MoE counterpart of [`Stage::Dense`].
//!
//! Freezing is Burn's `Module::no_grad`: a frozen parameter is not tracked
//! by autodiff, gets no gradient, and the optimizer leaves it untouched
//! (bit for bit: no weight decay either).

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};
use crate::model::transformer::Mlp;
use crate::model::weights::{weight_tensor, WeightsDtype};
use crate::model::{DecoderBlock, MoeLayer, Transformer};

/// A training stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Non-frozen experts + routers (MoE models).
    Experts,
    /// Routers only (MoE models).
    Router,
    /// Every parameter (dense models).
    Dense,
    /// The FFNs only (dense models).
    Ffn,
    /// Every parameter but the frozen experts (MoE models).
    All,
}

impl Stage {
    /// Every stage, in the order `--stage` lists them.
    pub const ALL: [Stage; 5] = [Stage::Experts, Stage::Router, Stage::All, Stage::Dense, Stage::Ffn];

    /// Every stage's name, in the order of [`Stage::ALL`].
    pub const NAMES: [&'static str; 5] = ["experts", "router", "all", "dense", "ffn"];

    /// Parses `experts`, `router`, `all`, `dense` or `ffn`.
    pub fn parse(s: &str) -> Option<Stage> {
        match s {
            "experts" => Some(Stage::Experts),
            "router" | "routers" => Some(Stage::Router),
            "all" => Some(Stage::All),
            "dense" => Some(Stage::Dense),
            "ffn" => Some(Stage::Ffn),
            _ => None,
        }
    }

    /// Whether the stage trains an MoE model (`experts`, `router`, `all`);
    /// the others train a dense one.
    pub fn is_moe(self) -> bool {
        matches!(self, Stage::Experts | Stage::Router | Stage::All)
    }

    /// Whether the stage trains a dense model (`dense`, `ffn`).
    pub fn is_dense(self) -> bool {
        !self.is_moe()
    }

    /// The stage's name.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Experts => "experts",
            Stage::Router => "router",
            Stage::Dense => "dense",
            Stage::Ffn => "ffn",
            Stage::All => "all",
        }
    }

    /// The reference learning rate of the stage: 5e-5 for experts (DeltaMoE),
    /// 1e-4 for routers (DUME+), 5e-5 for dense (and FFN-only) fine-tuning.
    pub fn default_lr(self) -> f64 {
        match self {
            Stage::Experts | Stage::Dense | Stage::Ffn | Stage::All => 5e-5,
            Stage::Router => 1e-4,
        }
    }
}

/// Whether any FFN of `model` is an MoE layer.
pub fn is_moe<B: Backend>(model: &Transformer<B>) -> bool {
    model.layers.iter().any(|b| matches!(b.mlp, Mlp::Moe(_)))
}

/// Marks the parameters `stage` does not train as frozen (`no_grad`).
///
/// # Errors
/// [`StudioError::Config`] naming `source`: `experts` or `router` on a
/// dense model, `dense` or `ffn` on an MoE model, or `experts` when every
/// expert of every MoE layer is frozen.
pub fn apply_stage<B: Backend>(model: Transformer<B>, stage: Stage, source: &str) -> Result<Transformer<B>> {
    let moe = is_moe(&model);
    match (stage.is_moe(), moe) {
        (true, false) => {
            return Err(StudioError::config(
                source,
                format!(
                    "--stage {} needs an MoE model, this one is dense (upcycle it first: `moe-studio upcycle`), \
                     or use --stage dense / ffn",
                    stage.name()
                ),
            ))
        }
        (false, true) => {
            return Err(StudioError::config(
                source,
                format!(
                    "--stage {} fine-tunes a dense model; this one is MoE: use --stage experts (new experts + \
                     routers), router or all",
                    stage.name()
                ),
            ))
        }
        _ => {}
    }
    if stage == Stage::Dense {
        return Ok(model);
    }
    if stage == Stage::Experts {
        let trainable = model.layers.iter().any(|b| match &b.mlp {
            Mlp::Moe(m) => {
                (0..m.num_experts()).any(|e| !m.frozen.contains(&e))
                    || (!m.shared_experts.is_empty() && !m.shared_frozen)
            }
            Mlp::Dense(_) => false,
        });
        if !trainable {
            return Err(StudioError::config(
                source,
                "--stage experts: every expert of every MoE layer is frozen, nothing but the routers would train \
                 (use --stage router)",
            ));
        }
    }
    // `all` keeps everything outside the experts trainable; the other
    // stages freeze it.
    let keep = stage == Stage::All;
    fn freeze<B: Backend, M: Module<B>>(m: M, keep: bool) -> M {
        if keep {
            m
        } else {
            m.no_grad()
        }
    }
    let Transformer { embed_tokens, layers, norm, lm_head, rope, rope_local, config } = model;
    let layers = layers
        .into_iter()
        .map(|b| DecoderBlock {
            input_layernorm: freeze(b.input_layernorm, keep),
            self_attn: freeze(b.self_attn, keep),
            post_attention_layernorm: freeze(b.post_attention_layernorm, keep),
            attn_out_norm: b.attn_out_norm.map(|n| freeze(n, keep)),
            ffn_out_norm: b.ffn_out_norm.map(|n| freeze(n, keep)),
            mlp: match b.mlp {
                // `ffn` trains the dense FFNs; in an MoE model a dense layer
                // (a layer with one expert) trains only under `all`.
                Mlp::Dense(m) => Mlp::Dense(freeze(m, keep || stage == Stage::Ffn)),
                Mlp::Moe(m) => {
                    let mut m: MoeLayer<B> = m;
                    let frozen = m.frozen.clone();
                    m.experts = std::mem::take(&mut m.experts)
                        .into_iter()
                        .enumerate()
                        .map(|(i, e)| if stage == Stage::Router || frozen.contains(&i) { e.no_grad() } else { e })
                        .collect();
                    // Shared experts and their gate train with the experts
                    // unless frozen; the router stage trains routers only.
                    if stage == Stage::Router || m.shared_frozen {
                        m.shared_experts =
                            std::mem::take(&mut m.shared_experts).into_iter().map(|e| e.no_grad()).collect();
                        m.shared_expert_gate = m.shared_expert_gate.take().map(|g| g.no_grad());
                    }
                    Mlp::Moe(m)
                }
            },
        })
        .collect();
    Ok(Transformer {
        embed_tokens: freeze(embed_tokens, keep),
        layers,
        norm: freeze(norm, keep),
        lm_head: lm_head.map(|h| freeze(h, keep)),
        rope,
        rope_local,
        config,
    })
}

/// The dtype a training run loads its model's large weights in
/// ([`crate::model::load_model_as`]: projections, experts, embedding and
/// untied head; norms, routers, biases and shared-expert gates load in f32
/// whatever it is): `frozen` (the run's `--frozen-dtype`) for
/// [`Stage::Router`], whose every such weight is frozen, so the model never
/// exists in f32 first and [`hold_frozen_in`] gives the same values without
/// that peak (4 bytes per parameter while loading, which for a large MoE is
/// more than the router stage's training needs); f32 for the other stages,
/// which train some of those weights from their exact values and narrow the
/// frozen ones after [`apply_stage`].
pub fn load_dtype(stage: Stage, frozen: WeightsDtype) -> WeightsDtype {
    if stage == Stage::Router {
        frozen
    } else {
        WeightsDtype::F32
    }
}

/// Holds every frozen matrix of `model` (a 2-D parameter that gets no
/// gradient: embedding, attention and frozen FFN/expert weights, frozen
/// routers) in `dtype`, rounded to nearest even; trainable parameters and
/// the vectors (norms, biases) stay f32. `F32` returns `model` unchanged.
/// The forward and backward passes widen such a weight to f32 for each
/// product only ([`crate::model::cpu_grad::frozen_product`] on the CPU,
/// Burn's `cast` elsewhere), so a stage that freezes most of the model
/// (`router`, `ffn`, `experts`) keeps those weights at 2 bytes each.
/// Saved checkpoints hold the rounded values (exact when the source was
/// already `dtype`, as bf16 checkpoints are).
///
/// Returns the model and the bytes saved against f32.
///
/// # Errors
/// [`StudioError::Tensor`] naming `source` and the parameter's module path
/// when `dtype` is f16 and a weight lies past f16's range (65504).
pub fn hold_frozen_in<B: Backend>(
    model: Transformer<B>,
    dtype: WeightsDtype,
    source: &str,
) -> Result<(Transformer<B>, usize)> {
    if dtype == WeightsDtype::F32 {
        return Ok((model, 0));
    }
    struct Narrow<'a> {
        dtype: WeightsDtype,
        source: &'a str,
        path: Vec<String>,
        saved: usize,
        error: Option<StudioError>,
    }
    impl<B: Backend> ModuleMapper<B> for Narrow<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            if D != 2 || tensor.is_require_grad() || self.error.is_some() || tensor.dtype() != burn::tensor::DType::F32
            {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let (dims, device) = (tensor.dims(), tensor.device());
            let values: Vec<f32> = tensor.clone().into_data().to_vec().expect("an f32 parameter");
            let name = self.path.join(".");
            match weight_tensor::<B, D>(values, dims, self.dtype, self.source, &name, &device) {
                Ok(t) => {
                    self.saved += dims.iter().product::<usize>() * (4 - self.dtype.bytes());
                    Param::from_mapped_value(id, t, mapper)
                }
                Err(e) => {
                    self.error = Some(e);
                    Param::from_mapped_value(id, tensor, mapper)
                }
            }
        }
    }
    let mut n = Narrow { dtype, source, path: Vec::new(), saved: 0, error: None };
    let model = model.map(&mut n);
    match n.error {
        Some(e) => Err(e),
        None => Ok((model, n.saved)),
    }
}

/// Trainable and frozen parameter counts (elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ParamCounts {
    /// Elements that will be updated.
    pub trainable: usize,
    /// Elements that stay fixed.
    pub frozen: usize,
    /// Parameter tensors that will be updated.
    pub trainable_tensors: usize,
}

struct Counter(ParamCounts);

impl<B: Backend> ModuleVisitor<B> for Counter {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let n = param.val().shape().num_elements();
        if param.is_require_grad() {
            self.0.trainable += n;
            self.0.trainable_tensors += 1;
        } else {
            self.0.frozen += n;
        }
    }
}

/// Counts `model`'s trainable and frozen parameters.
pub fn param_counts<B: Backend, M: Module<B>>(model: &M) -> ParamCounts {
    let mut c = Counter(ParamCounts::default());
    model.visit(&mut c);
    c.0
}
