//! How the routers' load is balanced in training (methods.md "Load
//! balancing"): the auxiliary load-balancing loss (Switch Transformers;
//! [`super::losses::load_balancing_loss`]), DeepSeek-V3's aux-loss-free
//! selection bias, or nothing.
//!
//! Aux-loss-free balancing (DeepSeek-AI, "DeepSeek-V3 Technical Report"
//! (2024) §2.1.2; Wang et al., "Auxiliary-Loss-Free Load Balancing Strategy
//! for Mixture-of-Experts" (2024)): every MoE layer keeps a bias `b_i` per
//! expert that is added to the router scores for the top-k SELECTION only
//! ([`crate::model::MoeLayer::selection_bias`]); the gating weights still
//! come from the unbiased logits, so the bias changes which experts a token
//! visits but gives no gradient and no term in the loss. After each
//! optimizer step, `b_i += gamma * sign(mean_load - load_i)`: an overloaded
//! expert's bias goes down by `gamma`, an underloaded one's up
//! ([`update_selection_bias`]). DeepSeek-V3 uses `gamma = 0.001` for most of
//! training (its scores are sigmoid affinities in `(0, 1)`; ours are
//! logits, so a larger `gamma` may be needed for a fast effect).

use serde::{Deserialize, Serialize};

/// The load-balancing method of a training run (`--balance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// `alpha` x the load-balancing loss (methods.md §1).
    #[default]
    Aux,
    /// DeepSeek-V3's selection bias, updated by the sign of the load error;
    /// no load-balancing term in the loss.
    AuxFree,
    /// Neither.
    None,
}

impl Balance {
    /// Parses `aux`, `aux-free` or `none`.
    pub fn parse(s: &str) -> Option<Balance> {
        match s {
            "aux" => Some(Balance::Aux),
            "aux-free" | "aux-loss-free" => Some(Balance::AuxFree),
            "none" => Some(Balance::None),
            _ => None,
        }
    }

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Balance::Aux => "aux",
            Balance::AuxFree => "aux-free",
            Balance::None => "none",
        }
    }
}

/// DeepSeek-V3's bias update for one layer: `bias[i] += rate * sign(mean -
/// counts[i])` with `mean = sum(counts) / E` the load every expert would
/// have if balanced (`sign(0) = 0`: a balanced expert keeps its bias).
/// `counts` are the routed token slots per expert of one optimizer step.
///
/// # Panics
/// If `bias` and `counts` differ in length.
pub fn update_selection_bias(bias: &mut [f32], counts: &[usize], rate: f64) {
    assert_eq!(bias.len(), counts.len(), "one bias per expert");
    let mean = counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64;
    for (b, &c) in bias.iter_mut().zip(counts) {
        let err = mean - c as f64;
        if err != 0.0 {
            *b = (f64::from(*b) + rate * err.signum()) as f32;
        }
    }
}

/// The ratio of the largest to the smallest expert load (`inf` when an
/// expert got nothing): 1 for perfect balance.
pub fn max_min_load_ratio(counts: &[usize]) -> f64 {
    let max = counts.iter().copied().max().unwrap_or(0) as f64;
    let min = counts.iter().copied().min().unwrap_or(0) as f64;
    if min == 0.0 {
        f64::INFINITY
    } else {
        max / min
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::linear::linear_from_hf;
    use crate::model::{MoeLayer, Routing, SwiGlu};
    use crate::CpuBackend;
    use burn::tensor::{Tensor, TensorData};

    type B = CpuBackend;

    #[test]
    fn the_bias_moves_against_the_load_error() {
        let mut b = vec![0.0f32, 0.5, -0.5, 0.0];
        update_selection_bias(&mut b, &[10, 2, 2, 6], 0.1);
        // mean 5: expert 0 overloaded (down), 1 and 2 underloaded (up), 3 over.
        assert_eq!(b, vec![-0.1, 0.6, -0.4, -0.1]);
        let mut b = vec![0.25f32; 2];
        update_selection_bias(&mut b, &[3, 3], 1.0);
        assert_eq!(b, vec![0.25, 0.25], "balanced experts keep their bias");
        assert_eq!(max_min_load_ratio(&[8, 2, 4]), 4.0);
        assert!(max_min_load_ratio(&[8, 0]).is_infinite());
    }

    /// A synthetic skewed router: 4 experts, logits `W x + b` with a bias of
    /// +1.2 / +0.6 / 0 / -0.6 over random inputs (top-2 of 512 tokens), so
    /// expert 0 is chosen for most tokens and expert 3 for few. The aux-free
    /// update (gamma = 0.05) at least halves the max/min load ratio within
    /// 10 updates (5.8 -> 1.8 here) and brings it under 1.25 within 40.
    #[test]
    fn aux_free_updates_halve_the_load_ratio_of_a_skewed_router() {
        let (d, e, n) = (8, 4, 512);
        let dev = Default::default();
        let w: Vec<f32> = (0..e * d).map(|j| ((j as f32) * 1.7).sin() * 0.5).collect();
        let gate = linear_from_hf(&w, e, d, Some(vec![1.2, 0.6, 0.0, -0.6]), &dev);
        let zero = |o: usize, i: usize| linear_from_hf::<B>(&vec![0.0; o * i], o, i, None, &dev);
        let expert = SwiGlu {
            gate_proj: zero(2, d),
            up_proj: zero(2, d),
            down_proj: zero(d, 2),
            activation: Default::default(),
        };
        let mut layer = MoeLayer::new(gate, vec![expert; e], 2, 1.0);
        layer.selection_bias = Some(vec![0.0; e]);
        let xs: Vec<f32> = (0..n * d).map(|j| ((j as f32 * 12.9898).sin() * 43758.547).fract() * 2.0 - 1.0).collect();
        let x = Tensor::<B, 3>::from_data(TensorData::new(xs, [1, n, d]), &dev);
        let counts = |layer: &MoeLayer<B>| layer.forward(x.clone(), Routing::Learned).1.counts;
        let c0 = counts(&layer);
        let r0 = max_min_load_ratio(&c0);
        assert!(r0 > 4.0, "the router should start skewed: {c0:?} (ratio {r0})");
        let updates = 40;
        let mut trace = vec![r0];
        for _ in 0..updates {
            let c = counts(&layer);
            update_selection_bias(layer.selection_bias.as_mut().unwrap(), &c, 0.05);
            trace.push(max_min_load_ratio(&counts(&layer)));
        }
        let r = *trace.last().unwrap();
        eprintln!(
            "aux-free: max/min load ratio {r0:.2} -> {:.2} after 10 updates, {r:.2} after {updates} ({trace:.2?})",
            trace[10]
        );
        assert!(trace[10] <= r0 / 2.0, "ratio {r0} -> {} after 10 updates: {trace:?}", trace[10]);
        assert!(r < 1.25, "ratio {r0} -> {r} after {updates} updates: {trace:?}");
    }
}
