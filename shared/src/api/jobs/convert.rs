//! `convert`: a checkpoint written again in another MoE layout, expert
//! storage or dtype, as a job (safetensors; the layouts of
//! docs/compatibility.md). The operation added after the registry, in this
//! file and one registry line (ARCHITECTURE.md, "Adding an operation").

use std::collections::HashMap;

use super::{
    check_dtype, dtype_field, json_out, param_err, req, ApiError, Field, Input, JobInputs, ModelSummary, Operation,
};
use crate::ops::convert::LayoutParams;

job_spec! {
    /// `convert`: the model as safetensors in the layout and expert storage
    /// asked for (`{"kind": "convert", "model": ..., "layout": "qwen3_moe",
    /// "experts_format": "packed"}`). The parameters are [`LayoutParams`]'s
    /// fields, flattened; unset ones take its defaults. The output model is
    /// registered as a checkpoint. A layout that cannot hold the model
    /// exactly fails the job, naming why and the layouts that can.
    pub struct ConvertSpec {
        /// Checkpoint id.
        pub model: String,
        /// Output dtype `f32`, `f16` or `bf16` (default: the input's float
        /// dtype, f32 for quantised tensors).
        #[serde(default)]
        pub dtype: Option<String>,
    }
    /// How the model is written (ops/convert.rs).
    params: LayoutParams
}

impl Operation for ConvertSpec {
    fn label() -> &'static str {
        "convert (MoE layout, packed experts, dtype)"
    }

    fn fields() -> Vec<Field> {
        std::iter::once(req("model", "model", Input::Checkpoint, ""))
            .chain(LayoutParams::form_fields())
            .chain([dtype_field()])
            .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.model", &self.model)?;
        self.params.check().map_err(param_err)?;
        check_dtype("spec.dtype", &self.dtype)
    }

    /// A dense model with a layout other than `auto` or packed experts
    /// asked for is refused (the CLI's own refusal, made at submission).
    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        if let (Some(m), Some(field)) = (models.get(&self.model), self.params.moe_only_field()) {
            if m.router_experts().is_empty() {
                return Err(ApiError::field(
                    &format!("spec.{field}"),
                    format!(
                        "checkpoint {} is a dense model; layout and experts_format apply to MoE checkpoints",
                        self.model
                    ),
                ));
            }
        }
        Ok(())
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::one("spec.model", &self.model)
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["convert".into(), inputs.model(&self.model)];
        a.extend(crate::ops::flags(&self.params));
        super::opt(&mut a, "dtype", self.dtype.clone());
        json_out(&mut a);
        a
    }
}
