//! `moe-studio eval MODEL --data NAME=FILE... [--routing learned|oracle|random] [--json]`:
//! per-dataset perplexity (the windows of `perplexity`) and, for MoE
//! models, the routing load per expert.
//!
//! Each dataset's `tokens` is the number of tokens scored: a stream of `T`
//! ids (the first `--max-tokens` of the file's stream) scores its `T − 1`
//! next-token predictions (the first id has no context); `perplexity`
//! counts the same way.
//!
//! `--routing oracle` forces dataset i to expert i (DUME's oracle: the
//! i-th `--data` is expert i's domain); `--routing random` replaces the
//! routers by seeded Gaussian ones (DUME's random-routing baseline).
//!
//! `--task NAME=FILE.jsonl` (instead of `--data`) measures multiple-choice
//! accuracy instead: [`super::eval_task`].

use std::path::PathBuf;

use anyhow::{bail, Context};
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::eval::{evaluate, randomize_routers, PerplexityOptions};
use moe_shared::model::{load_model_as, Routing};
use moe_shared::ops::eval::{EvalParams, EvalRouting};
use moe_shared::ops::task::TaskParams;
use moe_shared::train::freeze::is_moe;

use super::backend::WithBackend;
use super::train::{parse_data, resolve_tokenizer};

use super::args::FlagErr;

/// Arguments of `eval`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A model: Hugging Face / MoE directory, `.gguf` or llama2.c `.bin`.
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// `NAME=FILE` (.txt: documents cut by --docs; .jsonl: field `text`; .tokens: a token file of
    /// `moe-studio tokenize`, memory-mapped); repeat for several datasets.
    /// Each file is scored as its token stream (`moe_shared::corpus`), the ids `train` reads.
    #[arg(long = "data", required_unless_present = "task")]
    pub data: Vec<String>,
    #[command(flatten)]
    pub docs: super::args::DocsArg,
    /// `NAME=FILE.jsonl`: a multiple-choice task (one JSON object per line: `context`, `choices`, `gold`),
    /// scored as lm-evaluation-harness does (acc, acc_norm); repeat for several. Instead of --data,
    /// and without --window, --stride, --max-tokens and --docs (a task scores whole requests).
    #[arg(long = "task", conflicts_with_all = ["data", "window", "stride", "max_tokens", "docs"])]
    pub task: Vec<String>,
    /// With --task: what the task evaluation does (delimiter, items per
    /// task): the operation's own parameters, shared with the server's job.
    #[command(flatten)]
    pub task_params: TaskParams,
    /// Windows (with --task: requests, one per choice) per forward pass (a right-padded batch; more uses
    /// more memory).
    #[arg(long, default_value_t = PerplexityOptions::DEFAULT_BATCH)]
    pub batch: usize,
    /// What the eval does (window, stride, tokens per dataset, routing and
    /// its seed): the operation's own parameters, shared with the server's
    /// job.
    #[command(flatten)]
    pub params: EvalParams,
    /// Tokenizer (tokenizer.json or a llama2.c tok*.bin) when the model has none beside it.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        self.params.check().flag_err()?;
        if !self.task.is_empty() {
            return super::eval_task::run::<B>(self, device);
        }
        let a = self;
        let specs = parse_data(&a.data)?;
        // A report row per name (and, under --routing oracle, expert i per dataset i).
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        if let Some(i) = moe_shared::ops::first_repeat(&names) {
            bail!("--data: the name `{}` is used twice (dataset {})", names[i], i + 1);
        }
        if specs.iter().any(|s| s.original || s.weight != 1.0) {
            eprintln!("note: eval ignores :weight and :orig in --data");
        }
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let (tok, _) = resolve_tokenizer(&m, a.tokenizer.as_deref())?;
        let mut model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        super::args::trim_heap();
        let moe = is_moe(&model);
        let p = &a.params;
        match p.routing {
            EvalRouting::Learned => {}
            r if !moe => bail!("--routing {} needs an MoE model; this one is dense", r.name()),
            EvalRouting::Random => model = randomize_routers(model, p.seed),
            EvalRouting::Oracle => {
                // Before any dataset is evaluated (`evaluate` refuses it too, per dataset).
                let fewest = m.moe.iter().flat_map(|c| c.layers.iter().flatten().map(|s| s.num_experts)).min();
                if let Some(n) = fewest.filter(|&n| specs.len() > n) {
                    bail!(
                        "--routing oracle sends dataset i to expert i: {} datasets, but the model has {n} experts in \
                         a layer; give at most {n}, in expert order",
                        specs.len()
                    );
                }
            }
        }
        let opts = p.perplexity(a.batch);
        let mut rows = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let ids = moe_shared::corpus::read_stream(&s.path, a.docs.docs, &tok)?;
            let stream = (ids.sha256(), ids.docs_name(a.docs.docs));
            let routing = if p.routing == EvalRouting::Oracle { Routing::Forced(i) } else { Routing::Learned };
            let quiet = a.json || !std::io::IsTerminal::is_terminal(&std::io::stderr());
            let r = evaluate(&model, &ids, opts, routing, &device, |done, total| {
                if !quiet {
                    eprint!("\r{}: window {done}/{total}", s.name);
                }
            })?;
            if !quiet {
                eprint!("\r\x1b[2K");
            }
            rows.push((s, r, stream));
        }
        if a.json {
            let datasets: Vec<serde_json::Value> = rows
                .iter()
                .map(|(s, r, (sha256, docs))| {
                    serde_json::json!({
                        "name": s.name, "file": s.path, "tokens": r.report.tokens, "nll": r.report.nll,
                        "ppl": r.report.ppl, "load_mean": r.mean_load(), "load_per_layer": r.load,
                        "stream_sha256": sha256, "docs": docs,
                    })
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({
                    "model": m.path, "routing": p.routing.name(), "moe": moe, "docs": a.docs.docs, "datasets": datasets
                })
            );
        } else {
            println!(
                "{:<12} {:>9} {:>10} {:>10}{}",
                "dataset",
                "tokens",
                "nll",
                "ppl",
                if moe { "  load per expert (mean over layers)" } else { "" }
            );
            for (s, r, _) in &rows {
                let load = r
                    .mean_load()
                    .map(|l| format!("  [{}]", l.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(" ")))
                    .unwrap_or_default();
                println!("{:<12} {:>9} {:>10.5} {:>10.4}{load}", s.name, r.report.tokens, r.report.nll, r.report.ppl);
            }
        }
        Ok(())
    }
}

/// An eval job: the spec's model, datasets and parameters (perplexity and routing load).
impl super::run_job::FromJob for moe_shared::api::EvalSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Eval(Args {
            weights: super::run_job::defaults(),
            model: j.model(&self.model),
            data: self.data.iter().map(|d| j.named(d)).collect(),
            docs: j.docs(),
            task: Vec::new(),
            task_params: Default::default(),
            batch: PerplexityOptions::DEFAULT_BATCH,
            params: self.params.clone(),
            tokenizer: None,
            json: j.json,
        })
    }
}

/// A task job: `eval --task` with the spec's model, task files, parameters and batch.
impl super::run_job::FromJob for moe_shared::api::TaskSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Eval(Args {
            weights: super::run_job::defaults(),
            model: j.model(&self.model),
            data: Vec::new(),
            docs: j.docs(),
            task: self.tasks.iter().map(|d| j.named(d)).collect(),
            task_params: self.params.clone(),
            batch: self.batch.unwrap_or(PerplexityOptions::DEFAULT_BATCH),
            params: Default::default(),
            tokenizer: None,
            json: j.json,
        })
    }
}
