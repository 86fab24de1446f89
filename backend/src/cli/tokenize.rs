//! `moe-studio tokenize MODEL --text FILE --out FILE.tokens`: a corpus
//! tokenised once into a token file (`moe_shared::corpus::token_file`),
//! which `train`, `eval`, `perplexity` and `route` read by offset.

use std::path::PathBuf;

use anyhow::{bail, Context};
use moe_shared::checkpoint::open_model;
use moe_shared::corpus::token_file::{is_token_file, write_token_file, EXTENSION};

use super::train::resolve_tokenizer;

/// Arguments of `tokenize`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The model whose tokenizer encodes the text (a Hugging Face directory — its tokenizer.json is
    /// enough —, a `.gguf` or a llama2.c `.bin`; only its tokenizer is read).
    pub model: PathBuf,
    /// Tokenizer (tokenizer.json or a llama2.c tok*.bin) when the model has none beside it.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The UTF-8 text file (.txt, or .jsonl with a field `text`), read as a stream: a corpus larger
    /// than memory is fine.
    #[arg(long)]
    pub text: PathBuf,
    #[command(flatten)]
    pub docs: super::args::DocsArg,
    /// The token file to write (extension `.tokens`); written beside and renamed into place.
    #[arg(long)]
    pub out: PathBuf,
    /// Print the footer as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tokenize`.
pub fn run(a: Args) -> anyhow::Result<()> {
    if !is_token_file(&a.out.display().to_string()) {
        bail!(
            "--out {}: a token file's name ends in .{EXTENSION} (train, eval and route know it by that)",
            a.out.display()
        );
    }
    let hf_json = a.model.join("tokenizer.json");
    let tok = if a.tokenizer.is_none() && a.model.is_dir() && hf_json.is_file() {
        // Only the tokenizer is needed: a directory holding tokenizer.json (weights or not).
        let bytes = std::fs::read(&hf_json).with_context(|| format!("reading {}", hf_json.display()))?;
        moe_shared::tokenizer::Tokenizer::from_hf_json(&bytes, &hf_json.display().to_string())?
    } else {
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        resolve_tokenizer(&m, a.tokenizer.as_deref())?.0
    };
    let t0 = std::time::Instant::now();
    let quiet = a.json || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let h = write_token_file(&a.text, a.docs.docs, &tok, &a.out, |read, total| {
        if !quiet {
            eprint!("\r{} / {} MiB", read >> 20, total >> 20);
        }
    })?;
    let secs = t0.elapsed().as_secs_f64();
    if !quiet {
        eprint!("\r\x1b[2K");
    }
    if a.json {
        let mut v = serde_json::to_value(&h)?;
        v["out"] = a.out.display().to_string().into();
        v["seconds"] = secs.into();
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!(
            "{}: {} documents, {} tokens ({} MiB of text, --docs {}) in {secs:.1} s, {:.1} MiB/s; stream sha256 {}",
            a.out.display(),
            h.documents,
            h.tokens,
            h.source_bytes >> 20,
            h.docs,
            h.source_bytes as f64 / (1 << 20) as f64 / secs.max(1e-9),
            h.sha256
        );
    }
    Ok(())
}
