//! DUME's ridge router applied to an MoErged model: collect the ridge
//! statistics with one oracle-routed forward pass per domain, solve every
//! MoE layer's router, measure per-layer routing accuracy on held-out text,
//! and write the routed checkpoint with its statistics beside it.
//!
//! Source: DUME (2026), router section; methods.md §2. Domain `i` is
//! expert `i`: during collection every MoE layer is forced to expert `i`
//! (as if the router were an oracle) and the FFN input of each token (what
//! the router sees) is accumulated into that layer's [`RidgeStats`].

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::ridge::{RidgeStats, RouterWeights};
use crate::config::MoeConfig;
use crate::error::{Result, StudioError};
use crate::model::linear::linear_from_hf;
use crate::model::{ForwardOptions, Mlp, Padding, Routing, Trace, Transformer};

/// Options of the ridge router.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RouteOptions {
    /// Ridge strength `λ` (> 0; reference 1e-2).
    pub lambda: f64,
    /// Experts per token at inference (reference 1).
    pub top_k: usize,
    /// Router temperature `T` (reference 1.0 for evaluation).
    pub temperature: f64,
    /// An optional cap on the statistics tokens per domain (`None`: every
    /// token of the domain's training text, as the reference code's
    /// statistics pass over its whole training set).
    pub max_tokens: Option<usize>,
    /// Tokens per statistics sequence: the reference code's per-sequence
    /// position cap (`context_dim`, 512: `X = x[:, :context_dim, :]`); the
    /// domain's token stream is cut into sequences of this length and every
    /// position of each counts.
    pub context: usize,
    /// Append the constant-1 column (router bias). Without it the result
    /// exports in a public layout (Mixtral, Qwen2-MoE).
    pub bias: bool,
    /// How the domains' plain-text files are cut into documents
    /// ([`crate::corpus::DocSplit`]).
    #[serde(default)]
    pub docs: crate::corpus::DocSplit,
}

impl Default for RouteOptions {
    fn default() -> Self {
        RouteOptions {
            lambda: 1e-2,
            top_k: 1,
            temperature: 1.0,
            max_tokens: None,
            context: 512,
            bias: true,
            docs: crate::corpus::DocSplit::Blank,
        }
    }
}

/// Splits a token stream into sequences of at most `context` tokens
/// (the last, shorter one kept when it has at least 2 tokens).
pub fn pack_sequences(ids: &[u32], context: usize) -> Vec<Vec<u32>> {
    ids.chunks(context.max(2)).filter(|c| c.len() >= 2).map(|c| c.to_vec()).collect()
}

/// Sequences per right-padded forward pass when collecting statistics and
/// measuring routing accuracy.
pub const SEQUENCES_PER_PASS: usize = 4;

/// The prefixes of `sequences` that fit in `max_tokens` tokens in total
/// (the last one cut short; `None`: all of them), skipping empty ones: the
/// statistics tokens of one domain (docs/methods.md §2), the same on the CPU path
/// here and on the tab's WebGPU Gram path.
pub fn within_budget(sequences: &[Vec<u32>], max_tokens: Option<usize>) -> Vec<&[u32]> {
    let max_tokens = max_tokens.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut used = 0usize;
    for seq in sequences {
        if used >= max_tokens {
            break;
        }
        let take = seq.len().min(max_tokens - used);
        if take > 0 {
            out.push(&seq[..take]);
            used += take;
        }
    }
    out
}

/// One right-padded forward pass over `seqs` with a trace.
fn forward_trace<B: Backend>(
    model: &Transformer<B>,
    seqs: &[&[u32]],
    opts: ForwardOptions,
) -> Result<(Trace<B>, Padding)> {
    let device = model.embed_tokens.weight.val().device();
    let (t, padding) = Padding::pad_tensor::<B>(seqs, 0, &device)?;
    let mut trace = Trace::default();
    let _ = model.forward_hidden_masked(t, Some(&padding), None, opts, Some(&mut trace));
    Ok((trace, padding))
}

/// Empty statistics for every MoE layer of `model` (`None` for dense
/// layers).
pub fn empty_stats<B: Backend>(model: &Transformer<B>, bias: bool) -> Vec<Option<RidgeStats>> {
    let d = model.config.hidden_size;
    model
        .layers
        .iter()
        .map(|b| match &b.mlp {
            Mlp::Moe(m) => Some(RidgeStats::new(d, m.num_experts(), bias)),
            Mlp::Dense(_) => None,
        })
        .collect()
}

/// The FFN inputs (what the router sees) of `seqs` (one right-padded
/// forward pass) with every MoE layer forced to expert `domain`: per layer
/// `l` with `want[l]`, the `[tokens, d]` row-major values of the real
/// tokens (padding rows dropped, sequences one after the other); `None`
/// for the others. These are the rows [`collect_stats`] accumulates (and
/// the browser's WebGPU Gram kernel takes).
///
/// # Errors
/// [`StudioError::Invalid`] when `seqs` is empty or holds an empty sequence.
pub fn forced_ffn_inputs<B: Backend>(
    model: &Transformer<B>,
    domain: usize,
    seqs: &[&[u32]],
    want: &[bool],
) -> Result<(Vec<Option<Vec<f32>>>, usize)> {
    let opts = ForwardOptions { routing: Routing::Forced(domain), capture_ffn_inputs: true, ..Default::default() };
    let (trace, padding) = forward_trace(model, seqs, opts)?;
    let rows = trace
        .ffn_inputs
        .into_iter()
        .enumerate()
        .map(|(l, x)| {
            want.get(l)
                .copied()
                .unwrap_or(false)
                .then(|| padding.select_valid(x).into_data().convert::<f32>().to_vec().expect("f32"))
        })
        .collect();
    Ok((rows, padding.num_valid()))
}

/// Accumulates the statistics of domain `domain` (= expert index) from
/// `sequences`, forcing every MoE layer to that expert; stops after
/// `max_tokens` tokens when given (`None`: every sequence). The sequences
/// [`within_budget`] keeps go through the model [`SEQUENCES_PER_PASS`] at a
/// time ([`accumulate_group`]). Returns the tokens used.
///
/// # Errors
/// [`StudioError::Invalid`] when a layer has no expert `domain` or no
/// sequence has tokens.
pub fn collect_stats<B: Backend>(
    model: &Transformer<B>,
    domain: usize,
    sequences: &[Vec<u32>],
    max_tokens: Option<usize>,
    stats: &mut [Option<RidgeStats>],
) -> Result<usize> {
    let mut used = 0usize;
    for group in within_budget(sequences, max_tokens).chunks(SEQUENCES_PER_PASS) {
        used += accumulate_group(model, domain, group, stats)?;
    }
    if used == 0 {
        return Err(StudioError::Invalid(format!("domain {domain}: no tokens to collect statistics from")));
    }
    Ok(used)
}

/// One forward pass of [`collect_stats`]: the FFN inputs of `group` (at
/// most [`SEQUENCES_PER_PASS`] non-empty sequences, one right-padded batch)
/// with every MoE layer forced to expert `domain`, added into that layer's
/// statistics (`A += XᵀX`, `B += XᵀY` with `Y` the one-hot of `domain`;
/// docs/methods.md §2). Returns the tokens added.
///
/// # Errors
/// [`StudioError::Invalid`] when a layer has no expert `domain`, `group`
/// is empty or holds an empty sequence.
pub fn accumulate_group<B: Backend>(
    model: &Transformer<B>,
    domain: usize,
    group: &[&[u32]],
    stats: &mut [Option<RidgeStats>],
) -> Result<usize> {
    for (l, s) in stats.iter().enumerate() {
        if let Some(s) = s {
            if domain >= s.num_experts() {
                return Err(StudioError::Invalid(format!(
                    "layer {l} has {} experts; there is no expert for domain {domain}",
                    s.num_experts()
                )));
            }
        }
    }
    let moe: Vec<bool> = stats.iter().map(Option::is_some).collect();
    let (rows, valid) = forced_ffn_inputs(model, domain, group, &moe)?;
    for (l, x) in rows.into_iter().enumerate() {
        if let (Some(s), Some(x)) = (stats[l].as_mut(), x) {
            s.accumulate(&x, domain)?;
        }
    }
    Ok(valid)
}

/// Solves every MoE layer's router.
///
/// # Errors
/// As [`RidgeStats::solve`].
pub fn solve_all(stats: &[Option<RidgeStats>], lambda: f64) -> Result<Vec<Option<RouterWeights>>> {
    stats.iter().map(|s| s.as_ref().map(|s| s.solve(lambda)).transpose()).collect()
}

/// Solves every MoE layer's router with `λ_l = relative · tr(A_l) / p`
/// ([`RidgeStats::mean_diagonal`]): a regularisation whose strength does
/// not depend on how many statistics tokens were collected.
///
/// # Errors
/// As [`RidgeStats::solve`].
pub fn solve_all_relative(stats: &[Option<RidgeStats>], relative: f64) -> Result<Vec<Option<RouterWeights>>> {
    stats.iter().map(|s| s.as_ref().map(|s| s.solve(relative * s.mean_diagonal())).transpose()).collect()
}

/// Puts solved routers into `model` (weight `[E, d]`, optional bias) with
/// the given top-k and temperature.
pub fn set_routers<B: Backend>(
    model: &mut Transformer<B>,
    routers: &[Option<RouterWeights>],
    top_k: usize,
    temperature: f64,
) {
    let device = model.embed_tokens.weight.val().device();
    for (block, r) in model.layers.iter_mut().zip(routers) {
        if let (Mlp::Moe(m), Some(r)) = (&mut block.mlp, r) {
            m.gate = linear_from_hf(&r.weight, r.num_experts, r.dim, r.bias.clone(), &device);
            m.top_k = top_k.min(r.num_experts);
            m.temperature = temperature;
        }
    }
}

/// Held-out routing accuracy of one domain ([`routing_accuracy_detail`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingAccuracy {
    /// Per layer, the fraction of tokens whose top-1 expert is the
    /// domain's (`None`: dense layer).
    pub per_layer: Vec<Option<f64>>,
    /// The fraction of tokens routed to the domain's expert as top-1 in
    /// *every* MoE layer (what the per-layer mean cannot show: 95 % per
    /// layer over 30 layers can be anything from 0 to 95 % of the tokens).
    pub all_layers: f64,
    /// Tokens scored.
    pub tokens: usize,
}

/// Routing accuracy on held-out sequences of domain `domain`, with the
/// model routing by its routers: per layer, the fraction of tokens whose
/// highest-weighted chosen expert is `domain`, and the fraction of tokens
/// routed to it in every MoE layer. Uses at most `max_tokens` tokens.
pub fn routing_accuracy_detail<B: Backend>(
    model: &Transformer<B>,
    domain: usize,
    sequences: &[Vec<u32>],
    max_tokens: usize,
) -> RoutingAccuracy {
    let n_layers = model.layers.len();
    let mut hits = vec![0usize; n_layers];
    let mut total = 0usize;
    let mut everywhere = 0usize;
    for group in within_budget(sequences, Some(max_tokens)).chunks(SEQUENCES_PER_PASS) {
        let Ok((trace, padding)) = forward_trace(model, group, ForwardOptions::default()) else { continue };
        let n = padding.num_valid();
        let mut all = vec![true; n];
        for (l, r) in trace.routing.iter().enumerate() {
            if let Some(r) = r {
                // One entry per real token; chosen[t*k] is the top-1
                // (largest logit) expert.
                for (t, ok) in all.iter_mut().enumerate() {
                    let hit = r.chosen[t * r.top_k] as usize == domain;
                    hits[l] += usize::from(hit);
                    *ok &= hit;
                }
            }
        }
        everywhere += all.iter().filter(|&&b| b).count();
        total += n;
    }
    RoutingAccuracy {
        per_layer: model
            .layers
            .iter()
            .enumerate()
            .map(|(l, b)| matches!(b.mlp, Mlp::Moe(_)).then(|| hits[l] as f64 / total.max(1) as f64))
            .collect(),
        all_layers: everywhere as f64 / total.max(1) as f64,
        tokens: total,
    }
}

/// Per-layer routing accuracy on held-out sequences of domain `domain`
/// (`None` for dense layers): [`routing_accuracy_detail`]'s `per_layer`.
pub fn routing_accuracy<B: Backend>(
    model: &Transformer<B>,
    domain: usize,
    sequences: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Option<f64>> {
    routing_accuracy_detail(model, domain, sequences, max_tokens).per_layer
}

/// One domain of a ridge-router run: its token sequences for the
/// statistics and for the held-out routing accuracy (domain `i` = expert `i`).
#[derive(Debug, Clone, PartialEq)]
pub struct DomainSequences {
    /// Domain name (`en`, `code`, ...).
    pub name: String,
    /// Statistics sequences (at most `context` tokens each).
    pub train: Vec<Vec<u32>>,
    /// Held-out sequences.
    pub heldout: Vec<Vec<u32>>,
    /// [`crate::corpus::stream_sha256`] of the training text's whole
    /// stream (before the held-out cut when there is no held-out text).
    pub stream_sha256: String,
    /// The held-out text's, when it is its own text.
    pub heldout_sha256: Option<String>,
}

/// Checks that every MoE layer of `moe` has one expert per domain (DUME:
/// domain `i` routes to expert `i`).
///
/// # Errors
/// [`StudioError::Invalid`] naming the first layer whose expert count differs.
pub fn check_domains(moe: &MoeConfig, domains: usize) -> Result<()> {
    for (l, s) in moe.layers.iter().enumerate() {
        if let Some(s) = s {
            if s.num_experts != domains {
                return Err(StudioError::Invalid(format!(
                    "layer {l} has {} experts but {domains} domains were given (one per expert, in order)",
                    s.num_experts
                )));
            }
        }
    }
    Ok(())
}

/// Tokenises one domain (`text`, and `heldout` when given; `what` /
/// `heldout_what` name them in errors: a file, "the text") into its token
/// stream ([`crate::corpus::text_stream`]: documents cut by `split`, each
/// followed by the end-of-text token — the ids `train` and `eval` read)
/// and packs it into sequences of `context` tokens ([`pack_sequences`]);
/// without held-out text the last 10% of the tokens are held out
/// (methods.md §2). The CLI's `route` (files) and the tab's router (pasted
/// texts) both prepare their domains here, so they split and pack the same
/// tokens.
///
/// # Errors
/// [`StudioError::Invalid`] for an empty text; the tokenizer's errors.
pub fn domain_sequences(
    tok: &crate::tokenizer::Tokenizer,
    name: &str,
    (text, what): (&str, &str),
    heldout: Option<(&str, &str)>,
    split: crate::corpus::DocSplit,
    context: usize,
) -> Result<DomainSequences> {
    let encode = |t: &str, w: &str| -> Result<(Vec<u32>, String)> {
        if t.trim().is_empty() {
            return Err(StudioError::Invalid(format!("domain `{name}`: {w} is empty")));
        }
        let ids = crate::corpus::text_stream(t, w, split, tok)?;
        let sha = crate::corpus::stream_sha256(&ids);
        Ok((ids, sha))
    };
    let held = heldout.map(|(h, hw)| encode(h, hw)).transpose()?;
    let (ids, sha) = encode(text, what)?;
    domain_sequences_from_ids(name, (&ids, sha), held.as_ref().map(|(h, s)| (&h[..], s.clone())), context)
}

/// [`domain_sequences`] from token streams already made (`(ids, stream_sha256)`
/// of the training text and of the held-out text when given): a token file
/// or text read by the CLI's `route` (`corpus::read_stream`). Without
/// held-out ids the last 10% of `train`'s tokens are held out.
///
/// # Errors
/// [`StudioError::Invalid`] naming the domain when a stream is empty.
pub fn domain_sequences_from_ids(
    name: &str,
    (ids, stream_sha256): (&[u32], String),
    heldout: Option<(&[u32], String)>,
    context: usize,
) -> Result<DomainSequences> {
    if ids.is_empty() || heldout.as_ref().is_some_and(|(h, _)| h.is_empty()) {
        return Err(StudioError::Invalid(format!("domain `{name}`: an empty token stream")));
    }
    let (train, held, heldout_sha256) = match heldout {
        Some((held, sha)) => (ids, held, Some(sha)),
        None => {
            let cut = ids.len() * 9 / 10;
            (&ids[..cut], &ids[cut..], None)
        }
    };
    Ok(DomainSequences {
        name: name.to_string(),
        train: pack_sequences(train, context),
        heldout: pack_sequences(held, context),
        stream_sha256,
        heldout_sha256,
    })
}

/// Mean of a per-layer accuracy list over its MoE layers (dense layers, `None`, skipped).
pub fn mean_accuracy(v: &[Option<f64>]) -> f64 {
    let xs: Vec<f64> = v.iter().flatten().copied().collect();
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// `ridge_report.json` of a run (the CLI's `route` and the tab's router
/// write the same document).
#[derive(Debug, Clone, Serialize)]
pub struct RouteReport {
    /// The routed model's source.
    pub model: String,
    /// Domain names, expert order.
    pub domains: Vec<String>,
    /// Statistics tokens per domain.
    pub tokens_per_domain: Vec<usize>,
    /// Per domain, the training text's [`crate::corpus::stream_sha256`]
    /// (the same file gives the same value in `eval`, `train`, `neurons`).
    pub stream_sha256_per_domain: Vec<String>,
    /// Per domain, the held-out text's, when it is its own text.
    pub heldout_sha256_per_domain: Vec<Option<String>>,
    /// The options solved with.
    pub options: RouteOptions,
    /// `1 / domains`, what random routing scores.
    pub random_routing_accuracy: f64,
    /// `[domain][layer]` held-out routing accuracy (`None`: dense layer).
    pub accuracy_per_domain_per_layer: Vec<Vec<Option<f64>>>,
    /// Mean over the MoE layers, per domain.
    pub mean_accuracy_per_domain: Vec<f64>,
    /// Per domain, the fraction of held-out tokens routed to the domain's
    /// expert in every MoE layer ([`RoutingAccuracy::all_layers`]).
    pub all_layers_accuracy_per_domain: Vec<f64>,
    /// Condition number of each layer's ridge system, when computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition_number_per_layer: Option<Vec<Option<f64>>>,
    /// `tr(A) / p` of each MoE layer's statistics ([`RidgeStats::mean_diagonal`]),
    /// the scale the chosen `λ` is small or large against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_diagonal_per_layer: Option<Vec<Option<f64>>>,
    /// Held-out accuracy at other lambdas, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lambda_sweep: Option<Vec<serde_json::Value>>,
    /// The statistics file reused instead of collecting (`route --stats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_stats: Option<String>,
    /// The layout the routed model is written in (a
    /// [`crate::layout::REGISTRY`] name), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Warnings (the studio layout, which transformers cannot load).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warnings: Option<Vec<String>>,
}

impl RouteReport {
    /// The report of `domains` routed with `opts`.
    pub fn new(
        model: &str,
        domains: &[DomainSequences],
        tokens_per_domain: Vec<usize>,
        options: RouteOptions,
        accuracy: Vec<RoutingAccuracy>,
    ) -> Self {
        RouteReport {
            model: model.to_string(),
            domains: domains.iter().map(|d| d.name.clone()).collect(),
            tokens_per_domain,
            stream_sha256_per_domain: domains.iter().map(|d| d.stream_sha256.clone()).collect(),
            heldout_sha256_per_domain: domains.iter().map(|d| d.heldout_sha256.clone()).collect(),
            options,
            random_routing_accuracy: 1.0 / domains.len().max(1) as f64,
            mean_accuracy_per_domain: accuracy.iter().map(|a| mean_accuracy(&a.per_layer)).collect(),
            all_layers_accuracy_per_domain: accuracy.iter().map(|a| a.all_layers).collect(),
            accuracy_per_domain_per_layer: accuracy.into_iter().map(|a| a.per_layer).collect(),
            condition_number_per_layer: None,
            mean_diagonal_per_layer: None,
            lambda_sweep: None,
            reused_stats: None,
            layout: None,
            warnings: None,
        }
    }
}

/// The routing accuracy of a routed model as a model-card section
/// (Markdown): per domain (the expert it should reach) the share of its
/// held-out tokens routed there as top-1 in *every* MoE layer
/// ([`RoutingAccuracy::all_layers`], DUME §2.5's "fraction of tokens routed
/// to their domain's expert"), the mean over the MoE layers and each layer,
/// with random routing's `1 / domains` for scale. `accuracy` is one entry
/// per domain, in `domains`' order.
pub fn accuracy_markdown(domains: &[String], accuracy: &[RoutingAccuracy], opts: &RouteOptions) -> String {
    let layers: Vec<usize> = (0..accuracy.first().map_or(0, |a| a.per_layer.len()))
        .filter(|&l| accuracy.iter().any(|a| a.per_layer[l].is_some()))
        .collect();
    let mut out = format!(
        "Held-out routing accuracy (the share of a domain's held-out tokens whose top-1 expert is that domain's \
         expert: in every MoE layer at once, on average over the layers, and per layer; random routing scores \
         {:.3} per layer), ridge router with lambda {}, top-{}:\n\n| domain | all layers | mean |",
        1.0 / domains.len().max(1) as f64,
        opts.lambda,
        opts.top_k
    );
    for l in &layers {
        out.push_str(&format!(" layer {l} |"));
    }
    out.push_str(&format!("\n|---|---|---|{}\n", "---|".repeat(layers.len())));
    for (d, acc) in domains.iter().zip(accuracy) {
        out.push_str(&format!(
            "| {} | {:.3} | {:.3} |",
            d.replace('|', "\\|"),
            acc.all_layers,
            mean_accuracy(&acc.per_layer)
        ));
        for &l in &layers {
            out.push_str(&acc.per_layer[l].map_or(" – |".to_string(), |a| format!(" {a:.3} |")));
        }
        out.push('\n');
    }
    out
}

/// The MoE layout after routing: each MoE layer gets the router bias flag,
/// top-k and temperature of `opts`.
pub fn routed_config(moe: &MoeConfig, opts: &RouteOptions) -> MoeConfig {
    let mut out = moe.clone();
    for s in out.layers.iter_mut().flatten() {
        s.router_bias = opts.bias;
        s.top_k = opts.top_k.min(s.num_experts);
        s.temperature = opts.temperature;
    }
    out
}

const STATS_FORMAT: &str = "moe-studio-ridge-stats-v1";

/// Serialises per-layer statistics into a safetensors file:
/// `layers.{l}.A` (F64 `[p, p]`), `layers.{l}.B` (F64 `[p, E]`),
/// `layers.{l}.tokens` (I64 `[E]`), with `__metadata__` holding the format
/// tag, the domain names (JSON) and `bias`.
///
/// The same statistics always give the same bytes (the CLI, a server job
/// and the browser agree on the sha256): the header is written here, with
/// sorted keys, not by `safetensors::serialize`, whose `__metadata__` is a
/// `HashMap` written in a random order.
///
/// # Errors
/// [`StudioError::Invalid`] when serialisation fails.
pub fn stats_to_safetensors(stats: &[Option<RidgeStats>], domains: &[String]) -> Result<Vec<u8>> {
    let mut owned: Vec<(String, &str, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut bias = true;
    for (l, s) in stats.iter().enumerate() {
        let Some(s) = s else { continue };
        bias = s.bias;
        let (p, e) = (s.p(), s.num_experts());
        owned.push((format!("layers.{l}.A"), "F64", vec![p, p], s.a.iter().flat_map(|x| x.to_le_bytes()).collect()));
        owned.push((format!("layers.{l}.B"), "F64", vec![p, e], s.b.iter().flat_map(|x| x.to_le_bytes()).collect()));
        owned.push((
            format!("layers.{l}.tokens"),
            "I64",
            vec![e],
            s.tokens.iter().flat_map(|x| (*x as i64).to_le_bytes()).collect(),
        ));
    }
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("format".to_string(), STATS_FORMAT.to_string());
    meta.insert("domains".to_string(), serde_json::to_string(domains).expect("json"));
    meta.insert("bias".to_string(), bias.to_string());
    meta.insert("num_layers".to_string(), stats.len().to_string());
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::to_value(&meta).expect("string map"));
    let mut off = 0usize;
    for (name, dtype, shape, bytes) in &owned {
        if bytes.len() != 8 * shape.iter().product::<usize>() {
            return Err(StudioError::Invalid(format!("ridge statistics: tensor `{name}` has the wrong size")));
        }
        let end = off + bytes.len();
        header.insert(name.clone(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, end]}));
        off = end;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header))
        .map_err(|e| StudioError::Invalid(format!("ridge statistics: {e}")))?;
    // The data starts 8-aligned (the F64 / I64 tensors stay aligned).
    while !(json.len() + 8).is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + off);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend(json);
    for (_, _, _, bytes) in &owned {
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// Reads statistics written by [`stats_to_safetensors`]: per-layer stats
/// and the domain names.
///
/// # Errors
/// [`StudioError::Format`] naming `file_name` when the file is not a
/// studio ridge-statistics file or a tensor is malformed.
pub fn stats_from_safetensors(
    bytes: &[u8],
    file_name: &str,
    hidden: usize,
) -> Result<(Vec<Option<RidgeStats>>, Vec<String>)> {
    let fmt = |w: String| StudioError::format(file_name, "ridge statistics", w);
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| fmt(e.to_string()))?;
    let m = meta.metadata().clone().unwrap_or_default();
    if m.get("format").map(String::as_str) != Some(STATS_FORMAT) {
        return Err(fmt(format!("`__metadata__.format` is not {STATS_FORMAT}")));
    }
    let domains: Vec<String> =
        serde_json::from_str(m.get("domains").map(String::as_str).unwrap_or("[]")).map_err(|e| fmt(e.to_string()))?;
    let bias = m.get("bias").map(|b| b == "true").unwrap_or(true);
    let n_layers: usize =
        m.get("num_layers").and_then(|n| n.parse().ok()).ok_or_else(|| fmt("missing num_layers".into()))?;
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| fmt(e.to_string()))?;
    let f64s = |name: &str| -> Option<Vec<f64>> {
        st.tensor(name)
            .ok()
            .map(|t| t.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8"))).collect())
    };
    let mut out = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let (Some(a), Some(b)) = (f64s(&format!("layers.{l}.A")), f64s(&format!("layers.{l}.B"))) else {
            out.push(None);
            continue;
        };
        let tokens: Vec<u64> = st
            .tensor(&format!("layers.{l}.tokens"))
            .map_err(|e| fmt(e.to_string()))?
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8")) as u64)
            .collect();
        let p = hidden + usize::from(bias);
        if a.len() != p * p || b.len() != p * tokens.len() {
            return Err(fmt(format!("layer {l}: A/B shapes do not match hidden size {hidden}")));
        }
        out.push(Some(RidgeStats { dim: hidden, bias, a, b, tokens }));
    }
    Ok((out, domains))
}

/// The tensors and `config.json` of a routed checkpoint (see
/// [`plan_routed`]).
#[derive(Debug, Clone)]
pub struct RoutedPlan {
    /// Layout choice (router scales `1/T` where the layout folds them).
    pub choice: crate::checkpoint::output::LayoutChoice,
    /// Output tensors and their origins, in write order.
    pub tensors: Vec<crate::checkpoint::plan::MoeTensor>,
    /// The writer's plan: `tensors` with output dtypes under the layout's
    /// names, then the layout's zero tensors.
    pub planned: Vec<crate::tensor_io::PlannedTensor>,
    /// `config.json` (with `provenance`).
    pub config_json: serde_json::Value,
}

/// Plans the routed checkpoint of `src` (an MoE checkpoint, canonical
/// names) with MoE structure `routed`, written in the layout `layout` picks
/// (headers only, nothing written). Any platform.
///
/// # Errors
/// [`StudioError::Tensor`] when `src` lacks a tensor of the layout or has it
/// in another shape; [`StudioError::Config`] when a named `layout` cannot
/// hold `routed` (e.g. a router bias in Mixtral).
pub fn plan_routed(
    src: &dyn crate::tensor_io::TensorSource,
    base: &crate::config::ModelConfig,
    routed: &MoeConfig,
    provenance: serde_json::Value,
    layout: crate::layout::LayoutRequest,
) -> Result<RoutedPlan> {
    use crate::checkpoint::plan::{moe_tensor_plan, Origin};
    use crate::tensor_io::{DType, PlannedTensor};
    let choice = crate::layout::choose(base, routed, layout)?;
    let plan = moe_tensor_plan(base, routed);
    let dtype_of = |name: &str| src.info(name).map(|i| i.dtype).filter(|d| d.float_size().is_some());
    let mut planned = Vec::with_capacity(plan.len());
    for t in &plan {
        let dtype = match &t.origin {
            Origin::RouterWeight { layer } | Origin::RouterBias { layer } => {
                dtype_of(&crate::layout::names::expert_weight_name(*layer, 0, crate::layout::Proj::Gate))
                    .unwrap_or(DType::F32)
            }
            _ => {
                let info = src.info(&t.name).ok_or_else(|| {
                    StudioError::tensor(src.source_name(), &t.name, "missing from the MoE checkpoint")
                })?;
                if info.shape != t.shape {
                    return Err(StudioError::tensor(
                        src.source_name(),
                        &t.name,
                        format!("shape {:?}, expected {:?}", info.shape, t.shape),
                    ));
                }
                crate::checkpoint::output::out_dtype(info.dtype, None)
            }
        };
        planned.push(PlannedTensor { name: t.name.clone(), dtype, shape: t.shape.clone() });
    }
    let planned = choice.disk_plan(base, &planned);
    let dtype = planned.first().map(|p| p.dtype).unwrap_or(DType::F32);
    let config_json = crate::checkpoint::output::config_json(base, &choice, dtype, provenance);
    Ok(RoutedPlan { choice, tensors: plan, planned, config_json })
}

/// Streams the tensors `range` of a routed plan into `sink`: every tensor of
/// `src` is copied, router weights/biases replaced by `routers` (scaled by
/// `1/T` where the layout folds temperatures); the range that ends the plan
/// also writes the layout's zero tensors. Calling it on consecutive
/// ranges of `0..plan.tensors.len()` writes the same bytes as one call on
/// the whole plan (the browser yields between ranges).
///
/// # Errors
/// Missing routers, read errors of `src`, write errors of `sink`.
pub fn write_routed_tensors(
    src: &dyn crate::tensor_io::TensorSource,
    plan: &RoutedPlan,
    routers: &[Option<RouterWeights>],
    range: std::ops::Range<usize>,
    sink: &mut dyn crate::tensor_io::sink::TensorSink,
) -> Result<()> {
    use crate::checkpoint::plan::Origin;
    use crate::tensor_io::sink::write_values;
    let last = range.end == plan.tensors.len();
    let mut out = crate::checkpoint::output::layout_sink(sink, &plan.choice, &plan.planned, plan.tensors.len());
    let sink: &mut dyn crate::tensor_io::sink::TensorSink = &mut out;
    for (t, p) in plan.tensors[range.clone()].iter().zip(&plan.planned[range]) {
        match &t.origin {
            Origin::RouterWeight { layer } => {
                let r = routers[*layer]
                    .as_ref()
                    .ok_or_else(|| StudioError::Invalid(format!("layer {layer}: no router")))?;
                let s = plan.choice.router_scale[*layer] as f32;
                let v: Vec<f32> = r.weight.iter().map(|x| x * s).collect();
                write_values(sink, &t.name, p.dtype, &v)?;
            }
            Origin::RouterBias { layer } => {
                let r = routers[*layer].as_ref().and_then(|r| r.bias.clone()).ok_or_else(|| {
                    StudioError::Invalid(format!("layer {layer}: the router has no bias but the layout needs one"))
                })?;
                write_values(sink, &t.name, p.dtype, &r)?;
            }
            _ => write_values(sink, &t.name, p.dtype, &src.read_f32(&t.name)?)?,
        }
    }
    if last {
        out.finish()?;
    }
    Ok(())
}

/// Streams the routed checkpoint ([`plan_routed`] + [`write_routed_tensors`])
/// into the directory `out_dir`, its experts stored as `experts`, with
/// `extra` files (e.g. the statistics) beside it and the model card of
/// `write_opts` (given the layout's facts).
///
/// # Errors
/// Missing tensors, I/O, an existing non-empty `out_dir`.
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::too_many_arguments)]
pub fn write_routed(
    src: &dyn crate::tensor_io::TensorSource,
    base: &crate::config::ModelConfig,
    routed: &MoeConfig,
    routers: &[Option<RouterWeights>],
    out_dir: &std::path::Path,
    mut extra: Vec<(&str, Vec<u8>)>,
    provenance: serde_json::Value,
    layout: crate::layout::LayoutRequest,
    experts: crate::layout::ExpertsFormat,
    write_opts: crate::tensor_io::WriteOptions,
) -> Result<()> {
    use crate::tensor_io::SafetensorsWriter;
    let mut plan = plan_routed(src, base, routed, provenance, layout)?;
    plan.choice = plan.choice.with_experts(experts);
    let mut write_opts = write_opts;
    if let Some(c) = write_opts.card.as_mut() {
        crate::checkpoint::output::card_moe_details(c, base, &plan.choice, &plan.planned);
    }
    let mut w = SafetensorsWriter::create(out_dir, plan.choice.file_plan(&plan.planned)?, write_opts)?;
    let mut packing = plan.choice.packing_sink(&mut w, &plan.planned)?;
    write_routed_tensors(src, &plan, routers, 0..plan.tensors.len(), &mut packing)?;
    extra.push(("config.json", serde_json::to_vec_pretty(&plan.config_json).expect("json")));
    w.finish(&extra)?;
    Ok(())
}
