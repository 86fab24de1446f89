//! The moerge operation's parameters (DUME's MoErging, docs/methods.md §2,
//! and mergekit-moe's merge on a base model): one struct for the CLI
//! (`moe-studio moerge`, flattened), the server's job spec
//! ([`crate::api::MoergeSpec`] flattens it: the JSON keys are these
//! fields), the recipe runner's MoE stage, the tab's MoErge page and DUME
//! lesson (the worker message carries it), and the job form's inputs
//! ([`MoergeParams::form_fields`]).
//!
//! What stays with the caller: the dense models (expert `i` = model `i`),
//! mergekit-moe's `base_model`, the prompts a `hidden` / `cheap-embed`
//! router is computed from, the shared experts and their gate (inputs of
//! their own: models and, for a prompt gate, prompts), the output dtype,
//! layout and path.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::upcycle::{RouterInitArg, UpcycleParams};
use super::{Field, Input, ParamError};
use crate::methods::moerge::MoergeOptions;
use crate::methods::{RouterInit, SharedGate};

/// The most models a MoErge takes (one expert each; the server's cap on a
/// job's checkpoints).
pub const MAX_MODELS: usize = 64;

/// What a MoErge is asked to do, besides its inputs (see the module docs).
/// `Default` is DUME's: top-1, temperature 1, a zero router (the ridge
/// router is fitted afterwards by `route`), no frozen expert, seed 0
/// ([`MoergeOptions::default`]).
///
/// Source: DUME (2026), MoErging section (non-FFN tensors averaged, FFN `i`
/// = expert `i`); mergekit-moe's `gate_mode` (`random`, `hidden`,
/// `cheap_embed`) for the router initialisations; docs/methods.md §2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct MoergeParams {
    /// Experts per token (DUME reference: 1; at most the models).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().top_k))]
    pub top_k: usize,
    /// Router temperature (a finite number > 0; folded into the router
    /// weight when written).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().temperature))]
    pub temperature: f64,
    /// Router initialisation (`hidden` and `cheap-embed` need a base model
    /// and the experts' prompts). Default: zeros, or random when
    /// `router_std` is given.
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub router_init: Option<RouterInitArg>,
    /// Standard deviation of a random router, `N(0, std^2)` (default 0.02,
    /// the upcycle's; a finite number > 0).
    #[cfg_attr(feature = "cli", arg(long))]
    pub router_std: Option<f64>,
    /// Frozen experts of every layer, comma-separated (default none).
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ','))]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frozen: Vec<usize>,
    /// Seed of a random router (and of a random shared gate).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().seed))]
    pub seed: u64,
}

impl Default for MoergeParams {
    fn default() -> Self {
        let o = MoergeOptions::default();
        MoergeParams {
            top_k: o.top_k,
            temperature: o.temperature,
            router_init: None,
            router_std: None,
            frozen: o.frozen,
            seed: o.seed,
        }
    }
}

impl MoergeParams {
    /// How the router starts: `router_init` as given, else random when a
    /// `router_std` is given, else zeros.
    ///
    /// # Errors
    /// A [`ParamError`] on `router_std` when it is given for another
    /// initialisation than `random`.
    pub fn router_kind(&self) -> Result<RouterInitArg, ParamError> {
        match (self.router_init, self.router_std) {
            (None, None) => Ok(RouterInitArg::Zeros),
            (None, Some(_)) | (Some(RouterInitArg::Random), _) => Ok(RouterInitArg::Random),
            (Some(k), None) => Ok(k),
            (Some(k), Some(_)) => Err(ParamError {
                field: "router_std",
                message: format!("is for router init random (got router init {})", k.name()),
            }),
        }
    }

    /// The router (and shared gate) initialisation that needs no prompts:
    /// `Some` for zeros and random (`N(0, std^2)`, std `router_std` or
    /// 0.02), `None` for `hidden` / `cheap-embed` (the caller computes the
    /// rows from the prompts on the base model).
    ///
    /// # Errors
    /// As [`MoergeParams::router_kind`].
    pub fn plain_router(&self) -> Result<Option<RouterInit>, ParamError> {
        let std = self.router_std.unwrap_or(UpcycleParams::default().router_std);
        Ok(match self.router_kind()? {
            RouterInitArg::Zeros => Some(RouterInit::Zeros),
            RouterInitArg::Random => Some(RouterInit::Random { std }),
            RouterInitArg::Hidden | RouterInitArg::CheapEmbed => None,
        })
    }

    /// The method's options with the router `router_init` (from
    /// [`MoergeParams::plain_router`] or computed from prompts); the output
    /// dtype, layout, experts format and shared gate are
    /// [`MoergeOptions::default`]'s (the caller sets its own).
    pub fn options(&self, router_init: RouterInit) -> MoergeOptions {
        MoergeOptions {
            top_k: self.top_k,
            temperature: self.temperature,
            router_init,
            seed: self.seed,
            frozen: self.frozen.clone(),
            ..MoergeOptions::default()
        }
    }

    /// The rules every caller checks before any model is read (the CLI's
    /// `moerge`, the server's moerge job when it is created, the tab's
    /// form): top-k in `1..=64` and at most `models` (one expert per model,
    /// never clamped), a temperature finite and > 0, a `router_std` finite
    /// and > 0 and only for a random router, a prompt router only with a
    /// base model (`has_base`), frozen experts that exist.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self, models: usize, has_base: bool) -> Result<(), ParamError> {
        let bad = |field: &'static str, message: String| Err(ParamError { field, message });
        if !(1..=MAX_MODELS).contains(&self.top_k) {
            return bad("top_k", format!("{} is out of range 1..={MAX_MODELS}", self.top_k));
        }
        if self.top_k > models {
            return bad("top_k", format!("{}: expected 1 to {models} (the experts: one per model)", self.top_k));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad("temperature", format!("{}: expected a finite number > 0", self.temperature));
        }
        if let Some(s) = self.router_std.filter(|s| !(s.is_finite() && *s > 0.0)) {
            return bad("router_std", format!("{s}: expected a finite number > 0"));
        }
        let kind = self.router_kind()?;
        if kind.needs_prompts() && !has_base {
            return bad(
                "router_init",
                format!(
                    "{} reads the experts' prompts with a base model (mergekit-moe's base_model), and none is \
                     given: MoErge with zeros or random and fit the ridge router",
                    kind.name()
                ),
            );
        }
        if let Some(f) = self.frozen.iter().find(|f| **f >= models) {
            return bad("frozen", format!("expert {f} does not exist (experts 0 to {}, one per model)", models - 1));
        }
        if let Some(i) = super::first_repeat(&self.frozen) {
            return bad("frozen", format!("expert {} is listed twice (entry {})", self.frozen[i], i + 1));
        }
        Ok(())
    }

    /// The job form's inputs for these parameters, in order, with the
    /// defaults as hints (the Jobs page; the spec's other fields, `models`
    /// and `dtype`, are the job's own). The server MoErges without a base
    /// model, so the router choices are the two that need none.
    pub fn form_fields() -> Vec<Field> {
        let d = MoergeParams::default();
        vec![
            Field::new("top_k", "top-k", Input::Int, &format!("default {}", d.top_k)),
            Field::new("router_init", "router init", Input::Choice(&["zeros", "random"]), "zeros"),
            Field::new("router_std", "router std", Input::Float, "default 0.02 (random)").advanced(),
            Field::new("temperature", "temperature", Input::Float, &format!("default {}", d.temperature)).advanced(),
            Field::new("frozen", "frozen experts", Input::IntList, "default none").advanced(),
            Field::new("seed", "seed", Input::Int, &format!("default {}", d.seed)).advanced(),
        ]
    }
}

/// A MoErge's shared experts (mergekit-moe's `shared_experts`, MoErge on a
/// base model only): dense models whose FFN becomes an always-on expert of
/// every layer, added as they are (DeepSeekMoE) or gated by `sigmoid(g·x)`
/// (Qwen2-MoE) with `g` initialised as the router is. One struct for the
/// CLI (`moe-studio moerge`, flattened: `--shared-expert`, `--shared-gate`,
/// `--shared-prompts`) and the recipe runner's moerge stage; the server's
/// and the tab's MoErge take no shared experts (`Default`: none).
///
/// Source: mergekit-moe (`mergekit/moe/config.py`, `shared_experts`;
/// `qwen.py` for the gate); docs/methods.md §2.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct MoergeShared {
    /// A model whose FFN becomes an always-on shared expert of every layer
    /// (mergekit-moe's `shared_experts`; repeat for more; needs --base).
    /// One gated shared expert fits the qwen2_moe layout, anything else the
    /// studio layout.
    #[cfg_attr(feature = "cli", arg(long))]
    pub shared_expert: Vec<PathBuf>,
    /// Gate each shared expert by sigmoid(g·x) (Qwen2-MoE), `g` initialised
    /// as --router-init says; without it they are added as they are
    /// (DeepSeek-MoE).
    #[cfg_attr(feature = "cli", arg(long))]
    pub shared_gate: bool,
    /// Prompts per shared expert for a hidden / cheap-embed shared gate
    /// (the JSON of --expert-prompts, one entry per --shared-expert).
    #[cfg_attr(feature = "cli", arg(long))]
    pub shared_prompts: Option<PathBuf>,
}

impl MoergeShared {
    /// The shared experts `models`, gated or not, with no prompt file yet.
    pub fn new(models: Vec<PathBuf>, gated: bool) -> Self {
        MoergeShared { shared_expert: models, shared_gate: gated, shared_prompts: None }
    }

    /// The `moerge` flags that give these values (`--shared-expert=P` per
    /// model, `--shared-gate`, `--shared-prompts=P`): what clap parses back
    /// into this struct (the backend's recipe test checks it).
    pub fn flags(&self) -> Vec<String> {
        let mut v: Vec<String> =
            self.shared_expert.iter().map(|p| format!("--shared-expert={}", p.display())).collect();
        if self.shared_gate {
            v.push("--shared-gate".into());
        }
        if let Some(p) = &self.shared_prompts {
            v.push(format!("--shared-prompts={}", p.display()));
        }
        v
    }

    /// Whether the gate is computed from prompts (gated, under a `hidden`
    /// or `cheap-embed` router `kind`): then `shared_prompts` is needed.
    pub fn prompt_gate(&self, kind: RouterInitArg) -> bool {
        self.shared_gate && kind.needs_prompts()
    }

    /// The rules the CLI checks before any model is read: a gate needs
    /// shared experts, and prompts are read only by a prompt gate (`kind`:
    /// the router's initialisation, [`MoergeParams::router_kind`]).
    ///
    /// # Errors
    /// A [`ParamError`] on `shared_gate` or `shared_prompts`.
    pub fn check(&self, kind: RouterInitArg) -> Result<(), ParamError> {
        if self.shared_gate && self.shared_expert.is_empty() {
            return Err(ParamError { field: "shared_gate", message: "needs --shared-expert MODEL".into() });
        }
        if self.shared_prompts.is_some() && !self.prompt_gate(kind) {
            return Err(ParamError {
                field: "shared_prompts",
                message: "is read by a gated shared expert (--shared-gate) under --router-init hidden or \
                          cheap-embed only"
                    .into(),
            });
        }
        Ok(())
    }

    /// Sets the method's shared gate in `opts`: [`SharedGate::Gated`] with
    /// `init` (the gate's rows, computed like the router's) when gated, else
    /// ungated.
    pub fn configure(&self, opts: &mut MoergeOptions, init: RouterInit) {
        opts.shared_gate = if self.shared_gate { SharedGate::Gated(init) } else { SharedGate::Ungated };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared experts' rules, by field: a gate without shared experts,
    /// prompts without a prompt gate (ungated, or gated under a plain
    /// router); gated prompts under `hidden` pass.
    #[test]
    fn shared_expert_rules_name_their_flag() {
        let s = |models: usize, gated: bool, prompts: bool| MoergeShared {
            shared_expert: vec![PathBuf::from("m"); models],
            shared_gate: gated,
            shared_prompts: prompts.then(|| "p.json".into()),
        };
        let field = |x: MoergeShared, k| x.check(k).unwrap_err().field;
        assert_eq!(field(s(0, true, false), RouterInitArg::Zeros), "shared_gate");
        assert_eq!(field(s(1, false, true), RouterInitArg::Hidden), "shared_prompts");
        assert_eq!(field(s(1, true, true), RouterInitArg::Random), "shared_prompts");
        assert_eq!(s(1, true, true).check(RouterInitArg::Hidden), Ok(()));
        assert!(s(1, true, false).prompt_gate(RouterInitArg::CheapEmbed));
        assert!(!s(1, false, false).prompt_gate(RouterInitArg::CheapEmbed));
        let gate = |x: MoergeShared| {
            let mut o = MoergeOptions::default();
            x.configure(&mut o, RouterInit::Zeros);
            o.shared_gate
        };
        assert!(matches!(gate(s(1, false, false)), SharedGate::Ungated));
        assert!(matches!(gate(s(1, true, false)), SharedGate::Gated(RouterInit::Zeros)));
    }

    #[test]
    fn defaults_are_the_methods_defaults() {
        let p = MoergeParams::default();
        let o = p.options(p.plain_router().unwrap().unwrap());
        let d = MoergeOptions::default();
        assert_eq!((o.top_k, o.temperature, o.seed, &o.frozen), (d.top_k, d.temperature, d.seed, &d.frozen));
        assert!(matches!(o.router_init, RouterInit::Zeros));
        assert_eq!(p.check(2, false), Ok(()));
    }

    #[test]
    fn the_router_kind_follows_the_cli_s_rule() {
        let d = MoergeParams::default;
        let kind = |router_init, router_std| MoergeParams { router_init, router_std, ..d() }.router_kind();
        assert_eq!(kind(None, None), Ok(RouterInitArg::Zeros));
        assert_eq!(kind(None, Some(0.5)), Ok(RouterInitArg::Random));
        assert_eq!(kind(Some(RouterInitArg::Random), Some(0.5)), Ok(RouterInitArg::Random));
        assert_eq!(kind(Some(RouterInitArg::Hidden), None), Ok(RouterInitArg::Hidden));
        assert_eq!(kind(Some(RouterInitArg::Zeros), Some(0.5)).unwrap_err().field, "router_std");
        let random = MoergeParams { router_std: Some(0.5), ..d() }.plain_router().unwrap();
        assert!(matches!(random, Some(RouterInit::Random { std }) if std == 0.5));
        let random = MoergeParams { router_init: Some(RouterInitArg::Random), ..d() }.plain_router().unwrap();
        assert!(matches!(random, Some(RouterInit::Random { std }) if std == 0.02));
        assert!(MoergeParams { router_init: Some(RouterInitArg::CheapEmbed), ..d() }.plain_router().unwrap().is_none());
    }

    #[test]
    fn check_names_the_field() {
        let d = MoergeParams::default;
        let field = |p: MoergeParams| p.check(3, false).unwrap_err().field;
        assert_eq!(field(MoergeParams { top_k: 0, ..d() }), "top_k");
        assert_eq!(field(MoergeParams { top_k: 4, ..d() }), "top_k");
        assert_eq!(field(MoergeParams { temperature: f64::NAN, ..d() }), "temperature");
        assert_eq!(field(MoergeParams { router_std: Some(0.0), ..d() }), "router_std");
        assert_eq!(field(MoergeParams { router_init: Some(RouterInitArg::Hidden), ..d() }), "router_init");
        assert_eq!(field(MoergeParams { frozen: vec![3], ..d() }), "frozen");
        let e = MoergeParams { top_k: 4, ..d() }.check(3, false).unwrap_err();
        assert_eq!(
            (e.flag(), e.message.as_str()),
            ("--top-k".into(), "4: expected 1 to 3 (the experts: one per model)")
        );
        let hidden = MoergeParams { router_init: Some(RouterInitArg::Hidden), top_k: 3, frozen: vec![2], ..d() };
        assert_eq!(hidden.check(3, true), Ok(()));
    }

    #[test]
    fn json_takes_only_what_differs_and_refuses_unknown_fields() {
        let p: MoergeParams = serde_json::from_str(r#"{"top_k": 2, "router_init": "random"}"#).unwrap();
        assert_eq!(p, MoergeParams { top_k: 2, router_init: Some(RouterInitArg::Random), ..Default::default() });
        let e = serde_json::from_str::<MoergeParams>(r#"{"topk": 2}"#).unwrap_err().to_string();
        assert!(e.contains("topk"), "{e}");
        // No frozen expert is the CLI's default: no flag for it.
        assert!(!crate::ops::flags(&MoergeParams::default()).iter().any(|f| f.starts_with("--frozen")));
    }

    #[test]
    fn the_form_offers_every_parameter() {
        let mut keys: Vec<&str> = crate::ops::fields_of::<MoergeParams>().to_vec();
        let mut inputs: Vec<&str> = MoergeParams::form_fields().iter().map(|f| f.key).collect();
        keys.sort();
        inputs.sort();
        assert_eq!(keys, inputs);
    }
}
