//! What a job does (`POST /api/jobs`): [`JobSpec`], one spec per
//! operation, each in its own file here, and the registry that derives
//! everything else from them (issue 37).
//!
//! An operation's file holds its spec (its inputs, with the operation's
//! parameter struct from `ops/` flattened into it) and its [`Operation`]
//! impl: the checks that need no files and those against the input models'
//! summaries, the checkpoints and datasets it reads, the form's inputs, the
//! `moe-studio` command line that runs it and where its output lands. One
//! line of [`job_operations!`](crate::job_operations) registers it; from
//! that list come [`JobSpec`] (the wire's `kind`), [`JobKind`] (the Jobs
//! page's selector and form tables), every dispatch on a spec here, the
//! server's checks and the CLI's `run-job` (whose arm is the subcommand's
//! own `FromJob` impl, backend `cli/run_job.rs`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::server::check_id;
use super::{ApiError, ModelSummary};
use crate::ops::form::{Field, Input};

/// Declares a job spec made of its inputs (the fields listed) and an
/// operation's parameter struct flattened into it (`params`), with the
/// reader that splits one JSON object between the two
/// ([`crate::ops::split_params`]: unknown keys refused, naming every
/// accepted one). The inputs are listed once; the spec reads itself
/// through a private struct of the same fields.
macro_rules! job_spec {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )*
        }
        $(#[$pmeta:meta])*
        params: $params:ty
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "serde_json::Value")]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
            $(#[$pmeta])*
            #[serde(flatten)]
            pub params: $params,
        }

        impl TryFrom<serde_json::Value> for $name {
            type Error = String;
            fn try_from(v: serde_json::Value) -> Result<Self, String> {
                #[derive(serde::Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Inputs {
                    $( $(#[$fmeta])* $field: $ty, )*
                }
                let (i, params): (Inputs, $params) = crate::ops::split_params(v)?;
                Ok($name { $( $field: i.$field, )* params })
            }
        }
    };
}

mod convert;
mod eval;
mod graft;
mod merge;
mod moerge;
mod neurons;
mod route;
mod task;
mod train;
mod upcycle;

/// The registry of job operations: one line each, `"kind" =>
/// Variant(module::Spec)`, in the order of the Jobs page's selector (the
/// first is its default). `"kind"` is the spec's wire `kind`, `module` the
/// operation's file in `shared/src/api/jobs/` and `Spec` the type that
/// file defines, which implements [`Operation`] and is re-exported as
/// `api::Spec`.
///
/// It calls `$callback! { "kind" => Variant(module::Spec), ... }`: this crate derives
/// [`JobSpec`] and [`JobKind`] from it, and the backend its `run-job`
/// dispatch (each subcommand's `FromJob` impl), so a new operation is its
/// file here, its `mod` line and its line below (plus, for the CLI, its
/// subcommand). See ARCHITECTURE.md, "Adding an operation".
#[macro_export]
macro_rules! job_operations {
    ($callback:ident) => {
        $callback! {
            "upcycle" => Upcycle(upcycle::UpcycleSpec),
            "train" => Train(train::TrainSpec),
            "eval" => Eval(eval::EvalSpec),
            "task" => Task(task::TaskSpec),
            "moerge" => Moerge(moerge::MoergeSpec),
            "route" => Route(route::RouteSpec),
            "graft" => Graft(graft::GraftSpec),
            "merge" => Merge(merge::MergeSpec),
            "neurons" => Neurons(neurons::NeuronsSpec),
            "convert" => Convert(convert::ConvertSpec),
        }
    };
}

/// One operation as a job: what its spec type says about itself. Each
/// spec implements it in its own file here; [`JobSpec`] and [`JobKind`]
/// dispatch to it ([`job_operations!`](crate::job_operations)).
pub trait Operation {
    /// What the Jobs page's selector shows.
    fn label() -> &'static str
    where
        Self: Sized;

    /// The form's inputs, one per field of the spec, in its order: the
    /// job's own (checkpoints, data) and its parameters' (`ops/`'s
    /// `form_fields`), with the defaults as hints.
    fn fields() -> Vec<Field>
    where
        Self: Sized;

    /// Checks every field that can be checked without the files; the error
    /// names the field (`spec.steps`, `spec.data[0].upload`, ...).
    ///
    /// # Errors
    /// The first invalid field.
    fn validate(&self) -> Result<(), ApiError>;

    /// Checks the fields that depend on the input models (layers, context,
    /// experts) against their summaries (checkpoint id -> summary; an id
    /// missing is left to the caller's own lookup).
    ///
    /// # Errors
    /// The first field the models refuse.
    fn validate_against(&self, _models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        Ok(())
    }

    /// Checkpoint ids the job reads, with the field naming each.
    fn checkpoints(&self) -> Vec<(String, String)>;

    /// Datasets the job reads, with the field naming each list.
    fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        Vec::new()
    }

    /// Files the job's command reads besides its inputs, written by the
    /// server into the job's directory: (file name, contents).
    fn job_files(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// The `moe-studio` subcommand and options that run this spec (what
    /// follows the global `--backend`), writing into `out/` of the working
    /// directory with `--json` where the command has it; `resume` is
    /// train's `--resume`. The parameters are the operation's struct, every
    /// field written ([`crate::ops::flags`]).
    fn cli_args(&self, inputs: &dyn JobInputs, resume: bool) -> Vec<String>;

    /// Where the command writes its output model, relative to the working
    /// directory, or `None` when it writes no model.
    fn output_model(&self) -> Option<&'static str> {
        Some("out")
    }

    /// Whether the command's stdout is its result (a JSON report, kept as
    /// `out/result.json`).
    fn stdout_is_result(&self) -> bool {
        false
    }
}

/// Writes [`JobSpec`], [`JobKind`] and their dispatch from the registry
/// ([`job_operations!`](crate::job_operations)).
macro_rules! define_jobs {
    ($( $wire:literal => $variant:ident($module:ident :: $spec:ident) ),* $(,)?) => {
        $( pub use $module::$spec; )*

        /// What a job does: `{"kind": "train", ...TrainSpec fields}`, one
        /// variant per registered operation
        /// ([`job_operations!`](crate::job_operations)).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind")]
        pub enum JobSpec {
            $(
                #[doc = concat!("`", $wire, "`: [`", stringify!($spec), "`].")]
                #[serde(rename = $wire)]
                $variant($spec),
            )*
        }

        /// A job kind (the `kind` of [`JobSpec`]): the Jobs page's selector.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum JobKind {
            $(
                #[doc = concat!("[`", stringify!($spec), "`].")]
                $variant,
            )*
        }

        const KINDS: usize = [$(stringify!($variant)),*].len();

        impl JobKind {
            /// Every kind, in the order of the Jobs page's selector.
            pub const ALL: [JobKind; KINDS] = [$(JobKind::$variant),*];

            /// The wire spelling (as [`JobSpec::kind`]).
            pub fn as_str(self) -> &'static str {
                match self {
                    $( JobKind::$variant => $wire, )*
                }
            }

            /// What the selector shows.
            pub fn label(self) -> &'static str {
                match self {
                    $( JobKind::$variant => <$spec as Operation>::label(), )*
                }
            }

            fn make_fields(self) -> Vec<Field> {
                match self {
                    $( JobKind::$variant => <$spec as Operation>::fields(), )*
                }
            }
        }

        impl JobSpec {
            /// Its [`JobKind`].
            pub fn job_kind(&self) -> JobKind {
                match self {
                    $( JobSpec::$variant(_) => JobKind::$variant, )*
                }
            }

            /// The operation behind the spec.
            fn op(&self) -> &dyn Operation {
                match self {
                    $( JobSpec::$variant(s) => s, )*
                }
            }
        }
    };
}

crate::job_operations!(define_jobs);

impl Default for JobKind {
    fn default() -> Self {
        JobKind::ALL[0]
    }
}

impl JobKind {
    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<JobKind> {
        JobKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The form's inputs: one per field of the kind's spec type, in its
    /// order, with the defaults as hints ([`Operation::fields`]).
    pub fn fields(self) -> &'static [Field] {
        static TABLES: std::sync::OnceLock<Vec<Vec<Field>>> = std::sync::OnceLock::new();
        let t = TABLES.get_or_init(|| JobKind::ALL.iter().map(|k| k.make_fields()).collect());
        &t[JobKind::ALL.iter().position(|k| *k == self).unwrap_or(0)]
    }

    /// The field `key` of this kind's form.
    pub fn field(self, key: &str) -> Option<&'static Field> {
        self.fields().iter().find(|f| f.key == key)
    }
}

impl JobSpec {
    /// The kind's name (`train`, `upcycle`, ...).
    pub fn kind(&self) -> &'static str {
        self.job_kind().as_str()
    }

    /// The engine of a train job (`None` for the other kinds).
    pub fn engine(&self) -> Option<TrainEngine> {
        match self {
            JobSpec::Train(s) => Some(s.engine.unwrap_or_default()),
            _ => None,
        }
    }

    /// Checks every parameter that can be checked without the files
    /// ([`Operation::validate`]); the error names the field.
    ///
    /// # Errors
    /// The first invalid field.
    pub fn validate(&self) -> Result<(), ApiError> {
        self.op().validate()
    }

    /// Checks the parameters that depend on the input models against their
    /// summaries ([`Operation::validate_against`]).
    ///
    /// # Errors
    /// The first field the models refuse.
    pub fn validate_against(&self, models: &HashMap<String, ModelSummary>) -> Result<(), ApiError> {
        self.op().validate_against(models)
    }

    /// Checkpoint ids the job reads, with the field naming each.
    pub fn checkpoints(&self) -> Vec<(String, String)> {
        self.op().checkpoints()
    }

    /// Datasets the job reads, with the field naming each list.
    pub fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        self.op().datasets()
    }

    /// Files the server writes into the job's directory besides the job
    /// file ([`Operation::job_files`]).
    pub fn job_files(&self) -> Vec<(&'static str, String)> {
        self.op().job_files()
    }

    /// The `moe-studio` command line that runs this spec
    /// ([`Operation::cli_args`]), which the recipe runner shows and runs as
    /// its stages.
    pub fn cli_args(&self, inputs: &dyn JobInputs, resume: bool) -> Vec<String> {
        self.op().cli_args(inputs, resume)
    }

    /// Where the command writes its output model, relative to the working
    /// directory (`out`, train's `out/final`), or `None` when it writes no
    /// model (neurons, eval, task, a PyTorch hand-off).
    pub fn output_model(&self) -> Option<&'static str> {
        self.op().output_model()
    }

    /// Whether the command's stdout is its result (eval's and task's JSON
    /// report, kept as `out/result.json`).
    pub fn stdout_is_result(&self) -> bool {
        self.op().stdout_is_result()
    }

    /// Every file the job reads from its datasets, in spec order: each
    /// dataset's upload and, after it, its held-out upload where it has
    /// one. The one walk the server's checks, the job file and its reader
    /// share.
    pub fn data_files(&self) -> Vec<DataFile<'_>> {
        let mut out = Vec::new();
        let mut counters: HashMap<&str, usize> = HashMap::new();
        for (list, d) in self.datasets() {
            let i = counters.entry(list).or_default();
            out.push(DataFile { field: format!("{list}[{i}].upload"), data: d, heldout: false, upload: &d.upload });
            if let Some(h) = &d.heldout {
                out.push(DataFile { field: format!("{list}[{i}].heldout"), data: d, heldout: true, upload: h });
            }
            *i += 1;
        }
        out
    }
}

pub use graft::GraftInputs;
pub use train::TrainEngine;
pub use upcycle::UpcycleInputs;

/// A text corpus for a job: a completed upload (`.txt`: documents separated
/// by blank lines; `.jsonl`: field `text`, one document per line; the rule
/// of [`crate::corpus`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataRef {
    /// Name (`[A-Za-z0-9_-]`, 1-64): the dataset / language / domain label.
    pub name: String,
    /// Completed upload id.
    pub upload: String,
    /// Mixture weight (train), default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// An original language of the model (train's language prior).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub original: bool,
    /// Held-out upload (route only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heldout: Option<String>,
}

/// One file a job reads from a dataset ([`JobSpec::data_files`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DataFile<'a> {
    /// The spec field that names it (`spec.data[1].heldout`).
    pub field: String,
    /// The dataset it belongs to.
    pub data: &'a DataRef,
    /// Whether it is the dataset's held-out file.
    pub heldout: bool,
    /// Its upload id.
    pub upload: &'a str,
}

/// `POST /api/jobs` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateJob {
    /// What to run.
    pub spec: JobSpec,
    /// Burn backend (`cpu` (alias `ndarray`), `wgpu`, `cuda`, or `auto`; default: the
    /// server's, which `moe-studio serve --backend auto` chose at start).
    #[serde(default)]
    pub backend: Option<String>,
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
}

/// Where a job's inputs are, as its command sees them (paths relative to
/// the job's working directory): the server's job file
/// (`jobs::JobFile`), or the paths themselves (`jobs::PathInputs`, the
/// recipe runner's stages).
pub trait JobInputs {
    /// The model argument of checkpoint `id` (a directory or a file).
    fn model(&self, id: &str) -> String;
    /// The file of dataset `d` (its held-out file when `heldout`).
    fn data(&self, d: &DataRef, heldout: bool) -> String;
}

/// The file the server writes an upcycle's `experts_per_layer` into (in
/// the job's directory), passed as `--allocation`.
pub const ALLOCATION_FILE: &str = "allocation.json";

// ----- helpers of the operations' files ------------------------------------

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

/// `--out=out --json`: a command that writes a model into the job's `out/`
/// with a JSON summary on stdout.
fn json_out(a: &mut Vec<String>) {
    a.extend(["--out=out".to_string(), "--json".to_string()]);
}

/// The ParamError of an operation's `check` as the spec's field.
fn param_err(e: crate::ops::ParamError) -> ApiError {
    ApiError::field(&format!("spec.{}", e.field), e.message)
}

fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    v: Option<T>,
    lo: T,
    hi: T,
) -> Result<(), ApiError> {
    match v {
        Some(x) if !(lo <= x && x <= hi) => Err(ApiError::field(field, format!("{x} is out of range {lo}..={hi}"))),
        _ => Ok(()),
    }
}

fn check_f(field: &str, v: Option<f64>, lo: f64, hi: f64, lo_open: bool) -> Result<(), ApiError> {
    match v {
        Some(x) if !x.is_finite() || x > hi || x < lo || (lo_open && x == lo) => Err(ApiError::field(
            field,
            format!("{x} is out of range {}{lo}..={hi}", if lo_open { "(exclusive) " } else { "" }),
        )),
        _ => Ok(()),
    }
}

fn check_dtype(field: &str, v: &Option<String>) -> Result<(), ApiError> {
    match v.as_deref() {
        None | Some("f32" | "f16" | "bf16") => Ok(()),
        Some(x) => Err(ApiError::field(field, format!("`{x}`: expected f32, f16 or bf16"))),
    }
}

fn check_data(field: &str, data: &[DataRef], min: usize) -> Result<(), ApiError> {
    if data.len() < min || data.len() > 64 {
        return Err(ApiError::field(field, format!("{} entries: expected {min} to 64", data.len())));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, d) in data.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let ok = !d.name.is_empty()
            && d.name.len() <= 64
            && d.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(ApiError::field(&format!("{f}.name"), format!("`{}`: expected 1-64 of [A-Za-z0-9_-]", d.name)));
        }
        if !names.insert(d.name.as_str()) {
            return Err(ApiError::field(&format!("{f}.name"), format!("`{}` appears twice", d.name)));
        }
        check_id(&format!("{f}.upload"), &d.upload)?;
        if let Some(h) = &d.heldout {
            check_id(&format!("{f}.heldout"), h)?;
        }
        check_f(&format!("{f}.weight"), d.weight, 0.0, 1e6, true)?;
    }
    Ok(())
}

fn check_models(field: &str, ids: &[String], min: usize) -> Result<(), ApiError> {
    if ids.len() < min || ids.len() > 64 {
        return Err(ApiError::field(field, format!("{} models: expected {min} to 64", ids.len())));
    }
    for (i, id) in ids.iter().enumerate() {
        check_id(&format!("{field}[{i}]"), id)?;
    }
    Ok(())
}

/// A sequence length / window longer than model `id`'s context.
fn over_ctx(models: &HashMap<String, ModelSummary>, field: &str, v: usize, id: &str) -> Result<(), ApiError> {
    match models.get(id).map(|m| m.config.max_position_embeddings).filter(|&c| c > 0) {
        Some(c) if v > c => Err(ApiError::field(field, format!("{v} is longer than the model's context ({c} tokens)"))),
        _ => Ok(()),
    }
}

/// `[(field, id)]` of one checkpoint.
fn one(field: &str, id: &str) -> Vec<(String, String)> {
    vec![(field.to_string(), id.to_string())]
}

/// `[(field[i], id)]` of a list of checkpoints.
fn many(field: &str, ids: &[String]) -> Vec<(String, String)> {
    ids.iter().enumerate().map(|(i, id)| (format!("{field}[{i}]"), id.clone())).collect()
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

/// The output dtype's input (the kinds that write a model in a dtype).
fn dtype_field() -> Field {
    adv("dtype", "dtype", Input::Choice(DTYPES), "source's")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_spec_round_trip_and_validation() {
        let j: JobSpec = serde_json::from_str(
            r#"{"kind":"train","model":"123e4567-e89b-42d3-a456-426614174000","stage":"experts","steps":0,
                "data":[{"name":"hu","upload":"123e4567-e89b-42d3-a456-426614174001"}]}"#,
        )
        .unwrap();
        let e = j.validate().unwrap_err();
        assert_eq!(e.field.as_deref(), Some("spec.steps"));
        assert!(serde_json::from_str::<JobSpec>(r#"{"kind":"train","stage":"bogus"}"#).is_err());
    }

    #[test]
    fn data_files_list_each_upload_then_its_heldout_with_the_field_naming_it() {
        let j: JobSpec = serde_json::from_str(
            r#"{"kind":"route","model":"m","domains":[{"name":"a","upload":"u0"},
                {"name":"b","upload":"u1","heldout":"h1"}]}"#,
        )
        .unwrap();
        let got: Vec<(String, &str, bool, &str)> =
            j.data_files().into_iter().map(|f| (f.field, f.data.name.as_str(), f.heldout, f.upload)).collect();
        assert_eq!(
            got,
            [
                ("spec.domains[0].upload".to_string(), "a", false, "u0"),
                ("spec.domains[1].upload".to_string(), "b", false, "u1"),
                ("spec.domains[1].heldout".to_string(), "b", true, "h1"),
            ]
        );
    }

    /// The registry's wire names: the `kind` serde writes is the kind's
    /// `as_str`, and the tag reads back to the same kind.
    #[test]
    fn the_wire_kind_is_the_registered_name() {
        let names: Vec<&str> = JobKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            ["upcycle", "train", "eval", "task", "moerge", "route", "graft", "merge", "neurons", "convert"]
        );
        assert_eq!(JobKind::default(), JobKind::Upcycle);
        let j: JobSpec = serde_json::from_str(r#"{"kind":"graft","target":"t","base":"b","instruct":"i"}"#).unwrap();
        assert_eq!((j.kind(), j.job_kind()), ("graft", JobKind::Graft));
        assert_eq!(serde_json::to_value(&j).unwrap()["kind"], "graft");
        for k in JobKind::ALL {
            assert_eq!(JobKind::parse(k.as_str()), Some(k));
            assert!(!k.label().is_empty() && !k.fields().is_empty(), "{k:?}");
        }
    }
}
