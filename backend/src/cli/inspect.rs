//! `moe-studio inspect MODEL`.

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::api::ModelSummary;
use moe_shared::checkpoint::open_model;

/// Arguments of `inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also list every tensor (text mode).
    #[arg(long)]
    pub tensors: bool,
}

/// Runs `inspect`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let s = ModelSummary::new(
        &m.path,
        m.format,
        &m.config,
        m.source.as_ref(),
        m.tokenizer.as_ref().map(|t| t.vocab_size()),
    );
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let c = &s.config;
    println!("model        {}", s.path);
    println!("format       {:?}", s.format);
    println!(
        "architecture {} ({} layers, d={}, ffn={}, heads {}/{} kv, head_dim {})",
        c.architecture.model_type(),
        c.num_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim
    );
    println!("vocab        {}{}", c.vocab_size, if c.tie_word_embeddings { " (tied LM head)" } else { "" });
    println!("rope         theta {} {:?}; context {}", c.rope_theta, c.rope_scaling, c.max_position_embeddings);
    println!("parameters   {} ({:.2} M)", s.parameters, s.parameters as f64 / 1e6);
    let dt: Vec<String> = s.dtypes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("dtypes       {}", dt.join(", "));
    println!("tensors      {}", s.tensors.len());
    match s.tokenizer_vocab {
        Some(v) => println!("tokenizer    {v} tokens"),
        None => println!("tokenizer    none found"),
    }
    if a.tensors {
        for t in &s.tensors {
            println!("  {:<60} {:>6} {:?}", t.name, t.dtype, t.shape);
        }
    }
    Ok(())
}
