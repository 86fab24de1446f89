//! Shared experts of a MoErge on a base model, as mergekit-moe builds them
//! (its `shared_experts` key; docs/methods.md §6.1 "mergekit recipes").
//!
//! mergekit 0.1.5 (`mergekit/scripts/moe.py` `build`, `mergekit/moe/qwen.py`
//! and `deepseek.py` `write_model`, `mergekit/moe/router.py`
//! `get_gate_params`):
//!
//! - **The FFN.** Shared expert `j` of every MoE layer `l` is layer `l`'s
//!   FFN of its `source_model`, copied unchanged (`gate_proj`, `up_proj`,
//!   `down_proj` at the dense width; only converted to the output dtype).
//!   No scale is applied (`residual_scale` / `noise_scale` are refused,
//!   as for the routed experts).
//! - **The gate.** When every shared expert has `positive_prompts`, or the
//!   gate mode is `random`, the shared experts are gated and the gate rows
//!   are computed exactly like the router rows, in the same call: the
//!   `[N, d]` gate of layer `l` is what the router of layer `l` would be
//!   for `N` more experts with those prompts (`hidden`: normalised mean
//!   hidden state of the positive minus the negative prompts;
//!   `cheap_embed`: normalised sum of the prompts' token embeddings, the
//!   same in every layer; `random`: `N(0, 1)`). Qwen2-MoE applies it as
//!   `sigmoid(g_j · x) * FFN_j(x)`, `x` the FFN input. Otherwise (no
//!   prompts, a prompt-based gate mode) the shared experts are ungated and
//!   added as they are (mergekit's DeepSeek-MoE output).
//! - **How many each output holds.** `qwen` (Qwen2-MoE): exactly one,
//!   gated; `deepseek`: at most one, ungated; `mixtral` and `qwen3`: none.
//!   mergekit refuses anything else; the studio writes what no public
//!   layout holds (several shared experts, an ungated one) in its own
//!   layout, with the reason ([`crate::layout::choose`]).
//!
//! The studio extends this in two places, on purpose: its `zeros` gate
//! mode gives gated shared experts with a zero gate (`sigmoid(0) = 1/2`),
//! and a shared expert's `source_model` may be any dense model of the
//! base's architecture (mergekit 0.1.5 only opens loaders for `base_model`
//! and the experts, so another model fails there).
//!
//! Without a base model (DUME's MoErge) there are no shared experts: see
//! [`super::moerge`] for why the arithmetic loses its meaning there.

use super::moerge::MoergeInput;
use super::router_init::RouterInit;
use crate::checkpoint::plan::Origin;
use crate::config::MoeConfig;
use crate::error::{Result, StudioError};

/// How the shared experts of a MoErge are weighed.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum SharedGate {
    /// Added as they are (DeepSeek-MoE; mergekit's shared experts without
    /// prompts under a prompt-based gate mode). The default.
    #[default]
    Ungated,
    /// Each scaled by `sigmoid(g_j · x)` (Qwen2-MoE's
    /// `shared_expert_gate`), the `[N, d]` gate initialised like a router
    /// of `N` experts: [`RouterInit::Hidden`] / [`RouterInit::CheapEmbed`]
    /// rows from the shared experts' prompts (normalised), seeded
    /// [`RouterInit::Random`], or [`RouterInit::Zeros`].
    Gated(RouterInit),
}

impl SharedGate {
    /// Whether the shared experts are gated.
    pub fn is_gated(&self) -> bool {
        matches!(self, SharedGate::Gated(_))
    }

    /// The report name: `ungated`, or the gate's initialisation
    /// (`zeros`, `random`, `hidden`, `cheap-embed`).
    pub fn kind(&self) -> &'static str {
        match self {
            SharedGate::Ungated => "ungated",
            SharedGate::Gated(init) => init.kind(),
        }
    }

    /// Checks the gate against `n` shared experts on a model of hidden
    /// size `d` and layout `moe` (one entry per layer) before anything is
    /// written.
    ///
    /// # Errors
    /// [`StudioError::Config`] (source `--shared-prompts`): a gate without
    /// shared experts, prompt rows for a different number of shared
    /// experts, of another layer count or row length; a bad random std.
    pub fn validate(&self, n: usize, moe: &MoeConfig, d: usize) -> Result<()> {
        let SharedGate::Gated(init) = self else { return Ok(()) };
        let err = |what: String| Err(StudioError::config("--shared-prompts", what));
        if n == 0 {
            return err("a shared-expert gate needs shared experts (--shared-expert MODEL)".into());
        }
        let count = match init {
            RouterInit::Hidden { rows } => rows.iter().map(Vec::len).max(),
            RouterInit::CheapEmbed { rows } => Some(rows.len()),
            RouterInit::Zeros | RouterInit::Random { .. } => None,
        };
        if let Some(c) = count.filter(|&c| c != n) {
            return err(format!(
                "prompts were given for {c} shared expert(s) but there are {n} (one prompt set per shared expert)"
            ));
        }
        // The gate is a router of `n` rows in every MoE layer.
        let as_router = MoeConfig {
            layers: moe
                .layers
                .iter()
                .map(|s| s.as_ref().map(|s| crate::config::MoeLayerSpec { num_experts: n, ..s.clone() }))
                .collect(),
            router_aux_loss_coef: moe.router_aux_loss_coef,
        };
        init.validate(&as_router, d, "--shared-prompts")
    }
}

/// The values of a shared-expert tensor of a MoErge on a base model, as
/// mergekit-moe writes them (see the module docs for the procedure and its
/// source): for [`Origin::SharedExpert`] the `source_model`'s dense FFN
/// projection `dense_name`, unchanged; for [`Origin::SharedGate`] of layer
/// `l` the `[N, d]` gate rows of `gate` (`name` and `seed` seed the random
/// mode; no temperature: it scales the router only), zeros for an ungated
/// layout that still plans a gate (none does). `None` for any other origin.
///
/// # Errors
/// Read errors of the shared expert's source.
pub fn mergekit_shared_expert_tensor(
    origin: &Origin,
    shape: &[usize],
    name: &str,
    shared: &[MoergeInput<'_>],
    gate: &SharedGate,
    seed: u64,
) -> Option<Result<Vec<f32>>> {
    match origin {
        Origin::SharedExpert { index, dense_name, .. } => Some(shared[*index].source.read_f32(dense_name)),
        Origin::SharedGate { layer } => Some(Ok(match gate {
            SharedGate::Gated(init) => init.weight(*layer, shape[0], shape[1], seed, name, 1.0),
            SharedGate::Ungated => vec![0.0; shape.iter().product()],
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MoeLayerSpec;
    use crate::methods::router_init::cheap_embed_row;

    fn moe() -> MoeConfig {
        MoeConfig::uniform(2, MoeLayerSpec { num_experts: 2, top_k: 1, ..Default::default() })
    }

    #[test]
    fn the_gate_is_a_router_of_the_shared_experts_prompts() {
        // V = 4, d = 2; the shared expert's prompts are tokens [0, 1] and
        // [1]: Σ E = (1, 0) + 2·(0, 2) = (1, 4); negative [3]: (3, 4) / 5.
        let embed = [1.0, 0.0, 0.0, 2.0, 5.0, 5.0, 3.0, 4.0];
        let mut row = cheap_embed_row(&embed, 2, &[vec![0, 1], vec![1]]).unwrap();
        let neg = cheap_embed_row(&embed, 2, &[vec![3]]).unwrap();
        row.iter_mut().zip(neg).for_each(|(p, n)| *p -= n);
        let gate = SharedGate::Gated(RouterInit::CheapEmbed { rows: vec![row] });
        gate.validate(1, &moe(), 2).unwrap();
        let origin = Origin::SharedGate { layer: 1 };
        let g = mergekit_shared_expert_tensor(&origin, &[1, 2], "g", &[], &gate, 0).unwrap().unwrap();
        // (1, 4)/√17 − (0.6, 0.8), normalised: mergekit's formula by hand.
        let n17 = 17f64.sqrt();
        let (a, b) = (1.0 / n17 - 0.6, 4.0 / n17 - 0.8);
        let n = (a * a + b * b).sqrt();
        assert!((f64::from(g[0]) - a / n).abs() < 1e-7 && (f64::from(g[1]) - b / n).abs() < 1e-7, "{g:?}");
    }

    #[test]
    fn prompt_counts_and_gates_without_shared_experts_are_refused() {
        let two = SharedGate::Gated(RouterInit::CheapEmbed { rows: vec![vec![1.0, 0.0]; 2] });
        let e = two.validate(1, &moe(), 2).unwrap_err().to_string();
        assert!(e.contains("prompts were given for 2 shared expert(s) but there are 1"), "{e}");
        let e = SharedGate::Gated(RouterInit::Zeros).validate(0, &moe(), 2).unwrap_err().to_string();
        assert!(e.contains("needs shared experts"), "{e}");
        assert!(SharedGate::Ungated.validate(0, &moe(), 2).is_ok());
        let random = SharedGate::Gated(RouterInit::Random { std: 1.0 });
        random.validate(2, &moe(), 2).unwrap();
        let origin = Origin::SharedGate { layer: 0 };
        let a = mergekit_shared_expert_tensor(&origin, &[2, 2], "a", &[], &random, 3).unwrap().unwrap();
        let b = mergekit_shared_expert_tensor(&origin, &[2, 2], "b", &[], &random, 3).unwrap().unwrap();
        assert_eq!(a.len(), 4);
        assert_ne!(a, b, "each gate tensor has its own seeded stream");
        assert!(
            mergekit_shared_expert_tensor(&Origin::RouterWeight { layer: 0 }, &[2, 2], "r", &[], &random, 3).is_none()
        );
    }
}
