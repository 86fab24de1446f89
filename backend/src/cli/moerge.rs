//! `moe-studio moerge MODEL... --out DIR`: DUME MoErging — `N` dense models
//! of one architecture become one MoE with `N` experts (non-FFN tensors
//! averaged, FFN `i` = expert `i`, zero router until the ridge router is
//! fitted).
//!
//! With `--base DENSE` it is mergekit-moe's merge instead: the non-FFN
//! tensors are the base's, and the router may start from each expert's
//! prompts on the base (`--router-init hidden` or `cheap-embed` with
//! `--expert-prompts FILE`, the JSON of `upcycle --expert-prompts`).
//! `--shared-expert MODEL` (repeatable, `--base` only) adds that model's
//! FFN as an always-on shared expert of every layer (mergekit-moe's
//! `shared_experts`), ungated or, with `--shared-gate`, gated by
//! `sigmoid(g · x)` with `g` initialised as `--router-init` says (the
//! prompt-based modes read `--shared-prompts FILE`, one prompt set per
//! shared expert): `moe_shared::methods::moerge_shared`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::checkpoint::LoadedModel;
use moe_shared::methods::{hidden_router_rows, moerge_with_base, MoergeInput, RouterInit};
use moe_shared::model::load_model;
use moe_shared::ops::moerge::{MoergeParams, MoergeShared};
use moe_shared::tensor_io::card::CardMethod;

use super::backend::WithBackend;
use super::upcycle::RouterInitArg;

use super::args::FlagErr;

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
    /// What the MoErge does: top-k, temperature, router init and std,
    /// frozen experts, seed (ops/moerge.rs).
    #[command(flatten)]
    pub params: MoergeParams,
    /// Prompts per expert for `--router-init hidden` / `cheap-embed` (JSON:
    /// `{"experts": [{"positive": [...], "negative": [...]}, ...]}`).
    #[arg(long)]
    pub expert_prompts: Option<PathBuf>,
    /// Freeze no expert (the default; accepted for symmetry with upcycle).
    #[arg(long, conflicts_with = "frozen")]
    pub no_frozen: bool,
    /// Shared experts: `--shared-expert MODEL` (repeatable), `--shared-gate`,
    /// `--shared-prompts FILE` (ops/moerge.rs).
    #[command(flatten)]
    pub shared: MoergeShared,
    #[command(flatten)]
    pub layout: moe_shared::ops::convert::LayoutParams,
    #[command(flatten)]
    pub dtype: super::args::OutputDtype,
    #[command(flatten)]
    pub output: super::args::Output,
}

impl Args {
    /// Whether the router needs a forward pass (the `hidden` router).
    pub fn needs_backend(&self) -> bool {
        self.params.router_init == Some(RouterInitArg::Hidden)
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
        let layout = a.layout.request().flag_err()?;
        // The rules the server and the tab check too (shared), in the CLI's flags.
        a.params.check(a.models.len(), a.base.is_some()).flag_err()?;
        let kind = a.params.router_kind().flag_err()?;
        a.shared.check(kind).flag_err()?;
        let open = |p: &PathBuf| open_model(p).with_context(|| format!("opening {}", p.display()));
        let models = a.models.iter().map(open).collect::<anyhow::Result<Vec<_>>>()?;
        let base = a.base.as_ref().map(open).transpose()?;
        if let Some(m) = models.iter().chain(&base).find(|m| m.moe.is_some()) {
            anyhow::bail!("{}: the model is already an MoE; moerge takes dense models", m.path);
        }
        let shared = a.shared.shared_expert.iter().map(open).collect::<anyhow::Result<Vec<_>>>()?;
        if let Some(m) = shared.iter().find(|m| m.moe.is_some()) {
            anyhow::bail!("{}: the model is already an MoE; a shared expert is a dense model's FFN", m.path);
        }
        let plain = a.params.plain_router().flag_err()?;
        let prompt_gate = a.shared.prompt_gate(kind);
        let router_prompts = || a.expert_prompts.as_ref().context("this --router-init needs --expert-prompts FILE");
        let shared_prompts = || {
            a.shared
                .shared_prompts
                .as_ref()
                .context("a gated shared expert under this --router-init needs --shared-prompts FILE")
        };
        let with_base = || base.as_ref().context("this --router-init reads prompts with the base model: give --base");
        // The routers, then the shared gate the same way from its own
        // prompts (mergekit-moe computes both in one get_gate_params call).
        let (router_init, shared_init) = match (kind, plain) {
            (_, Some(plain)) => (plain.clone(), plain),
            (RouterInitArg::Hidden, None) => {
                let files: Vec<&PathBuf> =
                    std::iter::once(router_prompts()?).chain(prompt_gate.then(shared_prompts).transpose()?).collect();
                let mut inits = hidden_inits::<B>(with_base()?, &files, &device)?.into_iter();
                let router = inits.next().expect("one per file");
                (router, inits.next().unwrap_or(RouterInit::Zeros))
            }
            (_, None) => {
                let router = super::upcycle::cheap_embed_init(with_base()?, router_prompts()?)?;
                let gate = if prompt_gate {
                    super::upcycle::cheap_embed_init(with_base()?, shared_prompts()?)?
                } else {
                    RouterInit::Zeros
                };
                (router, gate)
            }
        };
        let inputs: Vec<MoergeInput<'_>> = models.iter().map(MoergeInput::from).collect();
        let shared_inputs: Vec<MoergeInput<'_>> = shared.iter().map(MoergeInput::from).collect();
        let mut opts = a.params.options(router_init);
        if a.no_frozen {
            opts.frozen.clear();
        }
        opts.dtype = dtype;
        opts.layout = layout;
        opts.experts_format = a.layout.experts().flag_err()?;
        a.shared.configure(&mut opts, shared_init);
        let first = base.as_ref().unwrap_or(&models[0]);
        let tok = first.tokenizer.as_ref().and_then(|t| t.to_hf_json()).map(String::into_bytes);
        let roles = a
            .base
            .iter()
            .map(|p| ("base".to_string(), p.as_path()))
            .chain(a.models.iter().enumerate().map(|(i, p)| (format!("expert {i}"), p.as_path())))
            .chain(a.shared.shared_expert.iter().enumerate().map(|(i, p)| (format!("shared expert {i}"), p.as_path())));
        let card = super::card::card(CardMethod::Dume, roles);
        let write_opts = a.output.write_options().with_card(Some(card));
        let report = moerge_with_base(
            &inputs,
            base.as_ref().map(MoergeInput::from),
            &shared_inputs,
            &opts,
            &a.output.out,
            tok,
            write_opts,
        )?;
        super::moe_summary::print(&report, &a.output.out, started, a.output.json)
    }
}

/// Hidden-state router rows of each prompt file (`upcycle --expert-prompts`
/// JSON) on `m`, loading the model once: the routers' and the shared
/// gate's.
fn hidden_inits<B: Backend>(
    m: &LoadedModel,
    files: &[&PathBuf],
    device: &B::Device,
) -> anyhow::Result<Vec<RouterInit>> {
    let model = load_model::<B>(m, device)?;
    files
        .iter()
        .map(|p| {
            let prompts = super::upcycle::expert_prompts(m, p)?;
            let rows = hidden_router_rows(&model, &prompts, device).with_context(|| p.display().to_string())?;
            Ok(RouterInit::Hidden { rows })
        })
        .collect()
}

/// A moerge job: the spec's models and parameters, with no base, prompts or shared experts.
impl super::run_job::FromJob for moe_shared::api::MoergeSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Moerge(Args {
            models: self.models.iter().map(|id| j.model(id)).collect(),
            base: None,
            params: self.params.clone(),
            expert_prompts: None,
            no_frozen: false,
            shared: Default::default(),
            layout: super::run_job::defaults(),
            dtype: super::args::OutputDtype { dtype: self.dtype.clone() },
            output: j.output(),
        })
    }
}
