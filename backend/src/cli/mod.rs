//! Command-line definitions and dispatch.

mod allocate;
mod args;
pub(crate) mod backend;
mod bench;
mod bench_capture;
mod bench_kernels;
mod bench_train;
mod convert;
mod eval;
mod generate;
mod graft;
mod init_random;
mod inspect;
mod merge;
mod moe_summary;
mod moerge;
mod neuron_figures;
mod neurons;
mod perplexity;
mod route;
mod train;
mod upcycle;

use clap::{Parser, Subcommand};

/// moe-studio: turn dense LLMs into Mixture-of-Experts models.
#[derive(Debug, Parser)]
#[command(name = "moe-studio", version, about)]
pub struct Cli {
    /// Compute backend: `auto` (CUDA if built with `cuda` and a device
    /// answers, else wgpu if built with `wgpu` and a hardware adapter exists,
    /// else CPU), `cpu` (always built; `ndarray` and `flex` are aliases),
    /// `wgpu` or `cuda` (when built with those cargo features).
    #[arg(long, global = true, default_value = "auto")]
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
    /// Dense -> MoE: copy every FFN into experts (DeltaMoE phase 1, NeuronMoE counts).
    Upcycle(upcycle::Args),
    /// N dense models -> one MoE with N experts (DUME MoErging).
    Moerge(moerge::Args),
    /// DUME ridge router for an MoErged model (one domain text per expert).
    Route(route::Args),
    /// Add `scale * (instruct - base)` to an MoE (every expert gets its layer's FFN delta) or a dense model (DeltaMoE phase 2).
    Graft(graft::Args),
    /// Merge baselines: linear, task-arithmetic, ties, dare, dare-ties (mergekit semantics).
    Merge(merge::Args),
    /// NeuronMoE: language-specific neurons by Average Precision (per layer and component).
    Neurons(neurons::Args),
    /// NeuronMoE: new experts per layer from `neurons` output (+ uniform / LayerMoE baselines).
    Allocate(allocate::Args),
    /// Redraw the CSV files and figures of a `neurons` output directory from its neurons.json.
    NeuronsPlot(neurons::PlotArgs),
    /// Train an MoE's new experts or routers, or fine-tune a dense model (DeltaMoE / MoE-LPR / DUME+).
    Train(train::Args),
    /// Per-dataset perplexity and MoE routing load.
    Eval(eval::Args),
    /// A dense model of a Hugging Face config with random weights (benchmarks on machines without model files).
    InitRandom(init_random::Args),
    /// Benchmarks (printed beside a reference measured in the same run).
    #[command(subcommand)]
    Bench(bench::Bench),
    /// The studio's HTTP server: frontend, JSON API, uploads, job queue, live progress.
    Serve(crate::server::ServeArgs),
}

/// Runs one parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    if !matches!(cli.command, Command::Serve(_)) {
        // Rust ignores SIGPIPE, so `moe-studio inspect M | head` panicked
        // with "failed printing to stdout: Broken pipe"; a command-line
        // tool should end quietly instead, as `cat` does. (Not for `serve`,
        // where a closed socket must not kill the server.)
        // SAFETY: `signal` only restores the default disposition of
        // SIGPIPE for the whole process; no handler is installed.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Generate(a) => {
            // Bad sampling flags fail before the backend is chosen or the model read.
            a.validate()?;
            backend::run(&cli.backend, a)
        }
        Command::Perplexity(a) => backend::run(&cli.backend, a),
        Command::Convert(a) => convert::run(a),
        Command::Upcycle(a) => backend::run(&cli.backend, a),
        Command::Moerge(a) => moerge::run(a),
        Command::Route(a) => backend::run(&cli.backend, a),
        Command::Graft(a) => graft::run(a),
        Command::Merge(a) => merge::run(a),
        Command::Neurons(a) => backend::run(&cli.backend, a),
        Command::Allocate(a) => allocate::run(a),
        Command::NeuronsPlot(a) => neurons::plot(a),
        Command::InitRandom(a) => init_random::run(a),
        Command::Bench(bench::Bench::Prefill(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Generate(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Ridge(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Neurons(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Train(a)) => train::run_autodiff(&cli.backend, a),
        Command::Bench(bench::Bench::Kernels(a)) => bench_kernels::run(a),
        Command::Train(a) => train::run_autodiff(&cli.backend, a),
        Command::Eval(a) => backend::run(&cli.backend, a),
        Command::Serve(a) => crate::server::run(&cli.backend, a),
    }
}
