//! `moe-studio recipe FILE.yml --out DIR`: runs a mergekit merge config, a
//! mergekit-moe config or a studio pipeline recipe
//! (`moe_shared::recipe`; docs/methods.md §6.1 "mergekit recipes").
//!
//! The recipe is read and every key checked, every input path checked,
//! and only then are the stages run: each is the `moe-studio` command the
//! recipe stands for, parsed by this CLI's own parser. Intermediate stages
//! write into a hidden temporary sibling of `--out`, removed at the end
//! (also on failure); the last stage writes `--out` atomically. A refused
//! or failed recipe leaves nothing behind.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use moe_shared::recipe::{parse, plan, RecipeContext};

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
        let mut argv = vec!["moe-studio".to_string(), format!("--backend={backend}")];
        argv.extend(s.argv.iter().cloned());
        let cli = super::Cli::try_parse_from(&argv)
            .with_context(|| format!("{source}: stage {} ({}) did not parse", i + 1, s.command))?;
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
