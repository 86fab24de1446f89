//! One replica's share of an optimizer step: forward + backward of its
//! micro-batches (with the routing counts and language rows all-reduced
//! across replicas first), its summed gradients, and the global-norm
//! gradient clipping.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};

#[cfg(target_arch = "wasm32")]
use super::Cluster;
use crate::error::Result;
use crate::model::{ForwardOptions, Trace, Transformer};
use crate::train::data::Batch;
use crate::train::losses::{language_prior_loss_dp, load_balancing_loss_dp, next_token_loss, router_z_loss, LbForm};
#[cfg(not(target_arch = "wasm32"))]
use crate::train::parallel::Cluster;

/// One replica's accumulated gradients and its per-micro-batch results.
pub(super) type ReplicaGrads = (GradientsParams, Vec<MicroStats>);

/// Per-micro-batch results.
pub(super) struct MicroStats {
    pub(super) ce: f64,
    pub(super) lb: Option<f64>,
    pub(super) z: Option<f64>,
    pub(super) prior: Option<f64>,
    pub(super) counts: Vec<Option<Vec<usize>>>,
}

/// Loss settings handed to the replicas.
#[derive(Clone, Copy)]
pub(super) struct LossSettings {
    /// `alpha` with `--balance aux`, else 0.
    pub(super) alpha: f64,
    pub(super) lb_form: LbForm,
    pub(super) z_loss: f64,
    pub(super) prior: f64,
    pub(super) scale: f64,
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
/// denominator are the global batch's ([`crate::train::parallel`]); the trace's
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
/// two small all-reduces ([`crate::train::parallel`]).
pub(super) fn replica_grads<B: AutodiffBackend>(
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
