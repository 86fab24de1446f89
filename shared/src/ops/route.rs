//! The route operation's parameters (DUME's ridge router on a MoErged
//! model, docs/methods.md §2): one struct for the CLI (`moe-studio route`,
//! flattened), the server's job spec ([`crate::api::RouteSpec`] flattens
//! it: the JSON keys are these fields), the recipe runner's `ridge:`
//! section, the tab's MoErge page and DUME lesson (the worker message
//! carries it), and the job form's inputs ([`RouteParams::form_fields`]).
//!
//! The fit itself is here too, once: [`fit`] (statistics of every
//! domain, the solve, the routers put in the model) and [`accuracy`] (the
//! held-out routing accuracy), which the CLI's `route` and the tab's
//! router both call, step for step the same.
//!
//! What stays with the caller: the MoE, the domains' texts (a file per
//! domain in the CLI, an upload id on the server, a text in the tab), how
//! a plain-text file is cut into documents (`--docs`), statistics gathered
//! elsewhere (the CLI's `--stats`, the tab's WebGPU Gram pass: handed to
//! [`fit`] as [`Collected`]), the output layout and path, and the CLI's
//! extra reports (`--lambda-sweep`, `--add-expert`).

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::corpus::DocSplit;
use crate::error::{Result, StudioError};
use crate::methods::ridge::{RidgeStats, RouterWeights};
use crate::methods::route::{
    accumulate_group, empty_stats, routing_accuracy_detail, set_routers, within_budget, DomainSequences, RouteOptions,
    RoutingAccuracy, SEQUENCES_PER_PASS,
};
use crate::model::Transformer;

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
            Field::new("max_tokens", "tokens per domain", Input::Int, "all"),
            Field::new("context", "context", Input::Int, &format!("default {}", d.context)),
            Field::new("temperature", "temperature", Input::Float, &format!("default {}", d.temperature)).advanced(),
            Field::new("eval_tokens", "held-out tokens", Input::Int, &format!("default {}", d.eval_tokens)).advanced(),
            Field::new("no_bias", "no bias column", Input::Flag, "exports as Mixtral / Qwen2-MoE").advanced(),
        ]
    }
}

/// Ridge statistics of every domain gathered before [`fit`] (the CLI's
/// `--stats` reuse of an earlier run, the tab's WebGPU Gram pass), and the
/// statistics tokens per domain. Source: DUME (2026), router section;
/// docs/methods.md §2.
#[derive(Debug, Clone)]
pub struct Collected {
    /// Per layer, `Some` for an MoE layer and `None` for a dense one: `A =
    /// XᵀX` `[p, p]` and `B = XᵀY` `[p, E]` in f64, `p = d + 1` with the
    /// bias column (`d` without), `E` = one column per domain.
    pub stats: Vec<Option<RidgeStats>>,
    /// Statistics tokens per domain (each ≥ 1).
    pub tokens: Vec<usize>,
}

/// What [`fit`] produced: the statistics it solved from, their tokens per
/// domain, and the solved routers, which are also in the model. Source:
/// DUME (2026), router section; docs/methods.md §2.
#[derive(Debug, Clone)]
pub struct RouteFit {
    /// Per layer, the statistics as in [`Collected::stats`] (written as
    /// `ridge_stats.safetensors`).
    pub stats: Vec<Option<RidgeStats>>,
    /// Statistics tokens per domain.
    pub tokens: Vec<usize>,
    /// Per layer, the solved router: weight `[E, d]`, bias `[E]` when solved
    /// with the bias column; `None` for a dense layer.
    pub routers: Vec<Option<RouterWeights>>,
}

/// A progress report of [`fit`] and [`accuracy`]: `(what, done, total,
/// unit)`, e.g. `("ridge statistics (hu)", 2048, 9000, "tokens")`: the
/// statistics count tokens over all domains, the solve counts MoE layers,
/// the accuracy counts held-out tokens over all domains.
pub type OnStep<'a> = &'a mut dyn FnMut(&str, u64, u64, &str);

/// DUME's router fit on `model` (an MoE whose expert `i` is domain `i`'s,
/// docs/methods.md §2): the statistics of each domain's training
/// sequences with every MoE layer forced to its expert (the forward passes
/// of `collect_stats`: [`SEQUENCES_PER_PASS`] sequences each, at most
/// `params.max_tokens` tokens per domain) unless `collected` brings them,
/// one ridge solve per MoE layer with `params.lambda`, and the routers put
/// into `model` with `params.top_k` and `params.temperature`. The CLI's
/// `route` and the tab's router run this; it reports progress to
/// `on_step` ([`OnStep`]).
///
/// # Errors
/// [`StudioError::Invalid`] when the parameters break [`RouteParams::check`]
/// (naming the field); when an MoE layer of `model` has another expert
/// count than there are `domains`; when `collected` does not cover this
/// model's MoE layers, has another bias column than the parameters ask
/// for, or not one non-zero token count per domain; when a domain has no
/// statistics tokens (naming it); the solver's errors.
pub fn fit<B: Backend>(
    model: &mut Transformer<B>,
    domains: &[DomainSequences],
    params: &RouteParams,
    collected: Option<Collected>,
    on_step: OnStep,
) -> Result<RouteFit> {
    params.check(domains.len()).map_err(|e| StudioError::Invalid(e.to_string()))?;
    let bias = !params.no_bias;
    let empty = empty_stats(model, bias);
    let other = |s: &RidgeStats| s.num_experts() != domains.len();
    if let Some((l, s)) = empty.iter().enumerate().find_map(|(l, s)| s.as_ref().filter(|s| other(s)).map(|s| (l, s))) {
        return Err(StudioError::Invalid(format!(
            "layer {l} has {} experts but {} domains were given (one per expert, in order)",
            s.num_experts(),
            domains.len()
        )));
    }
    let (stats, tokens) = match collected {
        Some(c) => {
            check_collected(&empty, &c, domains.len())?;
            (c.stats, c.tokens)
        }
        None => collect(model, empty, domains, params.max_tokens, on_step)?,
    };
    let layers = stats.iter().flatten().count() as u64;
    let mut routers = Vec::with_capacity(stats.len());
    for s in &stats {
        routers.push(s.as_ref().map(|s| s.solve(params.lambda)).transpose()?);
        on_step("solving the ridge systems", routers.iter().flatten().count() as u64, layers, "layers");
    }
    set_routers(model, &routers, params.top_k, params.temperature);
    Ok(RouteFit { stats, tokens, routers })
}

/// Incremental DUME (docs/methods.md §2.5): the statistics of a domain
/// added as expert `domain` of `model` (its sequences `train`, at most
/// `params.max_tokens` tokens), summed into `stats` (which already hold
/// the expert's empty rows and columns, `RidgeStats::add_expert`). Returns
/// the tokens used. `route --add-expert` runs this before solving again.
///
/// # Errors
/// As [`crate::methods::route::collect_stats`]: no tokens to collect from.
pub fn collect_added<B: Backend>(
    model: &Transformer<B>,
    domain: usize,
    train: &[Vec<u32>],
    params: &RouteParams,
    stats: &mut [Option<RidgeStats>],
) -> Result<usize> {
    crate::methods::route::collect_stats(model, domain, train, params.max_tokens, stats)
}

/// The statistics pass of [`fit`]: each domain's sequences that
/// `within_budget` keeps under `max_tokens`, through the model
/// [`SEQUENCES_PER_PASS`] at a time (the forward passes `collect_stats`
/// makes, so the sums are the same), with progress after each pass.
fn collect<B: Backend>(
    model: &Transformer<B>,
    mut stats: Vec<Option<RidgeStats>>,
    domains: &[DomainSequences],
    max_tokens: Option<usize>,
    on_step: OnStep,
) -> Result<(Vec<Option<RidgeStats>>, Vec<usize>)> {
    let kept: Vec<Vec<&[u32]>> = domains.iter().map(|d| within_budget(&d.train, max_tokens)).collect();
    let all: u64 = kept.iter().flatten().map(|s| s.len() as u64).sum();
    let (mut tokens, mut done) = (Vec::with_capacity(domains.len()), 0u64);
    for (i, (d, seqs)) in domains.iter().zip(&kept).enumerate() {
        let what = format!("ridge statistics ({})", d.name);
        let mut used = 0usize;
        for group in seqs.chunks(SEQUENCES_PER_PASS) {
            let got = accumulate_group(model, i, group, &mut stats).map_err(|e| match e {
                StudioError::Invalid(m) => StudioError::Invalid(format!("domain `{}`: {m}", d.name)),
                e => e,
            })?;
            used += got;
            done += got as u64;
            on_step(&what, done, all, "tokens");
        }
        if used == 0 {
            return Err(StudioError::Invalid(format!("domain `{}`: no tokens to collect statistics from", d.name)));
        }
        tokens.push(used);
    }
    Ok((stats, tokens))
}

/// Statistics gathered elsewhere fit this run: an MoE layer where the
/// model has one (`empty`: the model's empty statistics with the
/// parameters' bias column), one expert column per domain, the bias column
/// the parameters ask for, one non-zero token count per domain.
fn check_collected(empty: &[Option<RidgeStats>], c: &Collected, domains: usize) -> Result<()> {
    if c.stats.iter().map(Option::is_some).ne(empty.iter().map(Option::is_some)) {
        return Err(StudioError::Invalid(format!(
            "its MoE layers ({} of {}) are not this model's ({} of {})",
            c.stats.iter().flatten().count(),
            c.stats.len(),
            empty.iter().flatten().count(),
            empty.len()
        )));
    }
    if let Some(s) = c.stats.iter().flatten().find(|s| s.num_experts() != domains) {
        return Err(StudioError::Invalid(format!(
            "its statistics have {} expert columns, this run routes {domains} domains",
            s.num_experts()
        )));
    }
    let bias = empty.iter().flatten().next().is_none_or(|s| s.bias);
    if let Some(s) = c.stats.iter().flatten().find(|s| s.bias != bias) {
        return Err(StudioError::Invalid(format!(
            "its statistics are {} the bias column, the fit asks for them {}",
            if s.bias { "with" } else { "without" },
            if bias { "with" } else { "without" }
        )));
    }
    if c.tokens.len() != domains || c.tokens.contains(&0) {
        return Err(StudioError::Invalid(format!(
            "token counts {:?} for {domains} domains (one non-zero count per domain)",
            c.tokens
        )));
    }
    Ok(())
}

/// Held-out routing accuracy of every domain on `model` as routed by
/// [`fit`] (`routing_accuracy_detail`: per MoE layer the fraction of
/// tokens whose top-1 expert is the domain's, and the fraction routed to
/// it in every MoE layer, on at most `params.eval_tokens` tokens of each
/// domain's held-out sequences), in domain order; progress in tokens to
/// `on_step`. Source: DUME (2026), router section; docs/methods.md §2.
pub fn accuracy<B: Backend>(
    model: &Transformer<B>,
    domains: &[DomainSequences],
    params: &RouteParams,
    on_step: OnStep,
) -> Vec<RoutingAccuracy> {
    let budget = |d: &DomainSequences| d.heldout.iter().map(Vec::len).sum::<usize>().min(params.eval_tokens) as u64;
    let all: u64 = domains.iter().map(budget).sum();
    let mut done = 0u64;
    let mut out = Vec::with_capacity(domains.len());
    for (i, d) in domains.iter().enumerate() {
        let what = format!("routing accuracy ({})", d.name);
        on_step(&what, done, all, "tokens");
        out.push(routing_accuracy_detail(model, i, &d.heldout, params.eval_tokens));
        done += budget(d);
        on_step(&what, done, all, "tokens");
    }
    out
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
