//! Mixture-of-Experts FFN layer with a top-k router, sparse dispatch and
//! optional shared experts.
//!
//! Router `r(x) = (W_r x + b_r) / T` with `W_r: [E, d]`; each token takes
//! the `k` largest scores and the output is the weighted sum of the chosen
//! experts' SwiGLU outputs ([`routing_weights`]: softmax over the `k` chosen
//! logits, or with `norm_topk_prob: false` each chosen expert's softmax over
//! all `E`). An aux-loss-free selection bias ([`MoeLayer::selection_bias`],
//! DeepSeek-V3 §2.1.2) shifts which experts are chosen, never their weights.
//! Shared experts ([`MoeLayer::shared_output`]) run on every token and are
//! added, each optionally scaled by a sigmoid gate. Only chosen experts
//! compute: tokens are gathered per expert, run, and scatter-added back
//! (never all experts times a mask).
//!
//! Sources: Shazeer et al., "Outrageously Large Neural Networks" (2017) §2;
//! Fedus et al., "Switch Transformers" (2022) §2.1-2.2 (un-normalised
//! top-k weights, load-balancing statistics); Jiang et al., "Mixtral of
//! Experts" (2024) §2 (softmax over all logits then top-k renormalised is
//! the same as softmax over the top-k); Dai et al., "DeepSeekMoE" (2024)
//! §3.2 and Qwen2-MoE (`Qwen2MoeSparseMoeBlock`, transformers) for shared
//! experts; DeepSeek-AI, "DeepSeek-V3" (2024) §2.1.2 for the selection bias.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{
    activation::{sigmoid, softmax},
    backend::Backend,
    IndexingUpdateOp, Int, Tensor, TensorData,
};

use super::SwiGlu;

/// An MoE FFN layer.
#[derive(Module, Debug)]
pub struct MoeLayer<B: Backend> {
    /// Router (`block_sparse_moe.gate`): `d -> E`, Burn weight `[d, E]`,
    /// optional bias `[E]`.
    pub gate: Linear<B>,
    /// The routed experts (`block_sparse_moe.experts.{e}`), each a SwiGLU
    /// FFN (of width `expert_intermediate_size`).
    pub experts: Vec<SwiGlu<B>>,
    /// Always-active shared experts
    /// (`block_sparse_moe.shared_experts.{i}`), empty for none.
    pub shared_experts: Vec<SwiGlu<B>>,
    /// Sigmoid gates of the shared experts (`block_sparse_moe.shared_expert_gate`):
    /// `d -> N`, Burn weight `[d, N]`, no bias; `None` = ungated.
    pub shared_expert_gate: Option<Linear<B>>,
    /// Experts per token `k`.
    pub top_k: usize,
    /// Router temperature `T`.
    pub temperature: f64,
    /// Experts excluded from training (DeltaMoE: expert 0).
    #[module(skip)]
    pub frozen: Vec<usize>,
    /// Shared experts and their gate excluded from training.
    #[module(skip)]
    pub shared_frozen: bool,
    /// Renormalise the chosen weights over the top-k (see
    /// [`routing_weights`]).
    #[module(skip)]
    pub norm_topk_prob: bool,
    /// Aux-loss-free selection bias `[E]` (DeepSeek-V3 §2.1.2), added to
    /// the router logits to choose the top-k only. Not a parameter: the
    /// trainer moves it by the sign of each expert's load error
    /// (`train::balance`).
    #[module(skip)]
    pub selection_bias: Option<Vec<f32>>,
}

/// What the router did in one forward pass of one layer.
#[derive(Debug, Clone)]
pub struct RoutingTrace<B: Backend> {
    /// Router logits after the temperature, `[tokens, E]` (differentiable:
    /// the load-balancing, z- and language-prior losses use them; the
    /// selection bias is not in them).
    pub logits: Tensor<B, 2>,
    /// Chosen experts, `tokens * k` row-major (`chosen[t * k + j]`).
    pub chosen: Vec<u32>,
    /// Routed token slots per expert, `[E]` (sums to `tokens * k`).
    pub counts: Vec<usize>,
    /// `k` of this layer.
    pub top_k: usize,
}

/// How the experts are chosen in a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// By the router (top-k).
    #[default]
    Learned,
    /// Every token to one expert with weight 1 (DUME's oracle statistics
    /// pass, and the oracle baseline). Layers with fewer experts use their
    /// last expert. Shared experts still run.
    Forced(usize),
}

/// The `k` experts with the highest `scores` (`[n, E]`) per row, highest
/// first, ties broken by the LOWER expert index: `n * k` indices,
/// row-major. Computed on the host because Burn's sort is unstable (it may
/// order equal values either way, and backends differ); the studio's
/// documented behaviour needs determinism: a zero router picks experts
/// `0..k`, and granular upcycling's zero router picks whole copies (the
/// slices `c·G .. c·G + G` of the first `k` copies).
pub fn top_k_lowest_index_first<B: Backend>(scores: Tensor<B, 2>, k: usize) -> Vec<u32> {
    let [n, e] = scores.dims();
    let v: Vec<f32> = scores.into_data().convert::<f32>().to_vec().expect("float data");
    let mut out = Vec::with_capacity(n * k);
    let mut order: Vec<u32> = Vec::with_capacity(e);
    for row in v.chunks(e.max(1)).take(n) {
        order.clear();
        order.extend(0..e as u32);
        // Stable: equal scores keep ascending index order (-0.0 equals 0.0;
        // NaN ranks last).
        let key = |i: u32| {
            let x = row[i as usize];
            if x.is_nan() {
                f32::NEG_INFINITY
            } else {
                x + 0.0
            }
        };
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
        out.extend_from_slice(&order[..k.min(e)]);
    }
    out
}

/// The weights of the chosen experts, `[n * k]` row-major, from the router
/// `logits` `[n, E]` (temperature applied, selection bias NOT applied) and
/// the chosen indices `idx` `[n, k]`:
///
/// - `norm_topk_prob = true` (Mixtral; Qwen2-MoE `norm_topk_prob: true`):
///   `softmax` over the `k` chosen logits, so the weights sum to 1 and an
///   upcycled layer of equal experts computes the dense FFN for any router;
/// - `false` (Switch Transformers §2.1; Qwen2-MoE's default): each chosen
///   expert's probability in the softmax over all `E` logits. The weights
///   then sum to less than 1, and a top-1 router gets a gradient from the
///   next-token loss (with renormalisation its one weight is always 1).
///
/// Differentiable: gradients reach the router through `logits`.
pub fn routing_weights<B: Backend>(logits: Tensor<B, 2>, idx: Tensor<B, 2, Int>, norm_topk_prob: bool) -> Tensor<B, 1> {
    let [n, k] = idx.dims();
    let w = if norm_topk_prob { softmax(logits.gather(1, idx), 1) } else { softmax(logits, 1).gather(1, idx) };
    w.reshape([n * k])
}

impl<B: Backend> MoeLayer<B> {
    /// A layer of routed experts only: nothing frozen, no shared experts,
    /// renormalised top-k, no selection bias.
    pub fn new(gate: Linear<B>, experts: Vec<SwiGlu<B>>, top_k: usize, temperature: f64) -> Self {
        MoeLayer {
            gate,
            experts,
            shared_experts: Vec::new(),
            shared_expert_gate: None,
            top_k,
            temperature,
            frozen: Vec::new(),
            shared_frozen: false,
            norm_topk_prob: true,
            selection_bias: None,
        }
    }

    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// Router logits `[n, E]` for inputs `[n, d]` (temperature applied).
    pub fn router_logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let logits = self.gate.forward(x);
        if self.temperature == 1.0 {
            logits
        } else {
            logits.div_scalar(self.temperature)
        }
    }

    /// The scores the top-k selection ranks, `[n, E]`: the router logits
    /// plus the aux-loss-free selection bias when the layer has one
    /// (DeepSeek-V3 §2.1.2), else the logits themselves.
    pub fn selection_scores(&self, logits: &Tensor<B, 2>) -> Tensor<B, 2> {
        match &self.selection_bias {
            None => logits.clone(),
            Some(bias) => {
                let e = bias.len();
                let b = Tensor::<B, 2>::from_data(TensorData::new(bias.clone(), [1, e]), &logits.device());
                logits.clone() + b
            }
        }
    }

    /// The shared experts' term for inputs `[n, d]`:
    /// `sum_i g_i(x) * shared_i(x)` with `g_i = sigmoid(gate_i · x)` when
    /// gated (Qwen2-MoE), else 1 (DeepSeekMoE); `None` without shared
    /// experts.
    pub fn shared_output(&self, flat: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
        if self.shared_experts.is_empty() {
            return None;
        }
        let gates = self.shared_expert_gate.as_ref().map(|g| sigmoid(g.forward(flat.clone())));
        let mut sum: Option<Tensor<B, 2>> = None;
        for (i, ex) in self.shared_experts.iter().enumerate() {
            let mut y = ex.forward(flat.clone());
            if let Some(g) = &gates {
                y = y * g.clone().narrow(1, i, 1);
            }
            sum = Some(match sum {
                Some(s) => s + y,
                None => y,
            });
        }
        sum
    }

    /// `x: [batch, seq, d] -> [batch, seq, d]` with the routing trace.
    pub fn forward(&self, x: Tensor<B, 3>, routing: Routing) -> (Tensor<B, 3>, RoutingTrace<B>) {
        let [b, s, d] = x.dims();
        let flat = x.reshape([b * s, d]);
        let shared = self.shared_output(flat.clone());
        let (mut out, trace) = self.routed(flat, routing);
        if let Some(y) = shared {
            out = out + y;
        }
        (out.reshape([b, s, d]), trace)
    }

    /// The routed experts' output for inputs `[n, d]` and the trace.
    fn routed(&self, flat: Tensor<B, 2>, routing: Routing) -> (Tensor<B, 2>, RoutingTrace<B>) {
        let [n, d] = flat.dims();
        let e_count = self.num_experts();
        let logits = self.router_logits(flat.clone());
        let device = flat.device();
        if let Routing::Forced(e) = routing {
            let e = e.min(e_count - 1);
            let out = self.experts[e].forward(flat);
            let mut counts = vec![0; e_count];
            counts[e] = n;
            let trace = RoutingTrace { logits, chosen: vec![e as u32; n], counts, top_k: 1 };
            return (out, trace);
        }
        let k = self.top_k.min(e_count);
        let chosen = top_k_lowest_index_first(self.selection_scores(&logits), k);
        let idx_data: Vec<i64> = chosen.iter().map(|&e| i64::from(e)).collect();
        let idx = Tensor::<B, 2, Int>::from_data(TensorData::new(idx_data, [n, k]), &device);
        // Weights gathered from the logits, so gradients reach the router.
        let weights = routing_weights(logits.clone(), idx, self.norm_topk_prob);
        let plan = DispatchPlan::new(&chosen, k, e_count);
        // Sort the routed slots by expert once (one gather of the inputs and
        // one of the weights, one upload of two index vectors), run each
        // expert on its contiguous block, and scatter-add all results back
        // in one pass.
        let slots = Tensor::<B, 1, Int>::from_data(TensorData::new(plan.slots, [n * k]), &device);
        let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(plan.rows, [n * k]), &device);
        let xs = flat.select(0, rows.clone());
        let ws = weights.select(0, slots).reshape([n * k, 1]);
        let mut ys = Vec::with_capacity(e_count);
        let mut offset = 0;
        for (e, &m) in plan.counts.iter().enumerate() {
            if m > 0 {
                ys.push(self.experts[e].forward(xs.clone().narrow(0, offset, m)));
                offset += m;
            }
        }
        let y = Tensor::cat(ys, 0) * ws;
        let out = Tensor::<B, 2>::zeros([n, d], &device).select_assign(0, rows, y, IndexingUpdateOp::Add);
        (out, RoutingTrace { logits, chosen, counts: plan.counts, top_k: k })
    }
}

/// Routed slots grouped by expert (a counting sort of the chosen experts).
struct DispatchPlan {
    /// Slot indices `t * k + j` ordered by expert, stable within an expert.
    slots: Vec<i64>,
    /// The token row of each entry of `slots` (`slot / k`).
    rows: Vec<i64>,
    /// Slots per expert.
    counts: Vec<usize>,
}

impl DispatchPlan {
    fn new(chosen: &[u32], k: usize, num_experts: usize) -> Self {
        let mut counts = vec![0usize; num_experts];
        for &e in chosen {
            counts[e as usize] += 1;
        }
        let mut next: Vec<usize> = counts
            .iter()
            .scan(0usize, |acc, &c| {
                let start = *acc;
                *acc += c;
                Some(start)
            })
            .collect();
        let mut slots = vec![0i64; chosen.len()];
        for (slot, &e) in chosen.iter().enumerate() {
            slots[next[e as usize]] = slot as i64;
            next[e as usize] += 1;
        }
        let rows = slots.iter().map(|&s| s / k as i64).collect();
        DispatchPlan { slots, rows, counts }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::linear::linear_from_hf;
    use crate::CpuBackend;

    type B = CpuBackend;

    fn ffn(seed: f32, d: usize, f: usize) -> SwiGlu<B> {
        let dev = Default::default();
        let w = |o: usize, i: usize, s: f32| -> Vec<f32> {
            (0..o * i).map(|j| ((j as f32 * 0.37 + s).sin()) * 0.3).collect()
        };
        SwiGlu {
            gate_proj: linear_from_hf(&w(f, d, seed), f, d, None, &dev),
            up_proj: linear_from_hf(&w(f, d, seed + 1.0), f, d, None, &dev),
            down_proj: linear_from_hf(&w(d, f, seed + 2.0), d, f, None, &dev),
            activation: Default::default(),
        }
    }

    /// Dense reference: every expert on every token, the top-k chosen on the
    /// host from the logits plus the selection bias, the weights from the
    /// logits alone (renormalised over the top-k, or the full softmax).
    fn check_against_host(norm_topk_prob: bool, selection_bias: Option<Vec<f32>>) {
        let (d, f, e, k, n) = (6, 10, 4, 2, 7);
        let dev = Default::default();
        let router: Vec<f32> = (0..e * d).map(|j| ((j as f32) * 1.3).cos()).collect();
        let mut layer = MoeLayer::new(
            linear_from_hf(&router, e, d, Some(vec![0.1, -0.2, 0.0, 0.3]), &dev),
            (0..e).map(|i| ffn(i as f32, d, f)).collect(),
            k,
            0.7,
        );
        layer.norm_topk_prob = norm_topk_prob;
        layer.selection_bias = selection_bias.clone();
        let xs: Vec<f32> = (0..n * d).map(|j| ((j as f32) * 0.71).sin()).collect();
        let x = Tensor::<B, 3>::from_data(TensorData::new(xs.clone(), [1, n, d]), &dev);
        let (out, trace) = layer.forward(x.clone(), Routing::Learned);
        let out: Vec<f32> = out.into_data().to_vec().unwrap();
        assert_eq!(trace.counts.iter().sum::<usize>(), n * k);
        let flat = x.reshape([n, d]);
        let logits: Vec<f32> = layer.router_logits(flat.clone()).into_data().to_vec().unwrap();
        let expert_out: Vec<Vec<f32>> =
            layer.experts.iter().map(|ex| ex.forward(flat.clone()).into_data().to_vec().unwrap()).collect();
        let bias = selection_bias.unwrap_or(vec![0.0; e]);
        let mut moved = 0;
        for t in 0..n {
            let row = &logits[t * e..(t + 1) * e];
            let score: Vec<f32> = row.iter().zip(&bias).map(|(a, b)| a + b).collect();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|a, b| score[*b].partial_cmp(&score[*a]).unwrap());
            let top = &order[..k];
            let mut by_logit: Vec<usize> = (0..e).collect();
            by_logit.sort_by(|a, b| row[*b].partial_cmp(&row[*a]).unwrap());
            moved += usize::from(top.iter().any(|i| !by_logit[..k].contains(i)));
            let z: f32 = if norm_topk_prob { top.iter() } else { order.iter() }.map(|&i| row[i].exp()).sum();
            for c in 0..d {
                let expect: f32 = top.iter().map(|&i| row[i].exp() / z * expert_out[i][t * d + c]).sum();
                assert!((out[t * d + c] - expect).abs() < 1e-5, "token {t} dim {c}");
            }
            let mut picked: Vec<u32> = trace.chosen[t * k..(t + 1) * k].to_vec();
            picked.sort();
            let mut want: Vec<u32> = top.iter().map(|&i| i as u32).collect();
            want.sort();
            assert_eq!(picked, want);
        }
        if bias.iter().any(|&b| b != 0.0) {
            assert!(moved > 0, "the selection bias should change some choice");
        }
    }

    #[test]
    fn sparse_dispatch_equals_dense_weighted_sum() {
        check_against_host(true, None);
    }

    /// Switch / Qwen2-MoE `norm_topk_prob: false`: the softmax over all E.
    #[test]
    fn unnormalised_top_k_weighs_by_the_full_softmax() {
        check_against_host(false, None);
    }

    /// DeepSeek-V3's selection bias changes the choice, not the weights.
    #[test]
    fn selection_bias_moves_the_choice_only() {
        check_against_host(true, Some(vec![0.0, 3.0, -3.0, 0.5]));
        check_against_host(false, Some(vec![-2.0, 0.0, 2.0, 0.0]));
    }

    #[test]
    fn shared_experts_add_to_every_token_gated_or_not() {
        let (d, f, n) = (4, 6, 3);
        let dev = Default::default();
        let router: Vec<f32> = (0..2 * d).map(|j| (j as f32 * 0.9).sin()).collect();
        let routed_only =
            MoeLayer::new(linear_from_hf(&router, 2, d, None, &dev), vec![ffn(0.0, d, f), ffn(1.0, d, f)], 1, 1.0);
        let xs: Vec<f32> = (0..n * d).map(|j| ((j as f32) * 0.43).cos()).collect();
        let x = Tensor::<B, 3>::from_data(TensorData::new(xs, [1, n, d]), &dev);
        let base: Vec<f32> = routed_only.forward(x.clone(), Routing::Learned).0.into_data().to_vec().unwrap();
        let shared = [ffn(3.0, d, f), ffn(4.0, d, f)];
        let flat = x.clone().reshape([n, d]);
        let sh: Vec<Vec<f32>> = shared.iter().map(|s| s.forward(flat.clone()).into_data().to_vec().unwrap()).collect();
        let gate_w: Vec<f32> = (0..2 * d).map(|j| (j as f32 * 0.3).cos()).collect();
        for gated in [false, true] {
            let mut layer = MoeLayer::new(routed_only.gate.clone(), routed_only.experts.clone(), 1, 1.0);
            layer.shared_experts = shared.to_vec();
            if gated {
                layer.shared_expert_gate = Some(linear_from_hf(&gate_w, 2, d, None, &dev));
            }
            let out: Vec<f32> = layer.forward(x.clone(), Routing::Learned).0.into_data().to_vec().unwrap();
            for t in 0..n {
                let xt = &flat.clone().into_data().to_vec::<f32>().unwrap()[t * d..(t + 1) * d];
                let g = |i: usize| -> f32 {
                    if !gated {
                        return 1.0;
                    }
                    let z: f32 = gate_w[i * d..(i + 1) * d].iter().zip(xt).map(|(a, b)| a * b).sum();
                    1.0 / (1.0 + (-z).exp())
                };
                for c in 0..d {
                    let want = base[t * d + c] + g(0) * sh[0][t * d + c] + g(1) * sh[1][t * d + c];
                    assert!((out[t * d + c] - want).abs() < 1e-5, "gated {gated} token {t} dim {c}");
                }
            }
        }
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let dev = Default::default();
        let s = Tensor::<B, 2>::from_data(TensorData::new(vec![0.0f32; 40], [2, 20]), &dev);
        assert_eq!(top_k_lowest_index_first(s, 4), vec![0, 1, 2, 3, 0, 1, 2, 3]);
        let s = Tensor::<B, 2>::from_data(TensorData::new(vec![1.0f32, 2.0, 2.0, 0.5, 2.0, 3.0], [1, 6]), &dev);
        assert_eq!(top_k_lowest_index_first(s, 3), vec![5, 1, 2]);
    }

    #[test]
    fn forced_routing_uses_one_expert() {
        let (d, f) = (4, 5);
        let dev = Default::default();
        let layer =
            MoeLayer::new(linear_from_hf(&[0.0; 8], 2, d, None, &dev), vec![ffn(0.0, d, f), ffn(5.0, d, f)], 1, 1.0);
        let x = Tensor::<B, 3>::from_data(TensorData::new(vec![0.5f32; 2 * d], [1, 2, d]), &dev);
        let (out, trace) = layer.forward(x.clone(), Routing::Forced(1));
        let want: Vec<f32> = layer.experts[1].forward(x).into_data().to_vec().unwrap();
        assert_eq!(out.into_data().to_vec::<f32>().unwrap(), want);
        assert_eq!(trace.counts, vec![0, 2]);
    }
}
