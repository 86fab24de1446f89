//! The graft operation's parameters (DeltaMoE phase 2, docs/methods.md
//! §1.3: add `scale · (instruct − base)` to a model, every expert of layer
//! `l` taking layer `l`'s dense FFN delta): one struct for the CLI
//! (`moe-studio graft`, flattened), the server's job spec
//! ([`crate::api::GraftSpec`] flattens it), the recipe runner's `graft:`
//! section, the tab's Graft page and DeltaMoE lesson (the worker message
//! carries it), and the job form's inputs ([`GraftParams::form_fields`]).
//!
//! What stays with the caller: the target (MoE or dense), the base and
//! instruct models the delta is taken between, the output layout and path.

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};

/// The largest `|scale|` any caller accepts.
pub const MAX_SCALE: f64 = 1e3;

/// What a graft is asked to do, besides its inputs (see the module docs).
/// `Default` is the paper's: the whole delta (`scale` 1).
///
/// Source: DeltaMoE (2025), §3.3 (grafting the alignment delta onto the
/// shared weights and every expert); task arithmetic (Ilharco et al.
/// 2023) for a `scale` other than 1; docs/methods.md §1.3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct GraftParams {
    /// Scale λ on the delta (1.0 = the paper; negative subtracts it).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().scale, allow_negative_numbers = true))]
    pub scale: f64,
}

impl Default for GraftParams {
    fn default() -> Self {
        GraftParams { scale: 1.0 }
    }
}

impl GraftParams {
    /// The rules every caller checks before any model is read: `scale`
    /// finite, `|scale| <= 1000`.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self) -> Result<(), ParamError> {
        if !(self.scale.is_finite() && self.scale.abs() <= MAX_SCALE) {
            return Err(ParamError {
                field: "scale",
                message: format!("{}: expected a finite number in -1000..=1000", self.scale),
            });
        }
        Ok(())
    }

    /// The job form's inputs for these parameters (the Jobs page; the
    /// spec's other fields, `target`, `base` and `instruct`, are the job's
    /// inputs).
    pub fn form_fields() -> Vec<Field> {
        vec![Field::new("scale", "scale", Input::Float, &format!("default {}", GraftParams::default().scale))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_field_and_json_refuses_unknown_fields() {
        assert_eq!(GraftParams::default().check(), Ok(()));
        assert_eq!(GraftParams { scale: -1000.0 }.check(), Ok(()));
        for bad in [f64::NAN, f64::INFINITY, 1000.5] {
            let e = GraftParams { scale: bad }.check().unwrap_err();
            assert_eq!((e.field, e.flag()), ("scale", "--scale".to_string()));
        }
        let p: GraftParams = serde_json::from_str(r#"{"scale": -0.5}"#).unwrap();
        assert_eq!(p, GraftParams { scale: -0.5 });
        let e = serde_json::from_str::<GraftParams>(r#"{"lambda": 0.5}"#).unwrap_err().to_string();
        assert!(e.contains("lambda"), "{e}");
        // A negative scale reaches the CLI as one token (`--scale=-0.5`).
        assert_eq!(crate::ops::flags(&p), ["--scale=-0.5"]);
    }

    #[test]
    fn the_form_offers_every_parameter() {
        let keys: Vec<&str> = crate::ops::fields_of::<GraftParams>().to_vec();
        let inputs: Vec<&str> = GraftParams::form_fields().iter().map(|f| f.key).collect();
        assert_eq!(keys, inputs);
    }
}
