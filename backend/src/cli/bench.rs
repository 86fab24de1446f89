//! `moe-studio bench prefill MODEL --tokens 512`: prefill throughput on the
//! chosen backend, printed beside a reference measured in the same run
//! (Hugging Face transformers through `tests/reference/bench_prefill.py`,
//! when a Python with torch + transformers is given).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use moe_shared::checkpoint::open_model;
use moe_shared::model::load_model;

use super::backend::WithBackend;

/// Arguments of `bench prefill`.
#[derive(Debug, Clone, clap::Args)]
pub struct PrefillArgs {
    /// The model (directory, `.gguf` or llama2.c `.bin`).
    pub model: PathBuf,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    pub tokens: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// A Python interpreter with torch + transformers: runs the reference
    /// prefill on the same file in the same run.
    #[arg(long)]
    pub reference_python: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// Prefill throughput (tokens/s) of one forward pass over `--tokens`.
    Prefill(PrefillArgs),
    /// Training throughput (tokens/s) of an upcycled MoE, beside transformers' Mixtral.
    Train(super::bench_train::TrainBenchArgs),
    /// WGSL kernels (graft, weighted sum: GB/s; Gram: GFLOP/s) on wgpu vs the CPU path.
    Kernels(super::bench_kernels::KernelBenchArgs),
}

fn reference(py: &PathBuf, model: &PathBuf, tokens: usize, repeat: usize) -> anyhow::Result<f64> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/reference/bench_prefill.py");
    let out = std::process::Command::new(py)
        .arg(&script)
        .arg(model)
        .arg(tokens.to_string())
        .arg(repeat.to_string())
        .output()
        .with_context(|| format!("running {}", py.display()))?;
    if !out.status.success() {
        anyhow::bail!("reference failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("reference output is not JSON")?;
    v["tokens_per_s"].as_f64().context("reference JSON lacks tokens_per_s")
}

impl WithBackend for PrefillArgs {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let model = load_model::<B>(&m, &device)?;
        let n = a.tokens.min(m.config.max_position_embeddings);
        // Deterministic, varied ids (no tokenizer needed).
        let ids: Vec<i64> = (0..n).map(|i| ((i * 7919 + 13) % m.config.vocab_size) as i64).collect();
        let run_once = || {
            let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [1, n]), &device);
            let logits = model.forward(t, None);
            let _ = logits.into_data();
        };
        run_once();
        let mut times = Vec::new();
        for _ in 0..a.repeat.max(1) {
            let t0 = Instant::now();
            run_once();
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(|x, y| x.partial_cmp(y).expect("finite"));
        let median = times[times.len() / 2];
        let ours = n as f64 / median;
        let reference = match &a.reference_python {
            Some(py) => Some(reference(py, &a.model, n, a.repeat)?),
            None => None,
        };
        if a.json {
            println!(
                "{}",
                serde_json::json!({"tokens": n, "seconds": median, "tokens_per_s": ours, "reference_tokens_per_s": reference})
            );
        } else {
            println!("prefill {n} tokens: {median:.3} s, {ours:.1} tokens/s (moe-studio, median of {})", times.len());
            match reference {
                Some(r) => println!(
                    "reference (transformers, same run): {r:.1} tokens/s; ratio ours/reference = {:.2}",
                    ours / r
                ),
                None => println!("reference: not measured (pass --reference-python PYTHON with torch + transformers)"),
            }
        }
        Ok(())
    }
}
