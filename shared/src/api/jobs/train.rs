//! `train`: a training stage (experts, router, all, dense, ffn) as a job
//! (docs/methods.md §1.2-1.3; the trainer is `crate::train`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{
    check_data, check_range, data, f, json_out, param_err, req, ApiError, DataRef, Field, Input, JobInputs,
    ModelSummary, Operation,
};
use crate::ops::train::TrainParams;
use crate::train::Stage;

job_spec! {
    /// `train` (see `moe-studio train --help`). The parameters are
    /// [`TrainParams`]'s fields, flattened (`{"kind": "train", "model": ...,
    /// "stage": "experts", "data": [...], "steps": 100, "lr": 1e-4}`); unset
    /// ones take its defaults, and `save_every` unset (0) is a tenth of the
    /// steps (what a resumed job continues from). The output model is
    /// `final/` of the job's artefacts and is registered as a checkpoint.
    pub struct TrainSpec {
        /// Checkpoint id of the model to train.
        pub model: String,
        /// Stage (`experts`, `router`, `all`, `dense`, `ffn`): [`Stage`], the trainer's own.
        pub stage: Stage,
        /// Corpora (at least one).
        pub data: Vec<DataRef>,
        /// Optimizer steps (1-1,000,000).
        pub steps: usize,
        /// Where the stage runs (default [`TrainEngine::Burn`]).
        pub engine: Option<TrainEngine>,
    }
    /// The run's hyper-parameters (ops/train.rs).
    params: TrainParams
}

impl TrainSpec {
    /// The parameters the job's command runs with: a `save_every` of 0
    /// becomes a tenth of the steps (at least 1).
    pub fn run_params(&self) -> TrainParams {
        let mut p = self.params.clone();
        if p.save_every == 0 {
            p.save_every = (self.steps / 10).max(1);
        }
        p
    }

    /// Whether the stage is emitted as a PyTorch job rather than trained.
    fn torch(&self) -> bool {
        self.engine == Some(TrainEngine::Torch)
    }
}

/// The engine of a train job: `moe-studio train --engine`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainEngine {
    /// The studio's Burn trainer runs the stage; the output model is
    /// registered as a checkpoint.
    #[default]
    Burn,
    /// The stage is written as a PyTorch FSDP job (`--engine torch --emit`:
    /// model, packed data, `train.py`, README) for a cluster; the job's
    /// artefacts are that directory and nothing is trained here
    /// (backend/src/cli/torch_handoff.rs).
    Torch,
}

impl TrainEngine {
    /// The CLI name (`burn`, `torch`).
    pub fn name(self) -> &'static str {
        match self {
            TrainEngine::Burn => "burn",
            TrainEngine::Torch => "torch",
        }
    }

    /// What a job on this engine produces, for the Jobs page.
    pub fn describe(self) -> &'static str {
        match self {
            TrainEngine::Burn => "Burn: trained on this server",
            TrainEngine::Torch => "PyTorch FSDP job: emitted for torchrun, not trained here",
        }
    }
}

impl Operation for TrainSpec {
    fn label() -> &'static str {
        "train (experts / router / dense)"
    }

    fn fields() -> Vec<Field> {
        [
            req("model", "model", Input::Checkpoint, ""),
            req("stage", "stage", Input::Choice(&Stage::NAMES), ""),
            req("data", "corpora", data(1, true, true, false), ""),
            req("steps", "steps", Input::Int, "1-1000000"),
        ]
        .into_iter()
        .chain(TrainParams::form_fields())
        .chain([f("engine", "engine", Input::Choice(&["burn", "torch"]), "burn (torch: emit a PyTorch FSDP job)")])
        .collect()
    }

    fn validate(&self) -> Result<(), ApiError> {
        super::check_id("spec.model", &self.model)?;
        check_data("spec.data", &self.data, 1)?;
        check_range("spec.steps", Some(self.steps), 1, 1_000_000)?;
        self.params.check().map_err(param_err)?;
        if self.torch() && !matches!(self.stage, Stage::Experts | Stage::Router | Stage::Dense | Stage::Ffn) {
            return Err(ApiError::field(
                "spec.engine",
                format!(
                    "the PyTorch hand-off runs the stages experts, router, dense and ffn; stage {} trains on burn",
                    self.stage.name()
                ),
            ));
        }
        Ok(())
    }

    fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        super::over_ctx(models, "spec.seq_len", self.params.seq_len, &self.model)
    }

    fn checkpoints(&self) -> Vec<(String, String)> {
        super::one("spec.model", &self.model)
    }

    fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        self.data.iter().map(|d| ("spec.data", d)).collect()
    }

    fn cli_args(&self, inputs: &dyn JobInputs, resume: bool) -> Vec<String> {
        let mut a = vec!["train".into(), inputs.model(&self.model), format!("--stage={}", self.stage.name())];
        for d in &self.data {
            let mut x = super::data_arg(inputs, d, false);
            if let Some(w) = d.weight {
                x.push_str(&format!(":{w}"));
            }
            if d.original {
                x.push_str(":orig");
            }
            a.push(format!("--data={x}"));
        }
        a.push(format!("--steps={}", self.steps));
        a.extend(crate::ops::flags(&self.run_params()));
        if self.torch() {
            // The job directory is the artefact; emitting again is the resume.
            a.extend(["--engine=torch".to_string(), "--emit=out".to_string(), "--json".to_string()]);
        } else {
            json_out(&mut a);
            if resume {
                a.push("--resume".into());
            }
        }
        a
    }

    fn output_model(&self) -> Option<&'static str> {
        (!self.torch()).then_some("out/final")
    }
}
