//! `moe-studio bench train MODEL --experts 4 --top-k 2 --seq-len 256 --batch 4`:
//! training throughput (tokens/s) of the studio's trainer on the chosen
//! backend, beside transformers (MixtralForCausalLM of the same shape,
//! `tests/reference/bench_train.py`) measured in the same run.
//!
//! A dense MODEL is first upcycled (router `N(0, 0.02^2)`, f32, Mixtral
//! layout) into a temporary directory, which both sides then train: same
//! weights, same token ids, same frozen parameters, same optimizer (AdamW,
//! global-norm clipping 1.0, load balancing 0.01).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use burn::tensor::backend::AutodiffBackend;
use moe_shared::checkpoint::{open_model, DType, WriteOptions};
use moe_shared::methods::{upcycle, ExpertCounts, RouterInit, UpcycleOptions};
use moe_shared::model::load_model;
use moe_shared::train::{devices, DataSpec, Mixture, PackedSource, Stage, TrainConfig, Trainer};

use super::train::WithAutodiff;

/// Arguments of `bench train`.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainBenchArgs {
    /// A dense model (upcycled first) or an MoE checkpoint directory.
    pub model: PathBuf,
    /// Experts per layer when upcycling.
    #[arg(long, default_value_t = 4)]
    pub experts: usize,
    /// Experts per token when upcycling.
    #[arg(long, default_value_t = 2)]
    pub top_k: usize,
    /// Training stage: experts, router or dense.
    #[arg(long, default_value = "experts")]
    pub stage: String,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Timed steps (after one warm-up step).
    #[arg(long, default_value_t = 2)]
    pub steps: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 5e-5)]
    pub lr: f64,
    /// A Python with torch + transformers: runs the reference on the same checkpoint in the same run.
    #[arg(long)]
    pub reference_python: Option<PathBuf>,
    /// Keep the upcycled checkpoint here instead of a temporary directory.
    #[arg(long)]
    pub keep_upcycled: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn reference(py: &PathBuf, model: &std::path::Path, a: &TrainBenchArgs) -> anyhow::Result<serde_json::Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/reference/bench_train.py");
    let out = std::process::Command::new(py)
        .arg(&script)
        .arg(model)
        .args([a.seq_len.to_string(), a.batch.to_string(), a.steps.to_string(), a.stage.clone(), a.lr.to_string()])
        .output()
        .with_context(|| format!("running {}", py.display()))?;
    if !out.status.success() {
        bail!("reference failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).context("reference output is not JSON")
}

impl WithAutodiff for TrainBenchArgs {
    fn run<B: AutodiffBackend>(self) -> anyhow::Result<()> {
        let a = self;
        let stage = Stage::parse(&a.stage).with_context(|| format!("--stage `{}`", a.stage))?;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tmp = tempfile::tempdir().context("creating a temporary directory")?;
        let moe_dir = if m.moe.is_none() && stage != Stage::Dense {
            let out = a.keep_upcycled.clone().unwrap_or_else(|| tmp.path().join("moe"));
            let opts = UpcycleOptions {
                experts: ExpertCounts::Uniform(a.experts),
                top_k: a.top_k,
                router_init: RouterInit::Random { std: 0.02 },
                dtype: Some(DType::F32),
                ..Default::default()
            };
            let t0 = Instant::now();
            upcycle(m.source.as_ref(), &m.config, &opts, &out, None, WriteOptions::default())?;
            eprintln!("upcycled to {} experts (top-{}) in {:.1} s", a.experts, a.top_k, t0.elapsed().as_secs_f64());
            out
        } else {
            a.model.clone()
        };
        drop(m);
        let m = open_model(&moe_dir)?;
        let v = m.config.vocab_size;
        let device = devices::<B>(1);
        let model = load_model::<B>(&m, &device[0])?;
        let per_step = a.batch * a.seq_len;
        // The reference's ids: stream position j -> (j * 7919 + 13) % V.
        let total = (a.steps + 1) * per_step + 1;
        let ids: Vec<u32> = (0..total).map(|j| ((j * 7919 + 13) % v) as u32).collect();
        let spec = DataSpec { name: "synthetic".into(), path: "-".into(), weight: 1.0, original: false };
        let data = Mixture::new(vec![PackedSource::new(spec, ids, a.seq_len)?], 0)?;
        let config = TrainConfig {
            steps: a.steps + 1,
            seq_len: a.seq_len,
            batch_size: a.batch,
            lr: a.lr,
            warmup: 0,
            ..TrainConfig::new(stage)
        };
        let mut t = Trainer::new(model, data, config, device, &m.path)?;
        let counts = t.param_counts();
        drop(m);
        t.step()?; // warm-up
        let t0 = Instant::now();
        let mut losses = Vec::new();
        for _ in 0..a.steps {
            losses.push(t.step()?.loss);
        }
        let dt = t0.elapsed().as_secs_f64();
        let ours = (a.steps * per_step) as f64 / dt;
        drop(t);
        let reference = match &a.reference_python {
            Some(py) => Some(reference(py, &moe_dir, &a)?),
            None => None,
        };
        let theirs = reference.as_ref().and_then(|r| r["tokens_per_s"].as_f64());
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "seq_len": a.seq_len, "batch": a.batch, "steps": a.steps, "stage": a.stage,
                    "trainable": counts.trainable, "tokens_per_s": ours, "seconds": dt, "losses": losses,
                    "reference": reference,
                })
            );
        } else {
            println!(
                "train ({} stage, batch {} x seq {}, {} trainable params): {:.1} tokens/s (moe-studio, {} timed steps, {:.1} s)",
                a.stage, a.batch, a.seq_len, counts.trainable, ours, a.steps, dt
            );
            match theirs {
                Some(r) => println!(
                    "reference (transformers MixtralForCausalLM, same run): {r:.1} tokens/s; ratio ours/reference = {:.2}",
                    ours / r
                ),
                None => println!("reference: not measured (pass --reference-python PYTHON with torch + transformers)"),
            }
        }
        Ok(())
    }
}
