//! `merge`: the weight-merging baselines as a job (linear, task
//! arithmetic, TIES, DARE; docs/methods.md §2.6).

use std::collections::HashMap;

use super::{
    check_dtype, check_models, dtype_field, f, json_out, param_err, req, ApiError, Field, Input, JobInputs,
    ModelSummary, Operation,
};
use crate::methods::merge::MergeMethod;
use crate::ops::merge::MergeParams;

job_spec! {
    /// `merge`: the weight-merging baselines. The parameters are
    /// [`MergeParams`]'s fields, flattened (`{"kind": "merge", "method":
    /// "ties", "models": [...], "base": ..., "density": 0.3}`); unset ones take
    /// its defaults.
    pub struct MergeSpec {
        /// Method (`linear`, `task-arithmetic`, `ties`, `dare`, `dare-ties`):
        /// [`MergeMethod`], the merge's own.
        pub method: MergeMethod,
        /// Checkpoint ids (1-64).
        pub models: Vec<String>,
        /// Checkpoint id of the base (all but `linear`).
        pub base: Option<String>,
        /// Output dtype.
        pub dtype: Option<String>,
    }
    /// What the merge does (ops/merge.rs).
    params: MergeParams
}

impl Operation for MergeSpec {
    fn label() -> &'static str {
        "merge (linear / task arithmetic / TIES / DARE)"
    }

    fn fields() -> Vec<Field> {
        [
            req("method", "method", Input::Choice(&["linear", "task-arithmetic", "ties", "dare", "dare-ties"]), ""),
            req("models", "models", Input::Checkpoints, ""),
            f("base", "base", Input::OptCheckpoint, ""),
        ]
        .into_iter()
        .chain(MergeParams::form_fields())
        .chain([dtype_field()])
        .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        check_models("spec.models", &self.models, 1)?;
        self.params.check(self.models.len()).map_err(param_err)?;
        match (&self.base, self.method) {
            (Some(b), _) => super::check_id("spec.base", b)?,
            (None, MergeMethod::Linear) => {}
            (None, m) => return Err(ApiError::field("spec.base", format!("{} needs a base model", m.name()))),
        }
        check_dtype("spec.dtype", &self.dtype)
    }

    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        // Every model (and the base) must have the tensors of the first.
        let Some(first) = models.get(&self.models[0]) else { return Ok(()) };
        let others = self.models.iter().enumerate().skip(1).map(|(i, id)| (format!("spec.models[{i}]"), id));
        for (field, id) in others.chain(self.base.iter().map(|b| ("spec.base".to_string(), b))) {
            if let Some(why) = models.get(id).and_then(|m| first.tensor_mismatch(m)) {
                return Err(ApiError::field(
                    &field,
                    format!(
                        "checkpoint {id} cannot be merged with checkpoint {} (spec.models[0]): {why}",
                        self.models[0]
                    ),
                ));
            }
        }
        Ok(())
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        let mut v = super::many("spec.models", &self.models);
        if let Some(b) = &self.base {
            v.push(("spec.base".into(), b.clone()));
        }
        v
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["merge".into(), self.method.name().into()];
        a.extend(self.models.iter().map(|id| inputs.model(id)));
        if let Some(b) = &self.base {
            a.push(format!("--base={}", inputs.model(b)));
        }
        a.extend(crate::ops::flags(&self.params));
        super::opt(&mut a, "dtype", self.dtype.clone());
        json_out(&mut a);
        a
    }
}
