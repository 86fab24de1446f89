//! DUME's ridge router in the browser, step for step as `moe-studio route`:
//! the same tokenisation and 90/10 held-out split, `collect_stats` (one
//! oracle-routed forward pass per sequence, yielding between sequences),
//! `solve_all`, `set_routers`, `routing_accuracy`, and the routed checkpoint
//! through `plan_routed` / `write_routed_tensors` into memory. Adds the
//! per-domain perplexity table: DUME (learned routing) vs averaging (mean
//! of the experts) vs oracle (every token to its domain's expert).

use moe_shared::eval::{evaluate, PerplexityOptions};
use moe_shared::methods::route::{
    check_domains, collect_stats, domain_sequences, empty_stats, plan_routed, routed_config, routing_accuracy,
    set_routers, solve_all, stats_to_safetensors, write_routed_tensors, DomainSequences, RouteOptions, RouteReport,
};
use moe_shared::methods::sink::MemorySink;
use moe_shared::model::{load_transformer, Routing};

use super::artifact::{into_artifact, pretty, tokenizer_json, Output};
use super::average::AveragedExperts;
use super::{cpu_model, msg};
use crate::store::{Artifact, Picked};
use crate::task::Task;

/// One domain: a name and its text (expert `i` = domain `i`).
#[derive(Debug, Clone)]
pub struct DomainText {
    /// Domain name (`en`, `code`, ...).
    pub name: String,
    /// Its text.
    pub text: String,
}

/// Perplexities of one domain's held-out text.
#[derive(Debug, Clone, PartialEq)]
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
}

/// Mean over the MoE layers (shared with the CLI's report).
pub use moe_shared::methods::route::mean_accuracy as mean;

/// Runs the ridge router on the MoE `src` with one text per expert.
///
/// # Errors
/// Not an MoE, expert count != domains, empty texts, solve errors,
/// cancellation.
pub async fn run(
    task: &Task,
    src: &Picked,
    domains: &[DomainText],
    opts: RouteOptions,
    eval_tokens: usize,
    with_ppl: bool,
) -> Result<RouteResult, String> {
    let t0 = crate::web::now_ms();
    let m = src.model();
    let moe = m.moe.clone().ok_or_else(|| format!("{} is not an MoE: upcycle or MoErge first", src.name()))?;
    let tok = m.tokenizer.as_ref().ok_or_else(|| format!("{} has no tokenizer", src.name()))?;
    if !(opts.lambda.is_finite() && opts.lambda > 0.0) {
        return Err("lambda must be a number > 0".into());
    }
    // The CLI's domain check, tokenisation and held-out split (shared).
    check_domains(&moe, domains.len()).map_err(msg)?;
    let seqs: Vec<DomainSequences> = domains
        .iter()
        .map(|d| domain_sequences(tok, &d.name, (&d.text, "the text"), None, opts.context))
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
    task.step("loading the MoE", 0.0).await?;
    let mut model = cpu_model(m)?;
    let mut stats = empty_stats(&model, opts.bias);
    let mut tokens = Vec::new();
    let n = domains.len() as f64;
    for (i, d) in domains.iter().enumerate() {
        let mut used = 0usize;
        let total: usize = train[i].iter().map(Vec::len).sum::<usize>().min(opts.max_tokens).max(1);
        for seq in train[i].iter() {
            if used >= opts.max_tokens {
                break;
            }
            used += collect_stats(&model, i, std::slice::from_ref(seq), opts.max_tokens - used, &mut stats)
                .map_err(|e| format!("domain `{}`: {e}", d.name))?;
            let frac = (i as f64 + used as f64 / total as f64) / n * 0.6;
            task.step(&format!("ridge statistics: {} ({used} tokens)", d.name), frac).await?;
        }
        if used == 0 {
            return Err(format!("domain `{}`: no tokens to collect statistics from", d.name));
        }
        tokens.push(used);
    }
    task.step("solving the ridge systems", 0.6).await?;
    let routers = solve_all(&stats, opts.lambda).map_err(msg)?;
    set_routers(&mut model, &routers, opts.top_k, opts.temperature);
    let route_millis = crate::web::now_ms() - t0;
    let mut accuracy = Vec::new();
    for (i, d) in domains.iter().enumerate() {
        task.step(&format!("routing accuracy: {}", d.name), 0.65 + 0.1 * i as f64 / n).await?;
        accuracy.push(routing_accuracy(&model, i, held[i], eval_tokens));
    }
    // Perplexity: DUME vs averaging vs oracle on each held-out text.
    let mut ppl = Vec::new();
    if with_ppl {
        let avg_src = AveragedExperts::new(m.source.as_ref(), &m.config, &moe);
        let averaged = load_transformer::<crate::Cpu>(&m.config, None, &avg_src, &Default::default()).map_err(msg)?;
        let window = opts.context.min(m.config.max_position_embeddings).max(2);
        let popts = PerplexityOptions { window, stride: window, max_tokens: Some(eval_tokens), ..Default::default() };
        let dev = Default::default();
        for (i, d) in domains.iter().enumerate() {
            task.step(&format!("perplexity: {}", d.name), 0.75 + 0.2 * i as f64 / n).await?;
            let ids: Vec<u32> = held[i].concat();
            let ev = |model: &moe_shared::model::Transformer<crate::Cpu>, r: Routing| {
                evaluate(model, &ids, popts, r, &dev, |_, _| {}).map(|e| e.report).map_err(msg)
            };
            let dume = ev(&model, Routing::Learned)?;
            let oracle = ev(&model, Routing::Forced(i))?;
            let avg = ev(&averaged, Routing::Learned)?;
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
    task.step("writing the routed checkpoint", 0.95).await?;
    let mut sink = MemorySink::new(plan.planned.clone());
    write_routed_tensors(m.source.as_ref(), &plan, &routers, 0..plan.tensors.len(), &mut sink).map_err(msg)?;
    let report = RouteReport::new(&m.path, &seqs, tokens.clone(), opts, accuracy.clone());
    let extra = vec![
        ("ridge_stats.safetensors".to_string(), stats_to_safetensors(&stats, &names).map_err(msg)?),
        ("ridge_report.json".to_string(), pretty(&serde_json::to_value(&report).unwrap_or_default())),
    ];
    let out = Output {
        name: format!("{}-routed", src.name()),
        method: "route",
        safetensors: sink.into_safetensors().map_err(msg)?,
        config_json: pretty(&plan.config_json),
        tokenizer: m.tokenizer.clone(),
        tokenizer_json: tokenizer_json(m.tokenizer.as_ref()),
        extra,
        millis: crate::web::now_ms() - t0,
    };
    Ok(RouteResult { artifact: into_artifact(out)?, accuracy, tokens, ppl, route_millis })
}
