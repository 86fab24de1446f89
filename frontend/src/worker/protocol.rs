//! The messages between the page and the studio's worker: what the page
//! asks ([`Request`]), what the worker answers ([`Reply`]) and what it
//! reports meanwhile ([`Event`]). All plain data (serde JSON); files and
//! bytes travel beside the JSON as JavaScript objects (`File`, `Blob`).

use moe_shared::config::{ModelConfig, MoeConfig};
use serde::{Deserialize, Serialize};

use crate::compute::inspect::Inspection;
use crate::compute::neurons::{LanguageTexts, NeuronOutcome};
use crate::compute::progress::Step;
use crate::compute::route::{DomainText, PplRow};
use crate::compute::train::{TrainField, TrainJob, TrainPoint, TrainSummary};
use crate::store::ModelRef;

/// One tensor of a model as the page sees it (for the Upcycle page's plan,
/// made on the page from the tensor list alone).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorMeta {
    /// Hugging Face name.
    pub name: String,
    /// Storage dtype as `DType` displays it (`F32`, `BF16`, `Q4_1`, ...).
    pub dtype: String,
    /// Shape (PyTorch order).
    pub shape: Vec<usize>,
}

/// What the page knows of a model held by the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Its slot (stable: indices never move).
    pub r: ModelRef,
    /// Display name (unique in the studio).
    pub name: String,
    /// The method that made it (`upcycle`, `route`, ...); `None` for a
    /// loaded model.
    pub method: Option<String>,
    /// Dense configuration.
    pub config: ModelConfig,
    /// MoE layout, for an MoE.
    pub moe: Option<MoeConfig>,
    /// Where it was read from (`gguf`, `llama2c`, `safetensors`).
    pub format: String,
    /// Bytes of its files (a loaded model) or of its `model.safetensors`.
    pub bytes: u64,
    /// Whether it has a tokenizer.
    pub tokenizer: bool,
    /// Its tensors.
    pub tensors: Vec<TensorMeta>,
    /// The files a download gives (`model.safetensors`, `config.json`, ...)
    /// with their sizes; empty for a loaded model.
    pub files: Vec<(String, u64)>,
    /// Milliseconds the worker took to make it.
    pub millis: f64,
    /// Whether a copy is kept in this browser's storage (it then survives a
    /// reload or a cancelled task).
    pub kept: bool,
}

impl ModelInfo {
    /// Whether it is an MoE.
    pub fn is_moe(&self) -> bool {
        self.moe.is_some()
    }

    /// Parameters (all tensors' elements).
    pub fn numel(&self) -> u64 {
        self.tensors.iter().map(|t| t.shape.iter().product::<usize>() as u64).sum()
    }
}

/// The Upcycle request: the expert counts and the output dtype as the page
/// has them (the page previews the plan from it, the worker builds the same
/// `UpcycleOptions` from it), and the operation's typed parameters
/// (`moe_shared::ops::upcycle`, the CLI's too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpcycleForm {
    /// `Some(json)`: experts from an allocation file; `None`: `experts`.
    pub allocation: Option<String>,
    /// Experts per layer (uniform mode), as typed.
    pub experts: String,
    /// `auto` (the source's float dtype; bf16 for a quantized source),
    /// `source`, `f32`, `bf16` or `f16`.
    pub dtype: String,
    /// What the upcycle does (top-k, frozen, router, seed, shared experts,
    /// Drop-Upcycling, granularity, ...).
    pub params: moe_shared::ops::upcycle::UpcycleParams,
}

/// What the page asks the worker to do.
// One request per click, serialised into a message: the size of the
// largest form (Upcycle) costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Reloads the models kept in this browser's storage.
    Restore,
    /// Loads the build's demo model (`demo/manifest.json`).
    LoadDemo,
    /// Loads the build's "real model" (`demo/real/manifest.json`:
    /// SmolLM2-135M-Instruct beside the stories260K demo).
    LoadReal,
    /// Loads the files sent beside the request (`File` objects), under the
    /// given name (else the file's).
    LoadFiles {
        /// The name the user gave (empty: from the file).
        name: String,
    },
    /// Loads a model from URLs (a server checkpoint): `(file name, url)`.
    LoadUrls {
        /// Display name.
        name: String,
        /// Files to fetch.
        files: Vec<(String, String)>,
    },
    /// Removes a model (and its stored copy).
    Remove(ModelRef),
    /// Forgets every stored copy (models stay loaded in the worker).
    ClearStorage,
    /// Bytes used and available in this browser's storage.
    Storage,
    /// Dense -> MoE.
    Upcycle {
        /// The dense model.
        model: ModelRef,
        /// The form.
        form: UpcycleForm,
    },
    /// Dense vs MoE logits on a text.
    Logits {
        /// The dense model.
        dense: ModelRef,
        /// The upcycled MoE.
        moe: ModelRef,
        /// The text.
        text: String,
    },
    /// NeuronMoE analysis and allocation.
    Neurons {
        /// The dense model.
        model: ModelRef,
        /// Texts per language (the first is the original language).
        langs: Vec<LanguageTexts>,
        /// N of top-N.
        top_n: usize,
        /// `[E_min, E_max]`.
        range: (usize, usize),
    },
    /// MoErge dense models.
    Moerge {
        /// The models, expert `i` = model `i`.
        models: Vec<ModelRef>,
        /// What the MoErge does (top-k, router init, ...: ops/moerge.rs).
        params: moe_shared::ops::moerge::MoergeParams,
        /// Average on the WGSL kernel when a device is open.
        use_gpu: bool,
    },
    /// DUME's ridge router.
    Route {
        /// The MoE.
        model: ModelRef,
        /// One text per expert.
        domains: Vec<DomainText>,
        /// What the fit does (λ, top-k, statistics and held-out tokens).
        params: moe_shared::ops::route::RouteParams,
        /// Also the perplexity table.
        with_ppl: bool,
        /// Accumulate the Gram statistics on the WGSL kernel when a device
        /// is open.
        use_gpu: bool,
    },
    /// MoE + scale · (instruct − base).
    Graft {
        /// The target (MoE or dense).
        target: ModelRef,
        /// The base (dense).
        base: ModelRef,
        /// The instruct model (dense).
        instruct: ModelRef,
        /// What the graft does (λ: ops/graft.rs).
        params: moe_shared::ops::graft::GraftParams,
        /// On the WGSL kernel when a device is open.
        use_gpu: bool,
    },
    /// A DeltaMoE training stage (experts or router) on an MoE; every
    /// step is reported as [`Event::TrainPoint`].
    Train {
        /// The MoE.
        model: ModelRef,
        /// The stage, its texts and options.
        job: TrainJob,
    },
    /// Routing of a text at one layer.
    Inspect {
        /// The MoE.
        model: ModelRef,
        /// The text.
        text: String,
        /// The layer.
        layer: usize,
    },
    /// Greedy continuations of one prompt by several models.
    Generate {
        /// The models (e.g. the dense one and its MoE).
        models: Vec<ModelRef>,
        /// The prompt.
        prompt: String,
        /// New tokens per model.
        max_new_tokens: usize,
    },
    /// Perplexity of each model on one text (`moe-studio perplexity`'s
    /// windows; the Graft page's ability text).
    Perplexity {
        /// The models, in the order of the answer.
        models: Vec<ModelRef>,
        /// The text.
        text: String,
    },
    /// Multiple-choice task accuracy of each model on one JSONL task
    /// (`moe-studio eval --task`).
    Task {
        /// The models, in the order of the answer.
        models: Vec<ModelRef>,
        /// The task's name (errors, the answer's rows).
        name: String,
        /// The JSONL text: one `{"context", "choices", "gold"}` per line.
        task: String,
        /// The delimiter and the items to score: the task operation's own
        /// parameters (`moe_shared::ops::task`).
        params: moe_shared::ops::task::TaskParams,
    },
    /// One file of a produced checkpoint, as a `Blob` named after it.
    Download {
        /// The checkpoint.
        model: ModelRef,
        /// `model.safetensors`, `config.json`, ...
        file: String,
    },
    /// Every file of a produced checkpoint in one `.zip` (stored), as a
    /// `Blob`.
    Archive {
        /// The checkpoint.
        model: ModelRef,
    },
    /// Panics inside the worker (the end-to-end test of the crash path;
    /// the page sends it only when its URL asks for it).
    Panic,
}

impl Request {
    /// A few words for the progress line while it waits or runs.
    pub fn describe(&self) -> &'static str {
        match self {
            Request::Restore => "restoring the kept models",
            Request::LoadDemo => "loading the demo model",
            Request::LoadReal => "loading the real model",
            Request::LoadFiles { .. } | Request::LoadUrls { .. } => "loading the model",
            Request::Remove(_) => "removing the model",
            Request::ClearStorage => "clearing the browser's storage",
            Request::Storage => "reading the storage quota",
            Request::Upcycle { .. } => "upcycling",
            Request::Logits { .. } => "logits check",
            Request::Neurons { .. } => "neuron analysis",
            Request::Moerge { .. } => "MoErging",
            Request::Route { .. } => "ridge router",
            Request::Graft { .. } => "grafting",
            Request::Train { .. } => "training",
            Request::Inspect { .. } => "routing the text",
            Request::Generate { .. } => "generating",
            Request::Perplexity { .. } => "scoring the text",
            Request::Task { .. } => "scoring the task",
            Request::Download { .. } | Request::Archive { .. } => "preparing the download",
            Request::Panic => "a task that panics",
        }
    }
}

/// The logits check's numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitsReply {
    /// Tokens compared.
    pub tokens: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// `max |dense − MoE|`.
    pub max_abs_diff: f64,
    /// `max |dense|`.
    pub max_abs: f64,
}

/// One row of the graft's delta table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeltaRow {
    /// Delta tensor.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// `‖Δ‖₂`.
    pub delta_l2: f64,
    /// `‖Δ‖ / ‖base‖`.
    pub relative: f64,
    /// `max |Δ|`.
    pub max_abs: f64,
    /// Target tensors it was added to.
    pub applied_to: usize,
}

/// The ridge router's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteReply {
    /// The routed checkpoint.
    pub model: ModelInfo,
    /// `[domain][layer]` held-out routing accuracy.
    pub accuracy: Vec<Vec<Option<f64>>>,
    /// Statistics tokens per domain.
    pub tokens: Vec<usize>,
    /// The perplexity table.
    pub ppl: Vec<PplRow>,
    /// Where the Gram statistics were accumulated (`WebGPU` or `CPU`).
    pub gram_on: String,
}

/// One model's greedy continuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Continuation {
    /// The model.
    pub model: String,
    /// The new text.
    pub text: String,
    /// New tokens.
    pub tokens: usize,
    /// Milliseconds.
    pub millis: f64,
}

/// Bytes used and available in this browser's storage for the studio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorageInfo {
    /// Bytes used by this origin.
    pub usage: u64,
    /// Bytes this origin may use.
    pub quota: u64,
    /// Models kept.
    pub kept: usize,
    /// Why storage is unavailable (e.g. not a secure context), if it is.
    pub unavailable: Option<String>,
    /// The worker's wasm memory (`1.23 GB in use, ~2.80 GB left of 4 GiB`).
    pub memory: String,
}

/// What the worker answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Nothing to report.
    Done,
    /// The kernels' device (its description) or why it did not start.
    Gpu(Result<String, String>),
    /// Models restored (and those that could not be).
    Restored {
        /// Models back.
        models: usize,
        /// Why some could not be restored.
        failed: Vec<String>,
    },
    /// A model added to the store.
    Model(ModelInfo),
    /// The storage numbers.
    Storage(StorageInfo),
    /// Logits check.
    Logits(LogitsReply),
    /// Neurons.
    Neurons(NeuronOutcome),
    /// MoErge: the model and where its averages ran (`(tensors, on GPU,
    /// on CPU)`).
    Moerge(ModelInfo, (usize, usize, usize)),
    /// Route.
    Route(RouteReply),
    /// Graft: the model, the counts `(grafted, tensors, expert tensors,
    /// routers)`, and the delta table.
    Graft(ModelInfo, (usize, usize, usize, usize), Vec<DeltaRow>),
    /// A trained checkpoint and its run.
    Train(ModelInfo, TrainSummary),
    /// A training stage refused before it changed anything: the field at
    /// fault and why (the page shows it next to the field).
    TrainRefused(TrainField, String),
    /// Inspect.
    Inspect(Inspection),
    /// Generation.
    Generate(Vec<Continuation>),
    /// Perplexities, one per model asked.
    Perplexity(Vec<f64>),
    /// Each model's task accuracy (rows named after the models).
    Task(Vec<moe_shared::api::TaskResult>),
    /// A download: the `Blob` travels beside the reply; this is its name.
    File(String),
}

/// What the worker sends to the page.
// An event lives only between its construction and its serialisation into
// the message, so the size of the `Done` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// The worker runs: it starts taking requests (on the CPU at once;
    /// WebGPU comes up in the background and is reported by [`Event::Gpu`]).
    Ready,
    /// The outcome of the worker's background WebGPU start: the adapter
    /// and kernels' device (`Ok`), or why the studio stays on the CPU
    /// (`Err`: no adapter, the device failed, or no answer within the
    /// timeout). May come twice: a late success after a timeout upgrades
    /// the page's status.
    Gpu(Result<String, String>),
    /// Request `id` started running (it may have waited behind others).
    Started {
        /// The request.
        id: u64,
    },
    /// Progress of request `id`.
    Progress {
        /// The request.
        id: u64,
        /// The step.
        step: Step,
    },
    /// One step of training request `id` (losses, and on evaluation
    /// steps the held-out perplexity and routing shares).
    TrainPoint {
        /// The request.
        id: u64,
        /// The step.
        point: TrainPoint,
    },
    /// Request `id` finished.
    Done {
        /// The request.
        id: u64,
        /// Its answer or its error (in the page's words).
        result: Result<Reply, String>,
    },
    /// The models the worker holds, after any change.
    Models(Vec<ModelInfo>),
    /// The worker panicked (its message); it is dead and is restarted.
    Panicked(String),
}
