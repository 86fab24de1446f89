//! The training loop, generic over a Burn autodiff backend: continued
//! pre-training of new experts (DeltaMoE phase 1 / MoE-LPR stage 1),
//! router tuning (MoE-LPR stage 2, DUME+, BTX) and dense fine-tuning
//! (methods.md §1-2).
//!
//! One optimizer step:
//! 1. for each of `grad_accum` micro-steps, draw `batch_size * devices`
//!    packed sequences from the [`Mixture`] (a pure function of the seed);
//!    with several devices the batch is split, and each replica runs a fork
//!    of the model on its share in its own thread;
//! 2. loss = next-token cross-entropy + `alpha` x load balancing (with
//!    `--balance aux`) + `z_loss` x router z-loss + `prior` x language prior
//!    (see [`super::losses`]), each micro-loss scaled by
//!    `1 / (grad_accum * world)` so that the summed gradient is the mean;
//!    with several replicas the routing counts and original-language rows
//!    are all-reduced first, so the losses are those of the whole batch
//!    ([`super::parallel`]: Burn's collective all-reduce between threads);
//! 3. gradients summed with Burn's `GradientsAccumulator` (and, with
//!    several replicas, all-reduced once per step), clipped by their
//!    GLOBAL L2 norm (as `torch.nn.utils.clip_grad_norm_`, not Burn's
//!    per-tensor clipping), then one AdamW step (Burn's `AdamW`: decoupled
//!    weight decay, Loshchilov & Hutter 2019) at the scheduled rate;
//! 4. with `--balance aux-free`, every MoE layer's selection bias moves by
//!    the sign of its experts' load error over the step
//!    ([`super::balance`], DeepSeek-V3 §2.1.2).
//!
//! Determinism: the data order is a pure function of the seed and the
//! step; parameter ids are renumbered deterministically; checkpoints hold
//! the f32 weights, the AdamW moments and the data position, so a resumed
//! run continues with the same losses as an uninterrupted one.

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;

use super::adamw::StudioAdamW;
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::balance::{update_selection_bias, Balance};
use super::checkpoint::{assign_param_ids, fold_router_temperatures, TrainerState};
use super::data::{Batch, Mixture};
use super::freeze::{apply_stage, param_counts, ParamCounts, Stage};
use super::losses::{language_prior_loss_dp, load_balancing_loss_dp, next_token_loss, router_z_loss, LbForm};
#[cfg(not(target_arch = "wasm32"))]
use super::parallel::Cluster;
use super::schedule::LrSchedule;
use crate::error::{Result, StudioError};
use crate::model::transformer::Mlp;
use crate::model::{ForwardOptions, Trace, Transformer};

/// Hyper-parameters of a run (saved in every checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Which parameters train.
    pub stage: Stage,
    /// Optimizer steps in the whole run.
    pub steps: usize,
    /// Tokens per sequence `L` (<= the model's context).
    pub seq_len: usize,
    /// Sequences per device per micro-step.
    pub batch_size: usize,
    /// Micro-steps per optimizer step.
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps.
    pub warmup: usize,
    /// Final rate of the cosine as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW `beta_1`.
    pub beta1: f64,
    /// AdamW `beta_2`.
    pub beta2: f64,
    /// AdamW `epsilon`.
    pub eps: f64,
    /// Maximum global gradient L2 norm (`None`: no clipping).
    pub clip: Option<f64>,
    /// Load-balancing coefficient `alpha` (DeltaMoE: 0.01).
    pub alpha: f64,
    /// Load-balancing formula.
    pub lb_form: LbForm,
    /// Language-prior coefficient (MoE-LPR: 0.1); applies to sequences of
    /// sources tagged as original languages.
    pub prior: f64,
    /// Checkpoint every N steps (0: only at the end).
    pub save_every: usize,
    /// Periodic checkpoints kept (older ones are deleted; the final one is
    /// always kept).
    pub keep: usize,
    /// Seed of the data order (and of the backend generator).
    pub seed: u64,
    /// Data-parallel replicas (devices) of this process (1: no
    /// parallelism); together they equal one replica with `devices` times
    /// the batch.
    pub devices: usize,
    /// How the load is balanced: the `alpha` loss, DeepSeek-V3's
    /// aux-loss-free selection bias, or nothing.
    #[serde(default)]
    pub balance: Balance,
    /// The aux-free bias step `gamma` per optimizer step (DeepSeek-V3:
    /// 0.001 on sigmoid scores; default here 1e-3).
    #[serde(default = "default_bias_rate")]
    pub bias_update_rate: f64,
    /// Router z-loss coefficient (ST-MoE: 1e-3; 0 = off).
    #[serde(default)]
    pub z_loss: f64,
    /// Sets every MoE layer's `norm_topk_prob` before training (`None`:
    /// keep the model's). Saved in the checkpoint's config either way.
    #[serde(default)]
    pub norm_topk: Option<bool>,
}

fn default_bias_rate() -> f64 {
    1e-3
}

impl TrainConfig {
    /// The defaults of `stage`: 5e-5 (experts, dense) or 1e-4 (router),
    /// batch 8, sequence 256, 100 steps, warm-up 10, cosine to 10%, no
    /// weight decay, betas (0.9, 0.999), eps 1e-8, clip 1.0, alpha 0.01,
    /// per-layer load balancing, prior 0.1, seed 0, one device,
    /// `--balance aux`, bias step 1e-3, no z-loss, the model's top-k
    /// normalisation.
    pub fn new(stage: Stage) -> Self {
        TrainConfig {
            stage,
            steps: 100,
            seq_len: 256,
            batch_size: 8,
            grad_accum: 1,
            lr: stage.default_lr(),
            warmup: 10,
            min_lr_ratio: 0.1,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            clip: Some(1.0),
            alpha: 0.01,
            lb_form: LbForm::PerLayer,
            prior: 0.1,
            save_every: 0,
            keep: 2,
            seed: 0,
            devices: 1,
            balance: Balance::Aux,
            bias_update_rate: default_bias_rate(),
            z_loss: 0.0,
            norm_topk: None,
        }
    }

    /// The learning-rate schedule.
    pub fn schedule(&self) -> LrSchedule {
        LrSchedule { lr: self.lr, warmup: self.warmup, total: self.steps, min_ratio: self.min_lr_ratio }
    }

    /// Input tokens per optimizer step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch_size * self.devices * self.grad_accum * self.seq_len
    }

    /// Checks the values against each other and against `model`.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the option.
    pub fn validate<B: Backend>(&self, model: &Transformer<B>) -> Result<()> {
        let err = |opt: &str, what: String| Err(StudioError::config(opt, what));
        if self.steps == 0 {
            return err("--steps", "must be at least 1".into());
        }
        if self.batch_size == 0 || self.grad_accum == 0 || self.devices == 0 {
            return err("--batch/--grad-accum/--devices", "must be at least 1".into());
        }
        if self.seq_len == 0 || self.seq_len > model.config.max_position_embeddings {
            return err(
                "--seq-len",
                format!(
                    "{} must be in 1..={} (the model's context)",
                    self.seq_len, model.config.max_position_embeddings
                ),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return err("--lr", format!("{} must be a positive number", self.lr));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return err("--min-lr", format!("ratio {} must be in [0, 1]", self.min_lr_ratio));
        }
        if let Some(c) = self.clip {
            if !(c.is_finite() && c > 0.0) {
                return err("--clip", format!("{c} must be a positive number"));
            }
        }
        for (name, v) in [
            ("--alpha", self.alpha),
            ("--prior", self.prior),
            ("--weight-decay", self.weight_decay),
            ("--z-loss", self.z_loss),
            ("--bias-update-rate", self.bias_update_rate),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return err(name, format!("{v} must be >= 0"));
            }
        }
        if self.lb_form == LbForm::HfMixtral {
            let counts: Vec<usize> = model
                .layers
                .iter()
                .filter_map(|b| match &b.mlp {
                    Mlp::Moe(m) => Some(m.num_experts()),
                    Mlp::Dense(_) => None,
                })
                .collect();
            if counts.windows(2).any(|w| w[0] != w[1]) {
                return err(
                    "--lb-form",
                    "hf-mixtral pools layers and needs the same expert count in every MoE layer; use per-layer".into(),
                );
            }
        }
        Ok(())
    }
}

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Steps completed (1-based).
    pub step: usize,
    /// Steps of the run.
    pub steps: usize,
    /// Total loss (mean over micro-batches): ce + alpha*lb + prior*prior.
    pub loss: f64,
    /// Next-token cross-entropy (nats / token).
    pub ce_loss: f64,
    /// Load-balancing loss (MoE only).
    pub lb_loss: Option<f64>,
    /// Language-prior loss (when the batch had original-language tokens).
    pub prior_loss: Option<f64>,
    /// Router z-loss (MoE only; logged whatever its coefficient).
    #[serde(default)]
    pub z_loss: Option<f64>,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Input tokens of this step.
    pub tokens: usize,
    /// Input tokens since the start of the run.
    pub tokens_seen: u64,
    /// Wall time of this step (s).
    pub seconds: f64,
    /// Training throughput of this step.
    pub tokens_per_s: f64,
    /// Per MoE layer, the fraction of routed slots each expert got in this
    /// step (`None` for dense layers).
    pub expert_load: Vec<Option<Vec<f64>>>,
    /// Sequences per data source in this step.
    pub source_sequences: Vec<usize>,
    /// Per MoE layer, the aux-loss-free selection bias after this step's
    /// update (`None` for dense layers and layers without one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selection_bias: Vec<Option<Vec<f64>>>,
}

/// One replica's accumulated gradients and its per-micro-batch results.
type ReplicaGrads = (GradientsParams, Vec<MicroStats>);

/// Per-micro-batch results.
struct MicroStats {
    ce: f64,
    lb: Option<f64>,
    z: Option<f64>,
    prior: Option<f64>,
    counts: Vec<Option<Vec<usize>>>,
}

/// Loss settings handed to the replicas.
#[derive(Clone, Copy)]
struct LossSettings {
    /// `alpha` with `--balance aux`, else 0.
    alpha: f64,
    lb_form: LbForm,
    z_loss: f64,
    prior: f64,
    scale: f64,
}

fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    use burn::tensor::ElementConversion;
    t.into_scalar().elem::<f64>()
}

/// This process's replica `i` of a data-parallel run, or `None`.
type Comm<'a, B> = Option<(&'a Cluster<<B as AutodiffBackend>::InnerBackend>, usize)>;

/// Forward + backward of one micro-batch on `device`. With `comm`, the
/// routing counts and the original-language rows are first summed over all
/// replicas, so that the load-balancing fractions and the language prior's
/// denominator are the global batch's ([`super::parallel`]); the trace's
/// counts then hold the global counts.
fn micro_step<B: AutodiffBackend>(
    model: &Transformer<B>,
    batch: &Batch,
    device: &B::Device,
    s: LossSettings,
    comm: Comm<'_, B>,
) -> Result<(GradientsParams, MicroStats)> {
    let (b, l) = (batch.batch, batch.seq_len);
    let inputs = Tensor::<B, 2, Int>::from_data(TensorData::new(batch.inputs.clone(), [b, l]), device);
    let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(batch.targets.clone(), [b, l]), device);
    let mut trace = Trace::default();
    let hidden = model.forward_hidden_with(inputs, None, ForwardOptions::default(), Some(&mut trace));
    let ce = next_token_loss(model.head(hidden), targets);
    let mask: Vec<bool> = batch.original.iter().flat_map(|&o| std::iter::repeat_n(o, l)).collect();
    let mut masked = mask.iter().filter(|&&m| m).count();
    let mut world = 1;
    if let Some((cluster, i)) = comm {
        let mut v: Vec<f32> = trace.routing.iter().flatten().flat_map(|r| r.counts.iter().map(|&n| n as f32)).collect();
        v.push(masked as f32);
        let sum = cluster.all_reduce_sum(i, &v)?;
        let mut k = 0;
        for r in trace.routing.iter_mut().flatten() {
            for n in r.counts.iter_mut() {
                *n = sum[k] as usize;
                k += 1;
            }
        }
        masked = sum[k] as usize;
        world = cluster.world();
    }
    let lb = load_balancing_loss_dp(&trace.routing, s.lb_form, world);
    let z = router_z_loss(&trace.routing);
    let prior = language_prior_loss_dp(&trace.routing, &mask, masked, world);
    let mut total = ce.clone();
    if let (Some(x), true) = (&lb, s.alpha > 0.0) {
        total = total + x.clone().mul_scalar(s.alpha);
    }
    if let (Some(x), true) = (&z, s.z_loss > 0.0) {
        total = total + x.clone().mul_scalar(s.z_loss);
    }
    if let (Some(x), true) = (&prior, s.prior > 0.0) {
        total = total + x.clone().mul_scalar(s.prior);
    }
    let stats = MicroStats {
        ce: scalar(ce),
        lb: lb.map(scalar),
        z: z.map(scalar),
        prior: prior.map(scalar),
        counts: trace.routing.iter().map(|r| r.as_ref().map(|r| r.counts.clone())).collect(),
    };
    let grads = total.mul_scalar(s.scale).backward();
    Ok((GradientsParams::from_grads(grads, model), stats))
}

/// One replica's share of an optimizer step: its micro-batches' gradients
/// summed with Burn's `GradientsAccumulator`; with `comm`, then summed over
/// all replicas (a trainable parameter without a gradient here is sent as
/// zeros, and left without one when no replica had it) and the loss terms
/// averaged over the replicas: Burn's `GradientsParams::all_reduce` plus
/// two small all-reduces ([`super::parallel`]).
fn replica_grads<B: AutodiffBackend>(
    model: &Transformer<B>,
    micros: &[Batch],
    device: &B::Device,
    s: LossSettings,
    comm: Comm<'_, B>,
) -> Result<ReplicaGrads> {
    let mut acc = GradientsAccumulator::<Transformer<B>>::new();
    let mut stats = Vec::with_capacity(micros.len());
    for batch in micros {
        let (g, st) = micro_step(model, batch, device, s, comm)?;
        acc.accumulate::<B>(model, g);
        stats.push(st);
    }
    let mut grads = acc.grads();
    let Some((cluster, i)) = comm else { return Ok((grads, stats)) };
    let mut fill = FillMissing::<B> { grads: &mut grads, present: Vec::new(), _b: std::marker::PhantomData };
    model.visit(&mut fill);
    let present = fill.present;
    let flags: Vec<f32> = present.iter().map(|&(_, p)| if p { 1.0 } else { 0.0 }).collect();
    let mut terms = Vec::with_capacity(4 * stats.len());
    for st in &stats {
        for x in [Some(st.ce), st.lb, st.z, st.prior] {
            terms.push(x.unwrap_or(0.0) as f32);
        }
    }
    let any = if flags.is_empty() { Vec::new() } else { cluster.all_reduce_sum(i, &flags)? };
    let mut grads = cluster.all_reduce_grads(i, grads)?;
    let sum = cluster.all_reduce_sum(i, &terms)?;
    let absent: Vec<ParamId> = present.iter().zip(&any).filter(|(_, &n)| n == 0.0).map(|(&(id, _), _)| id).collect();
    if !absent.is_empty() {
        model.visit(&mut RemoveGrads { grads: &mut grads, ids: &absent });
    }
    let w = cluster.world() as f64;
    for (k, st) in stats.iter_mut().enumerate() {
        let mean = |j: usize| f64::from(sum[4 * k + j]) / w;
        st.ce = mean(0);
        st.lb = st.lb.map(|_| mean(1));
        st.z = st.z.map(|_| mean(2));
        st.prior = st.prior.map(|_| mean(3));
    }
    Ok((grads, stats))
}

/// Registers zeros for the trainable parameters without a gradient and
/// records, in module order, which had one.
struct FillMissing<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    present: Vec<(ParamId, bool)>,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for FillMissing<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !param.is_require_grad() {
            return;
        }
        let has = self.grads.get::<B::InnerBackend, D>(param.id).is_some();
        if !has {
            self.grads.register::<B::InnerBackend, D>(param.id, param.val().inner().zeros_like());
        }
        self.present.push((param.id, has));
    }
}

struct RemoveGrads<'a> {
    grads: &'a mut GradientsParams,
    ids: &'a [ParamId],
}

impl<B: AutodiffBackend> ModuleVisitor<B> for RemoveGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.ids.contains(&param.id) {
            self.grads.remove::<B::InnerBackend, D>(param.id);
        }
    }
}

struct SquaredNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    sum: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let s = g.square().sum();
            self.sum = Some(match self.sum.take() {
                Some(x) => {
                    let d = x.device();
                    x + s.to_device(&d)
                }
                None => s,
            });
        }
    }
}

struct ScaleGrads<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for ScaleGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register::<B::InnerBackend, D>(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// Global L2 norm of `grads` over `model`'s parameters; when it exceeds
/// `max_norm`, scales every gradient by `max_norm / (norm + 1e-6)` (as
/// `torch.nn.utils.clip_grad_norm_`). Returns the norm before clipping.
pub fn clip_global_norm<B: AutodiffBackend>(
    model: &Transformer<B>,
    grads: &mut GradientsParams,
    max_norm: Option<f64>,
) -> f64 {
    let mut v = SquaredNorm::<B> { grads, sum: None };
    model.visit(&mut v);
    let norm = v.sum.map(|s| scalar(s).sqrt()).unwrap_or(0.0);
    if let Some(m) = max_norm {
        if norm > m {
            let mut s = ScaleGrads { grads, factor: m / (norm + 1e-6) };
            model.visit(&mut s);
        }
    }
    norm
}

/// `n` devices of `B`: the default device's kind with indices `0..n`
/// (`cuda:0, cuda:1, ...`). Backends with a single device (ndarray)
/// return `n` handles to it, which still runs `n` workers in parallel.
pub fn devices<B: Backend>(n: usize) -> Vec<B::Device> {
    use burn::tensor::backend::{Device, DeviceId, DeviceOps};
    let first = B::Device::default();
    let id = first.id();
    (0..n).map(|i| <B::Device as Device>::from_id(DeviceId { type_id: id.type_id, index_id: i as u16 })).collect()
}

/// AdamW with Burn's record format, one fused in-place pass per parameter on
/// the CPU backend ([`super::adamw`]).
type Adam<B> = OptimizerAdaptor<StudioAdamW, Transformer<B>, B>;

/// Top-1 routing with renormalised weights weighs the chosen expert by a
/// softmax over ONE logit, i.e. 1, so the next-token loss gives the routers
/// no gradient (Mixtral's renormalised top-k). Switch Transformers'
/// un-normalised weights (`norm_topk_prob: false`, the softmax over all
/// experts) do give one. Otherwise router training only follows the
/// load-balancing, z- and language-prior terms.
///
/// # Errors
/// [`StudioError::Config`] for stage `router` when every MoE layer routes
/// top-1 with renormalised weights and neither `alpha` (with `--balance
/// aux`), the z-loss nor an applicable `prior` gives a gradient.
fn top1_check<B: Backend>(model: &Transformer<B>, c: &TrainConfig, data: &Mixture) -> Result<Vec<String>> {
    let ks: Vec<(usize, bool)> = model
        .layers
        .iter()
        .filter_map(|b| match &b.mlp {
            Mlp::Moe(m) => Some((m.top_k.min(m.num_experts()), m.norm_topk_prob)),
            Mlp::Dense(_) => None,
        })
        .collect();
    if ks.is_empty() || ks.iter().any(|&(k, norm)| k > 1 || !norm) || !c.stage.is_moe() {
        return Ok(Vec::new());
    }
    let prior = c.prior > 0.0 && data.sources().iter().any(|s| s.spec.original);
    let alpha = c.balance == Balance::Aux && c.alpha > 0.0;
    let what = "every MoE layer routes top-1 with renormalised weights: the chosen expert's weight is a softmax over \
                one logit (= 1), so the next-token loss gives the routers no gradient";
    if c.stage == Stage::Router && !alpha && c.z_loss == 0.0 && !prior {
        return Err(StudioError::config(
            "--stage router",
            format!(
                "{what}, and no --alpha (with --balance aux), --z-loss or --prior applies: nothing would train \
                 (use --norm-topk false, or route with top-k >= 2)"
            ),
        ));
    }
    Ok(vec![format!(
        "{what}; routers train only through the load-balancing / z / language-prior terms (--norm-topk false gives \
         them the next-token gradient)"
    )])
}

/// Applies the run's routing options to `model` before training: the
/// `norm_topk` override and, with `--balance aux-free`, a zero selection
/// bias on every MoE layer that has none. Returns notes for the user.
fn prepare_routing<B: Backend>(model: &mut Transformer<B>, c: &TrainConfig) -> Vec<String> {
    let mut notes = Vec::new();
    for (l, block) in model.layers.iter_mut().enumerate() {
        let Mlp::Moe(m) = &mut block.mlp else { continue };
        if let Some(norm) = c.norm_topk {
            if m.norm_topk_prob != norm && notes.is_empty() {
                notes.push(format!(
                    "--norm-topk {norm} changes how the model weighs its experts (layer {l} had norm_topk_prob {}): \
                     the model's function changes, and an upcycled model no longer equals its dense base",
                    m.norm_topk_prob
                ));
            }
            m.norm_topk_prob = norm;
        }
        if c.balance == Balance::AuxFree && m.selection_bias.is_none() {
            m.selection_bias = Some(vec![0.0; m.num_experts()]);
        }
    }
    if c.balance == Balance::AuxFree {
        notes.push(
            "--balance aux-free: the selection bias is written in the studio layout (transformers' Mixtral cannot \
             hold it)"
                .into(),
        );
    }
    notes
}

/// A training run in progress.
pub struct Trainer<B: AutodiffBackend> {
    model: Option<Transformer<B>>,
    optim: Adam<B>,
    data: Mixture,
    config: TrainConfig,
    devices: Vec<B::Device>,
    step: usize,
    tokens: u64,
    last_loss: Option<f64>,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))] // provenance of native checkpoints
    source: String,
    extra_files: Vec<(String, Vec<u8>)>,
    warnings: Vec<String>,
    /// The data-parallel replicas ([`super::parallel`]), when more than one.
    cluster: Option<Cluster<B::InnerBackend>>,
}

/// wasm32 has no data parallelism (burn-collective is native-only): this
/// stand-in has no value.
#[cfg(target_arch = "wasm32")]
pub struct Cluster<B>(std::convert::Infallible, std::marker::PhantomData<B>);

#[cfg(target_arch = "wasm32")]
impl<B> Cluster<B> {
    fn world(&self) -> usize {
        match self.0 {}
    }
    fn all_reduce_sum(&self, _: usize, _: &[f32]) -> Result<Vec<f32>> {
        match self.0 {}
    }
    fn all_reduce_grads(&self, _: usize, _: GradientsParams) -> Result<GradientsParams> {
        match self.0 {}
    }
}

/// The local replicas of a single-process run with several devices.
#[cfg(not(target_arch = "wasm32"))]
fn join_local<B: Backend>(devices: &[B::Device]) -> Result<Option<Cluster<B>>> {
    Ok(Some(Cluster::join(devices.to_vec())?))
}

/// wasm32: one replica only.
#[cfg(target_arch = "wasm32")]
fn join_local<B: Backend>(_: &[B::Device]) -> Result<Option<Cluster<B>>> {
    Err(StudioError::config("--devices", "data parallelism is native-only (the browser runs one replica)"))
}

fn adamw<B: AutodiffBackend>(c: &TrainConfig) -> Adam<B> {
    OptimizerAdaptor::from(StudioAdamW {
        beta_1: c.beta1 as f32,
        beta_2: c.beta2 as f32,
        epsilon: c.eps as f32,
        weight_decay: c.weight_decay as f32,
    })
}

impl<B: AutodiffBackend> Trainer<B> {
    /// Prepares `model` (loaded on `devices[0]`) for `config.stage`: folds
    /// router temperatures when the saved layout would, freezes what the
    /// stage does not train, renumbers parameters, and builds AdamW.
    /// `source` names the model in errors.
    ///
    /// # Errors
    /// [`TrainConfig::validate`], [`apply_stage`]; [`StudioError::Config`]
    /// when `devices.len() != config.devices` or the data's sequence length
    /// differs from `config.seq_len`. With several devices it registers them as Burn collective peers (waiting while another
    /// data-parallel run of this process holds Burn's local server).
    pub fn new(
        model: Transformer<B>,
        data: Mixture,
        config: TrainConfig,
        devices: Vec<B::Device>,
        source: &str,
    ) -> Result<Self> {
        config.validate(&model)?;
        if devices.len() != config.devices {
            return Err(StudioError::config(
                "--devices",
                format!("{} devices given, config says {}", devices.len(), config.devices),
            ));
        }
        if data.seq_len() != config.seq_len {
            return Err(StudioError::config("--seq-len", "the data was packed with another sequence length"));
        }
        let mut model = model;
        let mut warnings = prepare_routing(&mut model, &config);
        warnings.extend(top1_check(&model, &config, &data)?);
        B::seed(&devices[0], config.seed);
        let model = fold_router_temperatures(model);
        let model = apply_stage(model, config.stage, source)?;
        let model = assign_param_ids(model);
        let cluster = if config.devices > 1 { join_local(&devices)? } else { None };
        Ok(Trainer {
            model: Some(model),
            optim: adamw::<B>(&config),
            data,
            config,
            devices,
            step: 0,
            tokens: 0,
            last_loss: None,
            source: source.to_string(),
            extra_files: Vec::new(),
            warnings,
            cluster,
        })
    }

    /// Things the user should know about this run (e.g. routers that get
    /// no gradient from the next-token loss under top-1 routing).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Files written into every checkpoint beside the weights (e.g.
    /// `tokenizer.json`).
    pub fn with_extra_files(mut self, files: Vec<(String, Vec<u8>)>) -> Self {
        self.extra_files = files;
        self
    }

    /// The model being trained.
    pub fn model(&self) -> &Transformer<B> {
        self.model.as_ref().expect("the model is present between steps")
    }

    /// The trained model.
    pub fn into_model(self) -> Transformer<B> {
        self.model.expect("the model is present between steps")
    }

    /// Steps completed.
    pub fn step_count(&self) -> usize {
        self.step
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The data mixture (and its position).
    pub fn data(&self) -> &Mixture {
        &self.data
    }

    /// Trainable / frozen parameter counts.
    pub fn param_counts(&self) -> ParamCounts {
        param_counts::<B, _>(self.model())
    }

    /// Runs one optimizer step.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when a replica thread panicked, a collective
    /// all-reduce failed or the loss is not finite (the step is not applied
    /// then).
    pub fn step(&mut self) -> Result<StepMetrics> {
        // wasm32-unknown-unknown's std has no clock: timings read 0 there.
        #[cfg(not(target_arch = "wasm32"))]
        let t0 = std::time::Instant::now();
        let c = &self.config.clone();
        let local = self.devices.len();
        let world = self.cluster.as_ref().map_or(1, |cl| cl.world());
        let settings = LossSettings {
            alpha: if c.balance == Balance::Aux { c.alpha } else { 0.0 },
            lb_form: c.lb_form,
            z_loss: c.z_loss,
            prior: c.prior,
            scale: 1.0 / (c.grad_accum * world) as f64,
        };
        // The whole batch, split into the replicas' shares.
        let mut shares: Vec<Vec<Batch>> = (0..local).map(|_| Vec::with_capacity(c.grad_accum)).collect();
        let mut source_sequences = vec![0usize; self.data.sources().len()];
        for _ in 0..c.grad_accum {
            let batch = self.data.next_batch(c.batch_size * world);
            for &s in &batch.sources {
                source_sequences[s] += 1;
            }
            if world == 1 {
                shares[0].push(batch);
            } else {
                for (i, part) in batch.split(world).into_iter().enumerate() {
                    shares[i].push(part);
                }
            }
        }
        let model = self.model.as_ref().expect("model present");
        let (mut grads, stats) = match &self.cluster {
            None => replica_grads(model, &shares[0], &self.devices[0], settings, None)?,
            Some(cl) if local == 1 => replica_grads(model, &shares[0], &self.devices[0], settings, Some((cl, 0)))?,
            Some(cl) => {
                // One thread per local replica; they meet in the all-reduces.
                let results: Vec<std::thread::Result<Result<ReplicaGrads>>> = std::thread::scope(|scope| {
                    let handles: Vec<_> = shares
                        .iter()
                        .zip(&self.devices)
                        .enumerate()
                        .map(|(i, (micros, dev))| {
                            let m = model.clone();
                            scope.spawn(move || {
                                let m = m.fork(dev);
                                replica_grads(&m, micros, dev, settings, Some((cl, i)))
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join()).collect()
                });
                let mut first = None;
                for r in results {
                    let r = r.map_err(|_| StudioError::Invalid("a data-parallel replica panicked".into()))??;
                    // After the all-reduce every replica holds the same sums: keep replica 0's.
                    first.get_or_insert(r);
                }
                first.expect("at least one replica")
            }
        };
        let n = stats.len() as f64;
        let ce = stats.iter().map(|s| s.ce).sum::<f64>() / n;
        let mean_opt = |f: &dyn Fn(&MicroStats) -> Option<f64>| {
            let v: Vec<f64> = stats.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let lb = mean_opt(&|s| s.lb);
        let z = mean_opt(&|s| s.z);
        let prior = mean_opt(&|s| s.prior);
        let loss =
            ce + settings.alpha * lb.unwrap_or(0.0) + c.z_loss * z.unwrap_or(0.0) + c.prior * prior.unwrap_or(0.0);
        if !loss.is_finite() {
            return Err(StudioError::Invalid(format!(
                "step {}: the loss is {loss} (try a lower --lr or --clip); the step was not applied",
                self.step + 1
            )));
        }
        let grad_norm = clip_global_norm(self.model(), &mut grads, c.clip);
        let lr = c.schedule().lr(self.step);
        let model = self.model.take().expect("model present");
        self.model = Some(self.optim.step(lr, model, grads));
        // Expert load, summed over micro-batches (the counts are global).
        let layers = stats[0].counts.len();
        let counts: Vec<Option<Vec<usize>>> = (0..layers)
            .map(|l| {
                let mut sum: Option<Vec<usize>> = None;
                for s in &stats {
                    if let Some(cn) = &s.counts[l] {
                        let acc = sum.get_or_insert_with(|| vec![0; cn.len()]);
                        acc.iter_mut().zip(cn).for_each(|(a, b)| *a += b);
                    }
                }
                sum
            })
            .collect();
        let expert_load = counts
            .iter()
            .map(|v| {
                v.as_ref().map(|v| {
                    let t = v.iter().sum::<usize>().max(1) as f64;
                    v.iter().map(|&x| x as f64 / t).collect()
                })
            })
            .collect();
        let selection_bias = self.update_selection_biases(&counts);
        self.step += 1;
        let tokens = c.tokens_per_step();
        self.tokens += tokens as u64;
        self.last_loss = Some(loss);
        #[cfg(not(target_arch = "wasm32"))]
        let seconds = t0.elapsed().as_secs_f64();
        #[cfg(target_arch = "wasm32")]
        let seconds = 0.0;
        Ok(StepMetrics {
            step: self.step,
            steps: c.steps,
            loss,
            ce_loss: ce,
            lb_loss: lb,
            z_loss: z,
            prior_loss: prior,
            lr,
            grad_norm,
            tokens,
            tokens_seen: self.tokens,
            seconds,
            tokens_per_s: if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 },
            expert_load,
            source_sequences,
            selection_bias,
        })
    }

    /// With `--balance aux-free`, moves each MoE layer's selection bias by
    /// the sign of its load error over the step (`counts`, routed slots per
    /// expert); returns every layer's bias after the update (empty when no
    /// layer has one).
    fn update_selection_biases(&mut self, counts: &[Option<Vec<usize>>]) -> Vec<Option<Vec<f64>>> {
        let (balance, rate) = (self.config.balance, self.config.bias_update_rate);
        let model = self.model.as_mut().expect("model present");
        let mut out = Vec::with_capacity(model.layers.len());
        for (block, c) in model.layers.iter_mut().zip(counts) {
            let bias = match (&mut block.mlp, c) {
                (Mlp::Moe(m), Some(c)) => m.selection_bias.as_mut().map(|b| {
                    if balance == Balance::AuxFree {
                        update_selection_bias(b, c, rate);
                    }
                    b.iter().map(|&x| f64::from(x)).collect()
                }),
                _ => None,
            };
            out.push(bias);
        }
        if out.iter().all(Option::is_none) {
            out.clear();
        }
        out
    }

    /// The state that a checkpoint records (without the optimizer bytes'
    /// size, filled in when saving).
    pub fn state(&self) -> TrainerState {
        TrainerState {
            format: "moe-studio-trainer-state".into(),
            version: 1,
            step: self.step,
            tokens: self.tokens,
            config: self.config.clone(),
            data: self.data.state().clone(),
            sources: self.data.fingerprint(),
            optimizer_bytes: 0,
            last_loss: self.last_loss,
        }
    }

    /// The inference copy of the model (inner backend).
    pub fn inference_model(&self) -> Transformer<B::InnerBackend> {
        self.model().valid()
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::checkpoint::{open_model, DType};
    use crate::model::{load_model, save_model};
    use crate::train::checkpoint::{
        latest_checkpoint, list_checkpoints, read_state, record_from_bytes, record_to_bytes, CHECKPOINT_PREFIX,
        FINAL_DIR, OPTIMIZER_FILE, STATE_FILE,
    };

    /// How [`Trainer::run`] ended.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum RunOutcome {
        /// All steps done; the final checkpoint.
        Finished(PathBuf),
        /// Stopped by the flag after `step` steps; the checkpoint written
        /// (`None` when no step had run).
        Stopped {
            /// Steps completed.
            step: usize,
            /// The checkpoint to resume from.
            checkpoint: Option<PathBuf>,
        },
    }

    impl<B: AutodiffBackend> Trainer<B> {
        /// Continues the run saved in checkpoint directory `dir`: loads its
        /// weights on `devices[0]`, the AdamW state, the step and the data
        /// position. `config` must equal the saved one except for `steps`,
        /// `save_every` and `keep`; `data` must be the same sources.
        ///
        /// # Errors
        /// I/O and format errors naming the checkpoint;
        /// [`StudioError::Config`] listing the options that differ;
        /// [`StudioError::Invalid`] when the data differs.
        pub fn resume(dir: &Path, mut data: Mixture, config: TrainConfig, devices: Vec<B::Device>) -> Result<Self> {
            let st = read_state(dir)?;
            let mut saved = st.config.clone();
            saved.steps = config.steps;
            saved.save_every = config.save_every;
            saved.keep = config.keep;
            if saved != config {
                let a = serde_json::to_value(&saved).expect("json");
                let b = serde_json::to_value(&config).expect("json");
                let diff: Vec<String> = a
                    .as_object()
                    .expect("object")
                    .iter()
                    .filter(|(k, v)| b.get(k.as_str()) != Some(v))
                    .map(|(k, v)| format!("{k} (saved {v}, now {})", b[k.as_str()]))
                    .collect();
                return Err(StudioError::config(
                    dir.display(),
                    format!(
                        "--resume needs the options of the saved run; these differ: {} (only --steps, --save-every \
                         and --keep may change)",
                        diff.join(", ")
                    ),
                ));
            }
            if st.sources != data.fingerprint() {
                return Err(StudioError::Invalid(format!(
                    "{}: --resume needs the same --data (the checkpoint was trained on {:?})",
                    dir.display(),
                    st.sources.iter().map(|s| format!("{} ({} tokens)", s.name, s.tokens)).collect::<Vec<_>>()
                )));
            }
            data.set_state(st.data.clone())?;
            let m = open_model(dir)?;
            let model = load_model::<B>(&m, &devices[0])?;
            let mut t = Trainer::new(model, data, config, devices, &dir.display().to_string())?;
            let p = dir.join(OPTIMIZER_FILE);
            let bytes = std::fs::read(&p).map_err(|e| StudioError::io(p.display(), e))?;
            if bytes.len() != st.optimizer_bytes {
                return Err(StudioError::format(
                    p.display(),
                    "optimizer record",
                    format!("{} bytes, the trainer state says {}", bytes.len(), st.optimizer_bytes),
                ));
            }
            let record =
                record_from_bytes::<B, <Adam<B> as Optimizer<Transformer<B>, B>>::Record>(bytes, &t.devices[0])?;
            t.optim = t.optim.load_record(record);
            t.step = st.step;
            t.tokens = st.tokens;
            t.last_loss = st.last_loss;
            Ok(t)
        }

        /// Writes a checkpoint into `dir` (which must not exist or be
        /// empty): f32 weights + config.json + extra files +
        /// `trainer_state.json` + `optimizer.bin`, atomically.
        ///
        /// # Errors
        /// I/O errors, an existing non-empty `dir`.
        pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
            let opt = record_to_bytes::<B, _>(self.optim.to_record());
            let mut state = self.state();
            state.optimizer_bytes = opt.len();
            let mut extra: Vec<(&str, Vec<u8>)> =
                self.extra_files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
            extra.push((STATE_FILE, serde_json::to_vec_pretty(&state).expect("json")));
            extra.push((OPTIMIZER_FILE, opt));
            let provenance = serde_json::json!({
                "method": format!("train/{}", self.config.stage.name()),
                "source": self.source,
                "step": self.step,
                "steps": self.config.steps,
                "data": self.data.fingerprint(),
            });
            save_model(self.model(), dir, DType::F32, extra, provenance, crate::layout::LayoutRequest::Auto)
        }

        /// Runs until `config.steps`, writing periodic checkpoints
        /// (`out/checkpoint-NNNNNN`, the newest `keep` kept) and the final
        /// one (`out/final`), calling `on_step` after each step. Checks
        /// `stop` before each step: when set, saves a checkpoint and returns
        /// [`RunOutcome::Stopped`].
        ///
        /// # Errors
        /// Those of [`Trainer::step`] and [`Trainer::save_checkpoint`].
        pub fn run(
            &mut self,
            out: &Path,
            stop: &AtomicBool,
            mut on_step: impl FnMut(&StepMetrics),
        ) -> Result<RunOutcome> {
            std::fs::create_dir_all(out).map_err(|e| StudioError::io(out.display(), e))?;
            while self.step < self.config.steps {
                if stop.load(Ordering::SeqCst) {
                    return self.stopped(out);
                }
                let m = self.step()?;
                on_step(&m);
                let every = self.config.save_every;
                if every > 0 && self.step.is_multiple_of(every) && self.step < self.config.steps {
                    self.save_periodic(out)?;
                }
            }
            let fin = out.join(FINAL_DIR);
            let old = out.join(format!("{FINAL_DIR}.old"));
            if fin.exists() {
                if old.exists() {
                    std::fs::remove_dir_all(&old).map_err(|e| StudioError::io(old.display(), e))?;
                }
                std::fs::rename(&fin, &old).map_err(|e| StudioError::io(fin.display(), e))?;
            }
            self.save_checkpoint(&fin)?;
            if old.exists() {
                std::fs::remove_dir_all(&old).map_err(|e| StudioError::io(old.display(), e))?;
            }
            Ok(RunOutcome::Finished(fin))
        }

        fn periodic_dir(&self, out: &Path) -> PathBuf {
            out.join(format!("{CHECKPOINT_PREFIX}{:06}", self.step))
        }

        fn save_periodic(&self, out: &Path) -> Result<PathBuf> {
            let dir = self.periodic_dir(out);
            if !dir.exists() {
                self.save_checkpoint(&dir)?;
            }
            let periodic: Vec<(usize, PathBuf)> = list_checkpoints(out)
                .into_iter()
                .filter(|(_, p)| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(CHECKPOINT_PREFIX)))
                .collect();
            let keep = self.config.keep.max(1);
            if periodic.len() > keep {
                for (_, p) in &periodic[..periodic.len() - keep] {
                    std::fs::remove_dir_all(p).map_err(|e| StudioError::io(p.display(), e))?;
                }
            }
            Ok(dir)
        }

        fn stopped(&self, out: &Path) -> Result<RunOutcome> {
            if self.step == 0 {
                return Ok(RunOutcome::Stopped { step: 0, checkpoint: None });
            }
            if let Some((s, p)) = latest_checkpoint(out) {
                if s == self.step {
                    return Ok(RunOutcome::Stopped { step: self.step, checkpoint: Some(p) });
                }
            }
            let dir = self.save_periodic(out)?;
            Ok(RunOutcome::Stopped { step: self.step, checkpoint: Some(dir) })
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use native::RunOutcome;
