//! Training losses: next-token cross-entropy, the MoE load-balancing loss,
//! ST-MoE's router z-loss and MoE-LPR's language-prior routing loss
//! (methods.md §1, "Load balancing").
//!
//! All take the per-layer [`RoutingTrace`]s of one forward pass
//! (`Transformer::forward_hidden_with(.., Some(&mut trace))`); router logits
//! there are `[tokens, E]` with tokens in batch-major order
//! (`row = b * seq + s`) and the temperature already applied.

use burn::tensor::{activation::log_softmax, activation::softmax, backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::model::RoutingTrace;

/// Mean next-token negative log-likelihood (nats) of `logits`
/// `[batch, seq, V]` against `targets` `[batch, seq]`, as a `[1]` tensor.
pub fn next_token_loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [b, s, v] = logits.dims();
    let (logits, targets) = (logits.reshape([b * s, v]), targets.reshape([b * s]));
    // The CPU backend (with or without autodiff): one fused pass per row
    // (model::cpu_grad::cross_entropy); elsewhere Burn's composition.
    #[cfg(not(target_arch = "wasm32"))]
    let (logits, targets) = match crate::model::cpu_grad::cross_entropy(logits, targets) {
        Ok(loss) => return loss,
        Err(lt) => lt,
    };
    let logp = log_softmax(logits, 1);
    let picked = logp.gather(1, targets.reshape([b * s, 1]));
    picked.mean().neg()
}

/// Which load-balancing formula to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LbForm {
    /// methods.md §1 (Switch Transformers eq. 4-6 generalised to top-k):
    /// per MoE layer `LB_l = E * sum_i f_i * P_i` with `f_i` the fraction of
    /// routed token SLOTS (`tokens * k`) that went to expert `i` (so
    /// `sum_i f_i = 1`) and `P_i` the mean softmax-over-all-`E` router
    /// probability; the loss is the mean of `LB_l` over MoE layers. Equal to
    /// 1 for perfectly uniform routing whatever `k` and `E`.
    #[default]
    PerLayer,
    /// transformers' `load_balancing_loss_func` (Mixtral, v5.24): the
    /// counts and probabilities of all layers are pooled first,
    /// `f_i = count_i / tokens` (so `sum_i f_i = k`) and
    /// `LB = E * sum_i f_i * P_i`. With one layer it is `k` times
    /// [`LbForm::PerLayer`]. Needs the same `E` in every MoE layer.
    HfMixtral,
}

impl LbForm {
    /// Parses `per-layer` or `hf-mixtral`.
    pub fn parse(s: &str) -> Option<LbForm> {
        match s {
            "per-layer" => Some(LbForm::PerLayer),
            "hf-mixtral" | "hf" => Some(LbForm::HfMixtral),
            _ => None,
        }
    }
}

/// The load-balancing loss of one forward pass (`[1]` tensor,
/// differentiable through `P_i`; the routing fractions `f_i` are
/// constants), or `None` when no layer is MoE.
///
/// # Panics
/// With [`LbForm::HfMixtral`], if the MoE layers have different expert
/// counts (the trainer checks this up front).
pub fn load_balancing_loss<B: Backend>(routing: &[Option<RoutingTrace<B>>], form: LbForm) -> Option<Tensor<B, 1>> {
    load_balancing_loss_dp(routing, form, 1)
}

/// [`load_balancing_loss`] for one of `world` data-parallel replicas with
/// equal token counts (docs/methods.md §1 "Load balancing";
/// shared/src/train/parallel.rs): the routing fractions `f_i` come from
/// `routing[l].counts`, which hold the counts SUMMED over all replicas
/// (all-reduced), while `P_i` is this replica's mean router probability.
/// Since `P_i` of the whole batch is the mean of the replicas' `P_i`, the
/// mean of this term over the replicas equals the loss of one replica with
/// the whole batch, as `torch.distributed` runs do with all-reduced counts.
/// `world = 1` is [`load_balancing_loss`].
pub fn load_balancing_loss_dp<B: Backend>(
    routing: &[Option<RoutingTrace<B>>],
    form: LbForm,
    world: usize,
) -> Option<Tensor<B, 1>> {
    let world = world.max(1);
    let layers: Vec<&RoutingTrace<B>> = routing.iter().flatten().collect();
    let first = layers.first()?;
    let device = first.logits.device();
    match form {
        LbForm::PerLayer => {
            let mut total: Option<Tensor<B, 1>> = None;
            for r in &layers {
                let [t, e] = r.logits.dims();
                let p = softmax(r.logits.clone(), 1).mean_dim(0).reshape([e]);
                let slots = (t * r.top_k * world).max(1) as f32;
                let f: Vec<f32> = r.counts.iter().map(|&c| c as f32 / slots).collect();
                let f = Tensor::<B, 1>::from_data(TensorData::new(f, [e]), &device);
                let lb = (p * f).sum().mul_scalar(e as f64);
                total = Some(match total {
                    Some(x) => x + lb,
                    None => lb,
                });
            }
            total.map(|x| x.div_scalar(layers.len() as f64))
        }
        LbForm::HfMixtral => {
            let e = first.logits.dims()[1];
            assert!(layers.iter().all(|r| r.logits.dims()[1] == e), "hf-mixtral load balancing needs equal E");
            let mut rows = 0usize;
            let mut counts = vec![0f32; e];
            let mut psum: Option<Tensor<B, 1>> = None;
            for r in &layers {
                rows += r.logits.dims()[0];
                for (c, &n) in counts.iter_mut().zip(&r.counts) {
                    *c += n as f32;
                }
                let s = softmax(r.logits.clone(), 1).sum_dim(0).reshape([e]);
                psum = Some(match psum {
                    Some(x) => x + s,
                    None => s,
                });
            }
            let rows = rows.max(1) as f32;
            let f: Vec<f32> = counts.iter().map(|&c| c / (rows * world as f32)).collect();
            let f = Tensor::<B, 1>::from_data(TensorData::new(f, [e]), &device);
            let p = psum.expect("at least one layer").div_scalar(rows as f64);
            Some((p * f).sum().mul_scalar(e as f64))
        }
    }
}

/// The router z-loss of one forward pass (`[1]` tensor), or `None` when no
/// layer is MoE: per MoE layer
/// `L_z = (1/B) sum_t (log sum_j exp(x_tj))^2` over its `B` token rows and
/// `E` router logits `x` (temperature applied), averaged over layers. It
/// keeps router logits small, which keeps the softmax numerically stable
/// (ST-MoE's coefficient: 1e-3).
///
/// Source: Zoph et al., "ST-MoE: Designing Stable and Transferable Sparse
/// Expert Models" (2022) §3.1, Eq. 5.
pub fn router_z_loss<B: Backend>(routing: &[Option<RoutingTrace<B>>]) -> Option<Tensor<B, 1>> {
    let layers: Vec<&RoutingTrace<B>> = routing.iter().flatten().collect();
    let mut total: Option<Tensor<B, 1>> = None;
    for r in &layers {
        let [t, _] = r.logits.dims();
        // A stable log-sum-exp: max + log(sum(exp(x - max))).
        let max = r.logits.clone().max_dim(1).detach();
        let lse = (r.logits.clone() - max.clone()).exp().sum_dim(1).log() + max;
        let z = lse.powi_scalar(2).sum().div_scalar(t.max(1) as f64);
        total = Some(match total {
            Some(x) => x + z,
            None => z,
        });
    }
    total.map(|x| x.div_scalar(layers.len() as f64))
}

/// MoE-LPR's language-prior loss: for the token rows whose `mask` is true
/// (tokens of an ORIGINAL language), the cross-entropy of the router
/// distribution (one softmax over all `E` logits) against expert 0, i.e.
/// `-log softmax(logits)[0]`, averaged over those tokens and then over MoE
/// layers. `None` when no layer is MoE or no row is masked.
///
/// `mask` has one entry per token row (`batch * seq`, batch-major).
pub fn language_prior_loss<B: Backend>(routing: &[Option<RoutingTrace<B>>], mask: &[bool]) -> Option<Tensor<B, 1>> {
    let n_masked = mask.iter().filter(|&&m| m).count();
    language_prior_loss_dp(routing, mask, n_masked, 1)
}

/// [`language_prior_loss`] for one of `world` data-parallel replicas
/// (shared/src/train/parallel.rs): `masked_global` is the number of masked
/// rows over ALL replicas (all-reduced), and this replica's term is
/// `-world / masked_global * sum_{masked local rows} log p_0`, so that its
/// mean over the replicas is the loss of one replica with the whole batch,
/// also when this replica has no masked row (its term is then 0, with a
/// zero gradient). `None` when no layer is MoE or `masked_global` is 0.
/// `world = 1` with `masked_global` = the masked rows is
/// [`language_prior_loss`].
pub fn language_prior_loss_dp<B: Backend>(
    routing: &[Option<RoutingTrace<B>>],
    mask: &[bool],
    masked_global: usize,
    world: usize,
) -> Option<Tensor<B, 1>> {
    if masked_global == 0 {
        return None;
    }
    let n_masked = masked_global as f64 / world.max(1) as f64;
    let layers: Vec<&RoutingTrace<B>> = routing.iter().flatten().collect();
    let first = layers.first()?;
    let device = first.logits.device();
    let t = mask.len();
    let w: Vec<f32> = mask.iter().map(|&m| if m { 1.0 } else { 0.0 }).collect();
    let w = Tensor::<B, 2>::from_data(TensorData::new(w, [t, 1]), &device);
    let mut total: Option<Tensor<B, 1>> = None;
    for r in &layers {
        assert_eq!(r.logits.dims()[0], t, "one mask entry per token row");
        let logp0 = log_softmax(r.logits.clone(), 1).narrow(1, 0, 1);
        let l = (logp0 * w.clone()).sum().div_scalar(n_masked).neg();
        total = Some(match total {
            Some(x) => x + l,
            None => l,
        });
    }
    total.map(|x| x.div_scalar(layers.len() as f64))
}

/// Per MoE layer, the fraction of routed token slots each expert received
/// (`counts / sum(counts)`); `None` for dense layers.
pub fn expert_load<B: Backend>(routing: &[Option<RoutingTrace<B>>]) -> Vec<Option<Vec<f64>>> {
    routing
        .iter()
        .map(|r| {
            r.as_ref().map(|r| {
                let total = r.counts.iter().sum::<usize>().max(1) as f64;
                r.counts.iter().map(|&c| c as f64 / total).collect()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;

    type B = CpuBackend;

    fn trace(logits: Vec<f32>, t: usize, e: usize, k: usize) -> RoutingTrace<B> {
        let dev = Default::default();
        let lt = Tensor::<B, 2>::from_data(TensorData::new(logits.clone(), [t, e]), &dev);
        let (_, idx) = lt.clone().topk_with_indices(k, 1);
        let chosen: Vec<u32> =
            idx.into_data().convert::<i64>().to_vec::<i64>().unwrap().iter().map(|&x| x as u32).collect();
        let mut counts = vec![0; e];
        for &c in &chosen {
            counts[c as usize] += 1;
        }
        RoutingTrace { logits: lt, chosen, counts, top_k: k }
    }

    fn scalar(t: Tensor<B, 1>) -> f64 {
        t.into_scalar() as f64
    }

    #[test]
    fn uniform_routing_gives_one() {
        // Equal logits, 4 tokens, 2 experts, top-1 alternating by design of counts.
        let mut r = trace(vec![0.0; 8], 4, 2, 1);
        r.counts = vec![2, 2];
        assert!((scalar(load_balancing_loss(&[Some(r)], LbForm::PerLayer).unwrap()) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn cross_entropy_matches_host() {
        let dev = Default::default();
        let l: Vec<f32> = vec![1.0, 2.0, 0.5, -1.0, 0.0, 3.0];
        let logits = Tensor::<B, 3>::from_data(TensorData::new(l.clone(), [1, 2, 3]), &dev);
        let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![1i64, 2], [1, 2]), &dev);
        let got = scalar(next_token_loss(logits, targets));
        let nll = |row: &[f32], t: usize| {
            let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
            z.ln() - row[t] as f64
        };
        let want = (nll(&l[0..3], 1) + nll(&l[3..6], 2)) / 2.0;
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }

    /// ST-MoE Eq. 5 on logits worked by hand: rows (0, ln 3) and
    /// (ln 2, ln 2): log-sum-exps ln 4 and ln 4; rows (1, 1) and (-2, 0):
    /// 1 + ln 2 and ln(1 + e^-2). Mean of squares per layer, then over
    /// layers.
    #[test]
    fn z_loss_equals_the_st_moe_formula() {
        let ln = f64::ln;
        let l1 = vec![0.0, ln(3.0) as f32, ln(2.0) as f32, ln(2.0) as f32];
        let l2 = vec![1.0f32, 1.0, -2.0, 0.0];
        let got = scalar(router_z_loss(&[Some(trace(l1, 2, 2, 1)), None, Some(trace(l2, 2, 2, 1))]).unwrap());
        let layer1 = (ln(4.0).powi(2) + ln(4.0).powi(2)) / 2.0;
        let layer2 = ((1.0 + ln(2.0)).powi(2) + ln(1.0 + (-2f64).exp()).powi(2)) / 2.0;
        let want = (layer1 + layer2) / 2.0;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        // Large logits stay finite (the max is subtracted first).
        let big = scalar(router_z_loss(&[Some(trace(vec![1000.0, 1000.0], 1, 2, 1))]).unwrap());
        assert!((big - (1000.0 + ln(2.0)).powi(2)).abs() / big < 1e-5, "{big}");
        assert!(router_z_loss::<B>(&[None]).is_none());
    }

    #[test]
    fn prior_is_cross_entropy_against_expert_zero_on_masked_rows() {
        let l = vec![2.0, 0.0, 0.0, /* row 1 */ 0.0, 1.0, 0.0];
        let r = trace(l, 2, 3, 1);
        let got = scalar(language_prior_loss(&[Some(r), None], &[false, true]).unwrap());
        let want = (1f64.exp() + 2.0).ln(); // -log(e^0 / (1 + e + 1))
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        let r = trace(vec![0.0; 6], 2, 3, 1);
        assert!(language_prior_loss(&[Some(r)], &[false, false]).is_none());
    }
}
