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
use moe_shared::jobs::{JobFile, JobInputs, JOB_OUT};

use super::args::{DocsArg, Output};
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
/// JSON summary on stdout when `json` (a job's; a recipe stage prints none):
/// the operation's subcommand's [`FromJob`] impl, chosen by the registry
/// (`moe_shared::job_operations!`).
pub fn command_for(spec: &JobSpec, job: &dyn JobInputs, resume: bool, out: &Path, json: bool) -> Command {
    let j = JobArgs { job, resume, out, json };
    macro_rules! dispatch {
        ($( $wire:literal => $variant:ident($module:ident :: $spec:ident) ),* $(,)?) => {
            match spec {
                $( JobSpec::$variant(s) => FromJob::command(s, &j), )*
            }
        };
    }
    moe_shared::job_operations!(dispatch)
}

/// What a job's subcommand is built from besides its spec: where the
/// inputs are, the output directory, train's resume, whether to print a
/// JSON summary.
pub struct JobArgs<'a> {
    /// Where each input checkpoint and dataset is.
    pub job: &'a dyn JobInputs,
    /// Train: continue from the last checkpoint (`--resume`).
    pub resume: bool,
    /// The output directory (`--out`).
    pub out: &'a Path,
    /// A JSON summary on stdout (`--json`).
    pub json: bool,
}

impl JobArgs<'_> {
    /// The model argument of checkpoint `id`.
    pub fn model(&self, id: &str) -> PathBuf {
        PathBuf::from(self.job.model(id))
    }

    /// `NAME=FILE`, the form every `--data` / `--lang` / `--task` takes.
    pub fn named(&self, d: &DataRef) -> String {
        format!("{}={}", d.name, self.job.data(d, false))
    }

    /// The held-out file of `d`.
    pub fn heldout(&self, d: &DataRef) -> String {
        self.job.data(d, true)
    }

    /// The `--out` / `--json` of a command that writes a model.
    pub fn output(&self) -> Output {
        Output { max_shard_bytes: None, out: self.out.to_path_buf(), json: self.json }
    }

    /// The corpus reading the CLI defaults to (`--docs`).
    pub fn docs(&self) -> DocsArg {
        defaults()
    }
}

/// A CLI subcommand that runs a job of its operation: the typed arguments
/// that equal the job's command line (`JobSpec::cli_args`, checked by the
/// `cli` tests). Each operation's subcommand implements it in its own file
/// (`cli/upcycle.rs`, ...); [`command_for`] dispatches through the registry.
pub trait FromJob {
    /// The subcommand that runs this spec.
    fn command(&self, j: &JobArgs<'_>) -> Command;
}
