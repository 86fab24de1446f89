//! `moe-studio moerge MODEL... --out DIR`: DUME MoErging — `N` dense models
//! of one architecture become one MoE with `N` experts (non-FFN tensors
//! averaged, FFN `i` = expert `i`, zero router until the ridge router is
//! fitted).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use moe_shared::checkpoint::open_model;
use moe_shared::jobs::Defaults as D;
use moe_shared::methods::{moerge, MoergeInput, MoergeOptions, RouterInit};

/// Arguments of `moerge`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Two or more dense models (Hugging Face directories, `.gguf` or
    /// llama2.c `.bin`); model `i` becomes expert `i`.
    #[arg(required = true, num_args = 2..)]
    pub models: Vec<PathBuf>,
    /// Experts per token (DUME reference: 1).
    #[arg(long, default_value_t = D::default().moerge_top_k)]
    pub top_k: usize,
    /// Router temperature.
    #[arg(long, default_value_t = D::default().temperature)]
    pub temperature: f64,
    /// Initialise routers with `N(0, std^2)` instead of zeros.
    #[arg(long)]
    pub router_std: Option<f64>,
    /// Seed of a random router.
    #[arg(long, default_value_t = D::default().seed)]
    pub seed: u64,
    #[command(flatten)]
    pub layout: super::args::LayoutArg,
    #[command(flatten)]
    pub dtype: super::args::OutputDtype,
    #[command(flatten)]
    pub output: super::args::Output,
}

/// Runs `moerge`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let dtype = a.dtype.parse()?;
    let layout = a.layout.request()?;
    let models = a
        .models
        .iter()
        .map(|p| open_model(p).with_context(|| format!("opening {}", p.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(m) = models.iter().find(|m| m.moe.is_some()) {
        anyhow::bail!("{}: the model is already an MoE; moerge takes dense models", m.path);
    }
    let inputs: Vec<MoergeInput<'_>> = models.iter().map(MoergeInput::from).collect();
    let opts = MoergeOptions {
        top_k: a.top_k,
        temperature: a.temperature,
        router_init: a.router_std.map_or(RouterInit::Zeros, |std| RouterInit::Random { std }),
        seed: a.seed,
        dtype,
        layout,
        ..Default::default()
    };
    let tok = models[0].tokenizer.as_ref().and_then(|t| t.to_hf_json()).map(String::into_bytes);
    let write_opts = a.output.write_options();
    let report = moerge(&inputs, &opts, &a.output.out, tok, write_opts)?;
    super::moe_summary::print(&report, &a.output.out, started, a.output.json)
}
