//! `moe-studio merge linear|task-arithmetic|ties|dare|dare-ties MODEL...
//! [--weights ...] [--base DENSE] --out DIR`: the weight-merging baselines
//! (mergekit semantics; see `moe_shared::methods::merge`).

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::jobs::Defaults as D;
use moe_shared::methods::delta::companion_files;
use moe_shared::methods::merge::{merge, set_config_dtype, MergeMethod, MergeOptions, Rescale};
use moe_shared::methods::stream_read::use_positioned_reads;
use moe_shared::tensor_io::card::CardMethod;

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
    /// One weight per model, comma-separated (default: all 1).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub weights: Option<Vec<f64>>,
    /// The base model the deltas are taken from (all methods but linear).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Fraction of each delta kept by ties / dare, in (0, 1].
    #[arg(long, default_value_t = D::default().merge_density)]
    pub density: f64,
    /// Seed of dare's random drop.
    #[arg(long, default_value_t = D::default().seed)]
    pub seed: u64,
    /// Divide by the sum of weights: true or false (default as mergekit:
    /// true for linear and ties, false otherwise).
    #[arg(long)]
    pub normalize: Option<bool>,
    /// Rescaling of sparsified deltas: none, inverse-density (the DARE
    /// paper; dare's default) or l1 (mergekit 0.1.5's `rescale: true`).
    #[arg(long, value_parser = parse_rescale)]
    pub rescale: Option<Rescale>,
    /// Factor on the merged delta (mergekit's `lambda`).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub lambda: f64,
    #[command(flatten)]
    pub dtype: super::args::OutputDtype,
    #[command(flatten)]
    pub output: super::args::Output,
}

fn parse_method(s: &str) -> Result<MergeMethod, String> {
    MergeMethod::parse(s).ok_or_else(|| format!("`{s}`: expected linear, task-arithmetic, ties, dare or dare-ties"))
}

fn parse_rescale(s: &str) -> Result<Rescale, String> {
    Rescale::parse(s).ok_or_else(|| format!("`{s}`: expected none, inverse-density or l1"))
}

/// Runs `merge`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let dtype = a.dtype.parse()?;
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
    let opts = MergeOptions {
        method: a.method,
        weights: a.weights.clone(),
        density: a.density,
        normalize: a.normalize,
        rescale: a.rescale,
        lambda: a.lambda,
        seed: a.seed,
        dtype,
    };
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
