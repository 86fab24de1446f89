//! `upcycle`: dense -> MoE by copying every FFN into experts, as a job
//! (sparse upcycling; DeltaMoE's first step, docs/methods.md §1.1).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{
    check_dtype, check_range, dtype_field, f, json_out, param_err, req, ApiError, Field, Input, JobInputs,
    ModelSummary, Operation, ALLOCATION_FILE,
};
use crate::ops::upcycle::UpcycleParams;

/// `upcycle`: dense -> MoE by copying every FFN into experts. The
/// parameters are [`UpcycleParams`]'s fields, flattened (`{"kind":
/// "upcycle", "model": ..., "experts": 4, "top_k": 1}`); unset ones take
/// its defaults. A job has no expert prompts: the router starts as zeros or
/// random.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub struct UpcycleSpec {
    /// Checkpoint id of the dense model.
    pub model: String,
    /// Experts per MoE layer (2-256), or use `experts_per_layer`.
    pub experts: Option<usize>,
    /// Experts per layer (`null`: keep the layer dense); NeuronMoE's allocation.
    pub experts_per_layer: Option<Vec<Option<usize>>>,
    /// Output dtype `f32`, `f16` or `bf16` (default: the source's).
    pub dtype: Option<String>,
    /// What the upcycle does (ops/upcycle.rs).
    #[serde(flatten)]
    pub params: UpcycleParams,
}

/// The inputs of an upcycle job (the rest of its keys are
/// [`UpcycleParams`]); the recipe's `upcycle:` section names the same keys,
/// less `model`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpcycleInputs {
    /// Checkpoint id (the recipe runner fills it with `base_model`).
    pub model: String,
    /// Experts per MoE layer.
    #[serde(default)]
    pub experts: Option<usize>,
    /// Experts per layer (`null`: dense).
    #[serde(default)]
    pub experts_per_layer: Option<Vec<Option<usize>>>,
    /// Output dtype.
    #[serde(default)]
    pub dtype: Option<String>,
}

impl UpcycleSpec {
    /// The spec of inputs `i` and parameters `params`.
    pub fn new(i: UpcycleInputs, params: UpcycleParams) -> UpcycleSpec {
        UpcycleSpec {
            model: i.model,
            experts: i.experts,
            experts_per_layer: i.experts_per_layer,
            dtype: i.dtype,
            params,
        }
    }
}

impl TryFrom<serde_json::Value> for UpcycleSpec {
    type Error = String;
    fn try_from(v: serde_json::Value) -> Result<Self, String> {
        let (i, params): (UpcycleInputs, UpcycleParams) = crate::ops::split_params(v)?;
        Ok(UpcycleSpec::new(i, params))
    }
}

impl Operation for UpcycleSpec {
    fn label() -> &'static str {
        "upcycle (dense → MoE)"
    }

    fn fields() -> Vec<Field> {
        [
            req("model", "model", Input::Checkpoint, ""),
            f("experts", "experts", Input::Int, "2-256"),
            f("experts_per_layer", "experts per layer", Input::LayerList, "e.g. 2,4,-,4 (- = dense)"),
        ]
        .into_iter()
        .chain(UpcycleParams::form_fields())
        .chain([dtype_field()])
        .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.model", &self.model)?;
        match (&self.experts, &self.experts_per_layer) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(ApiError::field("spec.experts", "give exactly one of experts and experts_per_layer"))
            }
            (Some(e), None) => check_range("spec.experts", Some(*e), 2, 256)?,
            (None, Some(l)) => {
                if l.is_empty() || l.len() > 1024 {
                    return Err(ApiError::field("spec.experts_per_layer", "expected 1-1024 layers"));
                }
                for (i, e) in l.iter().enumerate() {
                    check_range(&format!("spec.experts_per_layer[{i}]"), *e, 1, 256)?;
                }
            }
        }
        self.params.check(false).map_err(param_err)?;
        check_dtype("spec.dtype", &self.dtype)
    }

    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        if let (Some(l), Some(m)) = (&self.experts_per_layer, models.get(&self.model)) {
            if l.len() != m.config.num_layers {
                return Err(ApiError::field(
                    "spec.experts_per_layer",
                    format!("{} entries for a model of {} layers", l.len(), m.config.num_layers),
                ));
            }
        }
        // The fewest experts of any MoE layer bounds top_k and the frozen indices.
        let fewest = match (&self.experts, &self.experts_per_layer) {
            (Some(e), _) => Some(*e),
            (None, Some(l)) => l.iter().flatten().min().copied(),
            _ => None,
        };
        if let Some(e) = fewest {
            let k = self.params.top_k;
            if k > e {
                return Err(ApiError::field("spec.top_k", format!("{k} is more than the {e} experts of a layer")));
            }
            for (i, f) in self.params.frozen.iter().enumerate() {
                if *f >= e {
                    return Err(ApiError::field(
                        &format!("spec.frozen[{i}]"),
                        format!("expert {f} does not exist (a layer has {e} experts, 0-{})", e - 1),
                    ));
                }
            }
        }
        Ok(())
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::one("spec.model", &self.model)
    }

    /// The allocation file `--allocation` reads (`{"experts_per_layer": [...]}`).
    fn job_files(&self) -> Vec<(&'static str, String)> {
        self.experts_per_layer
            .iter()
            .map(|l| (ALLOCATION_FILE, serde_json::json!({ "experts_per_layer": l }).to_string()))
            .collect()
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["upcycle".into(), inputs.model(&self.model)];
        super::opt(&mut a, "experts", self.experts);
        if self.experts_per_layer.is_some() {
            a.push(format!("--allocation={ALLOCATION_FILE}"));
        }
        a.extend(crate::ops::flags(&self.params));
        super::opt(&mut a, "dtype", self.dtype.clone());
        json_out(&mut a);
        a
    }
}
