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
use moe_shared::jobs::Defaults as D;
use moe_shared::methods::{
    cheap_embed_row, hidden_router_rows, upcycle, AllocationFile, CopyNoise, ExpertCounts, ExpertPrompts, NoiseKind,
    RouterInit, SharedExperts, SharedInit, UpcycleOptions,
};
use moe_shared::model::load_model;
use moe_shared::tensor_io::card::CardMethod;
use serde::Deserialize;

use super::backend::WithBackend;

/// Router initialisations offered on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RouterInitArg {
    /// All zeros.
    Zeros,
    /// `N(0, router_std^2)`, seeded.
    Random,
    /// Normalised mean FFN input of each expert's prompts.
    Hidden,
    /// Normalised sum of the token embeddings of each expert's prompts, the
    /// same in every layer (mergekit-moe's `cheap_embed`; no forward pass).
    CheapEmbed,
}

/// Noise kinds offered on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NoiseArg {
    /// `w * (1 + noise * n)`.
    Mul,
    /// `w + noise * n`.
    Add,
}

/// Shared-expert initialisations offered on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SharedInitArg {
    /// Down projection zero: the shared experts output 0 at first.
    Zero,
    /// Scaled copies of the FFN.
    Copy,
}

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
    /// Experts per token.
    #[arg(long, default_value_t = D::default().upcycle_top_k)]
    pub top_k: usize,
    /// Frozen experts of every layer, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = D::default().upcycle_frozen)]
    pub frozen: Vec<usize>,
    /// Freeze no expert (overrides --frozen).
    #[arg(long)]
    pub no_frozen: bool,
    /// Router initialisation.
    #[arg(long, value_enum, default_value_t = RouterInitArg::Zeros)]
    pub router_init: RouterInitArg,
    /// Standard deviation of the random router.
    #[arg(long, default_value_t = D::default().upcycle_router_std)]
    pub router_std: f64,
    /// Prompts per expert for `--router-init hidden` / `cheap-embed` (JSON).
    #[arg(long)]
    pub expert_prompts: Option<PathBuf>,
    /// Standard deviation of the noise on the non-frozen copies (0 = none).
    #[arg(long, default_value_t = D::default().upcycle_noise)]
    pub noise: f64,
    /// How the noise combines with the weights.
    #[arg(long, value_enum, default_value_t = NoiseArg::Mul)]
    pub noise_kind: NoiseArg,
    /// Seed of the random router and the noise.
    #[arg(long, default_value_t = D::default().seed)]
    pub seed: u64,
    /// Router temperature (folded into the router weight in every public layout).
    #[arg(long, default_value_t = D::default().temperature)]
    pub temperature: f64,
    /// Always-active shared experts per MoE layer (DeepSeekMoE, Qwen1.5/2-MoE); one gated shared expert fits
    /// the qwen2_moe layout, anything else the studio layout.
    #[arg(long, default_value_t = 0)]
    pub shared_experts: usize,
    /// Gate each shared expert by sigmoid(w·x) (Qwen2-MoE) instead of adding it as is (DeepSeekMoE).
    #[arg(long)]
    pub shared_gate: bool,
    /// Shared-expert init: `zero` (down projection 0: the model still equals the dense one) or `copy`
    /// (copies of the FFN, every shared and the routed part scaled to 1/(N+1) of the output; Qwen1.5-MoE).
    #[arg(long, value_enum, default_value_t = SharedInitArg::Zero)]
    pub shared_init: SharedInitArg,
    /// Keep the shared experts (and their gate) frozen in training.
    #[arg(long)]
    pub shared_frozen: bool,
    /// Drop-Upcycling: fraction r in [0, 1] of each non-frozen copy's intermediate units re-initialised
    /// (Nakamura et al. 2025; the paper's default 0.5), seeded by --seed.
    #[arg(long, default_value_t = 0.0)]
    pub drop_ratio: f64,
    /// Granular upcycling: split every copy into G experts of f/G units; --experts E and --top-k k
    /// become E·G experts and top-(k·G) (Megatron-Core --moe-upcycling-granularity). G must divide f.
    #[arg(long, default_value_t = 1)]
    pub granularity: usize,
    /// Renormalise the top-k weights (`true`, Mixtral) or weigh each chosen expert by its softmax over all
    /// experts (`false`, Switch / Qwen2-MoE; routed experts scaled so that the zero router keeps the function).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub norm_topk: bool,
    #[command(flatten)]
    pub layout: super::args::LayoutArg,
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
        let layout = a.layout.request()?;
        if !(a.temperature > 0.0 && a.temperature.is_finite()) {
            // Checked here: the MoE config would report it under the
            // --experts/--allocation source, naming the wrong option.
            anyhow::bail!("--temperature: the router temperature must be a finite number > 0 (got {})", a.temperature);
        }
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
        let router_init = match a.router_init {
            RouterInitArg::Zeros => RouterInit::Zeros,
            RouterInitArg::Random => RouterInit::Random { std: a.router_std },
            RouterInitArg::Hidden => {
                let p = a.expert_prompts.as_ref().context("--router-init hidden needs --expert-prompts FILE")?;
                hidden_rows::<B>(&m, p, &device)?
            }
            RouterInitArg::CheapEmbed => {
                let p = a.expert_prompts.as_ref().context("--router-init cheap-embed needs --expert-prompts FILE")?;
                cheap_embed_init(&m, p)?
            }
        };
        let kind = match a.noise_kind {
            NoiseArg::Mul => NoiseKind::Multiplicative,
            NoiseArg::Add => NoiseKind::Additive,
        };
        let opts = UpcycleOptions {
            experts,
            experts_source,
            top_k: a.top_k,
            frozen: if a.no_frozen { vec![] } else { a.frozen.clone() },
            router_init,
            noise: CopyNoise { kind, std: a.noise },
            seed: a.seed,
            temperature: a.temperature,
            dtype,
            router_aux_loss_coef: 0.01,
            shared: SharedExperts {
                count: a.shared_experts,
                gate: a.shared_gate,
                init: match a.shared_init {
                    SharedInitArg::Zero => SharedInit::Zero,
                    SharedInitArg::Copy => SharedInit::Copy,
                },
                frozen: a.shared_frozen,
            },
            drop_ratio: a.drop_ratio,
            granularity: a.granularity,
            norm_topk_prob: a.norm_topk,
            layout,
            experts_format: a.layout.experts_format()?,
        };
        let tok = m.tokenizer.as_ref().and_then(|t| t.to_hf_json()).map(String::into_bytes);
        let card = super::card::card(CardMethod::Upcycling, [("dense base".to_string(), a.model.as_path())]);
        let write_opts = a.output.write_options().with_card(Some(card));
        let report = upcycle(m.source.as_ref(), &m.config, &opts, &a.output.out, tok, write_opts)?;
        super::moe_summary::print(&report, &a.output.out, started, a.output.json)
    }
}
