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

//!
//! One file per part: [`config`] (the run's hyper-parameters), [`replica`]
//! (one replica's forward/backward and the gradient clipping), `native`
//! (the run loop with checkpoints, native only); this file holds the step.

use burn::module::{AutodiffModule, Module};
use burn::optim::adaptor::OptimizerAdaptor;

use super::adamw::StudioAdamW;
#[cfg(target_arch = "wasm32")]
use burn::optim::GradientsParams;
use burn::optim::Optimizer;
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};

use super::balance::{update_selection_bias, Balance};
use super::checkpoint::{assign_param_ids, fold_router_temperatures, TrainerState};
use super::data::{Batch, Mixture};
use super::freeze::{apply_stage, param_counts, ParamCounts, Stage};
#[cfg(not(target_arch = "wasm32"))]
use super::parallel::Cluster;
use crate::error::{Result, StudioError};
use crate::model::transformer::Mlp;
use crate::model::Transformer;

pub mod config;
#[cfg(not(target_arch = "wasm32"))]
mod native;
pub mod replica;

pub use config::TrainConfig;
pub use replica::clip_global_norm;
use replica::{replica_grads, LossSettings, MicroStats, ReplicaGrads};
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
    /// stage does not train (holding the frozen matrices in
    /// `config.frozen_dtype`), renumbers parameters, and builds AdamW.
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
        let (model, _) = super::freeze::hold_frozen_in(model, config.frozen_dtype, source)?;
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
pub use native::RunOutcome;
