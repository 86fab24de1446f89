//! `moe-studio neurons MODEL --lang CODE=FILE... [--new hu,el,tr] [--top-n 1000]
//! [--pool mean|max] [--max-texts 300] [--max-tokens 256] [--bench] --out DIR`:
//! NeuronMoE's language-specific neurons (methods.md §3).
//!
//! Each FILE's documents (`--docs`: blank-line separated by default,
//! `line` for one text per line) are the language's texts, each scored as
//! its token ids in the stream `train` and `eval` read (`moe_shared::corpus`:
//! with the end-of-text token), truncated to `--max-tokens`. Writes to DIR:
//! `neurons.json` (what `allocate` reads), `layer_counts.csv`,
//! `counts.csv`, `top_neurons.csv`, `similarity.csv`, the figures
//! `specific_per_layer.{svg,png}` and `specific_per_component.{svg,png}`,
//! for an MoE model `expert_counts.csv` and `specific_per_expert.{svg,png}`
//! (the post-training analysis, methods.md §3.7), and with `--bench`
//! `bench.json` (texts/s, capture overhead, peak memory).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use burn::tensor::backend::Backend;
use moe_shared::checkpoint::open_model;
use moe_shared::methods::neurons::{
    analyze, average_precision_table, expert_counts, expert_layer_means, ComponentUnits, ExpertLayerMeans, ExpertRef,
    LayerCounts, NeuronCollector, NeuronReport,
};
use moe_shared::model::{load_model_as, Pooling};
use moe_shared::ops::neurons::NeuronsParams;

use super::backend::WithBackend;
use super::figures::{line_chart, panels, Panel, Series};

use super::args::FlagErr;

/// Arguments of `neurons`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A model (directory, `.gguf` or llama2.c `.bin`) with a tokenizer.
    /// Dense, or MoE for NeuronMoE's post-training analysis: then every
    /// expert's gate/up/down units are neurons too, each expert computed on
    /// every token (`expert_counts.csv`, `specific_per_expert.{svg,png}`).
    pub model: PathBuf,
    #[command(flatten)]
    pub weights: super::args::WeightsArg,
    /// `CODE=FILE`: texts of one language, the file's documents (see --docs; at least 2 languages).
    #[arg(long = "lang", required = true)]
    pub langs: Vec<String>,
    #[command(flatten)]
    pub docs: super::args::DocsArg,
    /// The new languages whose union of specific neurons drives the
    /// allocation (comma-separated codes; default: every language but the first).
    #[arg(long, value_delimiter = ',')]
    pub new: Vec<String>,
    /// What the run does (top-N, bottom-N, pooling, texts per language,
    /// tokens per text): the operation's own parameters, shared with the
    /// server's job.
    #[command(flatten)]
    pub params: NeuronsParams,
    /// Texts per forward pass (one right-padded batch; pooling covers each
    /// text's own tokens, so the result does not depend on it beyond float
    /// summation order).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Threads for the Average Precision (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also time a plain forward pass on every text (interleaved with the
    /// capture pass) and report texts/s, the capture overhead and peak memory.
    #[arg(long)]
    pub bench: bool,
    /// Tokenizer (tokenizer.json or a llama2.c tok*.bin); it replaces the
    /// model's own. Without it: a llama2.c `tokenizer.bin`/`tok{V}.bin` in the
    /// model's directory, else the model's own (as `train` and `eval`).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Output directory (created; files in it are overwritten).
    #[arg(long)]
    pub out: PathBuf,
}

/// Reads `CODE=FILE` and returns the code and the file's first `max`
/// documents (`split`).
fn read_language(
    spec: &str,
    split: moe_shared::corpus::DocSplit,
    max: usize,
) -> anyhow::Result<(String, PathBuf, Vec<String>)> {
    let (code, file) = spec.split_once('=').with_context(|| format!("--lang `{spec}`: expected CODE=FILE"))?;
    if code.trim().is_empty() || file.is_empty() {
        bail!("--lang `{spec}`: expected CODE=FILE with a non-empty code and path");
    }
    if moe_shared::corpus::token_file::is_token_file(file) {
        bail!(
            "--lang `{spec}`: neurons reads its texts (the first --max-texts documents of each language) from the text file itself; give the .txt or .jsonl, not a token file"
        );
    }
    let path = PathBuf::from(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {} (language `{code}`)", path.display()))?;
    let docs = moe_shared::corpus::split_documents(&text, &path.display().to_string(), split)
        .with_context(|| format!("language `{code}`"))?;
    Ok((code.to_string(), path, docs.into_iter().take(max).collect()))
}

/// Peak resident memory of this process in MiB (Linux `VmHWM`).
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A specific-neuron count as the CSV files write it: whole counts as
/// integers, tie-weighted ones with 4 decimals.
pub fn count_text(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.4}")
    }
}

/// Writes the CSV files and figures of a report into `dir`; returns the
/// paths written.
pub fn write_outputs(report: &NeuronReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let codes = report.codes();
    let nl = report.layout.num_layers();
    let union_name = format!("union({})", report.new_languages.join(","));

    // Wide per-layer totals.
    let mut s = String::from("layer");
    for c in &codes {
        write!(s, ",{c}")?;
    }
    writeln!(s, ",union_new,union_new_tie_weighted")?;
    for l in 0..nl {
        write!(s, "{l}")?;
        for lang in &report.languages {
            write!(s, ",{}", count_text(lang.counts[l].total))?;
        }
        let u = &report.union_counts[l];
        writeln!(s, ",{},{}", count_text(u.total), count_text(u.tie_weighted))?;
    }
    let p = dir.join("layer_counts.csv");
    write(&p, &s)?;
    written.push(p);

    // Long per-component counts.
    let mut s = String::from("language,layer,component,count\n");
    for (name, counts) in
        report.languages.iter().map(|l| (l.code.as_str(), &l.counts)).chain([("union_new", &report.union_counts)])
    {
        for (l, c) in counts.iter().enumerate() {
            for (comp, n) in report.layout.layers[l].iter().zip(&c.per_component) {
                writeln!(s, "{name},{l},{},{}", comp.component, count_text(*n))?;
            }
        }
    }
    let p = dir.join("counts.csv");
    write(&p, &s)?;
    written.push(p);

    // The neurons above each cut count 1 (rank = their place); the
    // neurons tied at the cut share the places left (rank empty, weight
    // slots / tied).
    let mut s = String::from("language,kind,rank,layer,component,unit,ap,weight\n");
    let segs = report.layout.segments();
    for lang in &report.languages {
        for (kind, list, cut) in [("top", &lang.top, &lang.top_cut), ("bottom", &lang.bottom, &lang.bottom_cut)] {
            for (r, n) in list.iter().enumerate() {
                writeln!(s, "{},{kind},{r},{},{},{},{:.6},1", lang.code, n.layer, n.component, n.unit, n.ap)?;
            }
            for &i in &cut.tied {
                let p = moe_shared::methods::neurons::NeuronLayout::locate_in(&segs, i).context("tied neuron index")?;
                let comp = &report.layout.layers[p.layer][p.slot].component;
                writeln!(s, "{},{kind},,{},{comp},{},{:.6},{:.6}", lang.code, p.layer, p.unit, cut.ap, cut.weight())?;
            }
        }
    }
    let p = dir.join("top_neurons.csv");
    write(&p, &s)?;
    written.push(p);

    let mut s = String::from("layer,language_a,language_b,cosine\n");
    for (l, m) in report.similarity.cosine.iter().enumerate() {
        for (a, row) in m.iter().enumerate() {
            for (b, v) in row.iter().enumerate().skip(a + 1) {
                writeln!(s, "{l},{},{},{v:.6}", codes[a], codes[b])?;
            }
        }
    }
    let p = dir.join("similarity.csv");
    write(&p, &s)?;
    written.push(p);

    // Figures.
    let label =
        |code: &str| format!("{code}{}", if report.new_languages.iter().any(|n| n == code) { " (new)" } else { "" });
    let mut series: Vec<Series> = report
        .languages
        .iter()
        .map(|l| Series { name: label(&l.code), values: l.counts.iter().map(|c| c.total).collect(), emphasis: false })
        .collect();
    series.push(Series {
        name: union_name.clone(),
        values: report.union_counts.iter().map(|c| c.total).collect(),
        emphasis: true,
    });
    if report.union_counts.iter().any(|c| c.tie_weighted > 0.0) {
        series.push(Series {
            name: format!("{union_name}: tie-weighted part"),
            values: report.union_counts.iter().map(|c| c.tie_weighted).collect(),
            emphasis: false,
        });
    }
    let title = format!(
        "Language-specific neurons per layer (top-{} by AP{}, {} pooling)",
        report.top_n,
        if report.include_bottom { " + bottom" } else { "" },
        match report.pooling {
            Pooling::Mean => "mean",
            Pooling::Max => "max",
        }
    );
    written.extend(line_chart(&dir.join("specific_per_layer"), &title, "layer", "specific neurons", &series)?);

    // One panel per component (+ total); an MoE layer's experts are summed
    // per linear map (`experts.*.gate_proj`).
    let panel_of = |c: &ComponentUnits| match c.expert() {
        None => c.component.clone(),
        Some(ExpertRef::Routed(_)) => format!("experts.*.{}", c.base()),
        Some(ExpertRef::Shared(_)) => format!("shared_experts.*.{}", c.base()),
    };
    let mut comps: Vec<String> = Vec::new();
    for layer in &report.layout.layers {
        for c in layer {
            let name = panel_of(c);
            if !comps.contains(&name) {
                comps.push(name);
            }
        }
    }
    let per_comp = |counts: &[LayerCounts], comp: &str| -> Vec<f64> {
        counts
            .iter()
            .enumerate()
            .map(|(l, c)| {
                report.layout.layers[l]
                    .iter()
                    .zip(&c.per_component)
                    .filter(|(x, _)| panel_of(x) == comp)
                    .map(|(_, n)| n)
                    .sum()
            })
            .collect()
    };
    let mut ps: Vec<Panel> = comps
        .iter()
        .map(|comp| {
            let mut series: Vec<Series> = report
                .languages
                .iter()
                .map(|l| Series { name: label(&l.code), values: per_comp(&l.counts, comp), emphasis: false })
                .collect();
            series.push(Series {
                name: union_name.clone(),
                values: per_comp(&report.union_counts, comp),
                emphasis: true,
            });
            Panel { title: comp.clone(), series }
        })
        .collect();
    ps.push(Panel { title: "all components".into(), series });
    written.extend(panels(
        &dir.join("specific_per_component"),
        "Specific neurons per layer and component",
        "layer",
        "neurons",
        &ps,
        4,
    )?);
    written.extend(write_expert_outputs(report, dir)?);
    Ok(written)
}

/// For a model with MoE layers: `expert_counts.csv` (per language and the
/// union of the new ones, per layer and expert: its neurons and specific
/// neurons) and `specific_per_expert.{svg,png}` (per layer, the union's
/// specific neurons per trainable expert, per frozen expert and in
/// attention). NeuronMoE's post-training analysis (methods.md §3.7).
/// Writes nothing for a dense model.
fn write_expert_outputs(report: &NeuronReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let layout = &report.layout;
    if expert_counts(layout, &report.union_counts).is_empty() {
        return Ok(Vec::new());
    }
    let mut s = String::from("language,layer,expert,kind,units,specific\n");
    for (name, counts) in
        report.languages.iter().map(|l| (l.code.as_str(), &l.counts)).chain([("union_new", &report.union_counts)])
    {
        for e in expert_counts(layout, counts) {
            let kind = match (e.shared, e.frozen) {
                (true, _) => "shared",
                (false, true) => "frozen",
                (false, false) => "trainable",
            };
            writeln!(s, "{name},{},{},{kind},{},{}", e.layer, e.expert, e.units, count_text(e.specific))?;
        }
    }
    let p = dir.join("expert_counts.csv");
    write(&p, &s)?;
    let mut written = vec![p];
    let per_layer = expert_layer_means(layout, &report.union_counts);
    let pick = |f: fn(&ExpertLayerMeans) -> f64| per_layer.iter().map(f).collect::<Vec<f64>>();
    let mut series =
        vec![Series { name: "per trainable expert".into(), values: pick(|m| m.trainable), emphasis: true }];
    if !layout.frozen_experts.iter().all(Vec::is_empty) {
        series.push(Series { name: "per frozen expert".into(), values: pick(|m| m.frozen), emphasis: false });
    }
    series.push(Series { name: "attention (q, k, v, o)".into(), values: pick(|m| m.attention), emphasis: false });
    let title = format!(
        "Specific neurons of union({}) per layer: trainable experts vs the frozen original",
        report.new_languages.join(",")
    );
    written.extend(line_chart(&dir.join("specific_per_expert"), &title, "layer", "specific neurons", &series)?);
    Ok(written)
}

impl WithBackend for Args {
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()> {
        let a = self;
        let t_start = Instant::now();
        let p = a.params.clone();
        p.check().flag_err()?;
        if a.langs.len() < 2 {
            bail!("give at least 2 languages with --lang CODE=FILE (texts of the other languages are the negatives)");
        }
        let mut langs = Vec::new();
        for spec in &a.langs {
            langs.push(read_language(spec, a.docs.docs, p.max_texts)?);
        }
        for (code, path, lines) in &langs {
            if lines.len() < 2 {
                bail!(
                    "{}: language `{code}` has {} text; at least 2 are needed (documents cut by --docs {})",
                    path.display(),
                    lines.len(),
                    a.docs.docs
                );
            }
        }
        let codes: Vec<String> = langs.iter().map(|l| l.0.clone()).collect();
        for n in &a.new {
            if !codes.contains(n) {
                bail!("--new `{n}` is not among the --lang codes ({})", codes.join(", "));
            }
        }
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let (tok, _) = super::train::resolve_tokenizer(&m, a.tokenizer.as_deref())?;
        let model = load_model_as::<B>(&m, &device, a.weights.weights_dtype)?;
        super::args::trim_heap();
        let opts = p.collect();
        let mut col = NeuronCollector::new(&model, codes.clone(), opts)?;
        let mut encoded: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, (code, path, lines)) in langs.iter().enumerate() {
            for line in lines {
                let ids = moe_shared::corpus::document_ids(line, &tok)?;
                if !ids.is_empty() {
                    encoded.push((i, ids));
                }
            }
            let n = encoded.iter().filter(|e| e.0 == i).count();
            if n < 2 {
                bail!(
                    "{}: language `{code}` has {n} non-empty text(s) after tokenization; at least 2 are needed",
                    path.display()
                );
            }
        }
        col.reserve(encoded.len());
        eprintln!(
            "{} texts ({} languages), {} neurons in {} layers; pooling {}, <= {} tokens per text",
            encoded.len(),
            codes.len(),
            col.layout().num_neurons(),
            col.layout().num_layers(),
            match p.pool {
                Pooling::Mean => "mean",
                Pooling::Max => "max",
            },
            p.max_tokens
        );
        if a.bench {
            // Warm-up (allocator, thread pools) outside the timings.
            col.plain_forward(&encoded[0].1);
        }
        let (mut t_plain, mut t_capture, mut tokens) = (0.0f64, 0.0f64, 0usize);
        let t_collect = Instant::now();
        let mut done = 0usize;
        for group in encoded.chunks(a.batch.max(1)) {
            if a.bench {
                let t0 = Instant::now();
                for (_, ids) in group {
                    col.plain_forward(ids);
                }
                t_plain += t0.elapsed().as_secs_f64();
            }
            let t0 = Instant::now();
            let texts: Vec<(usize, &[u32])> = group.iter().map(|(l, ids)| (*l, ids.as_slice())).collect();
            tokens += col.add_texts(&texts)?;
            t_capture += t0.elapsed().as_secs_f64();
            let before = done;
            done += group.len();
            if done / 100 > before / 100 {
                eprintln!("  {}/{} texts, {:.1} s", done, encoded.len(), t_collect.elapsed().as_secs_f64());
            }
        }
        let pooled = col.finish()?;
        let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        let t0 = Instant::now();
        let table = average_precision_table(&pooled, threads)?;
        let t_ap = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let report = analyze(&pooled, &table, &p.analysis(&a.new))?;
        let t_analyze = t0.elapsed().as_secs_f64();
        let mut report = report;
        moe_shared::methods::neurons::stream_sha256_of_texts(&mut report, &encoded);
        drop(pooled);
        std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
        let json = a.out.join("neurons.json");
        write(&json, &serde_json::to_string(&report)?)?;
        let mut written = vec![json];
        written.extend(write_outputs(&report, &a.out)?);

        print!("{}", summary_table(&report));
        for w in report.warnings() {
            eprintln!("warning: {}", w.message);
        }
        let totals: Vec<String> = report.union_counts.iter().map(|c| count_text(c.total)).collect();
        println!("S_l (union of {}): {}", report.new_languages.join(","), totals.join(","));
        if !expert_counts(&report.layout, &report.union_counts).is_empty() {
            let means: Vec<String> = expert_layer_means(&report.layout, &report.union_counts)
                .iter()
                .map(|m| format!("{:.1}", m.trainable))
                .collect();
            println!("  per trainable expert: {}", means.join(","));
        }
        let tied: f64 = report.union_counts.iter().map(|c| c.tie_weighted).sum();
        if tied > 0.0 {
            let total: f64 = report.union_counts.iter().map(|c| c.total).sum();
            println!(
                "  of which {} ({:.0}%) tie-weighted: neurons tied at a cut-off share its places (slots / tied)",
                count_text((tied * 1e4).round() / 1e4),
                100.0 * tied / total
            );
        }
        let n_texts = encoded.len() as f64;
        let analysis_s = t_capture + t_ap + t_analyze;
        println!(
            "analysis: {:.1} s ({:.2} texts/s: capture {:.1} s, AP {:.1} s, top-N/counts {:.2} s)",
            analysis_s,
            n_texts / analysis_s,
            t_capture,
            t_ap,
            t_analyze
        );
        if a.bench {
            let overhead = t_capture / t_plain - 1.0;
            let peak = peak_rss_mib();
            println!(
                "plain forward: {:.1} s ({:.2} texts/s, {:.0} tokens/s); capture pass: {:.1} s ({:.2} texts/s); \
                 capture overhead {:+.1}%; peak RSS {}",
                t_plain,
                n_texts / t_plain,
                tokens as f64 / t_plain,
                t_capture,
                n_texts / t_capture,
                overhead * 100.0,
                peak.map(|p| format!("{p:.0} MiB")).unwrap_or_else(|| "n/a".into())
            );
            let b = serde_json::json!({
                "model": a.model.display().to_string(),
                "backend": std::any::type_name::<B>(),
                "texts": encoded.len(),
                "tokens": tokens,
                "neurons": report.layout.num_neurons(),
                "threads_ap": threads,
                "plain_forward_s": t_plain,
                "capture_s": t_capture,
                "capture_overhead": overhead,
                "ap_s": t_ap,
                "analyze_s": t_analyze,
                "analysis_s": analysis_s,
                "analysis_texts_per_s": n_texts / analysis_s,
                "plain_texts_per_s": n_texts / t_plain,
                "capture_texts_per_s": n_texts / t_capture,
                "pooled_matrix_mib": (encoded.len() * report.layout.num_neurons() * 4) as f64 / (1024.0 * 1024.0),
                "peak_rss_mib": peak,
                "total_s": t_start.elapsed().as_secs_f64(),
            });
            let p = a.out.join("bench.json");
            write(&p, &serde_json::to_string_pretty(&b)?)?;
            written.push(p);
        }
        for p in written {
            println!("wrote {}", p.display());
        }
        Ok(())
    }
}

/// The per-language table the CLI prints: texts, tokens, base rate, mean
/// AP, the best AP, the AP at the top-N cut-off, and the neurons tied at
/// the cut with the places they share (`-` when no tie crosses it).
pub fn summary_table(report: &NeuronReport) -> String {
    let mut s = format!(
        "language  texts  tokens  base_rate  mean_AP  top1_AP  cut_AP  tied_at_cut (places of top-{})\n",
        report.top_n
    );
    for l in &report.languages {
        let best = l.top.first().map(|n| n.ap).unwrap_or(l.top_cut.ap);
        let cut = if l.top_cut.crosses() {
            format!("{} ({})", l.top_cut.tied.len(), l.top_cut.slots)
        } else {
            "-".to_string()
        };
        s.push_str(&format!(
            "{:<8} {:>6} {:>7} {:>10.3} {:>8.3} {:>8.3} {:>7.4}  {cut}\n",
            l.code, l.texts, l.tokens, l.base_rate, l.mean_ap, best, l.top_cut.ap
        ));
    }
    s
}

/// Arguments of `neurons-plot`: redraw the CSV files and figures of a
/// `neurons` output directory from its `neurons.json` (no model needed).
#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// A `neurons` output directory (or its `neurons.json`).
    pub neurons: PathBuf,
    /// Where to write (default: the directory of `neurons.json`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `neurons-plot`.
pub fn plot(a: PlotArgs) -> anyhow::Result<()> {
    let path = if a.neurons.is_dir() { a.neurons.join("neurons.json") } else { a.neurons.clone() };
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let report = NeuronReport::from_json(&bytes, &path.display().to_string())?;
    let dir = a.out.unwrap_or_else(|| path.parent().map(Path::to_path_buf).unwrap_or_default());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for p in write_outputs(&report, &dir)? {
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// A neurons job: the spec's model, languages, new languages and parameters.
impl super::run_job::FromJob for moe_shared::api::NeuronsSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        super::Command::Neurons(Args {
            weights: super::run_job::defaults(),
            model: j.model(&self.model),
            langs: self.langs.iter().map(|d| j.named(d)).collect(),
            docs: j.docs(),
            new: self.new.clone(),
            params: self.params.clone(),
            batch: 8,
            threads: None,
            bench: false,
            tokenizer: None,
            out: j.out.to_path_buf(),
        })
    }
}
