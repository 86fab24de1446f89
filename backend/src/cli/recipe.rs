//! `moe-studio recipe FILE.yml --out DIR`: runs a mergekit merge config, a
//! mergekit-moe config or a studio pipeline recipe
//! (`moe_shared::recipe`; docs/methods.md §6.1 "mergekit recipes").
//!
//! The recipe is read and every key checked, every input path checked,
//! and only then are the stages run: each as the subcommand's typed
//! arguments ([`stage_command`] of the plan's `StageOp`), shown, logged and
//! written into the model card as the `moe-studio` command line it equals
//! (tested below for every kind of stage). Intermediate stages
//! write into a hidden temporary sibling of `--out`, removed at the end
//! (also on failure); the last stage writes `--out` atomically. A refused
//! or failed recipe leaves nothing behind.

use std::path::{Path, PathBuf};

use anyhow::Context;
use moe_shared::jobs::PathInputs;
use moe_shared::recipe::{parse, plan, RecipeContext, Stage, StageOp};

use super::args::{Output, OutputDtype};
use super::Command;
use moe_shared::ops::convert::LayoutParams;

/// Arguments of `recipe`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The recipe (YAML): a mergekit config (`merge_method`), a
    /// mergekit-moe config (`base_model`, `experts`) or a studio recipe.
    pub recipe: PathBuf,
    /// Output directory (must not exist or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Directory relative paths in the recipe are read from (default: the
    /// current directory, as mergekit).
    #[arg(long)]
    pub base_dir: Option<PathBuf>,
    /// Seed of DARE's drop, a random router and upcycle noise when the
    /// recipe gives none (mergekit-yaml's `--random-seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the stages' commands and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

fn nonempty_dir(p: &Path) -> bool {
    p.exists() && (p.is_file() || std::fs::read_dir(p).map(|mut d| d.next().is_some()).unwrap_or(true))
}

/// Runs `recipe` with the global `--backend` `backend`.
pub fn run(backend: &str, a: Args) -> anyhow::Result<()> {
    let source = a.recipe.display().to_string();
    let text = std::fs::read_to_string(&a.recipe).with_context(|| format!("reading {source}"))?;
    let recipe = parse(&text, &source)?;
    for w in recipe.warnings() {
        eprintln!("warning: {w}");
    }
    if nonempty_dir(&a.out) {
        anyhow::bail!("{}: the output exists and is not empty; choose a new directory", a.out.display());
    }
    let base_dir = match &a.base_dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("reading the current directory")?,
    };
    let parent = match a.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        anyhow::bail!("{}: the output's parent directory does not exist", a.out.display());
    }
    let name = a.out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    // The work directory's name is fixed only once it exists; plan with a
    // provisional one when nothing will be written.
    let work = if a.dry_run {
        None
    } else {
        Some(
            tempfile::Builder::new()
                .prefix(&format!(".{name}.recipe-"))
                .tempdir_in(&parent)
                .with_context(|| format!("creating a work directory in {}", parent.display()))?,
        )
    };
    let work_dir =
        work.as_ref().map(|w| w.path().to_path_buf()).unwrap_or_else(|| parent.join(format!(".{name}.recipe-work")));
    let ctx = RecipeContext { base_dir: base_dir.clone(), work_dir, out: a.out.clone(), seed: a.seed };
    let p = plan(&recipe, &ctx).map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
    for (key, path) in &p.inputs {
        if !path.exists() {
            anyhow::bail!(
                "{source}: `{key}`: {} does not exist (relative paths are read from {}; the studio reads local \
                 checkpoints and does not download Hugging Face Hub ids)",
                path.display(),
                base_dir.display()
            );
        }
    }
    if a.dry_run {
        println!("# {} recipe {source}: {} stage(s)", recipe.kind(), p.stages.len());
        for s in &p.stages {
            println!("moe-studio --backend={backend} {}", s.argv.join(" "));
        }
        return Ok(());
    }
    for (path, bytes) in &p.files {
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let n = p.stages.len();
    for (i, s) in p.stages.iter().enumerate() {
        eprintln!("recipe stage {}/{n}: moe-studio {}", i + 1, s.argv.join(" "));
        let cli = super::Cli { backend: backend.to_string(), command: stage_command(s) };
        // The stage's model card names the recipe, its inputs and the stage.
        super::card::set_recipe(Some(super::card::RecipeContext {
            yaml: text.clone(),
            inputs: p.inputs.clone(),
            stage: format!("moe-studio {}", s.argv.join(" ")),
        }));
        let done = super::run(cli).with_context(|| format!("{source}: stage {} ({}) failed", i + 1, s.command));
        super::card::set_recipe(None);
        done?;
    }
    drop(work);
    println!("{} recipe {source}: {n} stage(s) -> {}", recipe.kind(), a.out.display());
    Ok(())
}

/// The typed subcommand of a recipe stage (what its command line says:
/// checked for every kind of stage by the tests below).
pub(crate) fn stage_command(s: &Stage) -> Command {
    let layout = |l: &Option<String>| LayoutParams { layout: l.clone(), ..LayoutParams::default() };
    match &s.op {
        StageOp::Job { spec, layout: l, allocation } => {
            let mut c = super::run_job::command_for(spec, &PathInputs, false, &s.out, false);
            match &mut c {
                Command::Upcycle(a) => {
                    a.layout = layout(l);
                    if allocation.is_some() {
                        a.allocation = allocation.clone();
                    }
                }
                Command::Route(a) => a.layout = layout(l),
                Command::Graft(a) => a.layout = layout(l),
                _ => {}
            }
            c
        }
        StageOp::Moerge(m) => Command::Moerge(super::moerge::Args {
            models: m.models.clone(),
            base: m.base.clone(),
            params: m.params.clone(),
            expert_prompts: m.expert_prompts.clone(),
            no_frozen: false,
            shared: m.shared.clone(),
            layout: layout(&m.layout),
            dtype: OutputDtype { dtype: m.dtype.clone() },
            output: Output { max_shard_bytes: None, out: s.out.clone(), json: false },
        }),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// Every kind of stage runs exactly the command line it shows: the
    /// typed arguments equal what the CLI parses from the stage's argv.
    #[test]
    fn each_stage_runs_the_command_line_it_shows() {
        let ctx = RecipeContext { base_dir: "/r".into(), work_dir: "/w".into(), out: "/o".into(), seed: Some(5) };
        let recipes = [
            // DUME: moerge -> ridge route -> graft, a layout.
            "experts:\n  - source_model: a\n    data: a.txt\n  - source_model: b\n    data: b.txt\n    heldout: b.h\n\
             gate_mode: ridge\nexperts_per_token: 1\nridge: {lambda: 0.5, context: 64}\nlayout: moe_studio\n\
             graft: {base: base, instruct: inst, scale: 0.5}\ndtype: float16\n",
            // mergekit-moe with prompt routers and a gated shared expert.
            "base_model: m\ngate_mode: hidden\narchitecture: qwen\nexperts:\n  - {source_model: a, positive_prompts: [x]}\n\
             \x20 - {source_model: b, positive_prompts: [y]}\nshared_experts: [{source_model: m, positive_prompts: [z]}]\n",
            // Upcycle with a per-layer allocation written by the runner, then a graft.
            "base_model: m\nupcycle: {experts_per_layer: [2, null, 4], drop_ratio: 0.5}\ngate_mode: random\n\
             router_std: 0.02\nfrozen_experts: []\ndtype: bfloat16\ntemperature: 0.5\ngraft: {base: m, instruct: i}\n",
            // Upcycle with the recipe's allocation file.
            "base_model: m\nupcycle: {shared_experts: 1}\nallocation: alloc.json\ngate_mode: zeros\n",
            // mergekit merges.
            "merge_method: ties\nbase_model: b\nmodels:\n  - {model: m, parameters: {weight: 1, density: 0.5}}\n\
             \x20 - {model: n, parameters: {weight: 0.5, density: 0.5}}\ndtype: float16\n",
            "merge_method: linear\nmodels:\n  - model: m\n    parameters: {weight: 1}\n  - model: n\n    parameters: {weight: 2}\n",
        ];
        let mut kinds = std::collections::BTreeSet::new();
        for y in recipes {
            let p = plan(&parse(y, "t.yml").unwrap_or_else(|e| panic!("{y}: {e}")), &ctx).unwrap();
            for st in &p.stages {
                kinds.insert(st.command);
                let mut argv = vec!["moe-studio".to_string(), "--backend=ndarray".to_string()];
                argv.extend(st.argv.iter().cloned());
                let mut parsed =
                    super::super::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}")).command;
                match &mut parsed {
                    Command::Upcycle(a) if a.no_frozen => (a.no_frozen, a.params.frozen) = (false, Vec::new()),
                    Command::Moerge(a) if a.no_frozen => (a.no_frozen, a.params.frozen) = (false, Vec::new()),
                    _ => {}
                }
                assert_eq!(format!("{:?}", stage_command(st)), format!("{parsed:?}"), "{argv:?}");
            }
        }
        assert_eq!(kinds.len(), 5, "{kinds:?}");
    }
}
