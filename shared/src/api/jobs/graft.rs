//! `graft`: add `scale * (instruct - base)` to a model as a job
//! (DeltaMoE's graft, docs/methods.md §1.4).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{json_out, param_err, req, ApiError, Field, Input, JobInputs, ModelSummary, Operation};
use crate::ops::graft::GraftParams;

/// `graft`: add `scale * (instruct - base)` to a model. The parameters
/// are [`GraftParams`]'s fields, flattened (`{"kind": "graft", "target":
/// ..., "base": ..., "instruct": ..., "scale": 0.5}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub struct GraftSpec {
    /// Checkpoint id of the target (MoE or dense).
    pub target: String,
    /// Checkpoint id of the dense base.
    pub base: String,
    /// Checkpoint id of the dense instruct model.
    pub instruct: String,
    /// What the graft does (ops/graft.rs).
    #[serde(flatten)]
    pub params: GraftParams,
}

/// The inputs of a graft: the target and the two models the delta is taken
/// between (the recipe's `graft:` section names the same keys, less the
/// target).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraftInputs {
    /// The target (the recipe runner fills it with the MoE it made).
    pub target: String,
    /// The dense base.
    pub base: String,
    /// The dense instruct model.
    pub instruct: String,
}

impl TryFrom<serde_json::Value> for GraftSpec {
    type Error = String;
    fn try_from(v: serde_json::Value) -> Result<Self, String> {
        let (i, params): (GraftInputs, GraftParams) = crate::ops::split_params(v)?;
        Ok(GraftSpec { target: i.target, base: i.base, instruct: i.instruct, params })
    }
}

impl Operation for GraftSpec {
    fn label() -> &'static str {
        "graft (add instruct − base)"
    }

    fn fields() -> Vec<Field> {
        vec![
            req("target", "target (MoE or dense)", Input::Checkpoint, ""),
            req("base", "base (dense)", Input::Checkpoint, ""),
            req("instruct", "instruct (dense)", Input::Checkpoint, ""),
        ]
        .into_iter()
        .chain(GraftParams::form_fields())
        .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.target", &self.target)?;
        super::check_id("spec.base", &self.base)?;
        super::check_id("spec.instruct", &self.instruct)?;
        self.params.check().map_err(param_err)
    }

    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        for (field, id) in [("spec.base", &self.base), ("spec.instruct", &self.instruct)] {
            if models.get(id).is_some_and(|m| !m.router_experts().is_empty()) {
                return Err(ApiError::field(
                    field,
                    format!("checkpoint {id} is an MoE; the delta is taken between two dense models"),
                ));
            }
        }
        Ok(())
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        vec![
            ("spec.target".into(), self.target.clone()),
            ("spec.base".into(), self.base.clone()),
            ("spec.instruct".into(), self.instruct.clone()),
        ]
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let m = |id: &String| inputs.model(id);
        let mut a = vec!["graft".into(), m(&self.target), format!("--base={}", m(&self.base))];
        a.push(format!("--instruct={}", m(&self.instruct)));
        a.extend(crate::ops::flags(&self.params));
        json_out(&mut a);
        a
    }
}
