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

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use moe_shared::checkpoint::open_model;
use moe_shared::methods::{upcycle, ExpertCounts, RouterInit, UpcycleOptions};
use moe_shared::model::load_model;
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::train::{devices, DataSpec, Mixture, PackedSource, Stage, TrainConfig, Trainer};

use super::bench::{backend_name, finish, peak_rss_mib, reference_name, reference_throughput, run_reference};
use super::bench::{Measurement, Throughput};
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
    #[arg(long, default_value = "experts", value_parser = super::args::parse_stage)]
    pub stage: Stage,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Timed steps (after one warm-up step).
    #[arg(long, default_value_t = 3)]
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

impl WithAutodiff for TrainBenchArgs {
    fn run<B: AutodiffBackend>(self) -> anyhow::Result<()> {
        let a = self;
        let stage = a.stage;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tmp = tempfile::tempdir().context("creating a temporary directory")?;
        let moe_dir = if m.moe.is_none() && stage.is_moe() {
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
        let flops_per_token = train_flops_per_token(&model, a.seq_len);
        let mut t = Trainer::new(model, data, config, device, &m.path)?;
        let counts = t.param_counts();
        drop(m);
        t.step()?; // warm-up
        let mut losses = Vec::new();
        let mut secs = Vec::new();
        for _ in 0..a.steps.max(1) {
            let t0 = Instant::now();
            losses.push(t.step()?.loss);
            secs.push(t0.elapsed().as_secs_f64());
        }
        let ours = Throughput::of(per_step as f64, secs, peak_rss_mib());
        drop(t);
        let (reference, reference_name, ref_losses) = match &a.reference_python {
            Some(py) => {
                let args = [
                    moe_dir.display().to_string(),
                    a.seq_len.to_string(),
                    a.batch.to_string(),
                    a.steps.max(1).to_string(),
                    a.stage.name().to_string(),
                    a.lr.to_string(),
                ];
                let (v, rss) = run_reference(py, "bench_train.py", &args)?;
                (Some(reference_throughput(&v, per_step as f64, rss)?), Some(reference_name(&v)), v["losses"].clone())
            }
            None => (None, None, serde_json::Value::Null),
        };
        finish(Measurement {
            workload: "train".into(),
            setup: format!(
                "{} stage, {} experts top-{}, batch {} x seq {}, AdamW, {} trainable params",
                a.stage.name(),
                a.experts,
                a.top_k,
                a.batch,
                a.seq_len,
                counts.trainable
            ),
            unit: "tokens/s".into(),
            backend: backend_name::<B::InnerBackend>(),
            ours,
            reference,
            reference_name: reference_name.map(|n| format!("{n}, MixtralForCausalLM")),
            ratio: None,
            extra: serde_json::json!({
                "trainable": counts.trainable, "losses": losses, "reference_losses": ref_losses,
                "model_flops_per_token": flops_per_token,
            }),
        })
        .print(a.json);
        Ok(())
    }
}

/// Model FLOPs of one training step per token (forward + backward = 3x the
/// forward's 2 FLOPs per multiply-add, PaLM appendix B): the active
/// parameters of every matrix product (attention projections, the top-k
/// experts or the dense FFN, routers, the LM head; not the embedding
/// lookup) plus causal attention's score and value products
/// (`6 * L * seq * d_attn` on average over positions). Frozen weights are
/// counted like trainable ones, as MFU conventionally does.
pub fn train_flops_per_token<B: burn::tensor::backend::Backend>(
    model: &moe_shared::model::Transformer<B>,
    seq_len: usize,
) -> f64 {
    use moe_shared::model::Mlp;
    let c = &model.config;
    let (d, hd) = (c.hidden_size as f64, c.head_dim as f64);
    let (h, kvh) = (c.num_heads as f64, c.num_kv_heads as f64);
    let ffn = 3.0 * d * c.intermediate_size as f64;
    let mut matmul_params = c.vocab_size as f64 * d;
    for b in &model.layers {
        matmul_params += d * hd * (2.0 * h + 2.0 * kvh);
        matmul_params += match &b.mlp {
            Mlp::Dense(_) => ffn,
            Mlp::Moe(m) => m.top_k.min(m.num_experts()) as f64 * ffn + d * m.num_experts() as f64,
        };
    }
    let attention = 2.0 * model.layers.len() as f64 * seq_len as f64 * h * hd;
    3.0 * (2.0 * matmul_params + attention)
}
