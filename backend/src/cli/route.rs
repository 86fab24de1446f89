//! `moe-studio route MOE --domain NAME=FILE[:HELDOUT]... --out DIR`: DUME's
//! ridge router for an MoErged model (domain i = expert i).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::config::MoeConfig;
use moe_shared::layout::{self, LayoutRequest};
use moe_shared::methods::route::{
    accuracy_markdown, check_domains, domain_sequences_from_ids, mean_accuracy, routed_config, routing_accuracy,
    routing_accuracy_detail, set_routers, solve_all, solve_all_relative, stats_to_safetensors, write_routed,
    DomainSequences, RouteReport, RoutingAccuracy,
};
use moe_shared::model::load_model_as;
use moe_shared::ops::route::{self, Collected, RouteFit, RouteParams};
use moe_shared::tensor_io::card::CardMethod;
use moe_shared::StudioError;

use super::backend::WithBackend;

use super::args::FlagErr;

/// Arguments of `route`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// An MoE checkpoint directory whose expert i is domain i's model (see `moerge`).
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// `NAME=TRAIN_FILE[:HELDOUT_FILE]`, one per expert, in expert order.
    /// Without a held-out file the last 10% of the training tokens are held out. A `.tokens` file
    /// (`moe-studio tokenize`) is read as written.
    #[arg(long = "domain", required_unless_present = "add_expert")]
    pub domains: Vec<String>,
    /// Incremental DUME: `NAME=DENSE_MODEL:TRAIN_FILE[:HELDOUT_FILE]` adds the
    /// dense model's FFN as a new expert of a routed MoE, accumulates only the
    /// new domain's statistics onto the saved ones (`ridge_stats.safetensors`
    /// in MODEL) and re-solves; the old data is not revisited.
    #[arg(long, conflicts_with = "domains")]
    pub add_expert: Option<String>,
    /// What the fit does (shared/src/ops/route.rs: lambda, top-k, temperature, statistics and
    /// held-out tokens, context, bias column).
    #[command(flatten)]
    pub params: RouteParams,
    #[command(flatten)]
    pub docs: super::args::DocsArg,
    #[command(flatten)]
    pub layout: moe_shared::ops::convert::LayoutParams,
    /// Extra lambdas to report held-out accuracy for (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub lambda_sweep: Vec<f64>,
    /// Extra relative strengths r to report held-out accuracy for, each layer solved with
    /// lambda = r * tr(A) / p (its Gram matrix's mean diagonal; comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub lambda_sweep_relative: Vec<f64>,
    /// Reuse the statistics of an earlier `route` of the same MoE (its `ridge_stats.safetensors`)
    /// instead of collecting them: re-solve with another top-k, lambda or temperature. The domains
    /// must be the same, in the same order (their held-out text is still read for the accuracy).
    #[arg(long, conflicts_with = "add_expert")]
    pub stats: Option<PathBuf>,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_domain(spec: &str) -> anyhow::Result<(String, PathBuf, Option<PathBuf>)> {
    let (name, files) =
        spec.split_once('=').with_context(|| format!("--domain `{spec}`: expected NAME=FILE[:HELDOUT]"))?;
    if name.is_empty() {
        bail!("--domain `{spec}`: the name is empty");
    }
    let (train, held) = match files.split_once(':') {
        Some((t, h)) => (PathBuf::from(t), Some(PathBuf::from(h))),
        None => (PathBuf::from(files), None),
    };
    Ok((name.to_string(), train, held))
}

/// Reads a domain's files (text or token files) and prepares it as the tab
/// does ([`moe_shared::methods::route::domain_sequences`]).
fn read_domain(
    tok: &moe_shared::tokenizer::Tokenizer,
    name: String,
    train: &PathBuf,
    held: Option<&PathBuf>,
    split: moe_shared::corpus::DocSplit,
    context: usize,
) -> anyhow::Result<DomainSequences> {
    // One reading path for text and token files (`corpus::read_stream`): the
    // stream every other command reads; a token file's ids are used in place.
    let read = |p: &PathBuf| -> anyhow::Result<moe_shared::corpus::Stream> {
        moe_shared::corpus::read_stream(&p.display().to_string(), split, tok)
            .with_context(|| format!("domain `{name}`"))
    };
    let ids = read(train)?;
    let held = held.map(read).transpose()?;
    Ok(domain_sequences_from_ids(&name, (&ids, ids.sha256()), held.as_ref().map(|h| (&h[..], h.sha256())), context)?)
}

/// The statistics of an earlier `route` (`--stats FILE`) and their token
/// counts, checked against this run's domains (names and order), hidden
/// size and bias column.
fn reuse_stats(
    path: &PathBuf,
    domains: &[DomainSequences],
    hidden: usize,
    bias: bool,
) -> anyhow::Result<(Vec<Option<moe_shared::methods::ridge::RidgeStats>>, Vec<usize>)> {
    use moe_shared::methods::route::stats_from_safetensors;
    let raw = std::fs::read(path).with_context(|| format!("reading --stats {}", path.display()))?;
    let (stats, names) = stats_from_safetensors(&raw, &path.display().to_string(), hidden)?;
    let want: Vec<&str> = domains.iter().map(|d| d.name.as_str()).collect();
    if names.iter().map(String::as_str).ne(want.iter().copied()) {
        bail!(
            "--stats {}: its statistics are of the domains [{}], this run routes [{}] (same names, same order)",
            path.display(),
            names.join(", "),
            want.join(", ")
        );
    }
    if let Some(s) = stats.iter().flatten().find(|s| s.bias != bias) {
        bail!(
            "--stats {}: statistics {} the bias column; solve {} --no-bias",
            path.display(),
            if s.bias { "with" } else { "without" },
            if s.bias { "without" } else { "with" }
        );
    }
    let tokens =
        stats.iter().flatten().next().map(|s| s.tokens.iter().map(|&t| t as usize).collect()).unwrap_or_default();
    Ok((stats, tokens))
}

/// `route MOE --add-expert NAME=DENSE:TRAIN[:HELDOUT] --out DIR`.
fn add_expert<B: Backend>(a: Args, device: B::Device) -> anyhow::Result<()> {
    use moe_shared::methods::add_expert::{plan_add_expert, write_add_expert};
    use moe_shared::methods::route::stats_from_safetensors;
    use moe_shared::tensor_io::{SafetensorsWriter, WriteOptions};
    let t0 = Instant::now();
    let request = a.layout.request().flag_err()?;
    let spec = a.add_expert.clone().expect("checked");
    let (name, rest) = spec
        .split_once('=')
        .with_context(|| format!("--add-expert `{spec}`: expected NAME=DENSE_MODEL:TRAIN[:HELDOUT]"))?;
    let mut parts = rest.splitn(3, ':');
    let (dense_path, train, held) = match (parts.next(), parts.next(), parts.next()) {
        (Some(d), Some(t), h) => (PathBuf::from(d), PathBuf::from(t), h.map(PathBuf::from)),
        _ => bail!("--add-expert `{spec}`: expected NAME=DENSE_MODEL:TRAIN[:HELDOUT]"),
    };
    let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let moe = m.moe.clone().with_context(|| format!("{}: not an MoE checkpoint", m.path))?;
    let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer.json beside the model", m.path))?;
    let stats_path = a.model.join("ridge_stats.safetensors");
    let raw = std::fs::read(&stats_path).with_context(|| {
        format!("{}: incremental routing needs the statistics saved by `route`", stats_path.display())
    })?;
    let (mut stats, mut names) = stats_from_safetensors(&raw, &stats_path.display().to_string(), m.config.hidden_size)?;
    let bias = stats.iter().flatten().next().map(|s| s.bias).unwrap_or(true);
    let dense = open_model(&dense_path).with_context(|| format!("opening {}", dense_path.display()))?;
    let plan = plan_add_expert(m.source.as_ref(), &m.config, &moe, dense.source.as_ref(), &dense.config, names.len())?;
    // Stage the grown MoE beside the output, then route from it.
    let parent = a.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let stage = tempfile::Builder::new().prefix(".moe-studio-stage-").tempdir_in(parent)?;
    let stage_dir = stage.path().join("grown");
    let mut w = SafetensorsWriter::create(&stage_dir, plan.planned.clone(), WriteOptions::default())?;
    write_add_expert(m.source.as_ref(), dense.source.as_ref(), &plan, &mut w)?;
    // The stage holds canonical names: the studio layout.
    let cfg = layout::MoeLayout::write_config(&layout::studio::Studio, &m.config, &plan.moe);
    w.finish(&[("config.json", serde_json::to_vec(&cfg)?)])?;
    let grown = open_model(&stage_dir)?;
    let mut model = load_model_as::<B>(&grown, &device, a.weights.weights_dtype)?;
    let p = &a.params;
    let domain = read_domain(tok, name.to_string(), &train, held.as_ref(), a.docs.docs, p.context)?;
    let new_idx = names.len();
    for s in stats.iter_mut().flatten() {
        s.add_expert();
    }
    let n = route::collect_added(&model, new_idx, &domain.train, p, &mut stats)?;
    names.push(domain.name.clone());
    // The bias column is the saved statistics' (not --no-bias).
    let opts = moe_shared::methods::route::RouteOptions { bias, ..p.options(a.docs.docs) };
    let routers = solve_all(&stats, opts.lambda)?;
    set_routers(&mut model, &routers, opts.top_k, opts.temperature);
    let acc = routing_accuracy_detail(&model, new_idx, &domain.heldout, p.eval_tokens);
    let routed = routed_config(&plan.moe, &opts);
    let (layout, warnings) = layout_warnings(&m.config, &routed, request)?;
    let report = serde_json::json!({
        "model": m.path, "added_domain": domain.name, "added_from": dense_path.display().to_string(),
        "domains": names, "new_domain_tokens": n, "options": opts,
        "new_domain_accuracy_per_layer": acc.per_layer, "new_domain_mean_accuracy": mean_accuracy(&acc.per_layer),
        "new_domain_all_layers_accuracy": acc.all_layers, "new_domain_stream_sha256": domain.stream_sha256,
        "new_domain_heldout_sha256": domain.heldout_sha256,
        "layout": layout, "warnings": warnings,
        "seconds": t0.elapsed().as_secs_f64(),
    });
    let mut extra = vec![("ridge_stats.safetensors", stats_to_safetensors(&stats, &names)?)];
    extra.push(("ridge_report.json", serde_json::to_vec_pretty(&report)?));
    if let Some(t) = tok.to_hf_json() {
        extra.push(("tokenizer.json", t.into_bytes()));
    }
    let provenance = serde_json::json!({"method": "dume-ridge-router-add-expert", "source": m.path, "added": dense_path.display().to_string()});
    let mut card = super::card::card(
        CardMethod::Dume,
        [
            ("routed MoE".to_string(), a.model.as_path()),
            (format!("added expert `{}`", domain.name), dense_path.as_path()),
        ],
    );
    let added = accuracy_markdown(&names[new_idx..], std::slice::from_ref(&acc), &opts);
    card.section("Routing accuracy of the added expert", added);
    let write_opts = WriteOptions::default().with_card(Some(card));
    let experts = a.layout.experts().flag_err()?;
    write_routed(
        grown.source.as_ref(),
        &m.config,
        &routed,
        &routers,
        &a.out,
        extra,
        provenance,
        request,
        experts,
        write_opts,
    )?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "added expert {new_idx} ({}) -> {} ({:.1} s); held-out accuracy on it: mean {:.3}",
            domain.name,
            a.out.display(),
            t0.elapsed().as_secs_f64(),
            mean_accuracy(&acc.per_layer)
        );
    }
    Ok(())
}

/// The layout `routed` will be written in on `base` (checked before any
/// work: an explicit `--layout` that cannot hold it is refused), and the
/// warnings to print when it is the studio layout (transformers cannot
/// load it); when the router bias is what keeps it out of every public
/// layout, the warning points to `--no-bias`.
fn layout_warnings(
    base: &moe_shared::config::ModelConfig,
    routed: &MoeConfig,
    request: LayoutRequest,
) -> anyhow::Result<(&'static str, Vec<String>)> {
    let choice = layout::choose(base, routed, request)?;
    let Some(reason) = choice.reason.clone() else { return Ok((choice.name(), Vec::new())) };
    let mut unbiased = routed.clone();
    for s in unbiased.layers.iter_mut().flatten() {
        s.router_bias = false;
    }
    let public = layout::holding(base, &unbiased);
    let hint = match public.first() {
        Some(l) if routed.layers.iter().flatten().any(|s| s.router_bias) => {
            format!("; pass --no-bias to solve without the bias column and get the {l} layout (transformers loads it)")
        }
        _ => String::new(),
    };
    Ok((
        choice.name(),
        vec![format!(
            "written in the studio layout (model_type: moe_studio), which transformers cannot load, because {reason}{hint}"
        )],
    ))
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        // Before the statistics pass (hours on a large model), not after it.
        moe_shared::tensor_io::writer::check_out_dir(&self.out)?;
        if self.add_expert.is_some() {
            return add_expert::<B>(self, device);
        }
        let a = self;
        let t0 = Instant::now();
        let opts = a.params.options(a.docs.docs);
        // The rules the server and the tab check too (shared), in the CLI's flags.
        a.params.check(a.domains.len()).flag_err()?;
        let positive = |l: f64| l.is_finite() && l > 0.0;
        if !a.lambda_sweep.iter().all(|&l| positive(l)) {
            bail!("--lambda-sweep values must be > 0");
        }
        if !a.lambda_sweep_relative.iter().all(|&l| positive(l)) {
            bail!("--lambda-sweep-relative values must be > 0");
        }
        let request = a.layout.request().flag_err()?;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let moe = m.moe.clone().with_context(|| format!("{}: not an MoE checkpoint (run `moerge` first)", m.path))?;
        // Refuse an explicit layout that cannot hold the result before any work.
        let (layout, warnings) = layout_warnings(&m.config, &routed_config(&moe, &opts), request)?;
        let tok = m.tokenizer.as_ref().with_context(|| format!("{}: no tokenizer.json beside the model", m.path))?;
        check_domains(&moe, a.domains.len())?;
        let parsed = a.domains.iter().map(|s| parse_domain(s)).collect::<anyhow::Result<Vec<_>>>()?;
        // Domain i is expert i's: a name given twice is a mistake (the server refuses it too).
        let names: Vec<&str> = parsed.iter().map(|d| d.0.as_str()).collect();
        if let Some(i) = moe_shared::ops::first_repeat(&names) {
            bail!("--domain: the name `{}` is used twice (domain {}, which would be expert {})", parsed[i].0, i + 1, i);
        }
        let mut domains = Vec::new();
        for (name, train, held) in parsed {
            domains.push(read_domain(tok, name, &train, held.as_ref(), a.docs.docs, opts.context)?);
        }
        let mut model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        super::args::trim_heap();
        let collected = match &a.stats {
            Some(p) => {
                let (stats, tokens) = reuse_stats(p, &domains, m.config.hidden_size, opts.bias)?;
                Some(Collected { stats, tokens })
            }
            None => None,
        };
        // The tab's fit, step for step (shared): statistics, solve, routers;
        // each domain's statistics pass is announced when it starts.
        let mut last = String::new();
        let mut on_step = |what: &str, _: u64, _: u64, _: &str| {
            if !a.json && what.starts_with("ridge statistics") && what != last {
                eprintln!("{what}...");
                last = what.to_string();
            }
        };
        let fit = match (route::fit(&mut model, &domains, &a.params, collected, &mut on_step), &a.stats) {
            (Ok(fit), _) => fit,
            (Err(StudioError::Invalid(e)), Some(p)) => bail!("--stats {}: {e}", p.display()),
            (Err(e), _) => return Err(e.into()),
        };
        let RouteFit { stats, tokens, routers } = fit;
        super::args::trim_heap();
        if !a.json && a.stats.is_none() {
            for (i, (d, n)) in domains.iter().zip(&tokens).enumerate() {
                eprintln!("statistics: domain {i} ({}) {n} tokens", d.name);
            }
        }
        let cond: Vec<Option<f64>> =
            stats.iter().map(|s| s.as_ref().and_then(|s| s.condition_number(opts.lambda).ok())).collect();
        let accuracy: Vec<RoutingAccuracy> = route::accuracy(&model, &domains, &a.params, &mut |_, _, _, _| {});
        let mut sweep = Vec::new();
        for &lambda in &a.lambda_sweep {
            let r = solve_all(&stats, lambda)?;
            set_routers(&mut model, &r, opts.top_k, opts.temperature);
            let acc: Vec<f64> = domains
                .iter()
                .enumerate()
                .map(|(i, d)| mean_accuracy(&routing_accuracy(&model, i, &d.heldout, a.params.eval_tokens)))
                .collect();
            sweep.push(serde_json::json!({"lambda": lambda, "mean_accuracy_per_domain": acc}));
        }
        for &relative in &a.lambda_sweep_relative {
            let r = solve_all_relative(&stats, relative)?;
            set_routers(&mut model, &r, opts.top_k, opts.temperature);
            let acc: Vec<RoutingAccuracy> = domains
                .iter()
                .enumerate()
                .map(|(i, d)| routing_accuracy_detail(&model, i, &d.heldout, a.params.eval_tokens))
                .collect();
            sweep.push(serde_json::json!({
                "lambda_relative": relative,
                "mean_accuracy_per_domain": acc.iter().map(|x| mean_accuracy(&x.per_layer)).collect::<Vec<_>>(),
                "all_layers_accuracy_per_domain": acc.iter().map(|x| x.all_layers).collect::<Vec<_>>(),
            }));
        }
        // The model is not read again: writing streams from the checkpoint.
        drop(model);
        let names: Vec<String> = domains.iter().map(|d| d.name.clone()).collect();
        let stats_bytes = stats_to_safetensors(&stats, &names)?;
        let routed = routed_config(&moe, &opts);
        let mut report = RouteReport::new(&m.path, &domains, tokens, opts, accuracy.clone());
        report.condition_number_per_layer = Some(cond);
        report.mean_diagonal_per_layer = Some(stats.iter().map(|s| s.as_ref().map(|s| s.mean_diagonal())).collect());
        drop(stats);
        report.reused_stats = a.stats.as_ref().map(|p| p.display().to_string());
        report.lambda_sweep = Some(sweep);
        report.layout = Some(layout.to_string());
        report.warnings = Some(warnings.clone());
        let report = serde_json::to_value(&report)?;
        let provenance = serde_json::json!({"method": "dume-ridge-router", "source": m.path, "domains": names, "lambda": opts.lambda});
        let mut extra = vec![("ridge_stats.safetensors", stats_bytes)];
        extra.push(("ridge_report.json", serde_json::to_vec_pretty(&report)?));
        if let Some(t) = tok.to_hf_json() {
            extra.push(("tokenizer.json", t.into_bytes()));
        }
        let mut card = super::card::card(CardMethod::Dume, [("MoE".to_string(), a.model.as_path())]);
        card.detail("domains (expert order)", names.join(", "));
        card.section("Routing accuracy", accuracy_markdown(&names, &accuracy, &opts));
        let write_opts = moe_shared::tensor_io::WriteOptions::default().with_card(Some(card));
        let experts = a.layout.experts().flag_err()?;
        write_routed(
            m.source.as_ref(),
            &m.config,
            &routed,
            &routers,
            &a.out,
            extra,
            provenance,
            request,
            experts,
            write_opts,
        )?;
        let mut report = report;
        report["seconds"] = t0.elapsed().as_secs_f64().into();
        report["out"] = a.out.display().to_string().into();
        for w in &warnings {
            eprintln!("warning: {w}");
        }
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!("routed {} -> {} ({:.1} s)", m.path, a.out.display(), t0.elapsed().as_secs_f64());
            println!("random routing accuracy: {:.3}", report["random_routing_accuracy"].as_f64().unwrap_or(0.0));
            for (i, d) in domains.iter().enumerate() {
                let per: Vec<String> =
                    accuracy[i].per_layer.iter().map(|x| x.map(|v| format!("{v:.2}")).unwrap_or("-".into())).collect();
                println!(
                    "{:>10}: mean {:.3}  in every layer {:.3}  per layer [{}]",
                    d.name,
                    mean_accuracy(&accuracy[i].per_layer),
                    accuracy[i].all_layers,
                    per.join(" ")
                );
            }
        }
        Ok(())
    }
}

/// A route job: the spec's model, domains (`NAME=FILE[:HELDOUT]`) and parameters.
impl super::run_job::FromJob for moe_shared::api::RouteSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Route(Args {
            weights: super::run_job::defaults(),
            model: j.model(&self.model),
            domains: self
                .domains
                .iter()
                .map(|d| match &d.heldout {
                    Some(_) => format!("{}:{}", j.named(d), j.heldout(d)),
                    None => j.named(d),
                })
                .collect(),
            add_expert: None,
            params: self.params.clone(),
            docs: j.docs(),
            layout: super::run_job::defaults(),
            lambda_sweep: Vec::new(),
            lambda_sweep_relative: Vec::new(),
            stats: None,
            out: j.out.to_path_buf(),
            json: j.json,
        })
    }
}
