//! The route operation's parameters (DUME's ridge router on a MoErged
//! model, docs/methods.md §2): one struct for the CLI (`moe-studio route`,
//! flattened), the server's job spec ([`crate::api::RouteSpec`] flattens
//! it: the JSON keys are these fields), the recipe runner's `ridge:`
//! section, the tab's MoErge page and DUME lesson (the worker message
//! carries it), and the job form's inputs ([`RouteParams::form_fields`]).
//!
//! What stays with the caller: the MoE, the domains' texts (a file per
//! domain in the CLI, an upload id on the server, a text in the tab), how
//! a plain-text file is cut into documents (`--docs`), the output layout
//! and path, and the CLI's extra reports (`--lambda-sweep`, `--stats`,
//! `--add-expert`).

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::corpus::DocSplit;
use crate::methods::route::RouteOptions;

/// The most domains (= experts) a route takes, and so the largest top-k
/// (the server's cap on a job's datasets).
pub const MAX_DOMAINS: usize = 64;

/// What a ridge-router fit is asked to do, besides its inputs (see the
/// module docs). `Default` is the reference code's: `λ = 1e-2`, top-1,
/// temperature 1, every statistics token, 512 tokens per statistics
/// sequence, a bias column, 2,000 held-out tokens per domain for the
/// accuracy report ([`RouteOptions::default`]).
///
/// Source: DUME (2026), router section (ridge regression on the FFN
/// inputs, one expert per domain); docs/methods.md §2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct RouteParams {
    /// Ridge strength lambda (> 0).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().lambda))]
    pub lambda: f64,
    /// Experts per token at inference (1 to the number of domains).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().top_k))]
    pub top_k: usize,
    /// Router temperature (a finite number > 0; folded into the router
    /// weight when written).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().temperature))]
    pub temperature: f64,
    /// A cap on the statistics tokens per domain (default: every token of
    /// the training text, as the reference code's statistics pass).
    #[cfg_attr(feature = "cli", arg(long))]
    pub max_tokens: Option<usize>,
    /// Tokens per statistics sequence (the reference code's per-sequence
    /// position cap, `context_dim`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().context))]
    pub context: usize,
    /// Solve without the bias column (the result then exports in a public
    /// layout: Mixtral, Qwen2-MoE).
    #[cfg_attr(feature = "cli", arg(long))]
    pub no_bias: bool,
    /// Held-out tokens per domain for the routing-accuracy report.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().eval_tokens))]
    pub eval_tokens: usize,
}

impl Default for RouteParams {
    fn default() -> Self {
        let o = RouteOptions::default();
        RouteParams {
            lambda: o.lambda,
            top_k: o.top_k,
            temperature: o.temperature,
            max_tokens: o.max_tokens,
            context: o.context,
            no_bias: !o.bias,
            eval_tokens: 2_000,
        }
    }
}

impl RouteParams {
    /// The method's options; `docs` is how the callers' plain-text files
    /// are cut into documents (the tab's texts: [`DocSplit::Blank`]).
    pub fn options(&self, docs: DocSplit) -> RouteOptions {
        RouteOptions {
            lambda: self.lambda,
            top_k: self.top_k,
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            context: self.context,
            bias: !self.no_bias,
            docs,
        }
    }

    /// The rules every caller checks before any file is read (the CLI's
    /// `route`, the server's route job when it is created, the recipe
    /// runner, the tab's form): `λ` finite in `(0, 1e9]`, top-k in
    /// `1..=64` and at most `domains` (one expert per domain, never
    /// clamped), a temperature finite and > 0, at least one statistics
    /// token (at most 1e8) when capped, a context of 2 to 65,536 tokens, at
    /// least one held-out token.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self, domains: usize) -> Result<(), ParamError> {
        let bad = |field: &'static str, message: String| Err(ParamError { field, message });
        if !(self.lambda.is_finite() && self.lambda > 0.0 && self.lambda <= 1e9) {
            return bad("lambda", format!("{} is out of range (exclusive) 0..=1000000000", self.lambda));
        }
        if !(1..=MAX_DOMAINS).contains(&self.top_k) {
            return bad("top_k", format!("{} is out of range 1..={MAX_DOMAINS}", self.top_k));
        }
        if self.top_k > domains {
            return bad("top_k", format!("{}: expected 1 to {domains} (the experts: one per domain)", self.top_k));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad("temperature", format!("{}: expected a finite number > 0", self.temperature));
        }
        if let Some(m) = self.max_tokens.filter(|m| !(1..=100_000_000).contains(m)) {
            return bad("max_tokens", format!("{m} is out of range 1..=100000000 (statistics tokens per domain)"));
        }
        if !(2..=65_536).contains(&self.context) {
            return bad(
                "context",
                format!("{} is out of range 2..=65536 (tokens per statistics sequence)", self.context),
            );
        }
        if self.eval_tokens == 0 {
            return bad("eval_tokens", "0: expected at least 1 held-out token per domain".into());
        }
        Ok(())
    }

    /// The job form's inputs for these parameters, in order, with the
    /// defaults as hints (the Jobs page; the spec's other fields, `model`
    /// and `domains`, are the job's inputs).
    pub fn form_fields() -> Vec<Field> {
        let d = RouteParams::default();
        vec![
            Field::new("lambda", "lambda", Input::Float, &format!("default {}", d.lambda)),
            Field::new("top_k", "top-k", Input::Int, &format!("default {}", d.top_k)),
            Field::new("max_tokens", "max tokens", Input::Int, "all"),
            Field::new("context", "context", Input::Int, &format!("default {}", d.context)),
            Field::new("temperature", "temperature", Input::Float, &format!("default {}", d.temperature)).advanced(),
            Field::new("eval_tokens", "held-out tokens", Input::Int, &format!("default {}", d.eval_tokens)).advanced(),
            Field::new("no_bias", "no bias column", Input::Flag, "exports as Mixtral / Qwen2-MoE").advanced(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_methods_defaults() {
        let o = RouteParams::default().options(DocSplit::Blank);
        assert_eq!(o, RouteOptions::default());
        assert_eq!(RouteParams::default().check(2), Ok(()));
    }

    #[test]
    fn check_names_the_field() {
        let d = RouteParams::default;
        let field = |p: RouteParams, domains| p.check(domains).unwrap_err().field;
        assert_eq!(field(RouteParams { lambda: 0.0, ..d() }, 2), "lambda");
        assert_eq!(field(RouteParams { lambda: f64::NAN, ..d() }, 2), "lambda");
        assert_eq!(field(RouteParams { top_k: 0, ..d() }, 2), "top_k");
        assert_eq!(field(RouteParams { top_k: 3, ..d() }, 2), "top_k");
        assert_eq!(field(RouteParams { temperature: 0.0, ..d() }, 2), "temperature");
        assert_eq!(field(RouteParams { max_tokens: Some(0), ..d() }, 2), "max_tokens");
        assert_eq!(field(RouteParams { context: 1, ..d() }, 2), "context");
        assert_eq!(field(RouteParams { eval_tokens: 0, ..d() }, 2), "eval_tokens");
        let e = RouteParams { top_k: 0, ..d() }.check(2).unwrap_err();
        assert_eq!(e.message, "0 is out of range 1..=64");
        assert_eq!(e.flag(), "--top-k");
        assert!(RouteParams { top_k: 2, max_tokens: Some(10), ..d() }.check(2).is_ok());
    }

    #[test]
    fn json_takes_only_what_differs_and_refuses_unknown_fields() {
        let p: RouteParams = serde_json::from_str(r#"{"lambda": 0.5, "max_tokens": 2000}"#).unwrap();
        assert_eq!(p, RouteParams { lambda: 0.5, max_tokens: Some(2000), ..Default::default() });
        let e = serde_json::from_str::<RouteParams>(r#"{"lamda": 0.5}"#).unwrap_err().to_string();
        assert!(e.contains("lamda"), "{e}");
    }

    #[test]
    fn the_form_offers_every_parameter() {
        let mut keys: Vec<&str> = crate::ops::fields_of::<RouteParams>().to_vec();
        let mut inputs: Vec<&str> = RouteParams::form_fields().iter().map(|f| f.key).collect();
        keys.sort();
        inputs.sort();
        assert_eq!(keys, inputs);
    }
}
