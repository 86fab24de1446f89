//! `moe-studio perplexity MODEL --text FILE`.

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::eval::{perplexity, text_ids, PerplexityOptions};
use moe_shared::model::load_model;

use super::backend::WithBackend;

/// Arguments of `perplexity`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    /// UTF-8 text file, read whole and tokenized with the tokenizer's special tokens (the BOS it adds, as
    /// transformers' `tokenizer(text)` and llama.cpp's perplexity).
    #[arg(long)]
    pub text: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Advance between windows.
    #[arg(long, default_value_t = 256)]
    pub stride: usize,
    /// Windows per forward pass (a right-padded batch; more uses more memory).
    #[arg(long, default_value_t = PerplexityOptions::DEFAULT_BATCH)]
    pub batch: usize,
    /// Score only the first N tokens.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Print `{"tokens":..,"nll":..,"ppl":..}`.
    #[arg(long)]
    pub json: bool,
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let text = std::fs::read_to_string(&a.text).with_context(|| format!("reading {}", a.text.display()))?;
        if text.trim().is_empty() {
            anyhow::bail!("{}: the text file is empty", a.text.display());
        }
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer found with this model", m.path))?;
        let model = load_model::<B>(&m, &device)?;
        let ids = text_ids(tok, &text)?;
        let opts = PerplexityOptions { window: a.window, stride: a.stride, max_tokens: a.max_tokens, batch: a.batch };
        let quiet = a.json;
        let r = perplexity(&model, &ids, opts, &device, |done, total| {
            if !quiet {
                eprint!("\rwindow {done}/{total}");
            }
        })?;
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            eprintln!();
            println!("tokens {}  nll {:.6}  ppl {:.4}", r.tokens, r.nll, r.ppl);
        }
        Ok(())
    }
}
