//! The task operation's parameters (multiple-choice accuracy with the
//! lm-evaluation-harness `multiple_choice` semantics, docs/methods.md §8):
//! one struct for the CLI (`moe-studio eval --task`, flattened), the
//! server's job spec ([`crate::api::TaskSpec`] flattens it), the tab's task
//! table (the worker message carries it) and the job form's inputs
//! ([`TaskParams::form_fields`]).
//!
//! What stays with the caller: the model, the task files, the requests per
//! forward pass (`--batch`: speed and memory, not the result).

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::eval::task::MAX_ITEMS;

/// The longest `target_delimiter` any caller accepts (characters).
pub const MAX_DELIMITER: usize = 16;

/// What a task evaluation is asked to do, besides its inputs (see the
/// module docs). `Default` is lm-eval's: a space between the context and
/// each choice, every item scored.
///
/// Source: lm-evaluation-harness 0.4 (`target_delimiter` of a task YAML,
/// default `" "`; `--limit`); docs/methods.md §8.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct TaskParams {
    /// With --task: put between the context and each choice (lm-eval's `target_delimiter`;
    /// at most 16 characters, no control characters but newline and tab).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().target_delimiter, allow_hyphen_values = true))]
    pub target_delimiter: String,
    /// With --task: score only the first N items of each task (lm-eval's --limit); unset: every item.
    #[cfg_attr(feature = "cli", arg(long))]
    pub limit: Option<usize>,
}

impl Default for TaskParams {
    fn default() -> Self {
        TaskParams { target_delimiter: " ".into(), limit: None }
    }
}

impl TaskParams {
    /// The rules every caller checks before any model is read: the
    /// delimiter at most [`MAX_DELIMITER`] characters with no control
    /// character but `\n` and `\t`; `limit` in `1..=`[`MAX_ITEMS`].
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self) -> Result<(), ParamError> {
        let d = &self.target_delimiter;
        if d.chars().count() > MAX_DELIMITER || d.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            return Err(ParamError {
                field: "target_delimiter",
                message: format!(
                    "{d:?}: expected at most {MAX_DELIMITER} characters, no control characters but newline and tab"
                ),
            });
        }
        if let Some(n) = self.limit {
            if !(1..=MAX_ITEMS).contains(&n) {
                return Err(ParamError { field: "limit", message: format!("{n} is out of range 1..={MAX_ITEMS}") });
            }
        }
        Ok(())
    }

    /// The job form's inputs for these parameters (the Jobs page; the
    /// spec's `model`, `tasks` and `batch` are the job's own). The
    /// delimiter is offered as the two values tasks use: `space` (`" "`)
    /// and `none` (`""`, for contexts that end in a newline).
    pub fn form_fields() -> Vec<Field> {
        vec![
            Field::new(
                "target_delimiter",
                "target delimiter",
                Input::Choice(&["space", "none"]),
                "space (lm-eval's default); none for contexts that end in a newline",
            )
            .values(&[("space", " "), ("none", "")]),
            Field::new("limit", "items per task", Input::Int, "all"),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_field_and_json_refuses_unknown_fields() {
        assert_eq!(TaskParams::default().check(), Ok(()));
        let ok = TaskParams { target_delimiter: "\n\tA:".into(), limit: Some(MAX_ITEMS) };
        assert_eq!(ok.check(), Ok(()));
        for (bad, field) in [
            (TaskParams { target_delimiter: "x".repeat(17), limit: None }, "target_delimiter"),
            (TaskParams { target_delimiter: "\u{7}".into(), limit: None }, "target_delimiter"),
            (TaskParams { limit: Some(0), ..TaskParams::default() }, "limit"),
            (TaskParams { limit: Some(MAX_ITEMS + 1), ..TaskParams::default() }, "limit"),
        ] {
            assert_eq!(bad.check().unwrap_err().field, field, "{bad:?}");
        }
        let p: TaskParams = serde_json::from_str(r#"{"target_delimiter": "", "limit": 5}"#).unwrap();
        assert_eq!(p, TaskParams { target_delimiter: String::new(), limit: Some(5) });
        let e = serde_json::from_str::<TaskParams>(r#"{"delimiter": ""}"#).unwrap_err().to_string();
        assert!(e.contains("delimiter"), "{e}");
        // The default delimiter is one token on the command line.
        assert_eq!(crate::ops::flags(&TaskParams::default()), ["--target-delimiter= "]);
    }

    #[test]
    fn the_form_offers_every_parameter() {
        let keys: Vec<&str> = crate::ops::fields_of::<TaskParams>().to_vec();
        let inputs: Vec<&str> = TaskParams::form_fields().iter().map(|f| f.key).collect();
        assert_eq!(keys, inputs);
    }
}
