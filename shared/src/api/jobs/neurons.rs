//! `neurons`: NeuronMoE's language-specific neurons as a job
//! (docs/methods.md §3).

use super::{check_data, data, f, param_err, req, ApiError, DataRef, Field, Input, JobInputs, Operation};
use crate::ops::neurons::NeuronsParams;

job_spec! {
    /// `neurons`: NeuronMoE language-specific neurons. The parameters are
    /// [`NeuronsParams`]'s fields, flattened (`{"kind": "neurons", "model":
    /// ..., "langs": [...], "top_n": 100}`); unset ones take its defaults.
    pub struct NeuronsSpec {
        /// Checkpoint id.
        pub model: String,
        /// One corpus per language (name = language code), at least two.
        pub langs: Vec<DataRef>,
        /// The new languages (names among `langs`).
        #[serde(default)]
        pub new: Vec<String>,
    }
    /// What the run does (ops/neurons.rs).
    params: NeuronsParams
}

impl Operation for NeuronsSpec {
    fn label() -> &'static str {
        "neurons (language-specific neurons, NeuronMoE)"
    }

    fn fields() -> Vec<Field> {
        [
            req("model", "model", Input::Checkpoint, ""),
            req("langs", "languages (name = language code)", data(2, false, false, false), ""),
            f("new", "new languages", Input::Names, "e.g. hu,el"),
        ]
        .into_iter()
        .chain(NeuronsParams::form_fields())
        .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.model", &self.model)?;
        check_data("spec.langs", &self.langs, 2)?;
        for (i, n) in self.new.iter().enumerate() {
            if !self.langs.iter().any(|d| &d.name == n) {
                return Err(ApiError::field(&format!("spec.new[{i}]"), format!("`{n}` is not among langs")));
            }
        }
        self.params.check().map_err(param_err)
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::one("spec.model", &self.model)
    }

    fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        self.langs.iter().map(|d| ("spec.langs", d)).collect()
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["neurons".into(), inputs.model(&self.model)];
        for d in &self.langs {
            a.push(format!("--lang={}", super::data_arg(inputs, d, false)));
        }
        if !self.new.is_empty() {
            a.push(format!("--new={}", self.new.join(",")));
        }
        a.extend(crate::ops::flags(&self.params));
        a.push("--out=out".into());
        a
    }

    fn output_model(&self) -> Option<&'static str> {
        None
    }
}
