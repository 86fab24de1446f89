//! The neurons operation's parameters (NeuronMoE's language-specific
//! neurons by Average Precision, docs/methods.md §3): one struct for the
//! CLI (`moe-studio neurons`, flattened), the server's job spec
//! ([`crate::api::NeuronsSpec`] flattens it), the tab's Neurons check and
//! the job form's inputs ([`NeuronsParams::form_fields`]).
//!
//! What stays with the caller: the model, the languages' texts, which of
//! them are new, how documents are cut from a file, batching and threads
//! (they change the speed, not the result), the output directory.

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::methods::neurons::{AnalysisOptions, CollectOptions};
use crate::model::Pooling;

/// The most texts per language and tokens per text any caller accepts.
pub const MAX_TEXTS: usize = 1_000_000;
/// The most tokens per text any caller accepts.
pub const MAX_TOKENS: usize = 65_536;

/// What a neurons run is asked to do, besides its inputs (see the module
/// docs). `Default` is the NeuronMoE reference: top-1000 by AP, mean
/// pooling, 300 texts per language, 256 tokens per text
/// ([`AnalysisOptions::default`], [`CollectOptions::default`]).
///
/// Source: NeuronMoE (2025) §3.1–3.2 (Average Precision of a neuron's
/// pooled activation for a language against the others; the top-N per
/// language); docs/methods.md §3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct NeuronsParams {
    /// Specific neurons per language (top-N by Average Precision; also bottom-N).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().top_n))]
    pub top_n: usize,
    /// Count the bottom-N (neurons off for the language) as specific too.
    #[cfg_attr(feature = "cli", arg(long))]
    pub bottom: bool,
    /// Pooling of a neuron's activations over a text's tokens: mean or max.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Self::default().pool))]
    pub pool: Pooling,
    /// Texts used per language (the file's first documents; >= 2).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().max_texts))]
    pub max_texts: usize,
    /// Each text is truncated to this many tokens.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().max_tokens))]
    pub max_tokens: usize,
}

impl Default for NeuronsParams {
    fn default() -> Self {
        let (a, c) = (AnalysisOptions::default(), CollectOptions::default());
        NeuronsParams {
            top_n: a.top_n,
            bottom: a.include_bottom,
            pool: c.pooling,
            max_texts: 300,
            max_tokens: c.max_tokens,
        }
    }
}

impl NeuronsParams {
    /// The collection options (pooling, tokens per text).
    pub fn collect(&self) -> CollectOptions {
        CollectOptions { pooling: self.pool, max_tokens: self.max_tokens }
    }

    /// The analysis options for the new languages `new`.
    pub fn analysis(&self, new: &[String]) -> AnalysisOptions {
        AnalysisOptions { top_n: self.top_n, include_bottom: self.bottom, new_languages: new.to_vec() }
    }

    /// The rules every caller checks before any model is read: `top_n` in
    /// 1..=1,000,000, `max_texts` in 2..=1,000,000 (the Average Precision
    /// needs two texts per language), `max_tokens` in 1..=65,536. That
    /// `top_n` fits the model's neurons is the method's check.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self) -> Result<(), ParamError> {
        let bad = |field: &'static str, message: String| Err(ParamError { field, message });
        if !(1..=MAX_TEXTS).contains(&self.top_n) {
            return bad("top_n", format!("{} is out of range 1..={MAX_TEXTS}", self.top_n));
        }
        if !(2..=MAX_TEXTS).contains(&self.max_texts) {
            return bad(
                "max_texts",
                format!("{} is out of range 2..={MAX_TEXTS} (the Average Precision needs 2 texts)", self.max_texts),
            );
        }
        if !(1..=MAX_TOKENS).contains(&self.max_tokens) {
            return bad("max_tokens", format!("{} is out of range 1..={MAX_TOKENS}", self.max_tokens));
        }
        Ok(())
    }

    /// The job form's inputs for these parameters, in field order, with the
    /// defaults as hints (the Jobs page; `model`, `langs` and `new` are the
    /// job's own).
    pub fn form_fields() -> Vec<Field> {
        let d = NeuronsParams::default();
        let dflt = |v: &dyn std::fmt::Display| format!("default {v}");
        vec![
            Field::new("top_n", "top-n", Input::Int, &dflt(&d.top_n)),
            Field::new("bottom", "bottom-N too", Input::Flag, "").advanced(),
            Field::new("pool", "pooling", Input::Choice(&["mean", "max"]), "mean").advanced(),
            Field::new("max_texts", "max texts", Input::Int, &dflt(&d.max_texts)),
            Field::new("max_tokens", "max tokens", Input::Int, &dflt(&d.max_tokens)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_methods_and_check_names_the_field() {
        let d = NeuronsParams::default;
        assert_eq!(d().collect(), CollectOptions::default());
        assert_eq!(d().analysis(&[]), AnalysisOptions::default());
        assert_eq!(d().check(), Ok(()));
        let field = |p: NeuronsParams| p.check().unwrap_err().field;
        assert_eq!(field(NeuronsParams { top_n: 0, ..d() }), "top_n");
        assert_eq!(field(NeuronsParams { max_texts: 1, ..d() }), "max_texts");
        assert_eq!(field(NeuronsParams { max_tokens: 0, ..d() }), "max_tokens");
        let p = NeuronsParams { bottom: true, pool: Pooling::Max, ..d() };
        let f = crate::ops::flags(&p);
        assert!(f.contains(&"--bottom".to_string()) && f.contains(&"--pool=max".to_string()), "{f:?}");
    }

    #[test]
    fn the_form_offers_every_parameter() {
        let keys: Vec<&str> = crate::ops::fields_of::<NeuronsParams>().to_vec();
        let inputs: Vec<&str> = NeuronsParams::form_fields().iter().map(|f| f.key).collect();
        assert_eq!(keys, inputs);
    }
}
