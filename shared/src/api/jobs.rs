//! What a job does (`POST /api/jobs`): [`JobSpec`], one spec per kind, and
//! the checks that need no files.

use serde::{Deserialize, Serialize};

use super::server::check_id;
use super::ApiError;
use crate::methods::merge::MergeMethod;
use crate::ops::eval::EvalParams;
use crate::ops::graft::GraftParams;
use crate::ops::merge::MergeParams;
use crate::ops::moerge::MoergeParams;
use crate::ops::neurons::NeuronsParams;
use crate::ops::route::RouteParams;
use crate::ops::task::TaskParams;
use crate::ops::train::TrainParams;
use crate::ops::upcycle::UpcycleParams;
use crate::train::Stage;

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
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
                #[derive(Deserialize)]
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

job_spec! {
    /// `moerge`: N dense models -> one MoE (DUME). The parameters are
    /// [`MoergeParams`]'s fields, flattened (`{"kind": "moerge", "models":
    /// [...], "top_k": 2}`); unset ones take its defaults. The server MoErges
    /// without a base model, so the router starts as zeros or random and the
    /// ridge router is fitted by a `route` job.
    pub struct MoergeSpec {
        /// Checkpoint ids (2-64), expert i = model i.
        pub models: Vec<String>,
        /// Output dtype.
        #[serde(default)]
        pub dtype: Option<String>,
    }
    /// What the MoErge does (ops/moerge.rs).
    params: MoergeParams
}

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

job_spec! {
    /// `eval`: per-dataset perplexity and routing load (the result is
    /// `result.json` of the job's artefacts). The parameters are
    /// [`EvalParams`]'s fields, flattened (`{"kind": "eval", "model": ...,
    /// "data": [...], "window": 64, "routing": "oracle"}`).
    pub struct EvalSpec {
        /// Checkpoint id.
        pub model: String,
        /// Datasets (at least one).
        pub data: Vec<DataRef>,
    }
    /// What the eval does (ops/eval.rs).
    params: EvalParams
}

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

/// What a job does: `{"kind": "train", ...TrainSpec fields}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum JobSpec {
    /// Dense -> MoE.
    Upcycle(UpcycleSpec),
    /// Dense models -> MoE.
    Moerge(MoergeSpec),
    /// Ridge router.
    Route(RouteSpec),
    /// Delta graft.
    Graft(GraftSpec),
    /// Merge baselines.
    Merge(MergeSpec),
    /// Language-specific neurons.
    Neurons(NeuronsSpec),
    /// Training (stages experts / router / dense).
    Train(TrainSpec),
    /// Perplexity + routing load.
    Eval(EvalSpec),
    /// Multiple-choice task accuracy.
    Task(TaskSpec),
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

impl JobSpec {
    /// The engine of a train job (`None` for the other kinds).
    pub fn engine(&self) -> Option<TrainEngine> {
        match self {
            JobSpec::Train(s) => Some(s.engine.unwrap_or_default()),
            _ => None,
        }
    }

    /// The kind's name (`train`, `upcycle`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            JobSpec::Upcycle(_) => "upcycle",
            JobSpec::Moerge(_) => "moerge",
            JobSpec::Route(_) => "route",
            JobSpec::Graft(_) => "graft",
            JobSpec::Merge(_) => "merge",
            JobSpec::Neurons(_) => "neurons",
            JobSpec::Train(_) => "train",
            JobSpec::Eval(_) => "eval",
            JobSpec::Task(_) => "task",
        }
    }

    /// Checks every parameter that can be checked without the files; the
    /// error names the field (`spec.steps`, `spec.data[0].upload`, ...).
    ///
    /// # Errors
    /// The first invalid field.
    pub fn validate(&self) -> Result<(), ApiError> {
        match self {
            JobSpec::Train(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.data", &s.data, 1)?;
                check_range("spec.steps", Some(s.steps), 1, 1_000_000)?;
                s.params.check().map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
                if s.engine == Some(TrainEngine::Torch)
                    && !matches!(s.stage, Stage::Experts | Stage::Router | Stage::Dense | Stage::Ffn)
                {
                    return Err(ApiError::field(
                        "spec.engine",
                        format!(
                            "the PyTorch hand-off runs the stages experts, router, dense and ffn; stage {} trains on burn",
                            s.stage.name()
                        ),
                    ));
                }
            }
            JobSpec::Upcycle(s) => {
                check_id("spec.model", &s.model)?;
                match (&s.experts, &s.experts_per_layer) {
                    (Some(_), Some(_)) | (None, None) => {
                        return Err(ApiError::field(
                            "spec.experts",
                            "give exactly one of experts and experts_per_layer",
                        ))
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
                s.params.check(false).map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
                check_dtype("spec.dtype", &s.dtype)?;
            }
            JobSpec::Moerge(s) => {
                check_models("spec.models", &s.models, 2)?;
                s.params
                    .check(s.models.len(), false)
                    .map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
                check_dtype("spec.dtype", &s.dtype)?;
            }
            JobSpec::Route(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.domains", &s.domains, 2)?;
                s.params
                    .check(s.domains.len())
                    .map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
            }
            JobSpec::Graft(s) => {
                check_id("spec.target", &s.target)?;
                check_id("spec.base", &s.base)?;
                check_id("spec.instruct", &s.instruct)?;
                s.params.check().map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
            }
            JobSpec::Merge(s) => {
                check_models("spec.models", &s.models, 1)?;
                s.params.check(s.models.len()).map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
                match (&s.base, s.method) {
                    (Some(b), _) => check_id("spec.base", b)?,
                    (None, MergeMethod::Linear) => {}
                    (None, m) => return Err(ApiError::field("spec.base", format!("{} needs a base model", m.name()))),
                }
                check_dtype("spec.dtype", &s.dtype)?;
            }
            JobSpec::Neurons(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.langs", &s.langs, 2)?;
                for (i, n) in s.new.iter().enumerate() {
                    if !s.langs.iter().any(|d| &d.name == n) {
                        return Err(ApiError::field(&format!("spec.new[{i}]"), format!("`{n}` is not among langs")));
                    }
                }
                s.params.check().map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
            }
            JobSpec::Eval(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.data", &s.data, 1)?;
                s.params.check().map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
            }
            JobSpec::Task(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.tasks", &s.tasks, 1)?;
                s.params.check().map_err(|e| ApiError::field(&format!("spec.{}", e.field), e.message))?;
                check_range("spec.batch", s.batch, 1, 4096)?;
            }
        }
        Ok(())
    }

    /// Checkpoint ids the job reads, with the field naming each.
    pub fn checkpoints(&self) -> Vec<(String, String)> {
        let one = |f: &str, id: &String| vec![(f.to_string(), id.clone())];
        let many =
            |f: &str, ids: &[String]| ids.iter().enumerate().map(|(i, id)| (format!("{f}[{i}]"), id.clone())).collect();
        match self {
            JobSpec::Train(s) => one("spec.model", &s.model),
            JobSpec::Upcycle(s) => one("spec.model", &s.model),
            JobSpec::Moerge(s) => many("spec.models", &s.models),
            JobSpec::Route(s) => one("spec.model", &s.model),
            JobSpec::Graft(s) => vec![
                ("spec.target".into(), s.target.clone()),
                ("spec.base".into(), s.base.clone()),
                ("spec.instruct".into(), s.instruct.clone()),
            ],
            JobSpec::Merge(s) => {
                let mut v: Vec<(String, String)> = many("spec.models", &s.models);
                if let Some(b) = &s.base {
                    v.push(("spec.base".into(), b.clone()));
                }
                v
            }
            JobSpec::Neurons(s) => one("spec.model", &s.model),
            JobSpec::Eval(s) => one("spec.model", &s.model),
            JobSpec::Task(s) => one("spec.model", &s.model),
        }
    }

    /// Datasets the job reads, with the field naming each list.
    pub fn datasets(&self) -> Vec<(&'static str, &DataRef)> {
        match self {
            JobSpec::Train(s) => s.data.iter().map(|d| ("spec.data", d)).collect(),
            JobSpec::Route(s) => s.domains.iter().map(|d| ("spec.domains", d)).collect(),
            JobSpec::Neurons(s) => s.langs.iter().map(|d| ("spec.langs", d)).collect(),
            JobSpec::Eval(s) => s.data.iter().map(|d| ("spec.data", d)).collect(),
            JobSpec::Task(s) => s.tasks.iter().map(|d| ("spec.tasks", d)).collect(),
            _ => Vec::new(),
        }
    }

    /// Every file the job reads from its datasets, in spec order: each
    /// dataset's upload and, after it, its held-out upload where it has
    /// one. The one walk the server's checks, the job file and its reader
    /// share.
    pub fn data_files(&self) -> Vec<DataFile<'_>> {
        let mut out = Vec::new();
        let mut counters: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
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
}
