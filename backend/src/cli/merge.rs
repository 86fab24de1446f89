//! `moe-studio merge linear|task-arithmetic|ties|dare|dare-ties MODEL...
//! [--weights ...] [--base DENSE] --out DIR`: the weight-merging baselines
//! (mergekit semantics; see `moe_shared::methods::merge`).

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::methods::delta::companion_files;
use moe_shared::methods::merge::{merge, set_config_dtype, MergeMethod, MergeOptions};
use moe_shared::methods::stream_read::use_positioned_reads;
use moe_shared::ops::merge::MergeParams;
use moe_shared::tensor_io::card::CardMethod;

use super::args::FlagErr;

/// Arguments of `merge`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// `linear`, `task-arithmetic`, `ties`, `dare` (mergekit's
    /// `dare_linear`) or `dare-ties`.
    #[arg(value_parser = parse_method)]
    pub method: MergeMethod,
    /// The models to merge (Hugging Face directories, `.gguf` or llama2.c
    /// `.bin`), all of one architecture and shape.
    #[arg(required = true, num_args = 1..)]
    pub models: Vec<PathBuf>,
    /// The base model the deltas are taken from (all methods but linear).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// What the merge does (weights, density, normalise, rescale, lambda,
    /// seed): the operation's own parameters, shared with the server's job.
    #[command(flatten)]
    pub params: MergeParams,
    #[command(flatten)]
    pub dtype: super::args::OutputDtype,
    #[command(flatten)]
    pub output: super::args::Output,
}

fn parse_method(s: &str) -> Result<MergeMethod, String> {
    MergeMethod::parse(s).ok_or_else(|| format!("`{s}`: expected linear, task-arithmetic, ties, dare or dare-ties"))
}

/// Runs `merge`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let dtype = a.dtype.parse()?;
    a.params.check(a.models.len()).flag_err()?;
    // Positioned reads keep the inputs out of the resident set.
    let open = |p: &PathBuf, what: &str| -> anyhow::Result<LoadedModel> {
        let mut m = open_model(p).with_context(|| format!("opening {what}{}", p.display()))?;
        use_positioned_reads(p, &mut m)?;
        Ok(m)
    };
    let models = a.models.iter().map(|p| open(p, "")).collect::<anyhow::Result<Vec<_>>>()?;
    let base = match &a.base {
        Some(p) => Some(open(p, "the base ")?),
        None => None,
    };
    let mut extra = companion_files(&a.models[0], &models[0])?;
    if let Some(d) = dtype {
        for (name, bytes) in extra.iter_mut() {
            if *name == "config.json" {
                *bytes = set_config_dtype(bytes, d);
            }
        }
    }
    let opts = MergeOptions { dtype, ..a.params.options(a.method) };
    let roles = a
        .base
        .iter()
        .map(|p| ("base".to_string(), p.as_path()))
        .chain(a.models.iter().enumerate().map(|(i, p)| (format!("model {i}"), p.as_path())));
    let mut card = super::card::card(CardMethod::Merge, roles);
    card.detail("merge method", a.method.name());
    let write_opts = a.output.write_options().with_card(Some(card));
    let sources: Vec<&dyn moe_shared::tensor_io::TensorSource> =
        models.iter().map(|m| m.source.as_ref() as &dyn moe_shared::tensor_io::TensorSource).collect();
    let base_src = base.as_ref().map(|b| b.source.as_ref() as &dyn moe_shared::tensor_io::TensorSource);
    let report = merge(&sources, base_src, &opts, &a.output.out, &extra, write_opts)?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if a.output.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let kept =
            report.kept_fraction.map(|k| format!(", {:.1}% of delta elements kept", 100.0 * k)).unwrap_or_default();
        println!(
            "{} merge of {} model(s){}: {} tensors, {:.1} MB {} in {:.2} s{kept} -> {}",
            report.params.method.name(),
            report.models.len(),
            report.base.as_ref().map(|b| format!(" on base {b}")).unwrap_or_default(),
            report.tensors,
            report.tensor_bytes as f64 / 1e6,
            report.dtype,
            report.seconds.unwrap_or(0.0),
            a.output.out.display()
        );
    }
    Ok(())
}

/// A merge job: the spec's method, models, base, parameters and dtype.
impl super::run_job::FromJob for moe_shared::api::MergeSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Merge(Args {
            method: self.method,
            models: self.models.iter().map(|id| j.model(id)).collect(),
            base: self.base.as_ref().map(|b| j.model(b)),
            params: self.params.clone(),
            dtype: super::args::OutputDtype { dtype: self.dtype.clone() },
            output: j.output(),
        })
    }
}
