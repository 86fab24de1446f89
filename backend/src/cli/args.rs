//! Argument helpers shared by the commands that write checkpoints.

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::tensor_io::{DType, WriteOptions};

/// Where a command writes its checkpoint and how it reports
/// (`--max-shard-bytes`, `--out`, `--json`), flattened into the arguments of
/// `upcycle`, `moerge`, `merge` and `graft`.
#[derive(Debug, Clone, clap::Args)]
pub struct Output {
    /// Largest shard in bytes (default 5 GB).
    #[arg(long)]
    pub max_shard_bytes: Option<u64>,
    /// Output directory (must not exist or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Print a JSON summary on stdout (graft's includes per-tensor delta norms).
    #[arg(long)]
    pub json: bool,
}

impl Output {
    /// Writer options from `--max-shard-bytes`.
    pub fn write_options(&self) -> WriteOptions {
        write_options(self.max_shard_bytes)
    }
}

/// `--dtype` of a command that writes a checkpoint.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputDtype {
    /// Output dtype: f32, f16 or bf16 (default: the (first) input model's
    /// float dtype, f32 for quantised tensors).
    #[arg(long)]
    pub dtype: Option<String>,
}

impl OutputDtype {
    /// The parsed `--dtype` (`None`: keep the input's).
    ///
    /// # Errors
    /// A name other than f32 / f16 / bf16.
    pub fn parse(&self) -> anyhow::Result<Option<DType>> {
        parse_dtype(&self.dtype)
    }
}

/// Parses `--dtype` (`f32`, `f16`, `bf16`; `None` keeps the source's).
pub fn parse_dtype(s: &Option<String>) -> anyhow::Result<Option<DType>> {
    match s {
        Some(s) => {
            Ok(Some(DType::parse_float(s).with_context(|| format!("--dtype `{s}`: expected f32, f16 or bf16"))?))
        }
        None => Ok(None),
    }
}

/// Writer options from `--max-shard-bytes` (default: 5 GB shards).
pub fn write_options(max_shard_bytes: Option<u64>) -> WriteOptions {
    let mut opts = WriteOptions::default();
    if let Some(b) = max_shard_bytes {
        opts.max_shard_bytes = b;
    }
    opts
}

/// `--docs`: how the plain-text files a command reads are cut into
/// documents (`moe_shared::corpus`: each document's tokens are followed by
/// the end-of-text token). Flattened into every command that reads text:
/// `train`, `eval`, `perplexity`, `route`, `neurons`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct DocsArg {
    /// How a .txt file is cut into documents: `blank` (documents separated by blank lines, the
    /// corpora's own format), `line` (one document per line) or `file` (one document); .jsonl files
    /// always hold one document per line (field `text`).
    #[arg(long = "docs", default_value = "blank", value_parser = parse_docs)]
    pub docs: moe_shared::corpus::DocSplit,
}

fn parse_docs(s: &str) -> Result<moe_shared::corpus::DocSplit, String> {
    s.parse()
}

/// `--stage` of `train` and `bench train`: a [`moe_shared::train::Stage`]
/// by name (clap names the flag and the bad value in its error).
pub fn parse_stage(s: &str) -> Result<moe_shared::train::Stage, String> {
    moe_shared::train::Stage::parse(s)
        .ok_or_else(|| format!("expected one of {}", moe_shared::train::Stage::NAMES.join(", ")))
}

/// `--weights-dtype`: the dtype a forward-only command holds the model's
/// large weights in (`moe_shared::model::weights`: projections, experts,
/// the untied LM head and the embedding; norms, routers and activations stay
/// f32). Flattened into `perplexity`, `eval`, `logits`, `generate`,
/// `route` and `neurons`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct WeightsArg {
    /// Dtype of the model's weights in memory: `f32`, `bf16` or `f16` (16 bits halve the memory;
    /// the arithmetic stays f32 on the rounded weights). f16 refuses a weight past its range,
    /// naming the tensor.
    #[arg(long = "weights-dtype", default_value = "f32", value_parser = parse_weights)]
    pub weights_dtype: moe_shared::model::WeightsDtype,
}

fn parse_weights(s: &str) -> Result<moe_shared::model::WeightsDtype, String> {
    s.parse().map_err(|e: moe_shared::error::StudioError| e.to_string())
}

/// Gives the heap's free pages back to the kernel (`malloc_trim(0)`: glibc
/// releases every whole free page, inside the heap too, with
/// `madvise(MADV_DONTNEED)`). `main` keeps buffers up to 256 MiB in the heap
/// so a forward pass reuses them; a model load interleaves long-lived
/// weights with freed read and transpose buffers of the same sizes, and
/// those holes otherwise stay in the resident set for the whole run (3B-
/// shaped DUME in bf16: docs/benchmarks.md, "DUME at the papers' size").
/// Called after a load and between the phases of a long command; a no-op
/// off glibc.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory; no pointer changes.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A parameter error as the CLI words it: the flag, then what is wrong and
/// what is accepted (`--layout unknown layout `x` …`), where the shared
/// [`moe_shared::ops::ParamError`] names the field (`layout: …`, as the
/// server's 422 does).
pub trait FlagErr<T> {
    /// The result with its error worded by flag.
    ///
    /// # Errors
    /// The parameter error, as `--flag message`.
    fn flag_err(self) -> anyhow::Result<T>;
}

impl<T> FlagErr<T> for Result<T, moe_shared::ops::ParamError> {
    fn flag_err(self) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::anyhow!("{} {}", e.flag(), e.message))
    }
}
