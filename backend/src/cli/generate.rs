//! `moe-studio generate MODEL --prompt TEXT --max-new-tokens N`.

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::generate::{generate, Sampling};
use moe_shared::model::load_model_as;

use super::backend::WithBackend;

/// Arguments of `generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Number of tokens to generate.
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1] (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print JSON (`prompt_ids`, `new_ids`, `text`).
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// Checks the sampling flags (before any model is opened): `--top-p` in
    /// (0, 1], `--temperature` finite and >= 0, `--max-new-tokens` > 0.
    ///
    /// # Errors
    /// A message naming the offending flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            anyhow::bail!("--top-p: the nucleus mass must be in (0, 1] (got {}; 1 = off)", self.top_p);
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            anyhow::bail!("--temperature: must be a finite number >= 0 (got {}; 0 = greedy)", self.temperature);
        }
        if self.max_new_tokens == 0 {
            anyhow::bail!("--max-new-tokens: must be at least 1 (got 0)");
        }
        Ok(())
    }
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        a.validate()?;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer found with this model", m.path))?;
        let model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        super::args::trim_heap();
        // Special tokens as transformers adds them: BOS where the tokenizer's
        // post-processor has one (llama2.c: always, as run.c), for every
        // format, so a `.bin` and its converted/upcycled copy agree.
        let prompt_ids = tok.encode(&a.prompt, true)?;
        let sampling = Sampling { temperature: a.temperature, top_p: a.top_p, seed: a.seed };
        let new_ids = generate(&model, &prompt_ids, a.max_new_tokens, sampling, m.config.eos_token_id, &device)?;
        let mut all = prompt_ids.clone();
        all.extend(&new_ids);
        let full = tok.decode(&all)?;
        let prompt_text = tok.decode(&prompt_ids)?;
        let continuation = full
            .strip_prefix(&prompt_text)
            .map(str::to_string)
            .unwrap_or_else(|| tok.decode(&new_ids).unwrap_or_default());
        if a.json {
            println!(
                "{}",
                serde_json::json!({"prompt_ids": prompt_ids, "new_ids": new_ids, "text": full, "continuation": continuation})
            );
        } else {
            println!("{full}");
        }
        Ok(())
    }
}
