//! Mixture-of-Experts FFN layer with a top-k router and sparse dispatch.
//!
//! Router `r(x) = (W_r x + b_r) / T` with `W_r: [E, d]`; each token takes
//! the `k` largest logits, softmax over those `k` gives the weights, and the
//! output is the weighted sum of the chosen experts' SwiGLU outputs. Only
//! chosen experts compute: tokens are gathered per expert, run, and
//! scatter-added back (never all experts times a mask).
//!
//! Sources: Shazeer et al., "Outrageously Large Neural Networks" (2017) §2;
//! Fedus et al., "Switch Transformers" (2022) §2.2 for the load-balancing
//! statistics; Jiang et al., "Mixtral of Experts" (2024) §2 (softmax over
//! all logits then top-k renormalised is the same as softmax over the top-k).

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{activation::softmax, backend::Backend, IndexingUpdateOp, Int, Tensor, TensorData};

use super::SwiGlu;

/// An MoE FFN layer.
#[derive(Module, Debug)]
pub struct MoeLayer<B: Backend> {
    /// Router (`block_sparse_moe.gate`): `d -> E`, Burn weight `[d, E]`,
    /// optional bias `[E]`.
    pub gate: Linear<B>,
    /// The experts (`block_sparse_moe.experts.{e}`), each a SwiGLU FFN.
    pub experts: Vec<SwiGlu<B>>,
    /// Experts per token `k`.
    pub top_k: usize,
    /// Router temperature `T`.
    pub temperature: f64,
    /// Experts excluded from training (DeltaMoE: expert 0).
    #[module(skip)]
    pub frozen: Vec<usize>,
}

/// What the router did in one forward pass of one layer.
#[derive(Debug, Clone)]
pub struct RoutingTrace<B: Backend> {
    /// Router logits after the temperature, `[tokens, E]` (differentiable:
    /// the load-balancing and language-prior losses use them).
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
    /// last expert.
    Forced(usize),
}

impl<B: Backend> MoeLayer<B> {
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

    /// `x: [batch, seq, d] -> [batch, seq, d]` with the routing trace.
    pub fn forward(&self, x: Tensor<B, 3>, routing: Routing) -> (Tensor<B, 3>, RoutingTrace<B>) {
        let [b, s, d] = x.dims();
        let n = b * s;
        let e_count = self.num_experts();
        let flat = x.reshape([n, d]);
        let logits = self.router_logits(flat.clone());
        let device = flat.device();
        if let Routing::Forced(e) = routing {
            let e = e.min(e_count - 1);
            let out = self.experts[e].forward(flat);
            let mut counts = vec![0; e_count];
            counts[e] = n;
            let trace = RoutingTrace { logits, chosen: vec![e as u32; n], counts, top_k: 1 };
            return (out.reshape([b, s, d]), trace);
        }
        let k = self.top_k.min(e_count);
        let (_, idx) = logits.clone().topk_with_indices(k, 1);
        // Weights: softmax over the chosen logits (gathered, so gradients
        // reach the router through them).
        let weights = softmax(logits.clone().gather(1, idx.clone()), 1).reshape([n * k]);
        // The one device -> host read of the layer: the chosen experts
        // (`n * k` ids; the trace keeps them and the dispatch below needs
        // each expert's token count to size its product).
        let chosen: Vec<u32> =
            idx.into_data().convert::<i64>().to_vec::<i64>().expect("int data").into_iter().map(|x| x as u32).collect();
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
        (out.reshape([b, s, d]), RoutingTrace { logits, chosen, counts: plan.counts, top_k: k })
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
        }
    }

    /// Dense reference: every expert on every token, weights from a full
    /// softmax over the top-k logits computed on the host.
    #[test]
    fn sparse_dispatch_equals_dense_weighted_sum() {
        let (d, f, e, k, n) = (6, 10, 4, 2, 7);
        let dev = Default::default();
        let router: Vec<f32> = (0..e * d).map(|j| ((j as f32) * 1.3).cos()).collect();
        let layer = MoeLayer {
            gate: linear_from_hf(&router, e, d, Some(vec![0.1, -0.2, 0.0, 0.3]), &dev),
            experts: (0..e).map(|i| ffn(i as f32, d, f)).collect(),
            top_k: k,
            temperature: 0.7,
            frozen: vec![0],
        };
        let xs: Vec<f32> = (0..n * d).map(|j| ((j as f32) * 0.71).sin()).collect();
        let x = Tensor::<B, 3>::from_data(TensorData::new(xs.clone(), [1, n, d]), &dev);
        let (out, trace) = layer.forward(x.clone(), Routing::Learned);
        let out: Vec<f32> = out.into_data().to_vec().unwrap();
        assert_eq!(trace.counts.iter().sum::<usize>(), n * k);
        let flat = x.reshape([n, d]);
        let logits: Vec<f32> = layer.router_logits(flat.clone()).into_data().to_vec().unwrap();
        let expert_out: Vec<Vec<f32>> =
            layer.experts.iter().map(|ex| ex.forward(flat.clone()).into_data().to_vec().unwrap()).collect();
        for t in 0..n {
            let row = &logits[t * e..(t + 1) * e];
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|a, b| row[*b].partial_cmp(&row[*a]).unwrap());
            let top = &order[..k];
            let z: f32 = top.iter().map(|&i| row[i].exp()).sum();
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
    }

    #[test]
    fn forced_routing_uses_one_expert() {
        let (d, f) = (4, 5);
        let dev = Default::default();
        let layer = MoeLayer {
            gate: linear_from_hf(&[0.0; 8], 2, d, None, &dev),
            experts: vec![ffn(0.0, d, f), ffn(5.0, d, f)],
            top_k: 1,
            temperature: 1.0,
            frozen: vec![],
        };
        let x = Tensor::<B, 3>::from_data(TensorData::new(vec![0.5f32; 2 * d], [1, 2, d]), &dev);
        let (out, trace) = layer.forward(x.clone(), Routing::Forced(1));
        let want: Vec<f32> = layer.experts[1].forward(x).into_data().to_vec().unwrap();
        assert_eq!(out.into_data().to_vec::<f32>().unwrap(), want);
        assert_eq!(trace.counts, vec![0, 2]);
    }
}
