//! `moe-studio generate MODEL --prompt TEXT --max-new-tokens N`.

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::generate::{generate, Sampling};
use moe_shared::model::load_model;

use super::backend::WithBackend;

/// Arguments of `generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Number of tokens to generate.
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print JSON (`prompt_ids`, `new_ids`, `text`).
    #[arg(long)]
    pub json: bool,
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer found with this model", m.path))?;
        let model = load_model::<B>(&m, &device)?;
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
