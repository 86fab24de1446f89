//! `moe-studio init-random --config config.json --out DIR`: a dense model of
//! the given Hugging Face configuration with random weights, as
//! transformers' `from_config` initialises Llama-style models (linear and
//! embedding weights `N(0, std^2)` with `std` = the config's
//! `initializer_range`, default 0.02; RMSNorm gains 1; biases 0; seeded per
//! tensor name: [`moe_shared::model::init`]), written as a safetensors
//! directory in f32 or, with `--dtype`, bf16/f16 (rounded once). Each tensor
//! is drawn and written on its own, so a model of any size is made in the
//! memory of its largest tensor (three Llama-3.2-3B-shaped experts for the
//! DUME benchmark: docs/benchmarks.md, "DUME at the papers' size").
//!
//! With `--tokenizer FILE` the directory also gets that `tokenizer.json`,
//! and with `--train-tokenizer TEXT` one trained here (a byte-level BPE of
//! the config's `vocab_size` tokens on the texts' documents:
//! [`moe_shared::tokenizer::train::train_byte_level_bpe`]); the directory
//! is then a model `train --stage dense` starts from (a model trained from
//! scratch: the fetched teaching preset, `scripts/demo_preset.sh`).
//! Without either it is for benchmarks where the values do not matter but
//! the shapes do (`scripts/gpu_check.sh`: SmolLM2-shaped weights on a
//! machine with no model files and no network).

use std::path::PathBuf;

use anyhow::{bail, Context};
use moe_shared::checkpoint::export::export_dense;
use moe_shared::config::HfConfig;
use moe_shared::model::init::DEFAULT_INITIALIZER_RANGE;
use moe_shared::model::RandomInit;
use moe_shared::tensor_io::card::CardMethod;
use moe_shared::tensor_io::DType;
use moe_shared::tokenizer::train::train_byte_level_bpe;
use moe_shared::tokenizer::Tokenizer;

/// Arguments of `init-random`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A Hugging Face `config.json` (llama, qwen2, mistral).
    #[arg(long)]
    pub config: PathBuf,
    /// Output directory (must not exist or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Standard deviation of the weights (default: the config's `initializer_range`, else 0.02).
    #[arg(long)]
    pub std: Option<f64>,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A `tokenizer.json` to put beside the weights (at most the config's `vocab_size` tokens).
    #[arg(long, conflicts_with = "train_tokenizer")]
    pub tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE tokenizer of the config's `vocab_size` tokens on these texts (their
    /// documents, separated by blank lines; repeatable) and put it beside the weights as `tokenizer.json`.
    #[arg(long = "train-tokenizer")]
    pub train_tokenizer: Vec<PathBuf>,
    /// Dtype of the written weights: f32 (default), bf16 or f16 (the values are drawn in f32 and
    /// rounded once).
    #[arg(long)]
    pub dtype: Option<String>,
}

/// The `tokenizer.json` bytes to write, if any, checked against the
/// config's vocabulary.
fn tokenizer_json(a: &Args, vocab_size: usize, config_name: &str) -> anyhow::Result<Option<Vec<u8>>> {
    let (tok, what) = if let Some(p) = &a.tokenizer {
        let name = p.display().to_string();
        let bytes = std::fs::read(p).with_context(|| format!("reading {name}"))?;
        (Tokenizer::from_hf_json(&bytes, &name)?, name)
    } else if !a.train_tokenizer.is_empty() {
        // The documents `train` will read (blank-line separated: the
        // tokenizer sees the newlines inside them).
        let mut docs = Vec::new();
        for p in &a.train_tokenizer {
            docs.extend(moe_shared::corpus::read_documents(&p.display().to_string(), Default::default())?);
        }
        let t0 = std::time::Instant::now();
        let tok = train_byte_level_bpe(docs.iter(), vocab_size)?;
        eprintln!(
            "trained a byte-level BPE tokenizer of {} tokens on {} documents in {:.1} s",
            tok.vocab_size(),
            docs.len(),
            t0.elapsed().as_secs_f64()
        );
        (tok, "the trained tokenizer".to_string())
    } else {
        return Ok(None);
    };
    if tok.vocab_size() > vocab_size {
        bail!("{what} has {} tokens, more than {config_name}'s vocab_size {vocab_size}", tok.vocab_size());
    }
    let json = tok.to_hf_json().with_context(|| format!("{what}: cannot be written as tokenizer.json"))?;
    Ok(Some(json.into_bytes()))
}

/// Runs `init-random`.
///
/// # Errors
/// An unreadable or unsupported config, a bad `--std`, a tokenizer that
/// cannot be read or trained or has more tokens than the config's
/// vocabulary, an existing output, I/O.
pub fn run(a: Args) -> anyhow::Result<()> {
    let name = a.config.display().to_string();
    let raw = std::fs::read(&a.config).with_context(|| format!("reading {name}"))?;
    let config = HfConfig::from_json(&raw, &name)?.to_model_config(&name)?;
    let std = match a.std {
        Some(s) => s,
        None => serde_json::from_slice::<serde_json::Value>(&raw)?
            .get("initializer_range")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(DEFAULT_INITIALIZER_RANGE),
    };
    let tokenizer = tokenizer_json(&a, config.vocab_size, &name)?;
    let dtype = super::args::parse_dtype(&a.dtype)?.unwrap_or(DType::F32);
    // Streamed: each tensor is drawn and written on its own (a 3B-shaped
    // model never sits in memory), the same values `random_dense_model`
    // holds (one seed per tensor name).
    let src = RandomInit::new(&config, std, a.seed)?;
    let mut card = super::card::card(CardMethod::RandomInit, [("configuration".to_string(), a.config.as_path())]);
    card.detail("initialisation", format!("N(0, {std}^2), seed {}", a.seed));
    let opts = moe_shared::tensor_io::WriteOptions::default().with_card(Some(card));
    export_dense(&src, &config, &a.out, Some(dtype), tokenizer, opts)?;
    eprintln!("wrote {} ({} parameters, random N(0, {std}^2))", a.out.display(), config.num_parameters());
    Ok(())
}
