//! `moe-studio eval MODEL --task NAME=FILE.jsonl ... [--target-delimiter S] [--limit N] [--json]`:
//! multiple-choice task accuracy with the lm-evaluation-harness semantics
//! (`moe_shared::eval::multiple_choice`; docs/methods.md "Task accuracy").
//!
//! Every task file is read and checked before the model is loaded, and
//! nothing is printed before every task has been scored, so a bad line
//! (named with its file and line number) leaves no partial report.

use std::path::Path;

use anyhow::{bail, Context};
use burn::tensor::backend::Backend;
use moe_shared::api::{TaskEvalReport, TaskResult};
use moe_shared::checkpoint::open_model;
use moe_shared::eval::{evaluate_task, randomize_routers, McOptions, McTask, Metric};
use moe_shared::model::load_model_as;
use moe_shared::ops::eval::EvalRouting;
use moe_shared::train::freeze::is_moe;

use super::eval::Args;
use super::train::resolve_tokenizer;

use super::args::FlagErr;

/// `NAME=FILE` (or `FILE`, named after its stem) of `--task`.
fn parse_task_spec(s: &str) -> anyhow::Result<(String, String)> {
    let (name, file) = match s.split_once('=') {
        Some((n, f)) => (n.to_string(), f.to_string()),
        None => {
            let stem = Path::new(s).file_stem().and_then(|x| x.to_str()).unwrap_or("").to_string();
            (stem, s.to_string())
        }
    };
    if name.is_empty() || file.is_empty() {
        bail!("--task `{s}`: expected NAME=FILE.jsonl");
    }
    Ok((name, file))
}

fn pm(m: &Metric) -> String {
    match m.stderr {
        Some(s) => format!("{:.4} ± {:.4}", m.value, s),
        None => format!("{:.4} ± n/a   ", m.value),
    }
}

/// Runs `--task`: `a.task` is not empty.
pub fn run<B: Backend>(a: Args, device: B::Device) -> anyhow::Result<()> {
    if a.params.routing == EvalRouting::Oracle {
        bail!("--routing oracle forces dataset i to expert i; it has no meaning for --task (use learned or random)");
    }
    a.task_params.check().flag_err()?;
    let mut tasks: Vec<(String, McTask)> = Vec::new();
    for s in &a.task {
        let (name, file) = parse_task_spec(s)?;
        if tasks.iter().any(|(n, _)| *n == name) {
            bail!("--task `{s}`: the name `{name}` is given twice");
        }
        if moe_shared::corpus::token_file::is_token_file(&file) {
            bail!(
                "--task {name}: {file} is a token file (`moe-studio tokenize`: a corpus for --data); a task is \
                 multiple-choice JSON lines (NAME=FILE.jsonl, lm-evaluation-harness's multiple_choice: docs/methods.md §8)"
            );
        }
        let text = std::fs::read_to_string(&file).with_context(|| format!("--task {name}: reading {file}"))?;
        tasks.push((name, McTask::parse(&text, &file)?.limited(a.task_params.limit)));
    }
    let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let (tok, _) = resolve_tokenizer(&m, a.tokenizer.as_deref())?;
    let mut model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
    let moe = is_moe(&model);
    if a.params.routing == EvalRouting::Random {
        if !moe {
            bail!("--routing random needs an MoE model; this one is dense");
        }
        model = randomize_routers(model, a.params.seed);
    }
    let opts = McOptions { target_delimiter: a.task_params.target_delimiter.clone(), batch: a.batch };
    let quiet = a.json || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut rows = Vec::new();
    for (name, task) in &tasks {
        let r = evaluate_task(&model, &tok, task, &opts, &device, |done, total| {
            if !quiet {
                eprint!("\r{name}: request {done}/{total}");
            }
        })?;
        if !quiet {
            eprint!("\r\x1b[2K");
        }
        if r.truncated > 0 {
            eprintln!(
                "note: {name}: {} request(s) longer than the model's context ({} tokens) were cut from the left, as lm-eval does",
                r.truncated, model.config.max_position_embeddings
            );
        }
        rows.push((name, &task.file, r));
    }
    if a.json {
        let tasks = rows.iter().map(|(n, f, r)| TaskResult::new(n, f, r)).collect();
        let report = TaskEvalReport { model: m.path.clone(), routing: a.params.routing.name().to_string(), moe, tasks };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{:<12} {:>7} {:>17} {:>17} {:>17}", "task", "items", "acc", "acc_norm", "acc_bytes");
        for (n, _, r) in &rows {
            println!("{:<12} {:>7} {:>17} {:>17} {:>17}", n, r.items, pm(&r.acc), pm(&r.acc_norm), pm(&r.acc_bytes));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_specs_name_their_file() {
        assert_eq!(parse_task_spec("en=a/b.jsonl").unwrap(), ("en".into(), "a/b.jsonl".into()));
        assert_eq!(parse_task_spec("a/hu.jsonl").unwrap(), ("hu".into(), "a/hu.jsonl".into()));
        assert!(parse_task_spec("=x.jsonl").is_err());
        assert!(parse_task_spec("en=").is_err());
    }
}
