//! One description of each job kind: the spec ([`crate::api::JobSpec`],
//! which validates itself) also gives
//!
//! - the job file the server writes into the job's directory and runs with
//!   `moe-studio run-job job.json` ([`JobFile`]: the spec, the backend and
//!   where each input is); the CLI turns the spec into the subcommand's
//!   typed arguments, so a job and the command give the same numbers;
//! - the same job as a `moe-studio` command line ([`JobSpec::cli_args`]),
//!   which the recipe runner shows and runs as its stages;
//! - where its output model lands ([`JobSpec::output_model`]);
//! - the form's inputs with their labels, kinds and defaults
//!   ([`JobKind::fields`]): a job's inputs here, its parameters from the
//!   operation's own struct in `ops/` (whose `Default` the CLI's clap
//!   attributes read too), so the Jobs page, the CLI's `--help` and the
//!   spec's documentation say the same thing.
//!
//! Backend tests parse every kind's `cli_args` with the CLI's own parser
//! (every parameter reaches it; the parser's defaults are the operations'
//! `Default`s) and check that `run-job`'s typed arguments for the same job
//! are exactly the parsed ones.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::{DataRef, JobSpec};
pub use crate::ops::form::{Field, Input};

/// The file the server writes an upcycle's `experts_per_layer` into (in
/// the job's directory), passed as `--allocation`.
pub const ALLOCATION_FILE: &str = "allocation.json";

/// The file the server writes into a job's directory and runs with
/// `moe-studio run-job job.json` ([`JobFile`]).
pub const JOB_FILE: &str = "job.json";

/// The directory, in the job's directory, its command writes (its model,
/// or train's checkpoints and `final/`).
pub const JOB_OUT: &str = "out";

/// A job as its command runs it: what to run, on which backend, and where
/// each input is (paths relative to the job's directory, the command's
/// working directory). The server writes it as [`JOB_FILE`] and runs
/// `moe-studio run-job job.json`; the CLI turns the spec into the
/// subcommand's typed arguments (backend `cli/run_job.rs`). Kept with the
/// job's artefacts, it is also the record of how the output was made, and
/// it runs again by hand from the job's directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// The Burn backend (`cpu`, `wgpu`, `cuda`, `auto`): the CLI's `--backend`.
    pub backend: String,
    /// What to run.
    pub spec: JobSpec,
    /// Train: continue from the last checkpoint in `out/` (`--resume`).
    #[serde(default)]
    pub resume: bool,
    /// Checkpoint id -> its model (a directory or a file).
    pub models: BTreeMap<String, String>,
    /// Dataset name -> its file; a held-out file under `NAME/heldout`
    /// ([`JobFile::data_key`]).
    pub data: BTreeMap<String, String>,
}

impl JobFile {
    /// The key of dataset `d`'s file (its held-out file when `heldout`) in
    /// [`JobFile::data`]: its name, or `NAME/heldout` (names hold no `/`).
    pub fn data_key(d: &DataRef, heldout: bool) -> String {
        if heldout {
            format!("{}/heldout", d.name)
        } else {
            d.name.clone()
        }
    }

    /// The file as the server would accept its spec
    /// ([`JobSpec::validate`]) and every input placed: each checkpoint of
    /// the spec in `models`, each dataset (and held-out file) in `data`.
    ///
    /// # Errors
    /// The spec's field and what was expected, or the input the file does
    /// not place (`spec.model: checkpoint ID is not in the job file's
    /// models`).
    pub fn check(&self) -> Result<(), String> {
        self.spec.validate().map_err(|e| format!("{}: {}", e.field.unwrap_or_default(), e.error))?;
        for (field, id) in self.spec.checkpoints() {
            if !self.models.contains_key(&id) {
                return Err(format!("{field}: checkpoint {id} is not in the job file's `models`"));
            }
        }
        for f in self.spec.data_files() {
            let key = Self::data_key(f.data, f.heldout);
            if !self.data.contains_key(&key) {
                return Err(format!("{}: `{key}` is not in the job file's `data`", f.field));
            }
        }
        Ok(())
    }
}

impl JobInputs for JobFile {
    fn model(&self, id: &str) -> String {
        self.models.get(id).cloned().unwrap_or_default()
    }
    fn data(&self, d: &DataRef, heldout: bool) -> String {
        self.data.get(&Self::data_key(d, heldout)).cloned().unwrap_or_default()
    }
}

/// Inputs named by their paths: a spec whose checkpoint ids are model
/// paths and whose uploads are data files (the recipe runner's stages).
#[derive(Debug, Clone, Copy, Default)]
pub struct PathInputs;

impl JobInputs for PathInputs {
    fn model(&self, id: &str) -> String {
        id.to_string()
    }
    fn data(&self, d: &DataRef, heldout: bool) -> String {
        if heldout {
            d.heldout.clone().unwrap_or_default()
        } else {
            d.upload.clone()
        }
    }
}

/// Where a job's inputs are, as its command sees them (paths relative to
/// the job's working directory).
pub trait JobInputs {
    /// The model argument of checkpoint `id` (a directory or a file).
    fn model(&self, id: &str) -> String;
    /// The file of dataset `d` (its held-out file when `heldout`).
    fn data(&self, d: &DataRef, heldout: bool) -> String;
}

/// `--flag=value` when set (`=` so that negative numbers are not read as flags).
fn opt<T: ToString>(argv: &mut Vec<String>, flag: &str, v: Option<T>) {
    if let Some(v) = v {
        argv.push(format!("--{flag}={}", v.to_string()));
    }
}

/// `NAME=FILE` (with `:HELDOUT` when asked and given).
fn data_arg(inputs: &dyn JobInputs, d: &DataRef, with_heldout: bool) -> String {
    let mut s = format!("{}={}", d.name, inputs.data(d, false));
    if with_heldout && d.heldout.is_some() {
        s.push(':');
        s.push_str(&inputs.data(d, true));
    }
    s
}

impl JobSpec {
    /// The `moe-studio` subcommand and options that run this spec (what
    /// follows the global `--backend`), writing into `out/` of the
    /// working directory with `--json` where the command has it; `resume`
    /// adds train's `--resume`. The inputs are written here; the
    /// parameters are the operation's struct, every field written
    /// ([`crate::ops::flags`]); train's `--save-every` unset is a tenth of
    /// the steps (what a resumed job continues from).
    pub fn cli_args(&self, inputs: &dyn JobInputs, resume: bool) -> Vec<String> {
        let m = |id: &String| inputs.model(id);
        let mut a: Vec<String> = Vec::new();
        let json_out = |a: &mut Vec<String>| a.extend(["--out=out".to_string(), "--json".to_string()]);
        match self {
            JobSpec::Train(s) => {
                a.extend(["train".into(), m(&s.model), format!("--stage={}", s.stage.name())]);
                for d in &s.data {
                    let mut x = data_arg(inputs, d, false);
                    if let Some(w) = d.weight {
                        x.push_str(&format!(":{w}"));
                    }
                    if d.original {
                        x.push_str(":orig");
                    }
                    a.push(format!("--data={x}"));
                }
                a.push(format!("--steps={}", s.steps));
                a.extend(crate::ops::flags(&s.run_params()));
                if s.engine == Some(crate::api::TrainEngine::Torch) {
                    // The job directory is the artefact; emitting again is the resume.
                    a.extend(["--engine=torch".to_string(), "--emit=out".to_string(), "--json".to_string()]);
                } else {
                    json_out(&mut a);
                    if resume {
                        a.push("--resume".into());
                    }
                }
            }
            JobSpec::Upcycle(s) => {
                a.extend(["upcycle".into(), m(&s.model)]);
                opt(&mut a, "experts", s.experts);
                if s.experts_per_layer.is_some() {
                    a.push(format!("--allocation={ALLOCATION_FILE}"));
                }
                a.extend(crate::ops::flags(&s.params));
                opt(&mut a, "dtype", s.dtype.clone());
                json_out(&mut a);
            }
            JobSpec::Moerge(s) => {
                a.push("moerge".into());
                a.extend(s.models.iter().map(m));
                a.extend(crate::ops::flags(&s.params));
                opt(&mut a, "dtype", s.dtype.clone());
                json_out(&mut a);
            }
            JobSpec::Route(s) => {
                a.extend(["route".into(), m(&s.model)]);
                for d in &s.domains {
                    a.push(format!("--domain={}", data_arg(inputs, d, true)));
                }
                a.extend(crate::ops::flags(&s.params));
                json_out(&mut a);
            }
            JobSpec::Graft(s) => {
                a.extend(["graft".into(), m(&s.target), format!("--base={}", m(&s.base))]);
                a.push(format!("--instruct={}", m(&s.instruct)));
                a.extend(crate::ops::flags(&s.params));
                json_out(&mut a);
            }
            JobSpec::Merge(s) => {
                a.extend(["merge".into(), s.method.name().into()]);
                a.extend(s.models.iter().map(m));
                if let Some(b) = &s.base {
                    a.push(format!("--base={}", m(b)));
                }
                a.extend(crate::ops::flags(&s.params));
                opt(&mut a, "dtype", s.dtype.clone());
                json_out(&mut a);
            }
            JobSpec::Neurons(s) => {
                a.extend(["neurons".into(), m(&s.model)]);
                for d in &s.langs {
                    a.push(format!("--lang={}", data_arg(inputs, d, false)));
                }
                if !s.new.is_empty() {
                    a.push(format!("--new={}", s.new.join(",")));
                }
                a.extend(crate::ops::flags(&s.params));
                a.push("--out=out".into());
            }
            JobSpec::Eval(s) => {
                a.extend(["eval".into(), m(&s.model)]);
                for d in &s.data {
                    a.push(format!("--data={}", data_arg(inputs, d, false)));
                }
                a.extend(crate::ops::flags(&s.params));
                a.push("--json".into());
            }
            JobSpec::Task(s) => {
                a.extend(["eval".into(), m(&s.model)]);
                for d in &s.tasks {
                    a.push(format!("--task={}", data_arg(inputs, d, false)));
                }
                a.extend(crate::ops::flags(&s.params));
                opt(&mut a, "batch", s.batch);
                a.push("--json".into());
            }
        }
        a
    }

    /// Where the command writes its output model, relative to the working
    /// directory (`out`, train's `out/final`), or `None` when it writes no
    /// model (neurons, eval, task).
    pub fn output_model(&self) -> Option<&'static str> {
        match self {
            JobSpec::Train(s) if s.engine == Some(crate::api::TrainEngine::Torch) => None,
            JobSpec::Train(_) => Some("out/final"),
            JobSpec::Neurons(_) | JobSpec::Eval(_) | JobSpec::Task(_) => None,
            _ => Some("out"),
        }
    }

    /// Whether the command's stdout is its result (eval's and task's JSON
    /// report, kept as `out/result.json`).
    pub fn stdout_is_result(&self) -> bool {
        matches!(self, JobSpec::Eval(_) | JobSpec::Task(_))
    }
}

// ----- the form ---------------------------------------------------------------

/// A job kind (the `kind` of [`JobSpec`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JobKind {
    /// [`crate::api::UpcycleSpec`].
    #[default]
    Upcycle,
    /// [`crate::api::MoergeSpec`].
    Moerge,
    /// [`crate::api::RouteSpec`].
    Route,
    /// [`crate::api::GraftSpec`].
    Graft,
    /// [`crate::api::MergeSpec`].
    Merge,
    /// [`crate::api::NeuronsSpec`].
    Neurons,
    /// [`crate::api::TrainSpec`].
    Train,
    /// [`crate::api::EvalSpec`].
    Eval,
    /// [`crate::api::TaskSpec`].
    Task,
}

impl JobKind {
    /// Every kind, in the order of the Jobs page's selector.
    pub const ALL: [JobKind; 9] = [
        JobKind::Upcycle,
        JobKind::Train,
        JobKind::Eval,
        JobKind::Task,
        JobKind::Moerge,
        JobKind::Route,
        JobKind::Graft,
        JobKind::Merge,
        JobKind::Neurons,
    ];

    /// The wire spelling (as [`JobSpec::kind`]).
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Upcycle => "upcycle",
            JobKind::Moerge => "moerge",
            JobKind::Route => "route",
            JobKind::Graft => "graft",
            JobKind::Merge => "merge",
            JobKind::Neurons => "neurons",
            JobKind::Train => "train",
            JobKind::Eval => "eval",
            JobKind::Task => "task",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<JobKind> {
        JobKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// What the selector shows.
    pub fn label(self) -> &'static str {
        match self {
            JobKind::Upcycle => "upcycle (dense → MoE)",
            JobKind::Moerge => "moerge (dense models → MoE, DUME)",
            JobKind::Route => "route (ridge router of a MoErged model)",
            JobKind::Graft => "graft (add instruct − base)",
            JobKind::Merge => "merge (linear / task arithmetic / TIES / DARE)",
            JobKind::Neurons => "neurons (language-specific neurons, NeuronMoE)",
            JobKind::Train => "train (experts / router / dense)",
            JobKind::Eval => "eval (perplexity, routing load)",
            JobKind::Task => "task accuracy (multiple choice, lm-eval's acc / acc_norm)",
        }
    }

    /// The form's inputs: one per field of the kind's spec type, in its
    /// order, with the defaults as hints.
    pub fn fields(self) -> &'static [Field] {
        static TABLES: std::sync::OnceLock<Vec<Vec<Field>>> = std::sync::OnceLock::new();
        let t = TABLES.get_or_init(|| JobKind::ALL.iter().map(|k| k.make_fields()).collect());
        &t[JobKind::ALL.iter().position(|k| *k == self).unwrap_or(0)]
    }

    /// The field `key` of this kind's form.
    pub fn field(self, key: &str) -> Option<&'static Field> {
        self.fields().iter().find(|f| f.key == key)
    }

    fn make_fields(self) -> Vec<Field> {
        match self {
            JobKind::Upcycle => [
                req("model", "model", Input::Checkpoint, ""),
                f("experts", "experts", Input::Int, "2-256"),
                f("experts_per_layer", "experts per layer", Input::LayerList, "e.g. 2,4,-,4 (- = dense)"),
            ]
            .into_iter()
            .chain(crate::ops::upcycle::UpcycleParams::form_fields())
            .chain([adv("dtype", "dtype", Input::Choice(DTYPES), "source's")])
            .collect(),
            JobKind::Moerge => std::iter::once(req("models", "models (expert i = model i)", Input::Checkpoints, ""))
                .chain(crate::ops::moerge::MoergeParams::form_fields())
                .chain([adv("dtype", "dtype", Input::Choice(DTYPES), "source's")])
                .collect(),
            JobKind::Route => [
                req("model", "MoErged model", Input::Checkpoint, ""),
                req("domains", "domains (one per expert, in expert order)", data(2, false, false, true), ""),
            ]
            .into_iter()
            .chain(crate::ops::route::RouteParams::form_fields())
            .collect(),
            JobKind::Graft => vec![
                req("target", "target (MoE or dense)", Input::Checkpoint, ""),
                req("base", "base (dense)", Input::Checkpoint, ""),
                req("instruct", "instruct (dense)", Input::Checkpoint, ""),
            ]
            .into_iter()
            .chain(crate::ops::graft::GraftParams::form_fields())
            .collect(),
            JobKind::Merge => [
                req("method", "method", Input::Choice(&["linear", "task-arithmetic", "ties", "dare", "dare-ties"]), ""),
                req("models", "models", Input::Checkpoints, ""),
                f("base", "base", Input::OptCheckpoint, ""),
            ]
            .into_iter()
            .chain(crate::ops::merge::MergeParams::form_fields())
            .chain([adv("dtype", "dtype", Input::Choice(DTYPES), "source's")])
            .collect(),
            JobKind::Neurons => [
                req("model", "model", Input::Checkpoint, ""),
                req("langs", "languages (name = language code)", data(2, false, false, false), ""),
                f("new", "new languages", Input::Names, "e.g. hu,el"),
            ]
            .into_iter()
            .chain(crate::ops::neurons::NeuronsParams::form_fields())
            .collect(),
            JobKind::Train => [
                req("model", "model", Input::Checkpoint, ""),
                req("stage", "stage", Input::Choice(&crate::train::Stage::NAMES), ""),
                req("data", "corpora", data(1, true, true, false), ""),
                req("steps", "steps", Input::Int, "1-1000000"),
            ]
            .into_iter()
            .chain(crate::ops::train::TrainParams::form_fields())
            .chain([f("engine", "engine", Input::Choice(&["burn", "torch"]), "burn (torch: emit a PyTorch FSDP job)")])
            .collect(),
            JobKind::Eval => [
                req("model", "model", Input::Checkpoint, ""),
                req("data", "datasets", data(1, false, false, false), ""),
            ]
            .into_iter()
            .chain(crate::ops::eval::EvalParams::form_fields())
            .collect(),
            JobKind::Task => [
                req("model", "model", Input::Checkpoint, ""),
                req("tasks", "tasks (.jsonl: context, choices, gold per line)", data(1, false, false, false), ""),
            ]
            .into_iter()
            .chain(crate::ops::task::TaskParams::form_fields())
            .chain([adv(
                "batch",
                "batch (requests per pass)",
                Input::Int,
                &format!("default {}", crate::eval::McOptions::default().batch),
            )])
            .collect(),
        }
    }
}

impl JobSpec {
    /// Its [`JobKind`].
    pub fn job_kind(&self) -> JobKind {
        JobKind::parse(self.kind()).unwrap_or_default()
    }
}

fn f(key: &'static str, label: &'static str, input: Input, hint: &str) -> Field {
    Field::new(key, label, input, hint)
}
fn req(key: &'static str, label: &'static str, input: Input, hint: &str) -> Field {
    Field::new(key, label, input, hint).required()
}
fn adv(key: &'static str, label: &'static str, input: Input, hint: &str) -> Field {
    Field::new(key, label, input, hint).advanced()
}
const fn data(rows: usize, weight: bool, original: bool, heldout: bool) -> Input {
    Input::Data { rows, weight, original, heldout }
}

const DTYPES: &[&str] = &["f32", "f16", "bf16"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_show_the_defaults() {
        let r = crate::ops::route::RouteParams::default();
        assert_eq!(JobKind::Route.field("lambda").unwrap().hint, format!("default {}", r.lambda));
        assert_eq!(JobKind::Upcycle.field("top_k").unwrap().hint, "default 2");
        assert_eq!(JobKind::Upcycle.field("frozen").unwrap().hint, "default 0; none");
        assert_eq!(JobKind::Train.field("seq_len").unwrap().hint, "default 256");
        for k in JobKind::ALL {
            assert_eq!(JobKind::parse(k.as_str()), Some(k));
            assert!(!k.fields().is_empty());
        }
    }
}
