//! Types that cross the wire between the browser app and the server (and
//! the CLI's `--json` output). One definition, used by both sides.

use serde::{Deserialize, Serialize};

use crate::checkpoint::{ModelFormat, TensorSource};
use crate::config::{ModelConfig, MoeConfig};
use crate::methods::merge::MergeMethod;
use crate::train::Stage;

/// One tensor in a model summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSummary {
    /// Hugging Face name.
    pub name: String,
    /// Storage dtype (e.g. "BF16", "Q4_1").
    pub dtype: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
}

/// What `moe-studio inspect` reports about a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSummary {
    /// Path or name of the model.
    pub path: String,
    /// File format.
    pub format: ModelFormat,
    /// The validated configuration.
    pub config: ModelConfig,
    /// Parameters counted from the tensors present.
    pub parameters: usize,
    /// Count of tensors per storage dtype.
    pub dtypes: std::collections::BTreeMap<String, usize>,
    /// Every tensor.
    pub tensors: Vec<TensorSummary>,
    /// Vocabulary size of the tokenizer, when one was found.
    pub tokenizer_vocab: Option<usize>,
    /// The MoE structure, for MoE checkpoints (absent for dense models and
    /// in summaries stored before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSummary>,
}

/// The MoE structure of a model in a [`ModelSummary`]; per-layer lists have
/// one entry per decoder layer (`null` / empty / `false` for a dense layer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeSummary {
    /// The on-disk layout (a [`crate::layout::REGISTRY`] name: `mixtral`,
    /// `qwen2_moe`, ..., `moe_studio`): the one it was read in, else the one
    /// `auto` would write.
    pub layout: String,
    /// Why no public layout holds it (studio layout only): one reason per
    /// public layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub studio_reason: Option<String>,
    /// The public layouts that hold it exactly (`convert --layout` targets).
    #[serde(default)]
    pub public_layouts: Vec<String>,
    /// Experts per layer `E_l` (`null` = dense FFN).
    pub experts_per_layer: Vec<Option<usize>>,
    /// Experts per token `k_l` (`null` = dense FFN).
    pub top_k_per_layer: Vec<Option<usize>>,
    /// Frozen experts per layer (DeltaMoE: `[0]`).
    pub frozen_experts: Vec<Vec<usize>>,
    /// Whether each layer's router has a bias (DUME's ridge router).
    pub router_bias: Vec<bool>,
    /// Router temperature per layer (`null` = dense FFN; 1 in the Mixtral
    /// layout, where it is folded into the router weight).
    pub temperature_per_layer: Vec<Option<f64>>,
    /// Shared experts per layer (DeepSeekMoE / Qwen2-MoE); empty when no
    /// layer has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_experts_per_layer: Vec<usize>,
    /// Routed expert width per layer (`null` = dense FFN); empty when every
    /// expert has the FFN's width (granular upcycling narrows them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expert_width_per_layer: Vec<Option<usize>>,
    /// Layers whose chosen experts are weighed by the softmax over all
    /// experts (`norm_topk_prob: false`); empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unnormalised_top_k_layers: Vec<usize>,
    /// Layers with an aux-loss-free selection bias; empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selection_bias_layers: Vec<usize>,
    /// Total parameters ([`MoeConfig::num_parameters`]).
    pub total_parameters: usize,
    /// Parameters used per token ([`MoeConfig::num_active_parameters`]).
    pub active_parameters_per_token: usize,
    /// How the checkpoint stores its routed experts (`per-expert` or
    /// `packed`, [`crate::layout::packed`]), when read from safetensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_format: Option<crate::layout::ExpertsFormat>,
}

impl MoeSummary {
    /// Summarises `moe` on the dense `base`, read in `layout` (`None`: the
    /// layout `auto` would pick).
    pub fn new(base: &ModelConfig, moe: &MoeConfig, layout: Option<&dyn crate::layout::MoeLayout>) -> Self {
        let auto = crate::layout::choose(base, moe, crate::layout::LayoutRequest::Auto).ok();
        let name = layout.map(|l| l.name()).or(auto.as_ref().map(|c| c.name())).unwrap_or("moe_studio");
        let public = crate::layout::holding(base, moe);
        let studio_reason = if public.is_empty() { auto.and_then(|c| c.reason) } else { None };
        MoeSummary {
            layout: name.to_string(),
            studio_reason,
            public_layouts: public.iter().map(|s| s.to_string()).collect(),
            experts_per_layer: moe.layers.iter().map(|s| s.as_ref().map(|s| s.num_experts)).collect(),
            top_k_per_layer: moe.layers.iter().map(|s| s.as_ref().map(|s| s.top_k)).collect(),
            frozen_experts: moe
                .layers
                .iter()
                .map(|s| s.as_ref().map(|s| s.frozen.clone()).unwrap_or_default())
                .collect(),
            router_bias: moe.layers.iter().map(|s| s.as_ref().is_some_and(|s| s.router_bias)).collect(),
            temperature_per_layer: moe.layers.iter().map(|s| s.as_ref().map(|s| s.temperature)).collect(),
            shared_experts_per_layer: {
                let v: Vec<usize> = moe.layers.iter().map(|s| s.as_ref().map_or(0, |s| s.shared_experts)).collect();
                if v.iter().all(|&n| n == 0) {
                    Vec::new()
                } else {
                    v
                }
            },
            expert_width_per_layer: {
                let v: Vec<Option<usize>> =
                    moe.layers.iter().map(|s| s.as_ref().map(|s| s.expert_width(base))).collect();
                if v.iter().flatten().all(|&w| w == base.intermediate_size) {
                    Vec::new()
                } else {
                    v
                }
            },
            unnormalised_top_k_layers: layers_where(moe, |s| !s.norm_topk_prob),
            selection_bias_layers: layers_where(moe, |s| s.selection_bias),
            total_parameters: moe.num_parameters(base),
            active_parameters_per_token: moe.num_active_parameters(base),
            experts_format: None,
        }
    }
}

/// The MoE layers of `moe` whose spec satisfies `f`.
fn layers_where(moe: &MoeConfig, f: impl Fn(&crate::config::MoeLayerSpec) -> bool) -> Vec<usize> {
    moe.layers.iter().enumerate().filter(|(_, s)| s.as_ref().is_some_and(&f)).map(|(l, _)| l).collect()
}

impl ModelSummary {
    /// Summarises a model's tensors.
    pub fn new(
        path: &str,
        format: ModelFormat,
        config: &ModelConfig,
        src: &dyn TensorSource,
        tokenizer_vocab: Option<usize>,
    ) -> Self {
        let tensors: Vec<TensorSummary> = src
            .tensors()
            .into_iter()
            .map(|t| TensorSummary { name: t.name, dtype: t.dtype.to_string(), shape: t.shape })
            .collect();
        let mut dtypes = std::collections::BTreeMap::new();
        for t in &tensors {
            *dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
        }
        let parameters = tensors.iter().map(|t| t.shape.iter().product::<usize>()).sum();
        ModelSummary {
            path: path.into(),
            format,
            config: config.clone(),
            parameters,
            dtypes,
            tensors,
            tokenizer_vocab,
            moe: None,
        }
    }

    /// Adds the MoE structure of `moe`, read in `layout` (a no-op for
    /// `None`, a dense model).
    pub fn with_moe(mut self, moe: Option<&MoeConfig>, layout: Option<&dyn crate::layout::MoeLayout>) -> Self {
        self.moe = moe.map(|m| MoeSummary::new(&self.config, m, layout));
        self
    }

    /// Records how the MoE's experts are stored (a no-op for a dense model).
    pub fn with_experts_format(mut self, format: Option<crate::layout::ExpertsFormat>) -> Self {
        if let Some(m) = self.moe.as_mut() {
            m.experts_format = format;
        }
        self
    }
}

// ---------------------------------------------------------------------------
// The server API (`moe-studio serve`). The routes, their bodies and the error
// shape are documented in `backend/src/server/mod.rs` (and its README
// section). Ids are lowercase hyphenated UUIDs; times are Unix milliseconds.
// ---------------------------------------------------------------------------

/// The JSON body of every 4xx/5xx answer: `{"error": "...", "field": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong and what was expected, in one sentence.
    pub error: String,
    /// The request field (or path parameter / header) at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    /// An error about `field`.
    pub fn field(field: &str, error: impl Into<String>) -> Self {
        ApiError { error: error.into(), field: Some(field.into()) }
    }
    /// An error not tied to one field.
    pub fn msg(error: impl Into<String>) -> Self {
        ApiError { error: error.into(), field: None }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(x) => write!(f, "{x}: {}", self.error),
            None => f.write_str(&self.error),
        }
    }
}

/// Whether `s` is an id as the server issues them: a lowercase hyphenated
/// UUID (36 characters `[0-9a-f-]`). Anything else never reaches a path.
pub fn is_valid_id(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// Whether `s` is acceptable as an uploaded file's name: 1-128 characters
/// of `[A-Za-z0-9._-]`, starting with a letter or digit (so never `.`, `..`,
/// a hidden file or anything with a separator).
pub fn is_valid_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Longest display name of a checkpoint or a job, in characters.
pub const MAX_NAME_CHARS: usize = 200;

/// Whether `c` may not appear in a display name: control characters
/// (Unicode `Cc`), the bidirectional formatting characters that reorder
/// what is shown (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069: a name
/// must read as it is stored), line and paragraph separators and the BOM.
pub fn is_forbidden_in_name(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{FEFF}')
}

/// Checks the display name of a checkpoint or a job, the same way for the
/// server (`POST /api/checkpoints`, `POST /api/jobs`, job outputs) and the
/// browser's forms; returns it trimmed of surrounding whitespace.
///
/// # Errors
/// An [`ApiError`] about `field` for an empty (or all-whitespace) name, one
/// over [`MAX_NAME_CHARS`] characters, or one holding a character of
/// [`is_forbidden_in_name`] (named by its code point).
pub fn check_name(field: &str, name: &str) -> Result<String, ApiError> {
    let t = name.trim();
    if t.is_empty() {
        return Err(ApiError::field(field, "the name is empty: expected 1-200 printable characters"));
    }
    let n = t.chars().count();
    if n > MAX_NAME_CHARS {
        return Err(ApiError::field(
            field,
            format!("the name is {n} characters long: expected at most {MAX_NAME_CHARS}"),
        ));
    }
    if let Some((i, c)) = t.chars().enumerate().find(|(_, c)| is_forbidden_in_name(*c)) {
        return Err(ApiError::field(
            field,
            format!(
                "character {i} of the name is U+{:04X}, a control or bidirectional-formatting character: expected printable text",
                c as u32
            ),
        ));
    }
    Ok(t.to_string())
}

/// Whether `s` is a lowercase hex sha256 (64 characters).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

fn check_id(field: &str, id: &str) -> Result<(), ApiError> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(ApiError::field(field, format!("`{id}` is not an id (expected a lowercase hyphenated UUID)")))
    }
}

/// `GET /api/info`: what this server is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// `moe-studio` version.
    pub version: String,
    /// Burn backends compiled in (`cpu` always; `wgpu`, `cuda`).
    pub backends: Vec<String>,
    /// The backend jobs use unless their spec names another.
    pub default_backend: String,
    /// Jobs that run at once.
    pub workers: usize,
    /// Largest accepted upload, bytes.
    pub max_upload_bytes: u64,
    /// Chunk size used when an upload does not choose one, bytes.
    pub default_chunk_size: u64,
    /// Largest chunk size an upload may choose, bytes.
    pub max_chunk_size: u64,
}

// ----- uploads ---------------------------------------------------------------

/// `POST /api/uploads`: announce a file to upload in chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateUpload {
    /// The file's name (see [`is_valid_file_name`]); it keeps this name
    /// inside a checkpoint, so `config.json`, `tokenizer.json`,
    /// `model.safetensors`, `stories260K.bin`, `tok512.bin`, `x.gguf`.
    pub file_name: String,
    /// Total size in bytes (at most the server's `max_upload_bytes`).
    pub size: u64,
    /// sha256 of the whole file, lowercase hex; checked at `complete`.
    pub sha256: String,
    /// Bytes per chunk (every chunk but the last has exactly this size);
    /// default and bounds in [`ServerInfo`].
    #[serde(default)]
    pub chunk_size: Option<u64>,
}

/// Where an upload stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UploadState {
    /// Taking chunks.
    Uploading,
    /// Every chunk received and the whole-file sha256 verified; usable as a
    /// dataset in job specs or as a file of a new checkpoint.
    Complete,
    /// Moved into a checkpoint (see `checkpoint_id`).
    Consumed,
}

/// `GET /api/uploads/{id}` (and the answer of the other upload routes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadStatus {
    /// Upload id.
    pub id: String,
    /// File name.
    pub file_name: String,
    /// Total size, bytes.
    pub size: u64,
    /// Announced sha256.
    pub sha256: String,
    /// Bytes per chunk.
    pub chunk_size: u64,
    /// Number of chunks (`ceil(size / chunk_size)`, at least 1).
    pub chunks_total: u64,
    /// Chunks received and verified: chunks `0..chunks_received`. The next
    /// chunk to send is `chunks_received` (this is how a client resumes).
    pub chunks_received: u64,
    /// Bytes received and verified (`min(chunks_received * chunk_size, size)`).
    pub received_bytes: u64,
    /// State.
    pub state: UploadState,
    /// The checkpoint that took this file, once consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
    /// Creation time, Unix ms.
    pub created_at: u64,
}

/// Expected length of chunk `index` of an upload of `size` bytes in chunks
/// of `chunk_size` (`None` past the last chunk).
pub fn chunk_len(size: u64, chunk_size: u64, index: u64) -> Option<u64> {
    let total = chunks_total(size, chunk_size);
    if index >= total {
        return None;
    }
    Some(if index + 1 == total { size - index * chunk_size } else { chunk_size })
}

/// Number of chunks of an upload (an empty file has one empty chunk).
pub fn chunks_total(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size.max(1)).max(1)
}

// ----- checkpoints -----------------------------------------------------------

/// `POST /api/checkpoints`: turn completed uploads into one checkpoint.
///
/// The files land side by side in one directory under their upload names,
/// which is then opened the way `moe-studio inspect` opens models: with a
/// `config.json` as a Hugging Face directory (safetensors, optional
/// `tokenizer.json`), else the one `.gguf`, else the llama2.c `.bin` that is
/// not a tokenizer (`tok*.bin` / `tokenizer.bin` beside it is its vocabulary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCheckpoint {
    /// Display name (1-200 characters).
    pub name: String,
    /// Completed upload ids, one per file.
    pub uploads: Vec<String>,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Name inside the checkpoint (or path relative to a job's output).
    pub name: String,
    /// Size, bytes.
    pub size: u64,
    /// sha256, lowercase hex (absent for job artefacts listed on the fly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A registered checkpoint (`GET /api/checkpoints`, `GET /api/checkpoints/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// Checkpoint id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Format it was read as.
    pub format: ModelFormat,
    /// Its files (download: `GET /api/checkpoints/{id}/files/{name}`).
    pub files: Vec<FileInfo>,
    /// The job that produced it, for job outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_job: Option<String>,
    /// Parameters.
    pub parameters: usize,
    /// Architecture (`llama`, `qwen2`, ...) and whether it is an MoE.
    pub architecture: String,
    /// Registration time, Unix ms.
    pub created_at: u64,
    /// The full summary (only in `GET /api/checkpoints/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ModelSummary>,
}

// ----- jobs ------------------------------------------------------------------

/// A text corpus for a job: a completed upload (`.txt`: one document per
/// line; `.jsonl`: field `text`).
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

/// `train` (see `moe-studio train --help`); unset options take the CLI's
/// defaults. The output model is `final/` of the job's artefacts and is
/// registered as a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    /// Checkpoint id of the model to train.
    pub model: String,
    /// Stage (`experts`, `router`, `dense`): [`Stage`], the trainer's own.
    pub stage: Stage,
    /// Corpora (at least one).
    pub data: Vec<DataRef>,
    /// Optimizer steps (1-1,000,000).
    pub steps: usize,
    /// Tokens per sequence (2-65,536).
    #[serde(default)]
    pub seq_len: Option<usize>,
    /// Sequences per micro-step (1-4,096).
    #[serde(default)]
    pub batch: Option<usize>,
    /// Peak learning rate (> 0).
    #[serde(default)]
    pub lr: Option<f64>,
    /// Warm-up steps.
    #[serde(default)]
    pub warmup: Option<usize>,
    /// Final learning rate as a fraction of `lr` (0-1).
    #[serde(default)]
    pub min_lr: Option<f64>,
    /// Micro-steps per optimizer step (1-1,024).
    #[serde(default)]
    pub grad_accum: Option<usize>,
    /// Global gradient-norm clip (0: none).
    #[serde(default)]
    pub clip: Option<f64>,
    /// Load-balancing coefficient (>= 0).
    #[serde(default)]
    pub alpha: Option<f64>,
    /// Language-prior coefficient (>= 0).
    #[serde(default)]
    pub prior: Option<f64>,
    /// AdamW weight decay (>= 0).
    #[serde(default)]
    pub weight_decay: Option<f64>,
    /// Checkpoint every N steps (default: steps / 10, at least 1): what a
    /// resumed job continues from.
    #[serde(default)]
    pub save_every: Option<usize>,
    /// Seed of the data order.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Devices for data parallelism (1-64).
    #[serde(default)]
    pub devices: Option<usize>,
    /// Where the stage runs (default [`TrainEngine::Burn`]).
    #[serde(default)]
    pub engine: Option<TrainEngine>,
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

/// `upcycle`: dense -> MoE by copying every FFN into experts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpcycleSpec {
    /// Checkpoint id of the dense model.
    pub model: String,
    /// Experts per MoE layer (2-256), or use `experts_per_layer`.
    #[serde(default)]
    pub experts: Option<usize>,
    /// Experts per layer (`null`: keep the layer dense); NeuronMoE's allocation.
    #[serde(default)]
    pub experts_per_layer: Option<Vec<Option<usize>>>,
    /// Experts chosen per token (default 2).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Frozen experts (default `[0]`, the original FFN).
    #[serde(default)]
    pub frozen: Option<Vec<usize>>,
    /// Router initialisation: `zeros` (default) or `random`.
    #[serde(default)]
    pub router_init: Option<String>,
    /// Multiplicative noise on the copies (>= 0).
    #[serde(default)]
    pub noise: Option<f64>,
    /// Seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Output dtype `f32`, `f16` or `bf16` (default: the source's).
    #[serde(default)]
    pub dtype: Option<String>,
}

/// `moerge`: N dense models -> one MoE (DUME).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoergeSpec {
    /// Checkpoint ids (2-64), expert i = model i.
    pub models: Vec<String>,
    /// Experts per token (default 1).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Output dtype.
    #[serde(default)]
    pub dtype: Option<String>,
}

/// `route`: DUME's ridge router (domain i = expert i).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Checkpoint id of the MoErged model.
    pub model: String,
    /// One corpus per expert, in expert order (`heldout` optional).
    pub domains: Vec<DataRef>,
    /// Ridge lambda (> 0).
    #[serde(default)]
    pub lambda: Option<f64>,
    /// Experts per token.
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Training tokens per domain.
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// Context length of the statistics pass.
    #[serde(default)]
    pub context: Option<usize>,
}

/// `graft`: add `scale * (instruct - base)` to a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraftSpec {
    /// Checkpoint id of the target (MoE or dense).
    pub target: String,
    /// Checkpoint id of the dense base.
    pub base: String,
    /// Checkpoint id of the dense instruct model.
    pub instruct: String,
    /// Scale (finite, default 1).
    #[serde(default)]
    pub scale: Option<f64>,
}

/// `merge`: the weight-merging baselines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeSpec {
    /// Method (`linear`, `task-arithmetic`, `ties`, `dare`, `dare-ties`):
    /// [`MergeMethod`], the merge's own.
    pub method: MergeMethod,
    /// Checkpoint ids (1-64).
    pub models: Vec<String>,
    /// One weight per model (finite).
    #[serde(default)]
    pub weights: Option<Vec<f64>>,
    /// Checkpoint id of the base (all but `linear`).
    #[serde(default)]
    pub base: Option<String>,
    /// Density for ties / dare (0 < d <= 1).
    #[serde(default)]
    pub density: Option<f64>,
    /// Seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Output dtype.
    #[serde(default)]
    pub dtype: Option<String>,
}

/// `neurons`: NeuronMoE language-specific neurons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeuronsSpec {
    /// Checkpoint id.
    pub model: String,
    /// One corpus per language (name = language code), at least two.
    pub langs: Vec<DataRef>,
    /// The new languages (names among `langs`).
    #[serde(default)]
    pub new: Vec<String>,
    /// Neurons kept per language (1-1,000,000).
    #[serde(default)]
    pub top_n: Option<usize>,
    /// Texts per language.
    #[serde(default)]
    pub max_texts: Option<usize>,
    /// Tokens per text.
    #[serde(default)]
    pub max_tokens: Option<usize>,
}

/// `eval`: per-dataset perplexity and routing load (the result is
/// `result.json` of the job's artefacts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Checkpoint id.
    pub model: String,
    /// Datasets (at least one).
    pub data: Vec<DataRef>,
    /// Window (tokens).
    #[serde(default)]
    pub window: Option<usize>,
    /// Stride (tokens).
    #[serde(default)]
    pub stride: Option<usize>,
    /// Tokens per dataset.
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// `learned` (default), `oracle` or `random`.
    #[serde(default)]
    pub routing: Option<String>,
}

/// `task`: multiple-choice task accuracy with the lm-evaluation-harness
/// semantics (`moe-studio eval --task`; [`crate::eval::multiple_choice`]).
/// The result is `result.json` of the job's artefacts: per task `acc`,
/// `acc_norm`, `acc_bytes`, their standard errors and the per-item samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Checkpoint id.
    pub model: String,
    /// Task files (JSONL uploads, one item per line: `context`, `choices`,
    /// `gold`), at least one; `name` labels each.
    pub tasks: Vec<DataRef>,
    /// Put between the context and each choice (lm-eval's
    /// `target_delimiter`; default `" "`, at most 16 characters).
    #[serde(default)]
    pub target_delimiter: Option<String>,
    /// Score only the first N items of each task.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Requests (one per choice) per forward pass.
    #[serde(default)]
    pub batch: Option<usize>,
}

/// One task's result in `moe-studio eval --task ... --json` (a task job's
/// `result.json`), with lm-eval's metric names: `acc`, `acc_norm` (per
/// character), `acc_bytes` (per UTF-8 byte) and their `_stderr` (`null`
/// for a single item, lm-eval's "N/A").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The task's name.
    pub name: String,
    /// Its file.
    pub file: String,
    /// Items scored.
    pub items: usize,
    /// Requests cut from the left to fit the model's context.
    pub truncated: usize,
    /// The delimiter between context and choice.
    pub target_delimiter: String,
    /// Accuracy of `argmax ll`.
    pub acc: f64,
    /// Its standard error.
    pub acc_stderr: Option<f64>,
    /// Accuracy of `argmax ll / characters`.
    pub acc_norm: f64,
    /// Its standard error.
    pub acc_norm_stderr: Option<f64>,
    /// Accuracy of `argmax ll / bytes`.
    pub acc_bytes: f64,
    /// Its standard error.
    pub acc_bytes_stderr: Option<f64>,
    /// Per item, in file order.
    pub samples: Vec<crate::eval::McSample>,
}

impl TaskResult {
    /// The result of task `name` read from `file`.
    pub fn new(name: &str, file: &str, r: &crate::eval::McReport) -> Self {
        TaskResult {
            name: name.to_string(),
            file: file.to_string(),
            items: r.items,
            truncated: r.truncated,
            target_delimiter: r.target_delimiter.clone(),
            acc: r.acc.value,
            acc_stderr: r.acc.stderr,
            acc_norm: r.acc_norm.value,
            acc_norm_stderr: r.acc_norm.stderr,
            acc_bytes: r.acc_bytes.value,
            acc_bytes_stderr: r.acc_bytes.stderr,
            samples: r.samples.clone(),
        }
    }
}

/// `moe-studio eval --task ... --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEvalReport {
    /// The model's path.
    pub model: String,
    /// `learned` or `random`.
    pub routing: String,
    /// Whether the model is an MoE.
    pub moe: bool,
    /// One per `--task`, in order.
    pub tasks: Vec<TaskResult>,
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
                check_range("spec.seq_len", s.seq_len, 2, 65_536)?;
                check_range("spec.batch", s.batch, 1, 4096)?;
                check_f("spec.lr", s.lr, 0.0, 10.0, true)?;
                check_range("spec.warmup", s.warmup, 0, 1_000_000)?;
                check_f("spec.min_lr", s.min_lr, 0.0, 1.0, false)?;
                check_range("spec.grad_accum", s.grad_accum, 1, 1024)?;
                check_f("spec.clip", s.clip, 0.0, 1e6, false)?;
                check_f("spec.alpha", s.alpha, 0.0, 1e3, false)?;
                check_f("spec.prior", s.prior, 0.0, 1e3, false)?;
                check_f("spec.weight_decay", s.weight_decay, 0.0, 10.0, false)?;
                check_range("spec.save_every", s.save_every, 1, 1_000_000)?;
                check_range("spec.devices", s.devices, 1, 64)?;
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
                check_range("spec.top_k", s.top_k, 1, 256)?;
                if let Some(f) = &s.frozen {
                    for (i, e) in f.iter().enumerate() {
                        check_range(&format!("spec.frozen[{i}]"), Some(*e), 0, 255)?;
                    }
                }
                if let Some(r) = s.router_init.as_deref() {
                    if !matches!(r, "zeros" | "random") {
                        return Err(ApiError::field("spec.router_init", format!("`{r}`: expected zeros or random")));
                    }
                }
                check_f("spec.noise", s.noise, 0.0, 10.0, false)?;
                check_dtype("spec.dtype", &s.dtype)?;
            }
            JobSpec::Moerge(s) => {
                check_models("spec.models", &s.models, 2)?;
                check_range("spec.top_k", s.top_k, 1, 64)?;
                check_dtype("spec.dtype", &s.dtype)?;
            }
            JobSpec::Route(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.domains", &s.domains, 2)?;
                check_f("spec.lambda", s.lambda, 0.0, 1e9, true)?;
                check_range("spec.top_k", s.top_k, 1, 64)?;
                check_range("spec.max_tokens", s.max_tokens, 1, 100_000_000)?;
                check_range("spec.context", s.context, 2, 65_536)?;
            }
            JobSpec::Graft(s) => {
                check_id("spec.target", &s.target)?;
                check_id("spec.base", &s.base)?;
                check_id("spec.instruct", &s.instruct)?;
                check_f("spec.scale", s.scale, -1e3, 1e3, false)?;
            }
            JobSpec::Merge(s) => {
                check_models("spec.models", &s.models, 1)?;
                if let Some(w) = &s.weights {
                    if w.len() != s.models.len() {
                        return Err(ApiError::field(
                            "spec.weights",
                            format!("{} weights for {} models", w.len(), s.models.len()),
                        ));
                    }
                    for (i, x) in w.iter().enumerate() {
                        check_f(&format!("spec.weights[{i}]"), Some(*x), -1e3, 1e3, false)?;
                    }
                }
                match (&s.base, s.method) {
                    (Some(b), _) => check_id("spec.base", b)?,
                    (None, MergeMethod::Linear) => {}
                    (None, m) => return Err(ApiError::field("spec.base", format!("{} needs a base model", m.name()))),
                }
                check_f("spec.density", s.density, 0.0, 1.0, true)?;
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
                check_range("spec.top_n", s.top_n, 1, 1_000_000)?;
                check_range("spec.max_texts", s.max_texts, 1, 1_000_000)?;
                check_range("spec.max_tokens", s.max_tokens, 1, 65_536)?;
            }
            JobSpec::Eval(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.data", &s.data, 1)?;
                check_range("spec.window", s.window, 2, 65_536)?;
                check_range("spec.stride", s.stride, 1, 65_536)?;
                check_range("spec.max_tokens", s.max_tokens, 1, 1_000_000_000)?;
                if let Some(r) = s.routing.as_deref() {
                    if !matches!(r, "learned" | "oracle" | "random") {
                        return Err(ApiError::field(
                            "spec.routing",
                            format!("`{r}`: expected learned, oracle or random"),
                        ));
                    }
                }
            }
            JobSpec::Task(s) => {
                check_id("spec.model", &s.model)?;
                check_data("spec.tasks", &s.tasks, 1)?;
                if let Some(d) = &s.target_delimiter {
                    if d.chars().count() > 16 || d.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
                        return Err(ApiError::field(
                            "spec.target_delimiter",
                            "expected at most 16 characters, no control characters but newline and tab",
                        ));
                    }
                }
                check_range("spec.limit", s.limit, 1, crate::eval::task::MAX_ITEMS)?;
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
}

/// Job state. `queued -> running -> succeeded | failed | cancelled`;
/// a job running when the server stopped is `interrupted` after restart
/// (a `train` job can then be resumed from its last checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// Running.
    Running,
    /// Finished without error.
    Succeeded,
    /// Finished with an error (`JobInfo::error`).
    Failed,
    /// Cancelled by a user.
    Cancelled,
    /// The server stopped while it ran.
    Interrupted,
}

impl JobState {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Interrupted => "interrupted",
        }
    }
    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<JobState> {
        [
            JobState::Queued,
            JobState::Running,
            JobState::Succeeded,
            JobState::Failed,
            JobState::Cancelled,
            JobState::Interrupted,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
    /// Whether the job will not change again by itself.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

/// Live progress of a job (training jobs fill the step fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// What the job is doing (`loading`, the training stage, `writing`, ...).
    pub stage: String,
    /// Steps done.
    pub step: usize,
    /// Steps in all.
    pub steps: usize,
    /// Training loss of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Cross-entropy part of the loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ce_loss: Option<f64>,
    /// Learning rate of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Tokens per second of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Estimated seconds left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_s: Option<f64>,
}

/// A job (`GET /api/jobs`, `GET /api/jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    /// Job id.
    pub id: String,
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `train`, `upcycle`, ...
    pub kind: String,
    /// The spec as submitted.
    pub spec: JobSpec,
    /// Backend it runs on.
    pub backend: String,
    /// State.
    pub state: JobState,
    /// Error message of a failed job (the last lines of its log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Latest progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The checkpoint registered from its output model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_checkpoint: Option<String>,
    /// Times it was started (resumes count).
    pub attempts: u32,
    /// Submission time, Unix ms.
    pub created_at: u64,
    /// Last start, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// End, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Memory of its process (last attempt), once it has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<JobMemory>,
}

/// The memory of a job's process group: resident anonymous + shared memory
/// (memory-mapped checkpoint files are page cache and do not count),
/// measured while it runs, against the limit it runs under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMemory {
    /// Last measured, bytes (0 once the job ended).
    pub current_bytes: u64,
    /// Highest measured, bytes.
    pub peak_bytes: u64,
    /// The limit, bytes: over it the job is killed and fails saying so.
    pub limit_bytes: u64,
}

/// One server-sent event of `GET /api/jobs/{id}/events`; the SSE `event:`
/// field is the variant name (`state`, `progress`, `log`, `memory`) and `data:` is
/// this value as JSON. The stream starts with the current `state` (and the
/// last `progress`) and ends after a terminal state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum JobEvent {
    /// The job changed state.
    State {
        /// New state.
        state: JobState,
        /// Error of a failed job.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Checkpoint registered from its output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_checkpoint: Option<String>,
    },
    /// A step (or phase) finished.
    Progress(Progress),
    /// A line of the job's log.
    Log {
        /// The line.
        line: String,
    },
    /// The memory of the running job (every second).
    Memory(JobMemory),
}

impl JobEvent {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            JobEvent::State { .. } => "state",
            JobEvent::Progress(_) => "progress",
            JobEvent::Log { .. } => "log",
            JobEvent::Memory(_) => "memory",
        }
    }
}

#[cfg(test)]
mod server_api_tests {
    use super::*;

    #[test]
    fn ids_and_names() {
        assert!(is_valid_id("123e4567-e89b-42d3-a456-426614174000"));
        assert!(!is_valid_id("123E4567-e89b-42d3-a456-426614174000"));
        assert!(!is_valid_id("../../../../etc/passwd"));
        assert!(!is_valid_id("123e4567-e89b-42d3-a456-42661417400/"));
        assert!(is_valid_file_name("tok512.bin"));
        assert!(!is_valid_file_name(".."));
        assert!(!is_valid_file_name(".hidden"));
        assert!(!is_valid_file_name("a/b"));
        assert_eq!(chunks_total(10, 4), 3);
        assert_eq!(chunk_len(10, 4, 2), Some(2));
        assert_eq!(chunk_len(10, 4, 3), None);
        assert_eq!(chunk_len(0, 4, 0), Some(0));
    }

    #[test]
    fn names_are_checked_the_same_everywhere() {
        assert_eq!(check_name("name", "  stories260K MoE  ").unwrap(), "stories260K MoE");
        assert_eq!(check_name("name", "árvíztűrő 🦀 models").unwrap(), "árvíztűrő 🦀 models");
        for bad in ["", "   ", "a\nb", "a\u{7}b", "evil\u{202E}txt.exe", "x\u{2066}y", "\u{200F}", "a\u{FEFF}"] {
            let e = check_name("spec.name", bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("spec.name"), "{bad:?}");
        }
        assert!(check_name("name", &"x".repeat(200)).is_ok());
        assert!(check_name("name", &"x".repeat(201)).unwrap_err().error.contains("201 characters"));
        let e = check_name("name", "a\u{202E}b").unwrap_err().error;
        assert!(e.contains("U+202E"), "{e}");
    }

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
}
