//! `moe-studio upcycle MODEL (--experts N | --allocation FILE) --out DIR`:
//! dense -> MoE by copying every FFN into experts (DeltaMoE phase 1).
//!
//! `--allocation` reads a JSON file `{"experts_per_layer": [...]}` (totals,
//! the original FFN included) or `{"new_experts_per_layer": [...]}`
//! (NeuronMoE's added experts; total = 1 + entry); `null` keeps a layer
//! dense. `--router-init hidden` needs `--expert-prompts FILE`:
//! `{"experts": [{"positive": ["text", ...], "negative": [...]}, ...]}`
//! with one entry per expert (mergekit's `positive_prompts` /
//! `negative_prompts` names are accepted too).
//!
//! Variants (methods.md "Upcycling variants"): `--shared-experts N
//! [--shared-gate] [--shared-init zero|copy] [--shared-frozen]`,
//! `--drop-ratio r` (Drop-Upcycling), `--granularity G` (fine-grained
//! experts), `--norm-topk false` (un-normalised top-k). `--experts`,
//! `--top-k` and `--frozen` count whole copies of the FFN.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::methods::{
    cheap_embed_row, hidden_router_rows, upcycle, AllocationFile, ExpertCounts, ExpertPrompts, RouterInit,
    UpcycleOptions,
};
use moe_shared::model::load_model;
use moe_shared::ops::upcycle::UpcycleParams;
use moe_shared::tensor_io::card::CardMethod;
use serde::Deserialize;

use super::backend::WithBackend;

use super::args::FlagErr;

// The router choices are the operation's
// (moe_shared::ops::upcycle), used by `moerge` too.
pub use moe_shared::ops::upcycle::RouterInitArg;

/// Arguments of `upcycle`.
#[derive(Debug, Clone, clap::Args)]
#[command(group = clap::ArgGroup::new("counts").required(true).args(["experts", "allocation"]))]
pub struct Args {
    /// A dense model: Hugging Face directory, `.gguf` file or llama2.c `.bin`.
    pub model: PathBuf,
    /// Experts in every layer (the original FFN included).
    #[arg(long)]
    pub experts: Option<usize>,
    /// JSON allocation file with a per-layer list (see the command's docs).
    #[arg(long)]
    pub allocation: Option<PathBuf>,
    /// Freeze no expert (overrides --frozen).
    #[arg(long)]
    pub no_frozen: bool,
    /// Prompts per expert for `--router-init hidden` / `cheap-embed` (JSON).
    #[arg(long)]
    pub expert_prompts: Option<PathBuf>,
    /// What the upcycle does (top-k, frozen experts, router, noise, shared
    /// experts, Drop-Upcycling, granularity, ...): the operation's own
    /// parameters, shared with the tab.
    #[command(flatten)]
    pub params: UpcycleParams,
    #[command(flatten)]
    pub layout: moe_shared::ops::convert::LayoutParams,
    #[command(flatten)]
    pub dtype: super::args::OutputDtype,
    #[command(flatten)]
    pub output: super::args::Output,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptSet {
    #[serde(alias = "positive_prompts")]
    positive: Vec<String>,
    #[serde(default, alias = "negative_prompts")]
    negative: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptFile {
    experts: Vec<PromptSet>,
}

/// The prompt sets of `--expert-prompts FILE`, tokenized with `m`'s
/// tokenizer (special tokens added: the BOS mergekit prepends).
pub(crate) fn expert_prompts(m: &LoadedModel, path: &PathBuf) -> anyhow::Result<Vec<ExpertPrompts>> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file: PromptFile = serde_json::from_slice(&raw).with_context(|| {
        format!("{}: expected {{\"experts\": [{{\"positive\": [...], \"negative\": [...]}}, ...]}}", path.display())
    })?;
    let tok = m.tokenizer.as_ref().with_context(|| format!("{}: a prompt-based router needs a tokenizer", m.path))?;
    let encode = |texts: &[String]| -> anyhow::Result<Vec<Vec<u32>>> {
        texts.iter().map(|t| Ok(tok.encode(t, true)?)).collect()
    };
    file.experts
        .iter()
        .map(|e| Ok(ExpertPrompts { positive: encode(&e.positive)?, negative: encode(&e.negative)? }))
        .collect()
}

/// mergekit-moe's `cheap_embed` router from `m`'s input embeddings: per
/// expert the unit sum of its positive prompts' token embeddings minus that
/// of its negative prompts (`moe_shared::methods::cheap_embed_row`).
pub(crate) fn cheap_embed_init(m: &LoadedModel, path: &PathBuf) -> anyhow::Result<RouterInit> {
    let experts = expert_prompts(m, path)?;
    let embed = m.source.read_f32("model.embed_tokens.weight")?;
    let d = m.config.hidden_size;
    let rows = experts
        .iter()
        .map(|e| {
            let mut row = cheap_embed_row(&embed, d, &e.positive)?;
            if !e.negative.is_empty() {
                let neg = cheap_embed_row(&embed, d, &e.negative)?;
                row.iter_mut().zip(neg).for_each(|(p, n)| *p -= n);
            }
            Ok(row)
        })
        .collect::<moe_shared::Result<Vec<_>>>()
        .with_context(|| path.display().to_string())?;
    Ok(RouterInit::CheapEmbed { rows })
}

/// Runs the dense model on each expert's prompts (hidden router).
pub(crate) fn hidden_rows<B: Backend>(
    m: &LoadedModel,
    path: &PathBuf,
    device: &B::Device,
) -> anyhow::Result<RouterInit> {
    let experts = expert_prompts(m, path)?;
    let model = load_model::<B>(m, device)?;
    let rows = hidden_router_rows(&model, &experts, device).with_context(|| path.display().to_string())?;
    Ok(RouterInit::Hidden { rows })
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let started = Instant::now();
        let dtype = a.dtype.parse()?;
        let layout = a.layout.request().flag_err()?;
        let mut params = a.params.clone();
        if a.no_frozen {
            params.frozen.clear();
        }
        // The operation's rules, before any model is read (the MoE config
        // would report a bad temperature under --experts, the wrong option).
        params.check(a.expert_prompts.is_some()).flag_err()?;
        let (experts, experts_source) = match (&a.experts, &a.allocation) {
            (Some(n), _) => (ExpertCounts::Uniform(*n), "--experts".to_string()),
            (None, Some(p)) => {
                let raw = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
                (AllocationFile::parse(&raw, &p.display().to_string())?, p.display().to_string())
            }
            (None, None) => anyhow::bail!("give --experts N or --allocation FILE"),
        };
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        if m.moe.is_some() {
            anyhow::bail!("{}: the model is already an MoE; upcycle takes a dense model", m.path);
        }
        let prompt_router = match a.params.router_init {
            RouterInitArg::Zeros | RouterInitArg::Random => None,
            RouterInitArg::Hidden => {
                let p = a.expert_prompts.as_ref().context("--router-init hidden needs --expert-prompts FILE")?;
                Some(hidden_rows::<B>(&m, p, &device)?)
            }
            RouterInitArg::CheapEmbed => {
                let p = a.expert_prompts.as_ref().context("--router-init cheap-embed needs --expert-prompts FILE")?;
                Some(cheap_embed_init(&m, p)?)
            }
        };
        let opts = UpcycleOptions {
            dtype,
            layout,
            experts_format: a.layout.experts().flag_err()?,
            ..params.options(experts, &experts_source, prompt_router)?
        };
        let tok = m.tokenizer.as_ref().and_then(|t| t.to_hf_json()).map(String::into_bytes);
        let card = super::card::card(CardMethod::Upcycling, [("dense base".to_string(), a.model.as_path())]);
        let write_opts = a.output.write_options().with_card(Some(card));
        let report = upcycle(m.source.as_ref(), &m.config, &opts, &a.output.out, tok, write_opts)?;
        super::moe_summary::print(&report, &a.output.out, started, a.output.json)
    }
}

/// An upcycle job: the spec's model, experts (or its allocation file, written by the server as
/// `moe_shared::jobs::ALLOCATION_FILE`), parameters and dtype; no expert prompts.
impl super::run_job::FromJob for moe_shared::api::UpcycleSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Upcycle(Args {
            model: j.model(&self.model),
            experts: self.experts,
            allocation: self.experts_per_layer.as_ref().map(|_| moe_shared::jobs::ALLOCATION_FILE.into()),
            no_frozen: false,
            expert_prompts: None,
            params: self.params.clone(),
            layout: super::run_job::defaults(),
            dtype: super::args::OutputDtype { dtype: self.dtype.clone() },
            output: j.output(),
        })
    }
}
