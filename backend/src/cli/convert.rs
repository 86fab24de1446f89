//! `moe-studio convert MODEL --out PATH [--to safetensors|gguf] [--dtype ...]
//! [--layout auto|NAME] [--experts-format per-expert|packed]`: any supported
//! input to a Hugging Face safetensors directory (GGUF tensors dequantised;
//! an MoE written in the layout `--layout` picks, its experts per expert or
//! packed; a model card as `README.md`) or to a llama.cpp GGUF file (`--to gguf`: dense or MoE in
//! llama.cpp's `llama` or `deepseek` architecture, whichever computes the
//! model exactly, F32/F16/BF16/Q8_0, the tokenizer as `tokenizer.ggml.*`).

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::checkpoint::export::{export_dense, export_moe};
use moe_shared::checkpoint::gguf_write::write_gguf;
use moe_shared::checkpoint::open_model;
use moe_shared::tensor_io::card::CardMethod;
use moe_shared::tensor_io::DType;
use moe_shared::tokenizer::gguf_export::gguf_tokenizer;

use super::args::FlagErr;

/// Output formats of `convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// A Hugging Face directory (`config.json`, safetensors, `tokenizer.json`).
    Safetensors,
    /// One llama.cpp GGUF file: architecture `llama` (dense, or MoE as `ffn_*_exps` with renormalised
    /// top-k), else `deepseek` (leading dense layers, ungated shared experts, un-normalised top-k).
    Gguf,
}

/// Arguments of `convert`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    /// Output directory (safetensors; must not exist or be empty) or file
    /// (`--to gguf`; must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Target::Safetensors)]
    pub to: Target,
    /// Output dtype: f32, f16 or bf16 (safetensors default: the input's
    /// float dtype, f32 for quantised tensors); for `--to gguf` also q8_0
    /// (default f16, as llama.cpp's converter).
    #[arg(long)]
    pub dtype: Option<String>,
    #[command(flatten)]
    pub layout: moe_shared::ops::convert::LayoutParams,
    /// Largest shard in bytes (default 5 GB).
    #[arg(long)]
    pub max_shard_bytes: Option<u64>,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// Runs `convert`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let request = a.layout.request().flag_err()?;
    let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let tok = m.tokenizer.as_ref().and_then(|t| t.to_hf_json());
    if a.to == Target::Gguf {
        // `auto` and per-expert are what a GGUF is anyway; anything else asks for a safetensors layout.
        a.layout.experts().flag_err()?;
        if let Some(field) = a.layout.moe_only_field() {
            anyhow::bail!(
                "--{} applies to safetensors output; a GGUF MoE has llama.cpp's own layout",
                field.replace('_', "-")
            );
        }
        let dtype = match a.dtype.as_deref() {
            None => DType::F16,
            Some("q8_0" | "Q8_0") => DType::Q8_0,
            Some(s) => {
                DType::parse_float(s).with_context(|| format!("--dtype `{s}`: expected f32, f16, bf16 or q8_0"))?
            }
        };
        let tok = tok
            .with_context(|| format!("{}: no tokenizer to write as tokenizer.ggml.* (llama.cpp needs one)", m.path))?;
        let meta = gguf_tokenizer(&tok, &m.config, &m.path)?;
        let report = write_gguf(m.source.as_ref(), &m.config, m.moe.as_ref(), dtype, meta, &a.out)?;
        for w in &report.warnings {
            eprintln!("warning: {w}");
        }
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!(
                "wrote {} (llama.cpp `{}`, {} tensors, {:.1} MB, {:?})",
                a.out.display(),
                report.architecture,
                report.tensors,
                report.bytes as f64 / 1e6,
                report.types
            );
        }
        return Ok(());
    }
    let dtype = super::args::parse_dtype(&a.dtype)?;
    let tok = tok.map(String::into_bytes);
    if tok.is_none() {
        eprintln!("note: no Hugging Face tokenizer to write beside the weights");
    }
    let experts = a.layout.experts().flag_err()?;
    let card = super::card::card(CardMethod::Conversion, [("input".to_string(), a.model.as_path())]);
    let opts = super::args::write_options(a.max_shard_bytes).with_card(Some(card));
    let layout = match &m.moe {
        None => {
            if let Some(field) = a.layout.moe_only_field() {
                anyhow::bail!("{}: a dense model; --{} applies to MoE checkpoints", m.path, field.replace('_', "-"));
            }
            export_dense(m.source.as_ref(), &m.config, &a.out, dtype, tok, opts)?;
            None
        }
        Some(moe) => {
            let choice = export_moe(m.source.as_ref(), &m.config, moe, request, experts, &a.out, dtype, tok, opts)?;
            for w in &choice.warnings {
                eprintln!("warning: {w}");
            }
            Some(choice.name())
        }
    };
    if a.json {
        println!("{}", serde_json::json!({"out": a.out.display().to_string(), "layout": layout}));
    } else {
        match layout {
            Some(l) => println!("wrote {} ({l} layout)", a.out.display()),
            None => println!("wrote {}", a.out.display()),
        }
    }
    Ok(())
}

/// A convert job: the spec's model, layout, expert storage and dtype, as
/// safetensors into `out`.
impl super::run_job::FromJob for moe_shared::api::ConvertSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Convert(Args {
            model: j.model(&self.model),
            out: j.out.to_path_buf(),
            to: Target::Safetensors,
            dtype: self.dtype.clone(),
            layout: self.params.clone(),
            max_shard_bytes: None,
            json: j.json,
        })
    }
}
