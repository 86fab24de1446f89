//! `moe-studio init-random --config config.json --out DIR`: a dense model of
//! the given Hugging Face configuration with random weights (linear and
//! embedding weights `N(0, std^2)`, seeded per tensor name; RMSNorm gains
//! 1; biases 0), written as a safetensors directory.
//!
//! For benchmarks where the values do not matter but the shapes do:
//! `scripts/gpu_check.sh` makes SmolLM2-shaped weights on a machine that has
//! no model files and no network (the initialisation of Llama-style models
//! in transformers, `initializer_range` 0.02, up to the random stream).

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::checkpoint::{DType, TensorInfo, TensorSource};
use moe_shared::config::{HfConfig, ModelConfig};
use moe_shared::methods::rng::NormalRng;
use moe_shared::model::{load_transformer, save_model};

/// Arguments of `init-random`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A Hugging Face `config.json` (llama, qwen2, mistral).
    #[arg(long)]
    pub config: PathBuf,
    /// Output directory (must not exist or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Standard deviation of the weights.
    #[arg(long, default_value_t = 0.02)]
    pub std: f64,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// The tensors of a dense model of `c`, Hugging Face names and shapes.
fn dense_tensors(c: &ModelConfig) -> Vec<TensorInfo> {
    let (d, f, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let mut out: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![v, d])];
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![d]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        for (n, o) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            out.push((format!("{p}.self_attn.{n}.weight"), vec![o, d]));
            if c.attention_bias {
                out.push((format!("{p}.self_attn.{n}.bias"), vec![o]));
            }
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![d, q]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![d, f]));
    }
    out.push(("model.norm.weight".into(), vec![d]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![v, d]));
    }
    out.into_iter().map(|(name, shape)| TensorInfo { name, dtype: DType::F32, shape }).collect()
}

/// Random tensors by name.
struct RandomSource {
    tensors: Vec<TensorInfo>,
    std: f64,
    seed: u64,
}

impl TensorSource for RandomSource {
    fn source_name(&self) -> &str {
        "random initialisation"
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.clone()
    }

    fn read_f32(&self, name: &str) -> moe_shared::Result<Vec<f32>> {
        let info = self.tensors.iter().find(|t| t.name == name).ok_or_else(|| {
            moe_shared::StudioError::tensor("random initialisation", name, "not a tensor of this model")
        })?;
        let n = info.numel();
        if name.ends_with("layernorm.weight") || name.ends_with("norm.weight") {
            return Ok(vec![1.0; n]);
        }
        if name.ends_with(".bias") {
            return Ok(vec![0.0; n]);
        }
        let mut rng = NormalRng::for_tensor(self.seed, name);
        Ok((0..n).map(|_| (rng.next_normal() * self.std) as f32).collect())
    }
}

/// Runs `init-random`.
///
/// # Errors
/// An unreadable or unsupported config, an existing output, I/O.
pub fn run(a: Args) -> anyhow::Result<()> {
    let name = a.config.display().to_string();
    let raw = std::fs::read(&a.config).with_context(|| format!("reading {name}"))?;
    let config = HfConfig::from_json(&raw, &name)?.to_model_config(&name)?;
    let src = RandomSource { tensors: dense_tensors(&config), std: a.std, seed: a.seed };
    let device = Default::default();
    let model = load_transformer::<moe_shared::CpuBackend>(&config, None, &src, &device)?;
    let provenance = serde_json::json!({"init": "random", "std": a.std, "seed": a.seed});
    save_model(&model, &a.out, DType::F32, Vec::new(), provenance, Default::default())?;
    eprintln!("wrote {} ({} parameters, random N(0, {}^2))", a.out.display(), config.num_parameters(), a.std);
    Ok(())
}
