//! The merge operation's parameters (the weight-merging baselines:
//! linear, task arithmetic, TIES, DARE; mergekit's semantics,
//! docs/methods.md §6): one struct for the CLI (`moe-studio
//! merge`, flattened), the server's job spec ([`crate::api::MergeSpec`]
//! flattens it), the recipe runner's merge stage (a mergekit merge recipe
//! becomes one) and the job form's inputs ([`MergeParams::form_fields`]).
//!
//! What stays with the caller: the method (the CLI's first positional
//! argument), the models, the base model, the output dtype and path.

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::methods::merge::{MergeMethod, MergeOptions, Rescale};

/// The largest `|weight|` and `|lambda|` any caller accepts.
pub const MAX_WEIGHT: f64 = 1e3;

/// What a merge is asked to do, besides its method and inputs (see the
/// module docs). `Default` is the CLI's: unit weights, density 0.5, the
/// method's normalise / rescale defaults, lambda 1, seed 0
/// ([`MergeOptions::new`]).
///
/// Source: mergekit 0.1.5 (`linear`, `task_arithmetic`, `ties`,
/// `dare_linear`, `dare_ties`); TIES-Merging (Yadav et al. 2023); DARE
/// (Yu et al. 2024); docs/methods.md §6.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct MergeParams {
    /// One weight per model, comma-separated (default: all 1).
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', allow_negative_numbers = true))]
    pub weights: Option<Vec<f64>>,
    /// Fraction of each delta kept by ties / dare, in (0, 1].
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().density))]
    pub density: f64,
    /// Seed of dare's random drop.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().seed))]
    pub seed: u64,
    /// Divide by the sum of weights: true or false (default as mergekit:
    /// true for linear and ties, false otherwise).
    #[cfg_attr(feature = "cli", arg(long))]
    pub normalize: Option<bool>,
    /// Rescaling of sparsified deltas: none, inverse-density (the DARE
    /// paper; dare's default) or l1 (mergekit 0.1.5's `rescale: true`).
    #[cfg_attr(feature = "cli", arg(long, value_parser = parse_rescale))]
    pub rescale: Option<Rescale>,
    /// Factor on the merged delta (mergekit's `lambda`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().lambda, allow_negative_numbers = true))]
    pub lambda: f64,
}

#[cfg(feature = "cli")]
fn parse_rescale(s: &str) -> Result<Rescale, String> {
    Rescale::parse(s).ok_or_else(|| format!("`{s}`: expected none, inverse-density or l1"))
}

impl Default for MergeParams {
    fn default() -> Self {
        let o = MergeOptions::new(MergeMethod::Linear);
        MergeParams {
            weights: o.weights,
            density: o.density,
            seed: o.seed,
            normalize: o.normalize,
            rescale: o.rescale,
            lambda: o.lambda,
        }
    }
}

impl MergeParams {
    /// The parameters of merge options `o` (a mergekit recipe's), less its
    /// method and dtype.
    pub fn of(o: &MergeOptions) -> MergeParams {
        MergeParams {
            weights: o.weights.clone(),
            density: o.density,
            seed: o.seed,
            normalize: o.normalize,
            rescale: o.rescale,
            lambda: o.lambda,
        }
    }

    /// The method's options for `method` (the output dtype is the caller's).
    pub fn options(&self, method: MergeMethod) -> MergeOptions {
        MergeOptions {
            weights: self.weights.clone(),
            density: self.density,
            normalize: self.normalize,
            rescale: self.rescale,
            lambda: self.lambda,
            seed: self.seed,
            ..MergeOptions::new(method)
        }
    }

    /// The rules every caller checks before any model is read: one weight
    /// per model (`models` of them), each finite with `|w| <= 1000`;
    /// `density` in (0, 1]; `lambda` finite with `|lambda| <= 1000`.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self, models: usize) -> Result<(), ParamError> {
        let bad = |field: &'static str, message: String| Err(ParamError { field, message });
        if let Some(w) = &self.weights {
            if w.len() != models {
                return bad("weights", format!("{} weights for {models} models: give one weight per model", w.len()));
            }
            if let Some((i, x)) = w.iter().enumerate().find(|(_, x)| !(x.is_finite() && x.abs() <= MAX_WEIGHT)) {
                return bad("weights", format!("weight {i} = {x}: expected a finite number in -1000..=1000"));
            }
        }
        if !(self.density.is_finite() && self.density > 0.0 && self.density <= 1.0) {
            return bad("density", format!("{}: expected a number in (0, 1]", self.density));
        }
        if !(self.lambda.is_finite() && self.lambda.abs() <= MAX_WEIGHT) {
            return bad("lambda", format!("{}: expected a finite number in -1000..=1000", self.lambda));
        }
        Ok(())
    }

    /// The job form's inputs for these parameters, in field order, with the
    /// defaults as hints (the Jobs page; `method`, `models`, `base` and
    /// `dtype` are the job's own).
    pub fn form_fields() -> Vec<Field> {
        let d = MergeParams::default();
        vec![
            Field::new("weights", "weights", Input::FloatList, "one per model, e.g. 0.5,0.5"),
            Field::new("density", "density", Input::Float, &format!("default {}", d.density)),
            Field::new("seed", "seed", Input::Int, &format!("default {}", d.seed)).advanced(),
            Field::new("normalize", "normalise", Input::Choice(&["true", "false"]), "per method (as mergekit)")
                .advanced(),
            Field::new("rescale", "rescale", Input::Choice(&["none", "inverse-density", "l1"]), "per method")
                .advanced(),
            Field::new("lambda", "lambda", Input::Float, &format!("default {}", d.lambda)).advanced(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_methods_and_options_round_trip() {
        assert_eq!(MergeParams::default().options(MergeMethod::Ties), MergeOptions::new(MergeMethod::Ties));
        let p = MergeParams {
            weights: Some(vec![0.5, -0.25]),
            density: 0.3,
            seed: 5,
            normalize: Some(false),
            rescale: Some(Rescale::L1),
            lambda: 0.5,
        };
        assert_eq!(MergeParams::of(&p.options(MergeMethod::DareTies)), p);
        let mut f = crate::ops::flags(&p);
        f.sort();
        assert_eq!(
            f,
            ["--density=0.3", "--lambda=0.5", "--normalize=false", "--rescale=l1", "--seed=5", "--weights=0.5,-0.25"]
        );
    }

    #[test]
    fn check_names_the_field() {
        let d = MergeParams::default;
        assert_eq!(d().check(3), Ok(()));
        let field = |p: MergeParams| p.check(2).unwrap_err().field;
        assert_eq!(field(MergeParams { weights: Some(vec![1.0]), ..d() }), "weights");
        assert_eq!(field(MergeParams { weights: Some(vec![1.0, f64::NAN]), ..d() }), "weights");
        assert_eq!(field(MergeParams { density: 0.0, ..d() }), "density");
        assert_eq!(field(MergeParams { density: 1.5, ..d() }), "density");
        assert_eq!(field(MergeParams { lambda: f64::INFINITY, ..d() }), "lambda");
    }

    #[test]
    fn the_form_offers_every_parameter() {
        let keys: Vec<&str> = crate::ops::fields_of::<MergeParams>().to_vec();
        let inputs: Vec<&str> = MergeParams::form_fields().iter().map(|f| f.key).collect();
        assert_eq!(keys, inputs);
    }
}
