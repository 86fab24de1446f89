//! `route`: DUME's ridge router as a job (docs/methods.md §2.3).

use std::collections::HashMap;

use super::{
    check_data, data, json_out, param_err, req, ApiError, DataRef, Field, Input, JobInputs, ModelSummary, Operation,
};
use crate::ops::route::RouteParams;

job_spec! {
    /// `route`: DUME's ridge router (domain i = expert i). The parameters are
    /// [`RouteParams`]'s fields, flattened (`{"kind": "route", "model": ...,
    /// "domains": [...], "lambda": 0.05}`); unset ones take its defaults.
    pub struct RouteSpec {
        /// Checkpoint id of the MoErged model.
        pub model: String,
        /// One corpus per expert, in expert order (`heldout` optional).
        pub domains: Vec<DataRef>,
    }
    /// What the fit does (ops/route.rs).
    params: RouteParams
}

impl Operation for RouteSpec {
    fn label() -> &'static str {
        "route (ridge router of a MoErged model)"
    }

    fn fields() -> Vec<Field> {
        [
            req("model", "MoErged model", Input::Checkpoint, ""),
            req("domains", "domains (one per expert, in expert order)", data(2, false, false, true), ""),
        ]
        .into_iter()
        .chain(RouteParams::form_fields())
        .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.model", &self.model)?;
        check_data("spec.domains", &self.domains, 2)?;
        self.params.check(self.domains.len()).map_err(param_err)
    }

    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        if let Some(m) = models.get(&self.model) {
            let experts = m.router_experts();
            if experts.is_empty() {
                return Err(ApiError::field(
                    "spec.model",
                    format!("checkpoint {} is not an MoE: route needs a MoErged model (run moerge first)", self.model),
                ));
            }
            if let Some(e) = experts.iter().find(|&&e| e != self.domains.len()) {
                return Err(ApiError::field(
                    "spec.domains",
                    format!(
                        "{} domains for a model with {e} experts in a layer: one domain per expert, in expert order",
                        self.domains.len()
                    ),
                ));
            }
            // top-k against the experts needs no check of its own: every
            // layer has one expert per domain (above) and validate() keeps
            // top-k within the domains.
        }
        super::over_ctx(models, "spec.context", self.params.context, &self.model)
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::one("spec.model", &self.model)
    }

    fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        self.domains.iter().map(|d| ("spec.domains", d)).collect()
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["route".into(), inputs.model(&self.model)];
        for d in &self.domains {
            a.push(format!("--domain={}", super::data_arg(inputs, d, true)));
        }
        a.extend(crate::ops::flags(&self.params));
        json_out(&mut a);
        a
    }
}
