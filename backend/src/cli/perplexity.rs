//! `moe-studio perplexity MODEL --text FILE`.

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::eval::{perplexity, PerplexityOptions};
use moe_shared::model::load_model_as;

use super::backend::WithBackend;

/// Arguments of `perplexity`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// UTF-8 text file (.txt, or .jsonl with a field `text`), scored as its token stream
    /// (`moe_shared::corpus`, the ids `train` and `eval` read): each document as the tokenizer encodes it
    /// with its special tokens (the BOS it adds, as transformers' `tokenizer(text)`), then the
    /// end-of-text token. `--docs file` scores the whole file as one document. A `.tokens` file
    /// (`moe-studio tokenize`) is read as written.
    #[arg(long)]
    pub text: PathBuf,
    #[command(flatten)]
    pub docs: super::args::DocsArg,
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
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer found with this model", m.path))?;
        let model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        super::args::trim_heap();
        let ids = moe_shared::corpus::read_stream(&a.text.display().to_string(), a.docs.docs, tok)?;
        let opts = PerplexityOptions { window: a.window, stride: a.stride, max_tokens: a.max_tokens, batch: a.batch };
        let quiet = a.json;
        let r = perplexity(&model, &ids, opts, &device, |done, total| {
            if !quiet {
                eprint!("\rwindow {done}/{total}");
            }
        })?;
        if a.json {
            let mut v = serde_json::to_value(r)?;
            v["docs"] = ids.docs_name(a.docs.docs).into();
            v["stream_sha256"] = ids.sha256().into();
            println!("{}", serde_json::to_string(&v)?);
        } else {
            eprintln!();
            println!("tokens {}  nll {:.6}  ppl {:.4}", r.tokens, r.nll, r.ppl);
        }
        Ok(())
    }
}
