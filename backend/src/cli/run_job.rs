//! `moe-studio run-job job.json`: runs one server job from the file the
//! server wrote into the job's directory ([`moe_shared::jobs::JobFile`]:
//! the backend, the spec, and where each input checkpoint and dataset is).
//!
//! The spec becomes the subcommand's typed arguments here, field by field
//! (no command line is written and parsed again): the operation's
//! parameter struct (`moe_shared::ops`) is moved into the subcommand's
//! flattened `params` as it is, the inputs become paths, and the rest take
//! the subcommand's own defaults (read from its clap attributes by
//! [`defaults`], so a job and the typed command cannot drift apart). A
//! test checks that every kind's arguments equal what the CLI parses from
//! the same job typed as a command line (`shared::jobs::JobSpec::cli_args`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::FromArgMatches;
use moe_shared::api::{DataRef, JobSpec};
use moe_shared::jobs::{JobFile, JobInputs, ALLOCATION_FILE, JOB_OUT};

use super::args::{DocsArg, LayoutArg, Output, OutputDtype};
use super::{Cli, Command};

/// Arguments of `run-job`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The job file (`job.json`, written by `moe-studio serve` into the job's directory). Paths in it
    /// are relative to the working directory; the output goes to `out/` there.
    pub file: PathBuf,
}

/// Reads, checks and runs the job file (on the backend it names).
///
/// # Errors
/// The file unreadable or not a job file (named), a spec the server would
/// refuse, an input the file does not place; then whatever the command
/// returns.
pub fn run(a: Args) -> anyhow::Result<()> {
    let job = read(&a.file)?;
    // The output's model card names the command the job stands for.
    let argv = std::iter::once(format!("--backend={}", job.backend)).chain(job.spec.cli_args(&job, job.resume));
    super::card::set_command(Some(super::card::command_of(argv)));
    super::run(Cli { backend: job.backend.clone(), command: command(&job) })
}

/// The typed subcommand that runs `job` (its inputs placed by the file,
/// writing `out/` with a JSON summary).
pub fn command(job: &JobFile) -> Command {
    command_for(&job.spec, job, job.resume, Path::new(JOB_OUT), true)
}

/// The job file at `path`, checked ([`JobFile::check`]).
///
/// # Errors
/// As [`run`], before anything runs.
pub fn read(path: &Path) -> anyhow::Result<JobFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the job file {}", path.display()))?;
    let job: JobFile =
        serde_json::from_str(&text).with_context(|| format!("{}: not a moe-studio job file", path.display()))?;
    job.check().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(job)
}

/// The values of a flattened argument struct when no option of it is
/// given: its clap defaults (what the command line would give).
pub(crate) fn defaults<T: clap::Args + FromArgMatches>() -> T {
    let cmd = T::augment_args(clap::Command::new("defaults").no_binary_name(true));
    let m = cmd.try_get_matches_from(std::iter::empty::<String>()).expect("every option here has a default");
    T::from_arg_matches(&m).expect("the defaults parse")
}

/// The typed subcommand that runs `spec` with its inputs where `job`
/// places them, writing `out` (train: `--resume` when `resume`), with a
/// JSON summary on stdout when `json` (a job's; a recipe stage prints none).
pub fn command_for(spec: &JobSpec, job: &dyn JobInputs, resume: bool, out: &Path, json: bool) -> Command {
    let m = |id: &String| PathBuf::from(job.model(id));
    let output = || Output { max_shard_bytes: None, out: out.to_path_buf(), json };
    // `NAME=FILE`, the form every `--data` / `--lang` / `--task` takes.
    let named = |d: &DataRef| format!("{}={}", d.name, job.data(d, false));
    let docs: DocsArg = defaults();
    match spec {
        JobSpec::Upcycle(s) => Command::Upcycle(super::upcycle::Args {
            model: m(&s.model),
            experts: s.experts,
            allocation: s.experts_per_layer.as_ref().map(|_| ALLOCATION_FILE.into()),
            no_frozen: false,
            expert_prompts: None,
            params: s.params.clone(),
            layout: defaults::<LayoutArg>(),
            dtype: OutputDtype { dtype: s.dtype.clone() },
            output: output(),
        }),
        JobSpec::Moerge(s) => Command::Moerge(super::moerge::Args {
            models: s.models.iter().map(m).collect(),
            base: None,
            params: s.params.clone(),
            expert_prompts: None,
            no_frozen: false,
            shared: Default::default(),
            layout: defaults::<LayoutArg>(),
            dtype: OutputDtype { dtype: s.dtype.clone() },
            output: output(),
        }),
        JobSpec::Route(s) => Command::Route(super::route::Args {
            weights: defaults(),
            model: m(&s.model),
            // `NAME=FILE[:HELDOUT]`.
            domains: s
                .domains
                .iter()
                .map(|d| match &d.heldout {
                    Some(_) => format!("{}:{}", named(d), job.data(d, true)),
                    None => named(d),
                })
                .collect(),
            add_expert: None,
            params: s.params.clone(),
            docs,
            layout: defaults::<LayoutArg>(),
            lambda_sweep: Vec::new(),
            lambda_sweep_relative: Vec::new(),
            stats: None,
            out: out.to_path_buf(),
            json,
        }),
        JobSpec::Graft(s) => Command::Graft(super::graft::Args {
            target: m(&s.target),
            base: m(&s.base),
            instruct: m(&s.instruct),
            params: s.params.clone(),
            layout: defaults::<LayoutArg>(),
            output: output(),
        }),
        JobSpec::Merge(s) => Command::Merge(super::merge::Args {
            method: s.method,
            models: s.models.iter().map(m).collect(),
            base: s.base.as_ref().map(m),
            params: s.params.clone(),
            dtype: OutputDtype { dtype: s.dtype.clone() },
            output: output(),
        }),
        JobSpec::Neurons(s) => Command::Neurons(super::neurons::Args {
            weights: defaults(),
            model: m(&s.model),
            langs: s.langs.iter().map(named).collect(),
            docs,
            new: s.new.clone(),
            params: s.params.clone(),
            batch: 8,
            threads: None,
            bench: false,
            tokenizer: None,
            out: out.to_path_buf(),
        }),
        JobSpec::Train(s) => {
            let torch = s.engine == Some(moe_shared::api::TrainEngine::Torch);
            Command::Train(super::train::Args {
                model: m(&s.model),
                stage: s.stage,
                // `NAME=FILE[:WEIGHT][:orig]`.
                data: s
                    .data
                    .iter()
                    .map(|d| {
                        let mut x = named(d);
                        if let Some(w) = d.weight {
                            x.push_str(&format!(":{w}"));
                        }
                        if d.original {
                            x.push_str(":orig");
                        }
                        x
                    })
                    .collect(),
                docs,
                steps: s.steps,
                params: s.run_params(),
                // The torch engine's job directory is the artefact; emitting
                // again is its resume.
                out: (!torch).then(|| out.to_path_buf()),
                engine: if torch { "torch" } else { "burn" }.to_string(),
                emit: torch.then(|| out.to_path_buf()),
                resume: resume && !torch,
                nodes: 1,
                tokenizer: None,
                json,
            })
        }
        JobSpec::Eval(s) => Command::Eval(super::eval::Args {
            weights: defaults(),
            model: m(&s.model),
            data: s.data.iter().map(named).collect(),
            docs,
            task: Vec::new(),
            task_params: Default::default(),
            batch: moe_shared::eval::PerplexityOptions::DEFAULT_BATCH,
            params: s.params.clone(),
            tokenizer: None,
            json,
        }),
        JobSpec::Task(s) => Command::Eval(super::eval::Args {
            weights: defaults(),
            model: m(&s.model),
            data: Vec::new(),
            docs,
            task: s.tasks.iter().map(named).collect(),
            task_params: s.params.clone(),
            batch: s.batch.unwrap_or(moe_shared::eval::PerplexityOptions::DEFAULT_BATCH),
            params: Default::default(),
            tokenizer: None,
            json,
        }),
    }
}
