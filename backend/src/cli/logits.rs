//! `moe-studio logits MODEL (--ids 1,2,3 | --text FILE) --out FILE`: the
//! model's logits for one token window, as raw little-endian f32
//! `[tokens, vocab]` (row-major), for comparing with other loaders
//! (transformers, candle, llama.cpp; `tests/reference/compat_matrix.py`).
//! Prints `{"ids": [...], "vocab": V, "out": FILE}`.

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::open_model;
use moe_shared::model::load_model_as;

use super::backend::WithBackend;

/// Arguments of `logits`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// Token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required_unless_present = "text", conflicts_with = "text")]
    pub ids: Vec<u32>,
    /// A UTF-8 text file, tokenized with the tokenizer's special tokens (the BOS it adds; transformers'
    /// `tokenizer(text)`).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Keep the first N tokens of --text (--ids are run as given).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Output file (raw f32, `[tokens, vocab]`).
    #[arg(long)]
    pub out: PathBuf,
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let ids = match &a.text {
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
                let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer", m.path))?;
                let mut ids = moe_shared::eval::text_ids(tok, &text)?;
                ids.truncate(a.max_tokens);
                ids
            }
            None => a.ids.clone(),
        };
        if ids.is_empty() {
            anyhow::bail!("no tokens to run");
        }
        if ids.len() > m.config.max_position_embeddings {
            anyhow::bail!(
                "{} tokens exceed the model's context {} (max_position_embeddings); give fewer",
                ids.len(),
                m.config.max_position_embeddings
            );
        }
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= m.config.vocab_size) {
            anyhow::bail!("token id {bad} is outside the vocabulary ({} tokens)", m.config.vocab_size);
        }
        let model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        let n = ids.len();
        let input = Tensor::<B, 2, Int>::from_data(
            TensorData::new(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, n]),
            &device,
        );
        let logits: Vec<f32> = model.forward(input, None).into_data().convert::<f32>().to_vec().expect("f32");
        std::fs::write(&a.out, logits.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
            .with_context(|| format!("writing {}", a.out.display()))?;
        println!(
            "{}",
            serde_json::json!({"ids": ids, "vocab": m.config.vocab_size, "out": a.out.display().to_string()})
        );
        Ok(())
    }
}
