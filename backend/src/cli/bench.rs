//! `moe-studio bench WORKLOAD`: throughput of one studio workload on the
//! chosen backend, beside a reference measured in the same run on the same
//! machine (Hugging Face transformers / PyTorch through the scripts in
//! `tests/reference/`, when `--reference-python` names a Python with torch
//! and transformers).
//!
//! Every workload prints, for ours and the reference: the median of the
//! timed repetitions (after one warm-up), the min–max range, the ratio
//! ours / reference of the medians and the peak resident set (VmHWM of
//! this process before the reference starts; `ru_maxrss` of the reference's
//! process). `--json` prints one object with the same fields
//! ([`Measurement`]). `scripts/bench.sh` runs every workload and writes
//! `docs/benchmarks.md`; CI runs them in a smoke mode (tiny sizes) that only
//! checks they execute.
//!
//! Workloads: `prefill` (one forward over N tokens, all logits), `generate`
//! (KV-cache decoding), `train` (`bench_train.rs`), `ridge` and `neurons`
//! (`bench_capture.rs`), `kernels` (`bench_kernels.rs`, WGSL vs CPU).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use moe_shared::checkpoint::open_model;
use moe_shared::generate::{generate, Sampling};
use moe_shared::model::load_model_as;
use serde::Serialize;

use super::backend::WithBackend;

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// Prefill throughput (tokens/s) of one forward pass over `--tokens` (all logits).
    Prefill(PrefillArgs),
    /// Generation throughput (new tokens/s) with the KV cache, greedy, beside transformers' `generate`.
    Generate(GenerateArgs),
    /// Training throughput (tokens/s) of an upcycled MoE, beside transformers' Mixtral.
    Train(super::bench_train::TrainBenchArgs),
    /// DUME ridge statistics (forward with FFN-input capture + f64 Gram) tokens/s.
    Ridge(super::bench_capture::RidgeBenchArgs),
    /// NeuronMoE capture (every linear map's outputs pooled per text) tokens/s.
    Neurons(super::bench_capture::NeuronsBenchArgs),
    /// WGSL kernels (graft, weighted sum: GB/s; Gram: GFLOP/s) on wgpu vs the CPU path.
    Kernels(super::bench_kernels::KernelBenchArgs),
}

/// Throughput statistics of repeated runs of the same work.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// Work units per second of the median run.
    pub median: f64,
    /// Slowest run's rate.
    pub min: f64,
    /// Fastest run's rate.
    pub max: f64,
    /// Seconds of every timed run.
    pub seconds: Vec<f64>,
    /// Peak resident set of the process, MiB.
    pub peak_rss_mib: Option<f64>,
}

impl Throughput {
    /// Rates of `work` units done in each of `seconds`.
    pub fn of(work: f64, seconds: Vec<f64>, peak_rss_mib: Option<f64>) -> Self {
        let mut s = seconds.clone();
        s.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
        let med = if s.is_empty() { f64::NAN } else { s[s.len() / 2] };
        let (fast, slow) = (s.first().copied().unwrap_or(f64::NAN), s.last().copied().unwrap_or(f64::NAN));
        Throughput { median: work / med, min: work / slow, max: work / fast, seconds, peak_rss_mib }
    }
}

/// One workload's result: ours, the reference, their ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// Workload name (`prefill`, `generate`, ...).
    pub workload: String,
    /// What was measured, in words (sizes, model).
    pub setup: String,
    /// Unit of the rates (`tokens/s`).
    pub unit: String,
    /// The Burn backend ours ran on.
    pub backend: String,
    /// moe-studio.
    pub ours: Throughput,
    /// The reference (`None` without `--reference-python`).
    pub reference: Option<Throughput>,
    /// What the reference is (library and version).
    pub reference_name: Option<String>,
    /// `ours.median / reference.median`.
    pub ratio: Option<f64>,
    /// Workload-specific extras (losses, MFU inputs, checks).
    pub extra: serde_json::Value,
}

impl Measurement {
    /// Prints as JSON or as text.
    pub fn print(&self, json: bool) {
        if json {
            println!("{}", serde_json::to_string(self).expect("serialisable"));
            return;
        }
        let rss = |t: &Throughput| t.peak_rss_mib.map(|m| format!(", peak RSS {m:.0} MiB")).unwrap_or_default();
        println!("{} ({}; {} backend)", self.workload, self.setup, self.backend);
        let o = &self.ours;
        println!(
            "  moe-studio: {:.1} {} (median of {}, {:.1}-{:.1}{})",
            o.median,
            self.unit,
            o.seconds.len(),
            o.min,
            o.max,
            rss(o)
        );
        match (&self.reference, &self.ratio) {
            (Some(r), Some(x)) => println!(
                "  reference ({}, same run): {:.1} {} (median of {}, {:.1}-{:.1}{}); ratio ours/reference = {x:.2}",
                self.reference_name.as_deref().unwrap_or("python"),
                r.median,
                self.unit,
                r.seconds.len(),
                r.min,
                r.max,
                rss(r)
            ),
            _ => println!("  reference: not measured (pass --reference-python PYTHON with torch + transformers)"),
        }
    }
}

/// Peak resident set of this process (VmHWM), MiB.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs `python tests/reference/SCRIPT ARGS...` (`$MOE_STUDIO_REFERENCE_DIR/SCRIPT`
/// when set; the scripts take `$MOE_STUDIO_TORCH_DEVICE`, default cpu), parses the last stdout line
/// as JSON and returns it with the child's peak resident set (MiB).
///
/// # Errors
/// The interpreter cannot start, exits non-zero (its stderr is quoted) or
/// prints no JSON.
pub fn run_reference(py: &Path, script: &str, args: &[String]) -> anyhow::Result<(serde_json::Value, Option<f64>)> {
    // `MOE_STUDIO_REFERENCE_DIR`: where the scripts are when the binary runs
    // away from its source tree (scripts/gpu_check.sh).
    let dir = std::env::var_os("MOE_STUDIO_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/reference"));
    let path = dir.join(script);
    let child = std::process::Command::new(py)
        .arg(&path)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {} {}", py.display(), path.display()))?;
    let out = child.wait_with_output().with_context(|| format!("waiting for {}", py.display()))?;
    if !out.status.success() {
        anyhow::bail!("reference {script} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(last).with_context(|| format!("reference {script} printed no JSON: {last}"))?;
    Ok((v, children_peak_rss_mib()))
}

/// Largest peak resident set of the waited-for children (`ru_maxrss`), MiB.
fn children_peak_rss_mib() -> Option<f64> {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    (rc == 0 && ru.ru_maxrss > 0).then(|| ru.ru_maxrss as f64 / 1024.0)
}

/// The reference's throughput from its JSON (`seconds`: a list of per-run
/// times) for `work` units per run.
pub fn reference_throughput(v: &serde_json::Value, work: f64, rss: Option<f64>) -> anyhow::Result<Throughput> {
    let secs: Vec<f64> = v["seconds"]
        .as_array()
        .context("reference JSON lacks `seconds` (a list of per-run times)")?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect();
    anyhow::ensure!(!secs.is_empty(), "reference JSON has no timed runs");
    Ok(Throughput::of(work, secs, rss))
}

/// `name torch-VERSION transformers-VERSION` from a reference's JSON.
pub fn reference_name(v: &serde_json::Value) -> String {
    let torch = v["torch"].as_str().unwrap_or("?");
    let tf = v["transformers"].as_str().map(|t| format!(", transformers {t}")).unwrap_or_default();
    let threads = v["torch_threads"].as_u64().map(|t| format!(", {t} threads")).unwrap_or_default();
    format!("torch {torch}{tf}{threads}")
}

/// Times `f` once as a warm-up and then `repeat` times.
pub fn time_runs(repeat: usize, mut f: impl FnMut()) -> Vec<f64> {
    f();
    (0..repeat.max(1))
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect()
}

/// Deterministic, varied token ids shared with the reference scripts:
/// position `i` -> `(i * 7919 + 13) % vocab`.
pub fn synthetic_ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// Fills in the ratio.
pub fn finish(mut m: Measurement) -> Measurement {
    m.ratio = m.reference.as_ref().map(|r| m.ours.median / r.median);
    m
}

/// The name of backend `B` as `--backend` spells it.
pub fn backend_name<B: Backend>() -> String {
    let full = std::any::type_name::<B>();
    if full.contains("burn_flex") {
        "cpu".into()
    } else if full.contains("Cuda") || full.contains("cuda") {
        "cuda".into()
    } else if full.contains("Wgpu") || full.contains("wgpu") {
        "wgpu".into()
    } else {
        full.into()
    }
}

/// Arguments of `bench prefill`.
#[derive(Debug, Clone, clap::Args)]
pub struct PrefillArgs {
    /// The model (directory, `.gguf` or llama2.c `.bin`).
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    pub tokens: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// A Python interpreter with torch + transformers: runs the reference
    /// prefill on the same file in the same run.
    #[arg(long)]
    pub reference_python: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl WithBackend for PrefillArgs {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        let n = a.tokens.min(m.config.max_position_embeddings);
        let ids: Vec<i64> = synthetic_ids(n, m.config.vocab_size).into_iter().map(i64::from).collect();
        let secs = time_runs(a.repeat, || {
            let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [1, n]), &device);
            let _ = model.forward(t, None).into_data();
        });
        let ours = Throughput::of(n as f64, secs, peak_rss_mib());
        drop(model);
        let (reference, reference_name) = match &a.reference_python {
            Some(py) => {
                let args = [a.model.display().to_string(), n.to_string(), a.repeat.max(1).to_string()];
                let (v, rss) = run_reference(py, "bench_prefill.py", &args)?;
                (Some(reference_throughput(&v, n as f64, rss)?), Some(reference_name(&v)))
            }
            None => (None, None),
        };
        finish(Measurement {
            workload: "prefill".into(),
            setup: format!("{n} tokens, batch 1, all logits, {} weights, {}", a.weights.weights_dtype, m.path),
            unit: "tokens/s".into(),
            backend: backend_name::<B>(),
            ours,
            reference,
            reference_name,
            ratio: None,
            extra: serde_json::json!({"tokens": n}),
        })
        .print(a.json);
        Ok(())
    }
}

/// Arguments of `bench generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// The model (directory, `.gguf` or llama2.c `.bin`).
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// Prompt length in tokens (synthetic ids).
    #[arg(long, default_value_t = 32)]
    pub prompt_tokens: usize,
    /// New tokens per run (no early stop at end-of-sequence).
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// A Python with torch + transformers: `generate` (greedy, KV cache) on the same file in the same run.
    #[arg(long)]
    pub reference_python: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl WithBackend for GenerateArgs {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        let p = a.prompt_tokens.max(1);
        let n = a.new_tokens.max(1);
        let prompt = synthetic_ids(p, m.config.vocab_size);
        let mut out = Vec::new();
        let mut err = None;
        let secs = time_runs(a.repeat, || match generate(&model, &prompt, n, Sampling::default(), None, &device) {
            Ok(v) => out = v,
            Err(e) => err = Some(e),
        });
        if let Some(e) = err {
            return Err(e.into());
        }
        let ours = Throughput::of(n as f64, secs, peak_rss_mib());
        drop(model);
        let (reference, reference_name, theirs) = match &a.reference_python {
            Some(py) => {
                let args = [a.model.display().to_string(), p.to_string(), n.to_string(), a.repeat.max(1).to_string()];
                let (v, rss) = run_reference(py, "bench_generate.py", &args)?;
                let ids = v["ids"].clone();
                (Some(reference_throughput(&v, n as f64, rss)?), Some(reference_name(&v)), ids)
            }
            None => (None, None, serde_json::Value::Null),
        };
        finish(Measurement {
            workload: "generate".into(),
            setup: format!(
                "{p}-token prompt + {n} new tokens, greedy, KV cache, batch 1, {} weights, {}",
                a.weights.weights_dtype, m.path
            ),
            unit: "tokens/s".into(),
            backend: backend_name::<B>(),
            ours,
            reference,
            reference_name,
            ratio: None,
            extra: serde_json::json!({"prompt_tokens": p, "new_tokens": n, "ids": out, "reference_ids": theirs}),
        })
        .print(a.json);
        Ok(())
    }
}
