//! `task`: multiple-choice task accuracy as a job (`moe-studio eval
//! --task`; lm-evaluation-harness's acc / acc_norm, docs/methods.md §8).

use super::{
    adv, check_data, check_range, data, param_err, req, ApiError, DataRef, Field, Input, JobInputs, Operation,
};
use crate::ops::task::TaskParams;

job_spec! {
    /// `task`: multiple-choice task accuracy with the lm-evaluation-harness
    /// semantics (`moe-studio eval --task`; [`crate::eval::multiple_choice`]).
    /// The parameters are [`TaskParams`]'s fields, flattened (`{"kind": "task",
    /// "model": ..., "tasks": [...], "target_delimiter": "", "limit": 50}`);
    /// unset ones take its defaults. The result is `result.json` of the job's
    /// artefacts: per task `acc`, `acc_norm`, `acc_bytes`, their standard
    /// errors and the per-item samples.
    pub struct TaskSpec {
        /// Checkpoint id.
        pub model: String,
        /// Task files (JSONL uploads, one item per line: `context`, `choices`,
        /// `gold`), at least one; `name` labels each.
        pub tasks: Vec<DataRef>,
        /// Requests (one per choice) per forward pass (1-4096; speed and
        /// memory, not the result).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub batch: Option<usize>,
    }
    /// What the task evaluation does (ops/task.rs).
    params: TaskParams
}

impl Operation for TaskSpec {
    fn label() -> &'static str {
        "task accuracy (multiple choice, lm-eval's acc / acc_norm)"
    }

    fn fields() -> Vec<Field> {
        [
            req("model", "model", Input::Checkpoint, ""),
            req("tasks", "tasks (.jsonl: context, choices, gold per line)", data(1, false, false, false), ""),
        ]
        .into_iter()
        .chain(TaskParams::form_fields())
        .chain([adv(
            "batch",
            "batch (requests per pass)",
            Input::Int,
            &format!("default {}", crate::eval::McOptions::default().batch),
        )])
        .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.model", &self.model)?;
        check_data("spec.tasks", &self.tasks, 1)?;
        self.params.check().map_err(param_err)?;
        check_range("spec.batch", self.batch, 1, 4096)
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::one("spec.model", &self.model)
    }

    fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        self.tasks.iter().map(|d| ("spec.tasks", d)).collect()
    }

    fn cli_args(&self, inputs: &dyn JobInputs, _resume: bool) -> Vec<String> {
        let mut a = vec!["eval".into(), inputs.model(&self.model)];
        for d in &self.tasks {
            a.push(format!("--task={}", super::data_arg(inputs, d, false)));
        }
        a.extend(crate::ops::flags(&self.params));
        super::opt(&mut a, "batch", self.batch);
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
