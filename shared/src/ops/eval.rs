//! The eval operation's parameters (held-out perplexity by sliding
//! windows, with the MoE's routing learned, forced to the dataset's own
//! expert, or random; docs/methods.md §2.5–§2.6, DUME's oracle and random
//! baselines, and §7, the token stream): one struct for the CLI (`moe-studio eval --data`,
//! flattened), the server's job spec ([`crate::api::EvalSpec`] flattens
//! it) and the job form's inputs ([`EvalParams::form_fields`]).
//!
//! What stays with the caller: the model, the datasets, how documents are
//! cut from a file, the windows per forward pass (speed and memory, not
//! the result), the task mode (`--task`, [`crate::api::TaskSpec`]).

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::eval::PerplexityOptions;

/// How an MoE routes while it is scored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum EvalRouting {
    /// The model's own routers.
    #[default]
    Learned,
    /// Dataset i is sent to expert i in every layer (DUME's oracle).
    Oracle,
    /// Seeded random routers (DUME's random baseline).
    Random,
}

impl EvalRouting {
    /// The name on the command line and in reports (`learned`, `oracle`,
    /// `random`).
    pub fn name(self) -> &'static str {
        match self {
            EvalRouting::Learned => "learned",
            EvalRouting::Oracle => "oracle",
            EvalRouting::Random => "random",
        }
    }
}

/// The longest window and stride any caller accepts (tokens).
pub const MAX_WINDOW: usize = 65_536;

/// What an eval is asked to do, besides its inputs (see the module docs).
/// `Default`: windows of 512 tokens every 256, every token, learned
/// routing, seed 0.
///
/// Source: the sliding-window perplexity of transformers' "Perplexity of
/// fixed-length models" guide (each token scored once, with up to
/// `window - stride` tokens of context); DUME (2025) §4 for the oracle and
/// random routing; docs/methods.md §2.5–§2.6 and §7.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct EvalParams {
    /// Tokens per window.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().window))]
    pub window: usize,
    /// Advance between windows.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().stride))]
    pub stride: usize,
    /// Score only the first N tokens of each dataset.
    #[cfg_attr(feature = "cli", arg(long))]
    pub max_tokens: Option<usize>,
    /// MoE routing: `learned`, `oracle` (dataset i -> expert i) or `random` (seeded random routers).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Self::default().routing))]
    pub routing: EvalRouting,
    /// Seed of `--routing random`.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().seed))]
    pub seed: u64,
}

impl Default for EvalParams {
    fn default() -> Self {
        EvalParams { window: 512, stride: 256, max_tokens: None, routing: EvalRouting::Learned, seed: 0 }
    }
}

impl EvalParams {
    /// The perplexity options with `batch` windows per forward pass.
    pub fn perplexity(&self, batch: usize) -> PerplexityOptions {
        PerplexityOptions { window: self.window, stride: self.stride, max_tokens: self.max_tokens, batch }
    }

    /// The rules every caller checks before any model is read: `window` in
    /// 2..=65,536, `stride` in 1..=65,536, `max_tokens` in 1..=10^9. That
    /// oracle and random routing need an MoE is checked on the model.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self) -> Result<(), ParamError> {
        let bad = |field: &'static str, message: String| Err(ParamError { field, message });
        if !(2..=MAX_WINDOW).contains(&self.window) {
            return bad("window", format!("{} is out of range 2..={MAX_WINDOW}", self.window));
        }
        if !(1..=MAX_WINDOW).contains(&self.stride) {
            return bad("stride", format!("{} is out of range 1..={MAX_WINDOW}", self.stride));
        }
        if let Some(t) = self.max_tokens.filter(|t| !(1..=1_000_000_000).contains(t)) {
            return bad("max_tokens", format!("{t} is out of range 1..=1000000000"));
        }
        Ok(())
    }

    /// The job form's inputs for these parameters, in field order, with the
    /// defaults as hints (the Jobs page; `model` and `data` are the job's
    /// own).
    pub fn form_fields() -> Vec<Field> {
        let d = EvalParams::default();
        let dflt = |v: &dyn std::fmt::Display| format!("default {v}");
        vec![
            Field::new("window", "window", Input::Int, &dflt(&d.window)),
            Field::new("stride", "stride", Input::Int, &dflt(&d.stride)),
            Field::new("max_tokens", "max tokens", Input::Int, "all"),
            Field::new("routing", "routing", Input::Choice(&["learned", "oracle", "random"]), "learned"),
            Field::new("seed", "seed (random routing)", Input::Int, &dflt(&d.seed)).advanced(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_field_and_flags_reach_the_cli_names() {
        let d = EvalParams::default;
        assert_eq!(d().check(), Ok(()));
        let field = |p: EvalParams| p.check().unwrap_err().field;
        assert_eq!(field(EvalParams { window: 1, ..d() }), "window");
        assert_eq!(field(EvalParams { stride: 0, ..d() }), "stride");
        assert_eq!(field(EvalParams { max_tokens: Some(0), ..d() }), "max_tokens");
        let p = EvalParams { routing: EvalRouting::Oracle, max_tokens: Some(9), ..d() };
        let mut f = crate::ops::flags(&p);
        f.sort();
        assert_eq!(f, ["--max-tokens=9", "--routing=oracle", "--seed=0", "--stride=256", "--window=512"]);
        assert_eq!(serde_json::to_value(EvalRouting::Random).unwrap(), EvalRouting::Random.name());
    }

    #[test]
    fn the_form_offers_every_parameter() {
        let keys: Vec<&str> = crate::ops::fields_of::<EvalParams>().to_vec();
        let inputs: Vec<&str> = EvalParams::form_fields().iter().map(|f| f.key).collect();
        assert_eq!(keys, inputs);
    }
}
