//! `moe-studio allocate --neurons DIR --min 1 --max 6 [--baseline uniform|layermoe]
//! [--uniform N] [--new hu,el,tr] --out FILE`: NeuronMoE's per-layer new-expert
//! counts (methods.md §3) from a `neurons` run, written as the allocation file
//! `upcycle --allocation FILE` reads (`new_experts_per_layer`).
//!
//! FILE carries NeuronMoE's allocation, or the baseline named by
//! `--baseline`. Beside it, `STEM.comparison.{json,csv,svg,png}` compare
//! NeuronMoE, uniform and LayerMoE-style allocations per layer.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use moe_shared::methods::allocate::{compare_allocations, AllocationMethod, ExpertRange};
use moe_shared::methods::neurons::NeuronReport;
use moe_shared::methods::AllocationFile;

use super::figures::{grouped_bars, Series};
use super::neurons::count_text;

/// Arguments of `allocate`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The output directory of `moe-studio neurons` (or its `neurons.json`).
    #[arg(long)]
    pub neurons: PathBuf,
    /// E_min: fewest new experts per layer.
    #[arg(long, default_value_t = 1)]
    pub min: usize,
    /// E_max: most new experts per layer.
    #[arg(long, default_value_t = 6)]
    pub max: usize,
    /// Write a baseline instead of NeuronMoE: uniform (the same total spread evenly), layermoe
    /// (LayerMoE-style, from hidden-state similarity), or a placement control with NeuronMoE's own
    /// counts: shuffled (a seeded permutation), inverted (reverse order of the specific-neuron
    /// counts), layermoe-placed (in LayerMoE's order).
    #[arg(long)]
    pub baseline: Option<String>,
    /// New experts per layer of the uniform baseline (default: exactly NeuronMoE's total, spread
    /// evenly: every layer floor(total / layers), one more in the remainder's layers).
    #[arg(long)]
    pub uniform: Option<usize>,
    /// Seed of the shuffled control.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// New languages (comma-separated; default: those of the neurons run).
    #[arg(long, value_delimiter = ',')]
    pub new: Vec<String>,
    /// The allocation file to write (JSON).
    #[arg(long)]
    pub out: PathBuf,
}

fn stem_with(out: &Path, suffix: &str) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "allocation".into());
    out.with_file_name(format!("{stem}{suffix}"))
}

fn list(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// Runs `allocate`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let range = ExpertRange::new(a.min, a.max)?;
    let method = match a.baseline.as_deref() {
        None => AllocationMethod::NeuronMoe,
        Some(name) => AllocationMethod::parse(name).with_context(|| {
            let names: Vec<&str> = AllocationMethod::ALL.iter().map(|m| m.name()).collect();
            format!("--baseline `{name}`: expected one of {}", names.join(", "))
        })?,
    };
    let path = if a.neurons.is_dir() { a.neurons.join("neurons.json") } else { a.neurons.clone() };
    let bytes = std::fs::read(&path)
        .with_context(|| format!("reading {} (run `moe-studio neurons ... --out DIR` first)", path.display()))?;
    let report = NeuronReport::from_json(&bytes, &path.display().to_string())?;
    let new = (!a.new.is_empty()).then_some(a.new.as_slice());
    let mut cmp = compare_allocations(&report, new, range, a.uniform)?;
    cmp.reshuffle(a.seed);
    let file: AllocationFile = cmp.file(method)?;
    // Round trip through the reader `upcycle --allocation` uses.
    let text = serde_json::to_string_pretty(&file)?;
    AllocationFile::parse(text.as_bytes(), &a.out.display().to_string())?;
    if let Some(dir) = a.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&a.out, text + "\n").with_context(|| format!("writing {}", a.out.display()))?;

    let total = |v: &[usize]| v.iter().sum::<usize>();
    let mut csv = String::from(
        "layer,specific_neurons,neuronmoe,uniform,layermoe,layermoe_similarity,shuffled,inverted,layermoe_placed\n",
    );
    for l in 0..cmp.neuronmoe.len() {
        writeln!(
            csv,
            "{l},{},{},{},{},{},{},{},{}",
            count_text(cmp.specific_counts[l]),
            cmp.neuronmoe[l],
            cmp.uniform[l],
            cmp.layermoe.as_ref().map(|v| v[l].to_string()).unwrap_or_default(),
            cmp.layermoe_similarity.as_ref().map(|v| format!("{:.6}", v[l])).unwrap_or_default(),
            cmp.shuffled[l],
            cmp.inverted[l],
            cmp.layermoe_placed.as_ref().map(|v| v[l].to_string()).unwrap_or_default(),
        )?;
    }
    let csv_path = stem_with(&a.out, ".comparison.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let json_path = stem_with(&a.out, ".comparison.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&cmp)?)
        .with_context(|| format!("writing {}", json_path.display()))?;

    let mut series = vec![
        Series {
            name: format!("NeuronMoE (total {})", total(&cmp.neuronmoe)),
            values: cmp.neuronmoe.iter().map(|&x| x as f64).collect(),
            emphasis: false,
        },
        Series {
            name: format!("uniform (total {})", total(&cmp.uniform)),
            values: cmp.uniform.iter().map(|&x| x as f64).collect(),
            emphasis: false,
        },
    ];
    if let Some(l) = &cmp.layermoe {
        series.push(Series {
            name: format!("LayerMoE-style (total {})", total(l)),
            values: l.iter().map(|&x| x as f64).collect(),
            emphasis: false,
        });
    }
    let title =
        format!("New experts per layer for {} (E in [{}, {}])", cmp.new_languages.join(","), range.min, range.max);
    let figs = grouped_bars(&stem_with(&a.out, ".comparison"), &title, "layer", "new experts", &series)?;

    let s_l: Vec<String> = cmp.specific_counts.iter().map(|&x| count_text(x)).collect();
    println!("S_l:        {}", s_l.join(","));
    for w in report.warnings_for(&cmp.new_languages).iter().filter(|w| w.affects_allocation) {
        eprintln!("warning: {}", w.message);
    }
    println!("neuronmoe:  {} (total {})", list(&cmp.neuronmoe), total(&cmp.neuronmoe));
    let budget = if a.uniform.is_some() { "--uniform" } else { "NeuronMoE's total" };
    println!("uniform:    {} (total {}, {budget})", list(&cmp.uniform), total(&cmp.uniform));
    match &cmp.layermoe {
        Some(l) => println!("layermoe:   {} (total {})", list(l), total(l)),
        None => println!("layermoe:   n/a (every analysed language is new; no original language to compare with)"),
    }
    println!("shuffled:   {} (NeuronMoE's counts, seed {})", list(&cmp.shuffled), a.seed);
    println!("inverted:   {} (NeuronMoE's counts, reverse S_l order)", list(&cmp.inverted));
    if let Some(l) = &cmp.layermoe_placed {
        println!("layermoe-placed: {} (NeuronMoE's counts in LayerMoE's order)", list(l));
    }
    println!("wrote {} ({})", a.out.display(), method.name());
    for p in [csv_path, json_path].into_iter().chain(figs) {
        println!("wrote {}", p.display());
    }
    Ok(())
}
