//! DUME's ridge router in the browser, step for step as `moe-studio route`:
//! the same tokenisation and 90/10 held-out split, the same fit and
//! held-out accuracy (`moe_shared::ops::route::{fit, accuracy}`; the Gram
//! products optionally on WebGPU, handed to the fit), and the routed checkpoint
//! through `plan_routed` / `write_routed_tensors` into memory. Adds the
//! per-domain perplexity table: DUME (learned routing) vs averaging (mean
//! of the experts) vs oracle (every token to its domain's expert).

use moe_kernels::{Gpu, GramAccumulator};
use moe_shared::eval::{evaluate, PerplexityOptions};
use moe_shared::methods::ridge::RidgeStats;
use moe_shared::methods::route::{
    accuracy_markdown, check_domains, domain_sequences, empty_stats, forced_ffn_inputs, plan_routed, routed_config,
    stats_to_safetensors, within_budget, write_routed_tensors, DomainSequences, RouteReport,
};
use moe_shared::model::Transformer;
use moe_shared::model::{load_transformer, Routing};
use moe_shared::ops::route::{Collected, RouteFit, RouteParams};
use moe_shared::tensor_io::sink::MemorySink;

use super::artifact::{card_file, into_artifact, pretty, tokenizer_json, Output};
use super::average::AveragedExperts;
use super::progress::Progress;
use super::{cpu_model, msg};
use crate::store::{Artifact, Picked};
use moe_shared::checkpoint::output::card_moe_details;
use moe_shared::tensor_io::card::{CardMethod, ModelCard};

/// One domain: a name and its text (expert `i` = domain `i`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DomainText {
    /// Domain name (`en`, `code`, ...).
    pub name: String,
    /// Its text.
    pub text: String,
    /// Held-out text scored for the accuracy and the perplexity table
    /// (`route --domain NAME=TRAIN:HELDOUT`); `None`: the last 10% of
    /// `text`, as `route --domain NAME=TEXT`.
    #[serde(default)]
    pub heldout: Option<String>,
}

/// Perplexities of one domain's held-out text.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PplRow {
    /// Domain name.
    pub domain: String,
    /// Scored tokens.
    pub tokens: usize,
    /// Routed by the solved router.
    pub dume: f64,
    /// The experts averaged into one dense model.
    pub averaging: f64,
    /// Every token forced to the domain's own expert.
    pub oracle: f64,
}

/// What the ridge router produced.
pub struct RouteResult {
    /// The routed checkpoint.
    pub artifact: Artifact,
    /// `[domain][layer]` held-out routing accuracy (`None`: dense layer).
    pub accuracy: Vec<Vec<Option<f64>>>,
    /// Statistics tokens per domain.
    pub tokens: Vec<usize>,
    /// Perplexity table.
    pub ppl: Vec<PplRow>,
    /// Milliseconds for statistics + solve (the CLI's `route` work).
    pub route_millis: f64,
    /// Where the Gram statistics were accumulated (`WebGPU` or `CPU`).
    pub gram_on: String,
}

/// Rows (tokens) per f32 block on the GPU: each block's `XᵀX` / `XᵀY` is
/// read back and added into the f64 statistics, so f32 rounding never
/// builds up over more than this many rows (relative error of a block sum
/// ~ 1e-7 · sqrt(rows), against the CLI's f64 accumulation).
pub const GRAM_BLOCK_ROWS: usize = 4096;

/// Rows staged per dispatch of one layer's accumulator (bounds the staging
/// buffer of each of the `L` accumulators to `512 · (d + 1) · 4` bytes).
const GRAM_CHUNK_ROWS: usize = 512;

fn gpu_err(e: moe_kernels::KernelError) -> String {
    format!("WebGPU ridge statistics: {e}")
}

/// Reads every layer's block, adds it into `stats` in f64 (with `rows`
/// tokens of expert `domain`) and clears the accumulators.
async fn flush(
    accs: &mut [Option<GramAccumulator>],
    stats: &mut [Option<RidgeStats>],
    domain: usize,
    rows: usize,
) -> Result<(), String> {
    for (acc, s) in accs.iter_mut().zip(stats.iter_mut()) {
        if let (Some(acc), Some(s)) = (acc.as_mut(), s.as_mut()) {
            let (a, b) = acc.read().await.map_err(gpu_err)?;
            let mut tokens = vec![0u64; s.num_experts()];
            tokens[domain] = rows as u64;
            let block = RidgeStats {
                dim: s.dim,
                bias: s.bias,
                a: a.into_iter().map(f64::from).collect(),
                b: b.into_iter().map(f64::from).collect(),
                tokens,
            };
            s.merge(&block).map_err(msg)?;
            acc.clear();
        }
    }
    Ok(())
}

/// `collect_stats` with the Gram products on the WGSL kernel: the same
/// rows (`forced_ffn_inputs`, with the constant 1 of the bias and the
/// one-hot of `domain`), `XᵀX` and `XᵀY` accumulated per MoE layer in f32
/// on the GPU over blocks of at most [`GRAM_BLOCK_ROWS`] tokens, each block
/// added into `stats` in f64 on the CPU. Returns the tokens used;
/// `on_tokens(used)` after each sequence.
///
/// # Errors
/// A layer without expert `domain`, no tokens, the kernel's errors.
pub async fn gpu_collect_stats(
    gpu: &Gpu,
    model: &Transformer<crate::Cpu>,
    domain: usize,
    sequences: &[Vec<u32>],
    max_tokens: usize,
    stats: &mut [Option<RidgeStats>],
    mut on_tokens: impl FnMut(usize),
) -> Result<usize, String> {
    for (l, s) in stats.iter().enumerate() {
        if let Some(s) = s.as_ref().filter(|s| domain >= s.num_experts()) {
            return Err(format!("layer {l} has {} experts; there is no expert for domain {domain}", s.num_experts()));
        }
    }
    let want: Vec<bool> = stats.iter().map(Option::is_some).collect();
    let mut accs: Vec<Option<GramAccumulator>> = stats
        .iter()
        .map(|s| s.as_ref().map(|s| gpu.gram_chunked(s.p(), s.num_experts(), GRAM_CHUNK_ROWS)).transpose())
        .collect::<Result<_, _>>()
        .map_err(gpu_err)?;
    let (mut used, mut in_block) = (0usize, 0usize);
    for seq in within_budget(sequences, Some(max_tokens)) {
        let take = seq.len();
        let (inputs, _) = forced_ffn_inputs(model, domain, &[seq], &want).map_err(msg)?;
        for (l, x) in inputs.into_iter().enumerate() {
            let (Some(acc), Some(x), Some(s)) = (accs[l].as_mut(), x, stats[l].as_ref()) else { continue };
            let (d, e) = (s.dim, s.num_experts());
            let rows: Vec<f32> = if s.bias {
                x.chunks_exact(d).flat_map(|r| r.iter().copied().chain(std::iter::once(1.0))).collect()
            } else {
                x
            };
            let n = take;
            let mut y = vec![0f32; n * e];
            for i in 0..n {
                y[i * e + domain] = 1.0;
            }
            acc.add(&rows, &y).map_err(gpu_err)?;
        }
        used += take;
        in_block += take;
        if in_block >= GRAM_BLOCK_ROWS {
            flush(&mut accs, stats, domain, in_block).await?;
            in_block = 0;
        }
        on_tokens(used);
    }
    if in_block > 0 {
        flush(&mut accs, stats, domain, in_block).await?;
    }
    if used == 0 {
        return Err(format!("domain {domain}: no tokens to collect statistics from"));
    }
    Ok(used)
}

/// Held-out tokens per domain behind the router page's routing accuracy and
/// its perplexity table (DUME / averaging / oracle: three passes), which
/// the pages ask for ([`RouteParams::eval_tokens`]). 3,000 covers most of
/// the teaching preset's held-out documents (12,000 characters: the CLI's
/// checks score all of them), so the tab's table shows what `preset.json`
/// checked; the CLI's `route` evaluates as many as it is given.
pub const TAB_EVAL_TOKENS: usize = 3000;

/// The router page's statistics tokens per domain before a preset sets its
/// own (the CLI's default is every token; a tab keeps the step within
/// seconds on the demo models).
pub const TAB_MAX_TOKENS: usize = 10_000;

/// The route parameters the tab's pages send: `λ`, top-k and statistics
/// tokens per domain from the page, the tab's held-out budget
/// ([`TAB_EVAL_TOKENS`]), the rest at the operation's defaults.
pub fn tab_params(lambda: f64, top_k: usize, max_tokens: usize) -> RouteParams {
    RouteParams { lambda, top_k, max_tokens: Some(max_tokens), eval_tokens: TAB_EVAL_TOKENS, ..RouteParams::default() }
}

/// Mean over the MoE layers (shared with the CLI's report).
pub use moe_shared::methods::route::mean_accuracy as mean;

/// Runs the ridge router on the MoE `src` with one text per expert;
/// progress in tokens (statistics, accuracy), layers (solve) and windows
/// (perplexity).
///
/// # Errors
/// Not an MoE, expert count != domains, empty texts, solve errors.
pub async fn run(
    progress: &Progress,
    src: &Picked,
    domains: &[DomainText],
    params: &RouteParams,
    with_ppl: bool,
    use_gpu: bool,
) -> Result<RouteResult, String> {
    let t0 = crate::web::now_ms();
    let m = src.model();
    let moe = m.moe.clone().ok_or_else(|| format!("{} is not an MoE: upcycle or MoErge first", src.name()))?;
    let tok = m.tokenizer.as_ref().ok_or_else(|| format!("{} has no tokenizer", src.name()))?;
    // The CLI's domain check, tokenisation and held-out split (shared).
    check_domains(&moe, domains.len()).map_err(msg)?;
    // The CLI's option rules (shared), before any work: top-k 0 used to
    // panic inside the forward pass and kill the tab.
    params.check(domains.len()).map_err(|e| e.to_string())?;
    let (opts, eval_tokens) = (params.options(moe_shared::corpus::DocSplit::Blank), params.eval_tokens);
    let gram_on = if use_gpu && super::gpu::gpu().is_some() { "WebGPU" } else { "CPU" }.to_string();
    let seqs: Vec<DomainSequences> = domains
        .iter()
        .map(|d| {
            let held = d.heldout.as_deref().map(|h| (h, "the held-out text"));
            domain_sequences(tok, &d.name, (&d.text, "the text"), held, opts.docs, opts.context)
        })
        .collect::<Result<_, _>>()
        .map_err(msg)?;
    let train: Vec<&Vec<Vec<u32>>> = seqs.iter().map(|d| &d.train).collect();
    let held: Vec<&Vec<Vec<u32>>> = seqs.iter().map(|d| &d.heldout).collect();
    // The routed checkpoint's plan comes first: the memory guard needs its
    // size (the forward model, freed before the output is written, is the
    // other phase).
    let names: Vec<String> = domains.iter().map(|d| d.name.clone()).collect();
    let routed = routed_config(&moe, &opts);
    let provenance =
        serde_json::json!({"method": "dume-ridge-router", "source": m.path, "domains": names, "lambda": opts.lambda});
    let plan = plan_routed(m.source.as_ref(), &m.config, &routed, provenance, moe_shared::layout::LayoutRequest::Auto)
        .map_err(msg)?;
    let moe_layers = moe.layers.iter().flatten().count() as u64;
    crate::memory::ensure(
        "the ridge router",
        crate::memory::route_need(
            crate::load::params_u64(&m.config, Some(&moe)),
            crate::memory::ridge_stats_bytes(moe_layers, m.config.hidden_size as u64, domains.len() as u64),
            crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64)),
        ),
    )?;
    progress.step("building the MoE for the forward passes", 0, 1, "models");
    let mut model = cpu_model(m)?;
    let gpu = if gram_on == "WebGPU" { super::gpu::gpu() } else { None };
    // The WebGPU Gram pass gathers the statistics here; without it the
    // shared fit collects them on the CPU, as the CLI's `route` does.
    let collected = match &gpu {
        Some(g) => {
            let mut stats = empty_stats(&model, opts.bias);
            let cap = opts.max_tokens.unwrap_or(usize::MAX);
            let all: u64 = train.iter().map(|t| t.iter().map(Vec::len).sum::<usize>().min(cap) as u64).sum();
            let (mut tokens, mut done) = (Vec::new(), 0u64);
            for (i, d) in domains.iter().enumerate() {
                let what = format!("ridge statistics ({}, Gram on WebGPU)", d.name);
                let start = done;
                let used = gpu_collect_stats(g, &model, i, train[i], cap, &mut stats, |u| {
                    progress.step(&what, start + u as u64, all, "tokens")
                })
                .await
                .map_err(|e| format!("domain `{}`: {e}", d.name))?;
                done += used as u64;
                tokens.push(used);
            }
            Some(Collected { stats, tokens })
        }
        None => None,
    };
    let mut on_step = |what: &str, done: u64, total: u64, unit: &str| match what.strip_suffix(')') {
        Some(w) if what.starts_with("ridge statistics (") => {
            progress.step(&format!("{w}, Gram on CPU)"), done, total, unit)
        }
        _ => progress.step(what, done, total, unit),
    };
    // The CLI's fit (shared): statistics (unless gathered above), solve, routers.
    let RouteFit { stats, tokens, routers } =
        moe_shared::ops::route::fit(&mut model, &seqs, params, collected, &mut on_step).map_err(msg)?;
    let route_millis = crate::web::now_ms() - t0;
    let details = moe_shared::ops::route::accuracy(&model, &seqs, params, &mut on_step);
    // Perplexity: DUME vs averaging vs oracle on each held-out text.
    let mut ppl = Vec::new();
    if with_ppl {
        let avg_src = AveragedExperts::new(m.source.as_ref(), &m.config, &moe);
        let averaged = load_transformer::<crate::Cpu>(&m.config, None, &avg_src, &Default::default()).map_err(msg)?;
        let window = opts.context.min(m.config.max_position_embeddings).max(2);
        let popts = PerplexityOptions { window, stride: window, max_tokens: Some(eval_tokens), ..Default::default() };
        let dev = Default::default();
        for (i, d) in domains.iter().enumerate() {
            let ids: Vec<u32> = held[i].concat();
            let ev = |model: &moe_shared::model::Transformer<crate::Cpu>, r: Routing, what: &str| {
                let label = format!("perplexity ({}, {what})", d.name);
                evaluate(model, &ids, popts, r, &dev, |w, total| {
                    progress.step(&label, w as u64, total as u64, "windows")
                })
                .map(|e| e.report)
                .map_err(msg)
            };
            let dume = ev(&model, Routing::Learned, "DUME")?;
            let oracle = ev(&model, Routing::Forced(i), "oracle")?;
            let avg = ev(&averaged, Routing::Learned, "averaging")?;
            ppl.push(PplRow {
                domain: d.name.clone(),
                tokens: dume.tokens,
                dume: dume.ppl,
                averaging: avg.ppl,
                oracle: oracle.ppl,
            });
        }
    }
    // Free the Burn model before the output is built: wasm32 has 4 GiB, and
    // a 135M-parameter MoE in f32 is ~0.9 GB per copy.
    drop(model);
    progress.step("writing the routed checkpoint", 0, 1, "files");
    let mut sink = MemorySink::new(plan.planned.clone());
    write_routed_tensors(m.source.as_ref(), &plan, &routers, 0..plan.tensors.len(), &mut sink).map_err(msg)?;
    let report = RouteReport::new(&m.path, &seqs, tokens.clone(), opts, details.clone());
    let name = format!("{}-routed", src.name());
    let mut card = ModelCard::new(CardMethod::Dume).input("MoE", src.name(), None);
    card_moe_details(&mut card, &m.config, &plan.choice, &plan.planned);
    card.detail("domains (expert order)", names.join(", "));
    card.section("Routing accuracy", accuracy_markdown(&names, &details, &report.options));
    let accuracy: Vec<Vec<Option<f64>>> = details.into_iter().map(|d| d.per_layer).collect();
    let extra = vec![
        ("ridge_stats.safetensors".to_string(), stats_to_safetensors(&stats, &names).map_err(msg)?),
        ("ridge_report.json".to_string(), pretty(&serde_json::to_value(&report).unwrap_or_default())),
        card_file(card, &name, &plan.config_json),
    ];
    let out = Output {
        name,
        method: "route",
        safetensors: sink.into_safetensors().map_err(msg)?,
        config_json: pretty(&plan.config_json),
        tokenizer: m.tokenizer.clone(),
        tokenizer_json: tokenizer_json(m.tokenizer.as_ref()),
        extra,
        millis: crate::web::now_ms() - t0,
    };
    Ok(RouteResult { artifact: into_artifact(out)?, accuracy, tokens, ppl, route_millis, gram_on })
}
