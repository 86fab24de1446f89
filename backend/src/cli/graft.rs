//! `moe-studio graft MOE --base DENSE --instruct DENSE [--scale 1.0] --out
//! DIR`: DeltaMoE phase 2 — add `scale * (instruct - base)` to a model
//! (shared tensors get the delta of the same name, every expert of layer
//! `l` gets layer `l`'s dense FFN delta, routers none). On a dense target
//! this is task arithmetic with one model.

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::methods::delta::{companion_files, graft, GraftOptions};
use moe_shared::methods::stream_read::use_positioned_reads;
use moe_shared::ops::graft::GraftParams;
use moe_shared::tensor_io::card::CardMethod;

use super::args::FlagErr;

/// Arguments of `graft`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The model that receives the delta: an upcycled MoE (any layout of
    /// `--layout`) or a dense model (a Hugging Face directory, `.gguf` or
    /// llama2.c `.bin`).
    pub target: PathBuf,
    /// The dense base model the delta starts from.
    #[arg(long)]
    pub base: PathBuf,
    /// The post-trained (instruct / SFT) version of the base.
    #[arg(long)]
    pub instruct: PathBuf,
    /// What the graft does: the scale on the delta (ops/graft.rs).
    #[command(flatten)]
    pub params: GraftParams,
    /// Output layout of an MoE target (default: the target's own layout).
    #[command(flatten)]
    pub layout: moe_shared::ops::convert::LayoutParams,
    #[command(flatten)]
    pub output: super::args::Output,
}

/// Runs `graft`.
pub fn run(a: Args) -> anyhow::Result<()> {
    // The rules the server and the tab check too (shared), in the CLI's flags.
    a.params.check().flag_err()?;
    let open = |p: &PathBuf, role: &str| -> anyhow::Result<LoadedModel> {
        let mut m = open_model(p).with_context(|| format!("opening the {role} {}", p.display()))?;
        // Positioned reads keep the inputs out of the resident set.
        use_positioned_reads(p, &mut m)?;
        Ok(m)
    };
    let target = open(&a.target, "target")?;
    let base = open(&a.base, "base")?;
    let instruct = open(&a.instruct, "instruct model")?;
    for (m, role) in [(&base, "--base"), (&instruct, "--instruct")] {
        if m.moe.is_some() {
            anyhow::bail!("{role} {}: an MoE model; the delta is taken between two dense models", m.path);
        }
    }
    let keep = match target.layout {
        Some(l) => moe_shared::layout::LayoutRequest::Named(l),
        None => moe_shared::layout::LayoutRequest::Auto,
    };
    let layout = a.layout.request_or(keep).flag_err()?;
    let extra = companion_files(&a.target, &target)?;
    let card = super::card::card(
        CardMethod::DeltaMoe,
        [
            ("target".to_string(), a.target.as_path()),
            ("delta base".to_string(), a.base.as_path()),
            ("delta instruct".to_string(), a.instruct.as_path()),
        ],
    );
    let write_opts = a.output.write_options().with_card(Some(card));
    let report = graft(
        target.source.as_ref(),
        &target.config,
        target.moe.as_ref(),
        base.source.as_ref(),
        instruct.source.as_ref(),
        &GraftOptions { scale: a.params.scale, layout, experts_format: a.layout.experts().flag_err()? },
        &a.output.out,
        &extra,
        write_opts,
    )?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if a.output.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let largest = report.deltas.iter().max_by(|x, y| x.relative.total_cmp(&y.relative));
        println!(
            "grafted {} of {} tensors ({} expert tensors; {} router tensors unchanged), scale {}: {:.1} MB in {:.2} s -> {}",
            report.grafted,
            report.tensors,
            report.expert_tensors,
            report.routers,
            report.scale,
            report.tensor_bytes as f64 / 1e6,
            report.seconds.unwrap_or(0.0),
            a.output.out.display()
        );
        if let Some(d) = largest {
            println!("largest relative delta: {} (||delta|| / ||base|| = {:.3e})", d.name, d.relative);
        }
    }
    Ok(())
}

/// A graft job: the spec's target, base, instruct model and parameters.
impl super::run_job::FromJob for moe_shared::api::GraftSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Graft(Args {
            target: j.model(&self.target),
            base: j.model(&self.base),
            instruct: j.model(&self.instruct),
            params: self.params.clone(),
            layout: super::run_job::defaults(),
            output: j.output(),
        })
    }
}
