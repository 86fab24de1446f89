//! `moe-studio convert MODEL --out DIR [--dtype bf16]`: any supported input
//! to a Hugging Face safetensors directory (GGUF tensors dequantised).

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::checkpoint::export::export_dense;
use moe_shared::checkpoint::open_model;

/// Arguments of `convert`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    /// Output directory (must not exist or be empty).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub dtype: super::args::OutputDtype,
    /// Largest shard in bytes (default 5 GB).
    #[arg(long)]
    pub max_shard_bytes: Option<u64>,
}

/// Runs `convert`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let dtype = a.dtype.parse()?;
    let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let tok = m.tokenizer.as_ref().and_then(|t| t.to_hf_json()).map(String::into_bytes);
    if tok.is_none() {
        eprintln!("note: no Hugging Face tokenizer to write beside the weights");
    }
    let opts = super::args::write_options(a.max_shard_bytes);
    export_dense(m.source.as_ref(), &m.config, &a.out, dtype, tok, opts)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
