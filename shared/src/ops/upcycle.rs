//! The upcycle operation's parameters (dense -> MoE; DeltaMoE phase 1,
//! docs/methods.md §1.1, and its variants: shared experts, Drop-Upcycling,
//! granular upcycling, unnormalised top-k): one struct for the CLI
//! (`moe-studio upcycle`, flattened), the server's job spec
//! ([`crate::api::UpcycleSpec`] flattens it), the recipe runner's
//! `upcycle:` section, the tab (the Upcycle page and the lessons send it to
//! the worker) and the job form's inputs ([`UpcycleParams::form_fields`]).
//!
//! What stays with the caller: the dense model, the expert counts (a number
//! or an allocation file / JSON), the prompts a `hidden` / `cheap-embed`
//! router is computed from, the output dtype, layout and path.

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::error::{Result, StudioError};
use crate::methods::upcycle::{CopyNoise, NoiseKind, SharedExperts, SharedInit, UpcycleOptions};
use crate::methods::{ExpertCounts, RouterInit};

/// How the routers start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum RouterInitArg {
    /// All zeros (every expert weighs the same: the upcycled MoE computes
    /// the dense function).
    #[default]
    Zeros,
    /// `N(0, router_std^2)`, seeded.
    Random,
    /// Normalised mean FFN input of each expert's prompts.
    Hidden,
    /// Normalised sum of the token embeddings of each expert's prompts, the
    /// same in every layer (mergekit-moe's `cheap_embed`; no forward pass).
    CheapEmbed,
}

impl RouterInitArg {
    /// The name on the command line and in job specs (`zeros`, `random`,
    /// `hidden`, `cheap-embed`).
    pub fn name(self) -> &'static str {
        match self {
            RouterInitArg::Zeros => "zeros",
            RouterInitArg::Random => "random",
            RouterInitArg::Hidden => "hidden",
            RouterInitArg::CheapEmbed => "cheap-embed",
        }
    }

    /// Whether the router is computed from prompts (`hidden`,
    /// `cheap-embed`), which the caller supplies.
    pub fn needs_prompts(self) -> bool {
        matches!(self, RouterInitArg::Hidden | RouterInitArg::CheapEmbed)
    }
}

/// How the noise on the non-frozen copies combines with the weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum NoiseArg {
    /// `w * (1 + noise * n)`.
    #[default]
    Mul,
    /// `w + noise * n`.
    Add,
}

/// How the shared experts start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum SharedInitArg {
    /// Down projection zero: the shared experts output 0 at first.
    #[default]
    Zero,
    /// Scaled copies of the FFN.
    Copy,
}

/// What an upcycle is asked to do, besides its inputs (see the module
/// docs). `Default` is the DeltaMoE reference: top-2, expert 0 frozen, zero
/// router, no noise, seed 0, temperature 1, no shared experts, no drop,
/// granularity 1, renormalised top-k ([`UpcycleOptions::default`]).
///
/// Source: DeltaMoE §3.1 (upcycling with the original FFN frozen as expert
/// 0); Drop-Upcycling (Nakamura et al. 2025); Megatron-Core's granular
/// upcycling; DeepSeekMoE / Qwen2-MoE shared experts (docs/methods.md §1.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct UpcycleParams {
    /// Experts per token.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().top_k))]
    pub top_k: usize,
    /// Frozen experts of every layer, comma-separated (expert 0 is the
    /// original FFN; `--no-frozen`: none).
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', default_values_t = Self::default().frozen))]
    pub frozen: Vec<usize>,
    /// Router initialisation.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Self::default().router_init))]
    pub router_init: RouterInitArg,
    /// Standard deviation of the random router.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().router_std))]
    pub router_std: f64,
    /// Standard deviation of the noise on the non-frozen copies (0 = none).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().noise))]
    pub noise: f64,
    /// How the noise combines with the weights.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Self::default().noise_kind))]
    pub noise_kind: NoiseArg,
    /// Seed of the random router, the noise and Drop-Upcycling's draw.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().seed))]
    pub seed: u64,
    /// Router temperature (folded into the router weight in every public
    /// layout); a finite number > 0.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().temperature))]
    pub temperature: f64,
    /// Always-active shared experts per MoE layer (DeepSeekMoE,
    /// Qwen1.5/2-MoE); one gated shared expert fits the qwen2_moe layout,
    /// anything else the studio layout.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().shared_experts))]
    pub shared_experts: usize,
    /// Gate each shared expert by sigmoid(w·x) (Qwen2-MoE) instead of adding
    /// it as is (DeepSeekMoE).
    #[cfg_attr(feature = "cli", arg(long))]
    pub shared_gate: bool,
    /// Shared-expert init: `zero` (down projection 0: the model still equals
    /// the dense one) or `copy` (copies of the FFN, every shared and the
    /// routed part scaled to 1/(N+1) of the output; Qwen1.5-MoE).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Self::default().shared_init))]
    pub shared_init: SharedInitArg,
    /// Keep the shared experts (and their gate) frozen in training.
    #[cfg_attr(feature = "cli", arg(long))]
    pub shared_frozen: bool,
    /// Drop-Upcycling: fraction r in [0, 1] of each non-frozen copy's
    /// intermediate units re-initialised (Nakamura et al. 2025; the paper's
    /// default 0.5), seeded by --seed.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().drop_ratio))]
    pub drop_ratio: f64,
    /// Granular upcycling: split every copy into G experts of f/G units;
    /// --experts E and --top-k k become E·G experts and top-(k·G)
    /// (Megatron-Core --moe-upcycling-granularity). G must divide f.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().granularity))]
    pub granularity: usize,
    /// Renormalise the top-k weights (`true`, Mixtral) or weigh each chosen
    /// expert by its softmax over all experts (`false`, Switch / Qwen2-MoE;
    /// routed experts scaled so that the zero router keeps the function).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().norm_topk, action = clap::ArgAction::Set))]
    pub norm_topk: bool,
}

impl Default for UpcycleParams {
    fn default() -> Self {
        let o = UpcycleOptions::default();
        UpcycleParams {
            top_k: o.top_k,
            frozen: o.frozen,
            router_init: RouterInitArg::Zeros,
            router_std: 0.02,
            noise: o.noise.std,
            noise_kind: NoiseArg::Mul,
            seed: o.seed,
            temperature: o.temperature,
            shared_experts: o.shared.count,
            shared_gate: o.shared.gate,
            shared_init: SharedInitArg::Zero,
            shared_frozen: o.shared.frozen,
            drop_ratio: o.drop_ratio,
            granularity: o.granularity,
            norm_topk: o.norm_topk_prob,
        }
    }
}

impl UpcycleParams {
    /// The rules every caller checks before any model is read (what needs
    /// the model — top-k and frozen experts against a layer's experts, a
    /// granularity that divides the FFN width — the method checks):
    /// `top_k` 1..=256, frozen experts 0..=255 and each once, a router computed from
    /// prompts only when `has_prompts` (the CLI's `--expert-prompts`; a job
    /// and the tab have none), `router_std` finite > 0, `noise` finite in
    /// 0..=10, `temperature` finite > 0, `drop_ratio` in [0, 1],
    /// `granularity` 1..=64, `shared_experts` 0..=64.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self, has_prompts: bool) -> std::result::Result<(), ParamError> {
        let bad = |field: &'static str, message: String| Err(ParamError { field, message });
        if !(1..=256).contains(&self.top_k) {
            return bad("top_k", format!("{}: expected 1 to 256", self.top_k));
        }
        if let Some(f) = self.frozen.iter().find(|f| **f > 255) {
            return bad("frozen", format!("expert {f}: expected expert indices 0 to 255"));
        }
        if let Some(i) = super::first_repeat(&self.frozen) {
            return bad("frozen", format!("expert {} is listed twice (entry {})", self.frozen[i], i + 1));
        }
        if self.router_init.needs_prompts() && !has_prompts {
            return bad(
                "router_init",
                format!(
                    "{} computes the router from expert prompts, which are not given here: use zeros or random, \
                     or the CLI's --expert-prompts FILE",
                    self.router_init.name()
                ),
            );
        }
        if !(self.router_std.is_finite() && self.router_std > 0.0) {
            return bad("router_std", format!("{}: expected a finite number > 0", self.router_std));
        }
        if !(self.noise.is_finite() && (0.0..=10.0).contains(&self.noise)) {
            return bad("noise", format!("{}: expected a finite number in 0..=10", self.noise));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad("temperature", format!("{}: expected a finite number > 0", self.temperature));
        }
        if !(self.drop_ratio.is_finite() && (0.0..=1.0).contains(&self.drop_ratio)) {
            return bad(
                "drop_ratio",
                format!("{}: expected a number in [0, 1] (the fraction of units re-initialised)", self.drop_ratio),
            );
        }
        if !(1..=64).contains(&self.granularity) {
            return bad(
                "granularity",
                format!("{}: expected 1 to 64 (and a divisor of the FFN width)", self.granularity),
            );
        }
        if self.shared_experts > 64 {
            return bad("shared_experts", format!("{}: expected 0 to 64", self.shared_experts));
        }
        Ok(())
    }

    /// The job form's inputs for these parameters, in field order, with the
    /// defaults as hints (the Jobs page; the spec's other fields — `model`,
    /// `experts`, `experts_per_layer`, `dtype` — are the job's own). A job
    /// has no expert prompts, so the router choices are the two that need
    /// none; `norm_topk` (a `bool` that is `true` by default) is a choice
    /// of `true` / `false`.
    pub fn form_fields() -> Vec<Field> {
        let d = UpcycleParams::default();
        let dflt = |v: &dyn std::fmt::Display| format!("default {v}");
        let frozen = if d.frozen.is_empty() {
            "none".to_string()
        } else {
            d.frozen.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
        };
        vec![
            Field::new("top_k", "top-k", Input::Int, &dflt(&d.top_k)),
            Field::new("frozen", "frozen experts", Input::IntList, &format!("default {frozen}; none")),
            Field::new("router_init", "router init", Input::Choice(&["zeros", "random"]), "zeros"),
            Field::new("router_std", "router std", Input::Float, &format!("default {} (random)", d.router_std))
                .advanced(),
            Field::new("noise", "noise", Input::Float, &dflt(&d.noise)).advanced(),
            Field::new("noise_kind", "noise kind", Input::Choice(&["mul", "add"]), "mul").advanced(),
            Field::new("seed", "seed", Input::Int, &dflt(&d.seed)).advanced(),
            Field::new("temperature", "temperature", Input::Float, &dflt(&d.temperature)).advanced(),
            Field::new("shared_experts", "shared experts", Input::Int, &dflt(&d.shared_experts)).advanced(),
            Field::new("shared_gate", "shared gate (Qwen2-MoE)", Input::Flag, "").advanced(),
            Field::new("shared_init", "shared init", Input::Choice(&["zero", "copy"]), "zero").advanced(),
            Field::new("shared_frozen", "shared experts frozen", Input::Flag, "").advanced(),
            Field::new("drop_ratio", "drop ratio (Drop-Upcycling)", Input::Float, &dflt(&d.drop_ratio)).advanced(),
            Field::new("granularity", "granularity", Input::Int, &dflt(&d.granularity)).advanced(),
            Field::new("norm_topk", "renormalise top-k", Input::Choice(&["true", "false"]), "true (Mixtral)")
                .advanced(),
        ]
    }

    /// The method's options for expert counts `experts` (named
    /// `experts_source` in errors: `--experts`, an allocation file's path,
    /// the tab's field). `prompt_router` is the router computed from prompts
    /// when `router_init` is `hidden` / `cheap-embed` (the caller has the
    /// prompts and the model); the output dtype, layout and experts format
    /// are [`UpcycleOptions::default`]'s (the caller sets its own).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when a prompt router is asked for and not
    /// given. The values themselves are checked by the method
    /// (`methods::upcycle::plan_upcycle`, [`StudioError::Param`]).
    pub fn options(
        &self,
        experts: ExpertCounts,
        experts_source: &str,
        prompt_router: Option<RouterInit>,
    ) -> Result<UpcycleOptions> {
        let router_init = match (self.router_init, prompt_router) {
            (RouterInitArg::Zeros, _) => RouterInit::Zeros,
            (RouterInitArg::Random, _) => RouterInit::Random { std: self.router_std },
            (_, Some(r)) => r,
            (k, None) => {
                return Err(StudioError::Invalid(format!(
                    "router init {}: the router is computed from expert prompts, and none were given",
                    k.name()
                )))
            }
        };
        let kind = match self.noise_kind {
            NoiseArg::Mul => NoiseKind::Multiplicative,
            NoiseArg::Add => NoiseKind::Additive,
        };
        Ok(UpcycleOptions {
            experts,
            experts_source: experts_source.to_string(),
            top_k: self.top_k,
            frozen: self.frozen.clone(),
            router_init,
            noise: CopyNoise { kind, std: self.noise },
            seed: self.seed,
            temperature: self.temperature,
            shared: SharedExperts {
                count: self.shared_experts,
                gate: self.shared_gate,
                init: match self.shared_init {
                    SharedInitArg::Zero => SharedInit::Zero,
                    SharedInitArg::Copy => SharedInit::Copy,
                },
                frozen: self.shared_frozen,
            },
            drop_ratio: self.drop_ratio,
            granularity: self.granularity,
            norm_topk_prob: self.norm_topk,
            ..UpcycleOptions::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_methods_defaults() {
        let o = UpcycleParams::default().options(ExpertCounts::Uniform(4), "--experts", None).unwrap();
        let d = UpcycleOptions::default();
        assert_eq!(
            (o.top_k, &o.frozen, o.seed, o.temperature, o.granularity),
            (d.top_k, &d.frozen, d.seed, d.temperature, d.granularity)
        );
        assert_eq!(
            (o.drop_ratio, o.norm_topk_prob, o.noise, o.shared),
            (d.drop_ratio, d.norm_topk_prob, d.noise, d.shared)
        );
        assert!(matches!(o.router_init, RouterInit::Zeros));
    }

    #[test]
    fn json_takes_only_what_differs_and_refuses_unknown_fields() {
        let p: UpcycleParams = serde_json::from_str(r#"{"drop_ratio": 0.5, "router_init": "cheap-embed"}"#).unwrap();
        assert_eq!(p, UpcycleParams { drop_ratio: 0.5, router_init: RouterInitArg::CheapEmbed, ..Default::default() });
        let e = serde_json::from_str::<UpcycleParams>(r#"{"drop_rato": 0.5}"#).unwrap_err().to_string();
        assert!(e.contains("drop_rato"), "{e}");
        // A prompt router without its prompts is refused, naming it.
        let e = p.options(ExpertCounts::Uniform(4), "--experts", None).unwrap_err().to_string();
        assert!(e.contains("cheap-embed"), "{e}");
        // Passed through as given: a gate without shared experts is the
        // method's to refuse (naming --shared-experts).
        let g = UpcycleParams { shared_gate: true, ..Default::default() };
        assert!(g.options(ExpertCounts::Uniform(4), "--experts", None).unwrap().shared.gate);
    }

    #[test]
    fn check_names_the_field() {
        let d = UpcycleParams::default;
        assert_eq!(d().check(false), Ok(()));
        let field = |p: UpcycleParams| p.check(false).unwrap_err().field;
        assert_eq!(field(UpcycleParams { top_k: 0, ..d() }), "top_k");
        assert_eq!(field(UpcycleParams { frozen: vec![0, 256], ..d() }), "frozen");
        assert_eq!(field(UpcycleParams { frozen: vec![0, 0], ..d() }), "frozen");
        assert_eq!(field(UpcycleParams { router_init: RouterInitArg::Hidden, ..d() }), "router_init");
        assert_eq!(UpcycleParams { router_init: RouterInitArg::CheapEmbed, ..d() }.check(true), Ok(()));
        assert_eq!(field(UpcycleParams { router_std: 0.0, ..d() }), "router_std");
        assert_eq!(field(UpcycleParams { noise: -0.1, ..d() }), "noise");
        assert_eq!(field(UpcycleParams { noise: f64::NAN, ..d() }), "noise");
        assert_eq!(field(UpcycleParams { temperature: 0.0, ..d() }), "temperature");
        assert_eq!(field(UpcycleParams { drop_ratio: 1.5, ..d() }), "drop_ratio");
        assert_eq!(field(UpcycleParams { granularity: 0, ..d() }), "granularity");
        assert_eq!(field(UpcycleParams { shared_experts: 65, ..d() }), "shared_experts");
        let e = UpcycleParams { drop_ratio: 1.5, ..d() }.check(false).unwrap_err();
        assert_eq!(e.flag(), "--drop-ratio");
    }

    #[test]
    fn the_form_offers_every_parameter_and_flags_spell_them_for_the_cli() {
        let keys: Vec<&str> = crate::ops::fields_of::<UpcycleParams>().to_vec();
        let inputs: Vec<&str> = UpcycleParams::form_fields().iter().map(|f| f.key).collect();
        assert_eq!(keys, inputs);
        // None frozen and the un-normalised top-k: the spellings the CLI reads.
        let p = UpcycleParams { frozen: vec![], norm_topk: false, shared_gate: true, ..Default::default() };
        let f = crate::ops::flags(&p);
        for want in ["--no-frozen", "--norm-topk=false", "--shared-gate", "--top-k=2", "--router-init=zeros"] {
            assert!(f.contains(&want.to_string()), "{want}: {f:?}");
        }
        assert!(!crate::ops::flags(&UpcycleParams::default()).iter().any(|f| f.starts_with("--norm-topk")));
    }
}
