//! Command-line definitions and dispatch.

mod backend;
mod bench;
mod convert;
mod generate;
mod inspect;
mod perplexity;

use clap::{Parser, Subcommand};

/// moe-studio: turn dense LLMs into Mixture-of-Experts models.
#[derive(Debug, Parser)]
#[command(name = "moe-studio", version, about)]
pub struct Cli {
    /// Compute backend: `ndarray` (CPU, always built), `wgpu` or `cuda`
    /// (when built with those cargo features).
    #[arg(long, global = true, default_value = "ndarray")]
    pub backend: String,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Architecture, parameter count, dtypes and tensors of a model.
    Inspect(inspect::Args),
    /// Generate text from a prompt (greedy by default).
    Generate(generate::Args),
    /// Token-level perplexity of a model on a text file (strided windows).
    Perplexity(perplexity::Args),
    /// Write any supported model as a Hugging Face safetensors directory.
    Convert(convert::Args),
    /// Benchmarks (printed beside a reference measured in the same run).
    #[command(subcommand)]
    Bench(bench::Bench),
}

/// Runs one parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Generate(a) => backend::run(&cli.backend, a),
        Command::Perplexity(a) => backend::run(&cli.backend, a),
        Command::Convert(a) => convert::run(a),
        Command::Bench(bench::Bench::Prefill(a)) => backend::run(&cli.backend, a),
    }
}
