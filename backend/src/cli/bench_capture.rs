//! `moe-studio bench ridge` and `bench neurons`: the two capture workloads
//! (a forward pass that records hidden states, then host-side statistics)
//! beside PyTorch forward hooks doing the same work on the same tokens
//! (`tests/reference/bench_capture.py`) in the same run.
//!
//! - `ridge`: DUME's router statistics (methods.md §2) as `moe-studio route`
//!   collects them: sequences of `--context` tokens, every MoE layer forced
//!   to expert 0, each layer's FFN input accumulated into `A = Σ x xᵀ`,
//!   `B = Σ x yᵀ` in f64. A dense MODEL is upcycled to `--experts` equal
//!   copies first (temporary directory) so both sides run the same MoE.
//! - `neurons`: NeuronMoE's capture (methods.md §3) as `moe-studio neurons`
//!   runs it: every linear map's outputs mean-pooled over each text, for
//!   `--count` texts of a corpus file (one per line), `--batch` texts per
//!   forward pass (the reference runs them one at a time, as its hooks
//!   pool whole sequences).

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::methods::neurons::{CollectOptions, NeuronCollector};
use moe_shared::methods::route::{collect_stats, empty_stats, pack_sequences};
use moe_shared::methods::{upcycle, ExpertCounts, RouterInit, UpcycleOptions};
use moe_shared::model::load_model;
use moe_shared::tensor_io::{DType, WriteOptions};

use super::backend::WithBackend;
use super::bench::{
    backend_name, finish, peak_rss_mib, reference_name, reference_throughput, run_reference, synthetic_ids, time_runs,
    Measurement, Throughput,
};

/// Arguments of `bench ridge`.
#[derive(Debug, Clone, clap::Args)]
pub struct RidgeBenchArgs {
    /// A dense model (upcycled to `--experts` equal copies first) or an MoE directory.
    pub model: PathBuf,
    /// Tokens (synthetic ids) accumulated per run (DUME's reference cap: 10,000).
    #[arg(long, default_value_t = 10_000)]
    pub tokens: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Experts when upcycling a dense model.
    #[arg(long, default_value_t = 2)]
    pub experts: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// A Python with torch + transformers (the reference in the same run).
    #[arg(long)]
    pub reference_python: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl WithBackend for RidgeBenchArgs {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tmp = tempfile::tempdir().context("creating a temporary directory")?;
        let dir = if m.moe.is_none() {
            let out = tmp.path().join("moe");
            let opts = UpcycleOptions {
                experts: ExpertCounts::Uniform(a.experts.max(1)),
                top_k: 1,
                router_init: RouterInit::Zeros,
                dtype: Some(DType::F32),
                ..Default::default()
            };
            upcycle(m.source.as_ref(), &m.config, &opts, &out, None, WriteOptions::default())?;
            out
        } else {
            a.model.clone()
        };
        drop(m);
        let m = open_model(&dir)?;
        let model = load_model::<B>(&m, &device)?;
        let ids = synthetic_ids(a.tokens, m.config.vocab_size);
        let seqs = pack_sequences(&ids, a.context);
        let mut used = 0;
        let mut err = None;
        let secs = time_runs(a.repeat, || {
            let mut stats = empty_stats(&model, true);
            match collect_stats(&model, 0, &seqs, Some(a.tokens), &mut stats) {
                Ok(n) => used = n,
                Err(e) => err = Some(e),
            }
        });
        if let Some(e) = err {
            return Err(e.into());
        }
        let ours = Throughput::of(used as f64, secs, peak_rss_mib());
        drop(model);
        let (reference, reference_name) = match &a.reference_python {
            Some(py) => {
                let ids_file = tmp.path().join("ids.json");
                std::fs::write(&ids_file, serde_json::to_vec(&ids)?)?;
                let args = [
                    "ridge".to_string(),
                    dir.display().to_string(),
                    ids_file.display().to_string(),
                    a.context.to_string(),
                    a.repeat.max(1).to_string(),
                ];
                let (v, rss) = run_reference(py, "bench_capture.py", &args)?;
                (Some(reference_throughput(&v, used as f64, rss)?), Some(reference_name(&v)))
            }
            None => (None, None),
        };
        finish(Measurement {
            workload: "ridge".into(),
            setup: format!(
                "DUME ridge statistics, {used} tokens in sequences of {}, FFN inputs of {} layers into f64 Gram",
                a.context, m.config.num_layers
            ),
            unit: "tokens/s".into(),
            backend: backend_name::<B>(),
            ours,
            reference,
            reference_name,
            ratio: None,
            extra: serde_json::json!({"tokens": used}),
        })
        .print(a.json);
        Ok(())
    }
}

/// Arguments of `bench neurons`.
#[derive(Debug, Clone, clap::Args)]
pub struct NeuronsBenchArgs {
    /// The model (directory, `.gguf` or llama2.c `.bin`) with its tokenizer.
    pub model: PathBuf,
    /// A text file, one text per line (e.g. `corpora/lang/en/valid.txt`).
    #[arg(long)]
    pub texts: PathBuf,
    /// Texts per run (the first non-empty lines).
    #[arg(long, default_value_t = 200)]
    pub count: usize,
    /// Each text is truncated to this many tokens.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Texts per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// A Python with torch + transformers (the reference in the same run).
    #[arg(long)]
    pub reference_python: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl WithBackend for NeuronsBenchArgs {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer found with this model", m.path))?;
        let body = std::fs::read_to_string(&a.texts).with_context(|| format!("reading {}", a.texts.display()))?;
        let mut texts: Vec<Vec<u32>> = Vec::new();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            if texts.len() == a.count {
                break;
            }
            let mut ids = tok.encode(line, true)?;
            ids.truncate(a.max_tokens);
            if !ids.is_empty() {
                texts.push(ids);
            }
        }
        anyhow::ensure!(!texts.is_empty(), "{}: no non-empty lines", a.texts.display());
        let model = load_model::<B>(&m, &device)?;
        let tokens: usize = texts.iter().map(|t| t.len()).sum();
        let opts = CollectOptions { max_tokens: a.max_tokens, ..Default::default() };
        let mut err = None;
        let secs = time_runs(a.repeat, || {
            let run = || -> moe_shared::Result<()> {
                let mut col = NeuronCollector::new(&model, vec!["en".into(), "other".into()], opts)?;
                col.reserve(texts.len());
                for (g, group) in texts.chunks(a.batch.max(1)).enumerate() {
                    let batch: Vec<(usize, &[u32])> =
                        group.iter().enumerate().map(|(i, t)| ((g + i) % 2, t.as_slice())).collect();
                    col.add_texts(&batch)?;
                }
                Ok(())
            };
            if let Err(e) = run() {
                err = Some(e);
            }
        });
        if let Some(e) = err {
            return Err(e.into());
        }
        let ours = Throughput::of(tokens as f64, secs, peak_rss_mib());
        drop(model);
        let (reference, reference_name) = match &a.reference_python {
            Some(py) => {
                let tmp = tempfile::tempdir().context("creating a temporary directory")?;
                let file = tmp.path().join("texts.json");
                std::fs::write(&file, serde_json::to_vec(&texts)?)?;
                let args = [
                    "neurons".to_string(),
                    a.model.display().to_string(),
                    file.display().to_string(),
                    a.repeat.max(1).to_string(),
                ];
                let (v, rss) = run_reference(py, "bench_capture.py", &args)?;
                (Some(reference_throughput(&v, tokens as f64, rss)?), Some(reference_name(&v)))
            }
            None => (None, None),
        };
        finish(Measurement {
            workload: "neurons".into(),
            setup: format!(
                "NeuronMoE capture, {} texts ({tokens} tokens, <= {} each), {} per pass, {}",
                texts.len(),
                a.max_tokens,
                a.batch,
                m.path
            ),
            unit: "tokens/s".into(),
            backend: backend_name::<B>(),
            ours,
            reference,
            reference_name,
            ratio: None,
            extra: serde_json::json!({"texts": texts.len(), "tokens": tokens}),
        })
        .print(a.json);
        Ok(())
    }
}
