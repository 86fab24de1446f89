//! `moerge`: N dense models -> one MoE (DUME, docs/methods.md §2) as a job.

use std::collections::HashMap;

use super::{
    check_dtype, check_models, dtype_field, json_out, param_err, req, ApiError, Field, Input, JobInputs, ModelSummary,
    Operation,
};
use crate::ops::moerge::MoergeParams;

job_spec! {
    /// `moerge`: N dense models -> one MoE (DUME). The parameters are
    /// [`MoergeParams`]'s fields, flattened (`{"kind": "moerge", "models":
    /// [...], "top_k": 2}`); unset ones take its defaults. The server MoErges
    /// without a base model, so the router starts as zeros or random and the
    /// ridge router is fitted by a `route` job.
    pub struct MoergeSpec {
        /// Checkpoint ids (2-64), expert i = model i.
        pub models: Vec<String>,
        /// Output dtype.
        #[serde(default)]
        pub dtype: Option<String>,
    }
    /// What the MoErge does (ops/moerge.rs).
    params: MoergeParams
}

impl Operation for MoergeSpec {
    fn label() -> &'static str {
        "moerge (dense models → MoE, DUME)"
    }

    fn fields() -> Vec<Field> {
        std::iter::once(req("models", "models (expert i = model i)", Input::Checkpoints, ""))
            .chain(MoergeParams::form_fields())
            .chain([dtype_field()])
            .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        check_models("spec.models", &self.models, 2)?;
        self.params.check(self.models.len(), false).map_err(param_err)?;
        check_dtype("spec.dtype", &self.dtype)
    }

    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        // top-k against the models and frozen experts that exist are the
        // spec's own checks (MoergeParams::check in validate).
        for (i, id) in self.models.iter().enumerate() {
            if models.get(id).is_some_and(|m| !m.router_experts().is_empty()) {
                return Err(ApiError::field(
                    &format!("spec.models[{i}]"),
                    format!("checkpoint {id} is already an MoE; moerge takes dense models"),
                ));
            }
        }
        Ok(())
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::many("spec.models", &self.models)
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["moerge".to_string()];
        a.extend(self.models.iter().map(|id| inputs.model(id)));
        a.extend(crate::ops::flags(&self.params));
        super::opt(&mut a, "dtype", self.dtype.clone());
        json_out(&mut a);
        a
    }
}
