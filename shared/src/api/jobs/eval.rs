//! `eval`: per-dataset perplexity and routing load as a job
//! (`crate::eval`; docs/methods.md §8).

use std::collections::HashMap;

use super::{check_data, data, param_err, req, ApiError, DataRef, Field, Input, JobInputs, ModelSummary, Operation};
use crate::ops::eval::EvalParams;

job_spec! {
    /// `eval`: per-dataset perplexity and routing load (the result is
    /// `result.json` of the job's artefacts). The parameters are
    /// [`EvalParams`]'s fields, flattened (`{"kind": "eval", "model": ...,
    /// "data": [...], "window": 64, "routing": "oracle"}`).
    pub struct EvalSpec {
        /// Checkpoint id.
        pub model: String,
        /// Datasets (at least one).
        pub data: Vec<DataRef>,
    }
    /// What the eval does (ops/eval.rs).
    params: EvalParams
}

impl Operation for EvalSpec {
    fn label() -> &'static str {
        "eval (perplexity, routing load)"
    }

    fn fields() -> Vec<Field> {
        [req("model", "model", Input::Checkpoint, ""), req("data", "datasets", data(1, false, false, false), "")]
            .into_iter()
            .chain(EvalParams::form_fields())
            .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.model", &self.model)?;
        check_data("spec.data", &self.data, 1)?;
        self.params.check().map_err(param_err)
    }

    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        super::over_ctx(models, "spec.window", self.params.window, &self.model)
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::one("spec.model", &self.model)
    }

    fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        self.data.iter().map(|d| ("spec.data", d)).collect()
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["eval".into(), inputs.model(&self.model)];
        for d in &self.data {
            a.push(format!("--data={}", super::data_arg(inputs, d, false)));
        }
        a.extend(crate::ops::flags(&self.params));
        a.push("--json".into());
        a
    }

    fn output_model(&self) -> Option<&'static str> {
        None
    }

    fn stdout_is_result(&self) -> bool {
        true
    }
}
