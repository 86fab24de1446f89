//! `moe-studio moerge MODEL... --out DIR`: DUME MoErging — `N` dense models
//! of one architecture become one MoE with `N` experts (non-FFN tensors
//! averaged, FFN `i` = expert `i`, zero router until the ridge router is
//! fitted).
//!
//! With `--base DENSE` it is mergekit-moe's merge instead: the non-FFN
//! tensors are the base's, and the router may start from each expert's
//! prompts on the base (`--router-init hidden` or `cheap-embed` with
//! `--expert-prompts FILE`, the JSON of `upcycle --expert-prompts`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::jobs::Defaults as D;
use moe_shared::methods::{moerge_with_base, MoergeInput, MoergeOptions, RouterInit};

use super::backend::WithBackend;
use super::upcycle::RouterInitArg;

/// Arguments of `moerge`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Two or more dense models (Hugging Face directories, `.gguf` or
    /// llama2.c `.bin`); model `i` becomes expert `i`.
    #[arg(required = true, num_args = 2..)]
    pub models: Vec<PathBuf>,
    /// A base model whose non-FFN tensors the MoE keeps (mergekit-moe's
    /// `base_model`); without it they are the models' mean (DUME).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Experts per token (DUME reference: 1).
    #[arg(long, default_value_t = D::default().moerge_top_k)]
    pub top_k: usize,
    /// Router temperature.
    #[arg(long, default_value_t = D::default().temperature)]
    pub temperature: f64,
    /// Router initialisation (`hidden` and `cheap-embed` need --base and
    /// --expert-prompts). Default: zeros, or random when --router-std is given.
    #[arg(long, value_enum)]
    pub router_init: Option<RouterInitArg>,
    /// Initialise routers with `N(0, std^2)` instead of zeros.
    #[arg(long)]
    pub router_std: Option<f64>,
    /// Prompts per expert for `--router-init hidden` / `cheap-embed` (JSON:
    /// `{"experts": [{"positive": [...], "negative": [...]}, ...]}`).
    #[arg(long)]
    pub expert_prompts: Option<PathBuf>,
    /// Frozen experts of every layer, comma-separated (default none).
    #[arg(long, value_delimiter = ',')]
    pub frozen: Vec<usize>,
    /// Freeze no expert (the default; accepted for symmetry with upcycle).
    #[arg(long)]
    pub no_frozen: bool,
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

impl Args {
    /// Whether the router needs a forward pass (the `hidden` router).
    pub fn needs_backend(&self) -> bool {
        self.router_init == Some(RouterInitArg::Hidden)
    }
}

/// Runs `moerge` (on the CPU backend unless the hidden router needs
/// another).
pub fn run(a: Args) -> anyhow::Result<()> {
    a.run::<moe_shared::CpuBackend>(Default::default())
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let started = Instant::now();
        let dtype = a.dtype.parse()?;
        let layout = a.layout.request()?;
        let open = |p: &PathBuf| open_model(p).with_context(|| format!("opening {}", p.display()));
        let models = a.models.iter().map(open).collect::<anyhow::Result<Vec<_>>>()?;
        let base = a.base.as_ref().map(open).transpose()?;
        if let Some(m) = models.iter().chain(&base).find(|m| m.moe.is_some()) {
            anyhow::bail!("{}: the model is already an MoE; moerge takes dense models", m.path);
        }
        let prompts = || a.expert_prompts.as_ref().context("this --router-init needs --expert-prompts FILE");
        let with_base = || base.as_ref().context("this --router-init reads prompts with the base model: give --base");
        let router_init = match (a.router_init, a.router_std) {
            (None, None) | (Some(RouterInitArg::Zeros), None) => RouterInit::Zeros,
            (None, Some(std)) | (Some(RouterInitArg::Random), Some(std)) => RouterInit::Random { std },
            (Some(RouterInitArg::Random), None) => RouterInit::Random { std: D::default().upcycle_router_std },
            (Some(RouterInitArg::Hidden), None) => super::upcycle::hidden_rows::<B>(with_base()?, prompts()?, &device)?,
            (Some(RouterInitArg::CheapEmbed), None) => super::upcycle::cheap_embed_init(with_base()?, prompts()?)?,
            (Some(_), Some(_)) => anyhow::bail!("--router-std is for --router-init random"),
        };
        let inputs: Vec<MoergeInput<'_>> = models.iter().map(MoergeInput::from).collect();
        let opts = MoergeOptions {
            top_k: a.top_k,
            temperature: a.temperature,
            router_init,
            seed: a.seed,
            frozen: if a.no_frozen { vec![] } else { a.frozen.clone() },
            dtype,
            layout,
            ..Default::default()
        };
        let first = base.as_ref().unwrap_or(&models[0]);
        let tok = first.tokenizer.as_ref().and_then(|t| t.to_hf_json()).map(String::into_bytes);
        let write_opts = a.output.write_options();
        let report =
            moerge_with_base(&inputs, base.as_ref().map(MoergeInput::from), &opts, &a.output.out, tok, write_opts)?;
        super::moe_summary::print(&report, &a.output.out, started, a.output.json)
    }
}
