//! `moe-studio train MODEL --stage experts|router|dense|ffn --data NAME=FILE[:weight][:orig]... --steps N --out DIR`:
//! continued pre-training of upcycled experts (DeltaMoE phase 1 / MoE-LPR
//! stage 1), router tuning (MoE-LPR stage 2, DUME+, BTX) and dense
//! fine-tuning, on Burn's autodiff backend.
//!
//! Output directory: `metrics.jsonl` (one JSON object per step),
//! `checkpoint-NNNNNN/` every `--save-every` steps (the newest `--keep`),
//! `final/` at the end. Every checkpoint is a loadable model directory plus
//! `trainer_state.json` and `optimizer.bin`; `--resume` continues from the
//! newest one exactly. Ctrl-C or SIGTERM finishes the current step, saves a
//! checkpoint and exits with status 128 + the signal (a second one 2 s or
//! more after the first exits at once, without a checkpoint; sooner, it is
//! taken as the same stop).
//!
//! One process, Burn: `--devices N` runs N data-parallel replicas as
//! threads of this process (Burn's collective all-reduce,
//! shared/src/train/parallel.rs); N replicas with `--batch b` equal one
//! with `--batch N*b`. Several machines, or a model one replica cannot
//! hold: `--engine torch --emit DIR` writes a PyTorch FSDP2 job for
//! torchrun (backend/src/cli/torch_handoff.rs). `--nodes N` answers with
//! that job's commands and exits without training ([`nodes_answer`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use burn::tensor::backend::AutodiffBackend;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::model::load_model;
use moe_shared::ops::train::TrainParams;
use moe_shared::tensor_io::card::CardMethod;
use moe_shared::tokenizer::{Llama2cTokenizer, Tokenizer};
use moe_shared::train::checkpoint::latest_checkpoint;
use moe_shared::train::data::load_mixture;
use moe_shared::train::{devices, DataSpec, RunOutcome, Stage, StepMetrics, TrainConfig, Trainer};

use super::args::FlagErr;

/// Arguments of `train`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The model to train: an MoE checkpoint (stages experts, router) or a dense one (stages dense, ffn).
    pub model: PathBuf,
    /// MoE models: `experts` (new experts + routers), `router` (routers only) or `all` (everything but the
    /// frozen experts); dense models: `dense` (everything) or `ffn` (the FFNs only).
    #[arg(long, value_parser = super::args::parse_stage)]
    pub stage: Stage,
    /// `NAME=FILE[:weight][:orig]`: a .txt (documents cut by --docs), .jsonl (field `text`) or .tokens
    /// (`moe-studio tokenize`: memory-mapped, for corpora larger than memory) corpus;
    /// `weight` is its mixture share (default 1); `orig` marks an original language (language prior).
    #[arg(long = "data", required = true)]
    pub data: Vec<String>,
    #[command(flatten)]
    pub docs: super::args::DocsArg,
    /// Optimizer steps.
    #[arg(long)]
    pub steps: usize,
    /// The run's hyper-parameters (sequence length, batch, learning rate
    /// and schedule, losses and balancing, checkpoints, seed, devices): the
    /// operation's own parameters, shared with the server's job and the tab.
    #[command(flatten)]
    pub params: TrainParams,
    /// Output directory (not with `--engine torch`, whose job writes into `--emit DIR/out`).
    #[arg(long, required_unless_present = "emit", conflicts_with = "emit")]
    pub out: Option<PathBuf>,
    /// `burn` (train here) or `torch` (write a PyTorch FSDP job for this stage into `--emit DIR` instead:
    /// backend/src/cli/torch_handoff.rs).
    #[arg(long, default_value = "burn", value_parser = ["burn", "torch"])]
    pub engine: String,
    /// With `--engine torch`: the directory the job is written into (must not exist or be empty).
    #[arg(long)]
    pub emit: Option<PathBuf>,
    /// Continue from the newest checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Machines of a multi-node run. The studio trains on one machine (`--devices` for its devices);
    /// with N > 1 it prints the `--engine torch --emit` and `torchrun --nnodes N` commands of the same
    /// run and exits with an error, training nothing.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Tokenizer (tokenizer.json or a llama2.c tok*.bin) when the model has none beside it.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Print one JSON object per step on stdout (no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// A command generic over a Burn autodiff backend.
pub trait WithAutodiff {
    /// Runs with autodiff backend `B`.
    fn run<B: AutodiffBackend>(self) -> anyhow::Result<()>;
}

/// Runs `w` on the autodiff version of the backend `name` resolves to
/// (see [`super::backend::resolve`]).
///
/// # Errors
/// An unknown or unbuilt backend, then the command's.
pub fn run_autodiff<W: WithAutodiff>(name: &str, w: W) -> anyhow::Result<()> {
    use burn::backend::Autodiff;
    let r = super::backend::resolve(name)?;
    super::backend::announce(&r);
    match r.name {
        #[cfg(feature = "wgpu")]
        "wgpu" => w.run::<Autodiff<burn::backend::Wgpu>>(),
        #[cfg(feature = "cuda")]
        "cuda" => w.run::<Autodiff<burn::backend::Cuda>>(),
        _ => w.run::<Autodiff<moe_shared::CpuBackend>>(),
    }
}

/// Files written beside the weights of every output (name, bytes).
pub type ExtraFiles = Vec<(String, Vec<u8>)>;

/// The tokenizer to use with `m` and the files that carry it into output
/// directories: `--tokenizer` (a `tokenizer.json` or a llama2.c vocabulary),
/// else a `tokenizer.bin` / `tok{V}.bin` inside a model directory (written
/// there by `train` for llama2.c models; preferred over the converted
/// `tokenizer.json` beside it so that training and evaluation tokenize
/// exactly alike), else the model's own. llama2.c vocabularies are written
/// as `tokenizer.bin` plus the equivalent converted `tokenizer.json` (which
/// the other commands read).
///
/// # Errors
/// An unreadable or malformed tokenizer; a `--tokenizer` JSON whose
/// vocabulary is larger than the model's `vocab_size` (its ids would index
/// past the embedding); a model with no tokenizer and none given.
pub fn resolve_tokenizer(m: &LoadedModel, explicit: Option<&Path>) -> anyhow::Result<(Tokenizer, ExtraFiles)> {
    let v = m.config.vocab_size;
    let llama2c = |bytes: Vec<u8>, name: &str| -> anyhow::Result<(Tokenizer, ExtraFiles)> {
        let t = Tokenizer::Llama2c(Llama2cTokenizer::parse(&bytes, v, name)?);
        let mut files = vec![("tokenizer.bin".to_string(), bytes)];
        if let Some(json) = t.to_hf_json() {
            files.push(("tokenizer.json".to_string(), json.into_bytes()));
        }
        Ok((t, files))
    };
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading tokenizer {}", p.display()));
    if let Some(p) = explicit {
        let bytes = read(p)?;
        let name = p.display().to_string();
        if p.extension().is_some_and(|e| e == "json") {
            let t = Tokenizer::from_hf_json(&bytes, &name)?;
            if t.vocab_size() > v {
                bail!(
                    "--tokenizer {name}: a vocabulary of {} tokens (added tokens included), but {}'s embedding has \
                     {v} rows (config.json `vocab_size`): its ids past {} would index outside the model; pass the \
                     tokenizer this model was trained with",
                    t.vocab_size(),
                    m.path,
                    v - 1
                );
            }
            return Ok((t, vec![("tokenizer.json".into(), bytes)]));
        }
        return llama2c(bytes, &name);
    }
    let path = Path::new(&m.path);
    let dir = if path.is_dir() { path.to_path_buf() } else { path.parent().unwrap_or(Path::new(".")).to_path_buf() };
    let llama2c_file = [dir.join("tokenizer.bin"), dir.join(format!("tok{v}.bin"))].into_iter().find(|p| p.exists());
    if let Some(p) = llama2c_file {
        if path.is_dir() || matches!(m.tokenizer, Some(Tokenizer::Llama2c(_))) {
            return llama2c(read(&p)?, &p.display().to_string());
        }
    }
    match &m.tokenizer {
        Some(t) => {
            let json = t.to_hf_json().map(|s| ("tokenizer.json".to_string(), s.into_bytes()));
            Ok((t.clone(), json.into_iter().collect()))
        }
        None => bail!("{}: no tokenizer found with this model (pass --tokenizer FILE)", m.path),
    }
}

/// Parses and checks the `--data` entries (files exist).
pub fn parse_data(specs: &[String]) -> anyhow::Result<Vec<DataSpec>> {
    let mut out = Vec::new();
    for s in specs {
        let d = DataSpec::parse(s)?;
        if !Path::new(&d.path).is_file() {
            bail!("--data `{s}`: no such file {}", d.path);
        }
        out.push(d);
    }
    Ok(out)
}

impl Args {
    fn config(&self) -> anyhow::Result<TrainConfig> {
        self.params.check().flag_err()?;
        Ok(self.params.config(self.stage, self.steps))
    }
}

/// `--engine torch --emit DIR`: writes the PyTorch job instead of training
/// (backend/src/cli/torch_handoff.rs).
fn emit_torch_job<B: AutodiffBackend>(
    a: &Args,
    config: TrainConfig,
    data: moe_shared::train::Mixture,
    devs: Vec<B::Device>,
    m: &LoadedModel,
    tok_files: ExtraFiles,
) -> anyhow::Result<()> {
    let dir = a.emit.as_deref().context("--engine torch needs --emit DIR (where the PyTorch job is written)")?;
    if a.engine != "torch" {
        bail!("--emit writes a PyTorch job: pass --engine torch with it");
    }
    if a.resume {
        bail!("--engine torch: the emitted job resumes itself (`torchrun ... train.py --resume`); drop --resume");
    }
    let model = load_model::<B>(m, &devs[0])?;
    let to = super::torch_handoff::Target {
        dir,
        source: &m.path,
        extra_files: tok_files,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        prefer: m.layout,
    };
    let e = super::torch_handoff::emit::<B>(model, data, config, devs, &to)?;
    eprintln!(
        "wrote the PyTorch job ({} layout, {} modeling) to {}: see its README.md (torchrun --nproc-per-node N \
         train.py; several nodes: torchrun --nnodes)",
        e.layout,
        e.modeling.name(),
        dir.display()
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({"engine": "torch", "job": dir, "layout": e.layout, "modeling": e.modeling.name()})
        );
    }
    Ok(())
}

/// Quotes `s` for a POSIX shell when it holds anything but `[A-Za-z0-9_./=:,+@%-]`.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_./=:,+@%-".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `argv` without the options `drop` (each `--opt VALUE` or `--opt=VALUE`)
/// and the flags `flags`.
fn without_options(argv: &[String], drop: &[&str], flags: &[&str]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut it = argv.iter();
    while let Some(x) = it.next() {
        if flags.contains(&x.as_str()) {
            continue;
        }
        if drop.contains(&x.as_str()) {
            it.next();
            continue;
        }
        if drop.iter().any(|d| x.starts_with(&format!("{d}="))) {
            continue;
        }
        out.push(x.clone());
    }
    out
}

/// The commands of a multi-node run of `a` (launched as `argv`): the
/// `train ... --engine torch --emit JOB` line that writes the same run as a
/// PyTorch FSDP2 job (`--devices` = every GPU of every node, so the global
/// batch is the same `--batch` per device), and the `torchrun --nnodes`
/// line of each node.
fn nodes_commands(a: &Args, argv: &[String]) -> (String, Vec<String>) {
    let job = match &a.out {
        Some(o) => format!("{}-torch-job", o.display().to_string().trim_end_matches('/')),
        None => a.emit.as_ref().map_or("torch-job".to_string(), |e| e.display().to_string()),
    };
    // --frozen-dtype is the Burn trainer's (the PyTorch job refuses it).
    let mut emit = without_options(
        argv,
        &["--nodes", "--out", "--engine", "--emit", "--devices", "--frozen-dtype"],
        &["--resume", "--json"],
    );
    emit.extend([
        "--devices".to_string(),
        (a.params.devices * a.nodes).to_string(),
        "--engine".into(),
        "torch".into(),
        "--emit".into(),
        job.clone(),
    ]);
    let emit: Vec<String> = emit.iter().map(|x| shell_quote(x)).collect();
    let script = shell_quote(&format!("{job}/train.py"));
    let runs = (0..a.nodes)
        .map(|r| {
            format!(
                "torchrun --nnodes {n} --nproc-per-node {d} --node-rank {r} --rdzv-backend c10d \
                 --rdzv-endpoint HOST:29500 --rdzv-id moe-job {script}",
                n = a.nodes,
                d = a.params.devices,
            )
        })
        .collect();
    (emit.join(" "), runs)
}

/// `train --nodes N` with N > 1: the studio trains on one machine (Burn,
/// `--devices` for its devices); several machines run the emitted PyTorch
/// FSDP2 job under torchrun (docs/scaling.md). Prints that job's commands
/// for this run on stdout and fails, starting nothing.
///
/// # Errors
/// Always: `--nodes 0`, or the explanation after the commands.
fn nodes_answer(a: &Args, argv: &[String]) -> anyhow::Result<()> {
    if a.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let (emit, runs) = nodes_commands(a, argv);
    println!("# 1. write this run as a PyTorch FSDP2 job (once, where the model and --data files are):");
    if a.params.frozen_dtype != moe_shared::model::WeightsDtype::F32 {
        println!("#    (without --frozen-dtype {}: the PyTorch job keeps its weights in f32)", a.params.frozen_dtype);
    }
    println!("{emit}");
    println!(
        "# 2. on each of the {} nodes (HOST: node 0's address; the job directory at the same path on every node):",
        a.nodes
    );
    for r in runs {
        println!("{r}");
    }
    bail!(
        "--nodes {}: moe-studio trains on one machine (Burn; --devices N for its devices) and hands runs over several \
         machines to PyTorch FSDP2 under torchrun; the commands above run this one on {} nodes x {} device(s) (the \
         job's README.md has the Slurm form); nothing was started",
        a.nodes,
        a.nodes,
        a.params.devices
    )
}

/// Refuses a `--out` (without `--resume`) that holds anything but the
/// metrics of a run of ours that stopped before its first checkpoint: a
/// `metrics.jsonl` whose every line is a step row (the last may be cut
/// short by a kill), besides hidden files (`.DS_Store`, a writer's
/// temporary), which a run never touches. The metrics would otherwise be
/// overwritten (the other writers refuse a non-empty `--out` the same way).
fn check_fresh_out(out: &Path) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else { return Ok(()) };
    let not_ours = |what: String| {
        anyhow::anyhow!(
            "output directory {} already exists and is not empty ({what}); choose a new --out, or pass --resume \
             to continue a run there",
            out.display()
        )
    };
    for e in entries {
        let e = e.with_context(|| format!("reading {}", out.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        // Hidden files: a checkpoint interrupted while it was written (the writers' temporary
        // sibling), a file manager's or NFS's own; a run writes none of these names.
        if name.starts_with('.') {
            continue;
        }
        if name != "metrics.jsonl" {
            return Err(not_ours(format!("it holds {name}")));
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        // A run killed while it appended a row leaves that last row cut short.
        let whole = if text.ends_with('\n') { &lines[..] } else { &lines[..lines.len().saturating_sub(1)] };
        let ours = whole.iter().all(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .is_some_and(|v| v["step"].is_u64() && (v["loss"].is_number() || v["ce_loss"].is_number()))
        });
        if !ours {
            return Err(not_ours("its metrics.jsonl is not a training run's".into()));
        }
    }
    Ok(())
}

/// Refuses `--resume` with a MODEL whose shape differs from the
/// checkpoint's (layers, widths, vocabulary, experts per layer): the run
/// continues from the checkpoint's weights, so such a MODEL would be
/// ignored without a word.
fn check_resume_model(model: &LoadedModel, dir: &Path) -> anyhow::Result<()> {
    let saved = open_model(dir).with_context(|| format!("opening {}", dir.display()))?;
    let shape = |m: &LoadedModel| {
        let c = &m.config;
        let experts: Vec<usize> =
            m.moe.iter().flat_map(|moe| moe.layers.iter().map(|l| l.as_ref().map_or(0, |s| s.num_experts))).collect();
        (c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size, experts)
    };
    let (a, b) = (shape(model), shape(&saved));
    if a != b {
        bail!(
            "--resume: MODEL {} is not the model this run trains (layers, d, ffn, vocab, experts per layer: {:?} \
             here, {:?} in {}); give the run's model, or choose another --out",
            model.path,
            a,
            b,
            dir.display()
        );
    }
    Ok(())
}

/// Keeps the lines of `metrics.jsonl` up to `step` (a resumed run rewrites
/// what came after its checkpoint).
fn truncate_metrics(path: &Path, step: usize) -> anyhow::Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .collect();
    let mut body = kept.join("\n");
    if !body.is_empty() {
        body.push('\n');
    }
    std::fs::write(path, body).with_context(|| format!("rewriting {}", path.display()))
}

fn load_summary(m: &StepMetrics) -> String {
    let layers: Vec<&Vec<f64>> = m.expert_load.iter().flatten().collect();
    let Some(first) = layers.first() else { return String::new() };
    let e = first.len();
    let mean: Vec<String> = (0..e)
        .map(|i| {
            let v: f64 = layers.iter().filter(|l| l.len() == e).map(|l| l[i]).sum::<f64>() / layers.len() as f64;
            format!("{v:.2}")
        })
        .collect();
    format!(" load [{}]", mean.join(" "))
}

/// The stop flag of a run: set by the first SIGINT (Ctrl-C) or SIGTERM (what
/// `kill`, `timeout`, Slurm and Kubernetes send before they kill), after which
/// the trainer finishes its step and saves a checkpoint; the exit status is
/// then 128 + that signal. A second signal exits at once, without a
/// checkpoint, only when it comes [`SECOND_SIGNAL_AFTER`] or more after the
/// first: a service manager's SIGTERM to the whole process group followed by
/// the server's own SIGINT to its job (`systemctl stop`), or a double click on
/// cancel, still saves. SIGHUP is left alone, so `nohup moe-studio train ...`
/// keeps running when its terminal closes. Messages ignore a closed stderr
/// (`train ... 2>&1 | tee log` with tee killed by the same Ctrl-C).
fn stop_flag() -> (Arc<AtomicBool>, Arc<AtomicI32>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flag = Arc::new(AtomicBool::new(false));
    let signal = Arc::new(AtomicI32::new(SIGINT));
    match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
        Ok(mut signals) => {
            let (f, s) = (flag.clone(), signal.clone());
            std::thread::spawn(move || {
                let mut first: Option<std::time::Instant> = None;
                for sig in signals.forever() {
                    let name = if sig == SIGTERM { "SIGTERM" } else { "Ctrl-C" };
                    match first {
                        Some(t) if t.elapsed() >= SECOND_SIGNAL_AFTER => {
                            let _ = writeln!(
                                std::io::stderr(),
                                "\nsecond interrupt ({name}): exiting without a checkpoint"
                            );
                            std::process::exit(128 + sig);
                        }
                        Some(_) => {}
                        None => {
                            // The signal before the flag: the trainer reads it after it sees the flag.
                            s.store(sig, Ordering::SeqCst);
                            f.store(true, Ordering::SeqCst);
                            first = Some(std::time::Instant::now());
                            let _ = writeln!(
                                std::io::stderr(),
                                "\n{name}: finishing this step, then saving a checkpoint (interrupt again, 2 s from now or later, to quit without one)"
                            );
                        }
                    }
                }
            });
        }
        Err(e) => {
            eprintln!("warning: interrupt handler not installed ({e}); Ctrl-C or SIGTERM will not save a checkpoint")
        }
    }
    (flag, signal)
}

/// How long after the first interrupt a second one quits without a checkpoint
/// (sooner ones are the same stop, sent twice).
const SECOND_SIGNAL_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

impl WithAutodiff for Args {
    fn run<B: AutodiffBackend>(self) -> anyhow::Result<()> {
        let a = self;
        if a.nodes != 1 {
            return nodes_answer(&a, &std::env::args().collect::<Vec<_>>());
        }
        let config = a.config()?;
        // Before the model and the data are read (tokenising can take minutes): anything in --out
        // but a stale run's metrics is the user's, refused as every other writer does.
        if let (false, Some(out)) = (a.resume, a.out.as_deref()) {
            if latest_checkpoint(out).is_none() {
                check_fresh_out(out)?;
            }
        }
        let specs = parse_data(&a.data)?;
        let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
        let (tok, mut tok_files) = resolve_tokenizer(&m, a.tokenizer.as_deref())?;
        let method = if m.moe.is_some() { CardMethod::DeltaMoe } else { CardMethod::Training };
        let mut card = super::card::card(method, [("model".to_string(), a.model.as_path())]);
        card.moe = m.moe.is_some();
        card.detail("data", a.data.join(", "));
        let (name, bytes) =
            super::card::readme(card, a.out.as_deref().or(a.emit.as_deref()).unwrap_or(a.model.as_path()));
        tok_files.push((name.to_string(), bytes));
        if config.seq_len > m.config.max_position_embeddings {
            bail!("--seq-len {} exceeds the model's context {}", config.seq_len, m.config.max_position_embeddings);
        }
        let data = load_mixture(&specs, a.docs.docs, &tok, config.seq_len, config.seed)?;
        for s in data.sources() {
            eprintln!(
                "data {:<10} {:>9} tokens {:>7} sequences  weight {}{}  ({}, --docs {}, stream sha256 {})",
                s.spec.name,
                s.ids.len(),
                s.num_sequences(),
                s.spec.weight,
                if s.spec.original { "  original language" } else { "" },
                s.spec.path,
                s.ids.docs_name(a.docs.docs),
                s.ids.sha256()
            );
        }
        let devs = devices::<B>(config.devices);
        if a.engine == "torch" || a.emit.is_some() {
            return emit_torch_job::<B>(&a, config, data, devs, &m, tok_files);
        }
        let out = a.out.clone().context("--out is required with --engine burn")?;
        let existing = latest_checkpoint(&out);
        for u in moe_shared::train::checkpoint::unreadable_checkpoints(&out) {
            eprintln!("warning: {} is not a usable checkpoint ({}); it is skipped", u.dir.display(), u.error);
        }
        let mut trainer = if a.resume {
            let (step, dir) = existing
                .with_context(|| format!("--resume: no checkpoint (checkpoint-*/ or final/) in {}", out.display()))?;
            eprintln!("resuming from {} (step {step})", dir.display());
            // MODEL names the run's starting model; the weights come from the checkpoint, so a
            // MODEL of another shape (another expert count, say) is a mistake, not a request.
            check_resume_model(&m, &dir)?;
            // Checked first: a refused resume leaves the run's metrics as they were.
            let t = Trainer::<B>::resume(&dir, data, config.clone(), devs)?;
            truncate_metrics(&out.join("metrics.jsonl"), step)?;
            t
        } else {
            if let Some((step, dir)) = existing {
                bail!(
                    "{} already holds a checkpoint ({}, step {step}): pass --resume to continue it, or choose another --out",
                    out.display(),
                    dir.display()
                );
            }
            // A run that stopped before its first checkpoint leaves only its metrics: this run
            // starts at step 1 again, so its rows replace those (they were appended after them).
            let stale = out.join("metrics.jsonl");
            if stale.exists() {
                eprintln!(
                    "note: {} is from a run that saved no checkpoint; starting it anew",
                    stale.display()
                );
                truncate_metrics(&stale, 0)?;
            }
            // The router stage's frozen weights load in --frozen-dtype directly (no f32 copy first).
            let weights = moe_shared::train::freeze::load_dtype(config.stage, config.frozen_dtype);
            let model = moe_shared::model::load_model_as::<B>(&m, &devs[0], weights)?;
            Trainer::new(model, data, config.clone(), devs, &m.path)?
        }
        .with_extra_files(tok_files);
        drop(m);
        for w in trainer.warnings() {
            eprintln!("warning: {w}");
        }
        let counts = trainer.param_counts();
        eprintln!(
            "stage {}: {} trainable parameters in {} tensors, {} frozen{}; {} tokens per step ({} x {} x {} \
             device(s) x {})",
            config.stage.name(),
            counts.trainable,
            counts.trainable_tensors,
            counts.frozen,
            match (counts.frozen, config.frozen_dtype) {
                (0, _) => String::new(),
                (_, d) => format!(" (matrices in {d})"),
            },
            config.tokens_per_step(),
            config.batch_size,
            config.seq_len,
            config.devices,
            config.grad_accum,
        );
        let metrics_path = out.join("metrics.jsonl");
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let mut metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .with_context(|| format!("opening {}", metrics_path.display()))?;
        let bar = if a.json {
            indicatif::ProgressBar::hidden()
        } else {
            let b = indicatif::ProgressBar::new(config.steps as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps [{elapsed_precise} < {eta_precise}] {msg}",
                )
                .expect("template"),
            );
            b
        };
        bar.set_position(trainer.step_count() as u64);
        bar.reset_eta();
        let (stop, signal) = stop_flag();
        let mut write_err: Option<std::io::Error> = None;
        let outcome = trainer.run(&out, &stop, |m| {
            let line = serde_json::to_string(m).expect("json");
            if let Err(e) = writeln!(metrics, "{line}") {
                write_err.get_or_insert(e);
            }
            if a.json {
                // A closed stdout (`--json | jq` with jq gone) must not stop the run before it saves.
                let _ = writeln!(std::io::stdout(), "{line}");
            }
            bar.set_position(m.step as u64);
            bar.set_message(format!(
                "loss {:.4} ce {:.4}{}{} lr {:.2e} {:.0} tok/s{}",
                m.loss,
                m.ce_loss,
                m.lb_loss.map(|x| format!(" lb {x:.3}")).unwrap_or_default(),
                m.z_loss.map(|x| format!(" z {x:.2}")).unwrap_or_default(),
                m.lr,
                m.tokens_per_s,
                load_summary(m)
            ));
        })?;
        bar.finish();
        if let Some(e) = write_err {
            // Not `eprintln!`: a signal may have closed stderr, and a panic here would lose the exit status.
            let _ = writeln!(std::io::stderr(), "warning: could not write {}: {e}", metrics_path.display());
        }
        match outcome {
            RunOutcome::Finished(dir) => {
                eprintln!("done: {} steps; model in {}", config.steps, dir.display());
                if a.json {
                    println!("{}", serde_json::json!({"finished": true, "model": dir}));
                }
            }
            RunOutcome::Stopped { step, checkpoint } => {
                // Stopped by a signal that may have closed the pipes too: report what we can.
                let _ = match &checkpoint {
                    Some(c) => writeln!(
                        std::io::stderr(),
                        "stopped after step {step}; checkpoint {} (continue with the same command plus --resume)",
                        c.display()
                    ),
                    None => writeln!(std::io::stderr(), "stopped before the first step; nothing saved"),
                };
                if a.json {
                    let done = serde_json::json!({"finished": false, "step": step, "checkpoint": checkpoint});
                    let _ = writeln!(std::io::stdout(), "{done}");
                }
                std::process::exit(128 + signal.load(Ordering::SeqCst));
            }
        }
        Ok(())
    }
}

/// A train job: the spec's model, stage, corpora (`NAME=FILE[:WEIGHT][:orig]`), steps and
/// parameters (`save_every` unset: a tenth of the steps); the torch engine emits into `out`.
impl super::run_job::FromJob for moe_shared::api::TrainSpec {
    fn command(&self, j: &super::run_job::JobArgs<'_>) -> super::Command {
        let torch = self.engine == Some(moe_shared::api::TrainEngine::Torch);
        super::Command::Train(Args {
            model: j.model(&self.model),
            stage: self.stage,
            data: self
                .data
                .iter()
                .map(|d| {
                    let mut x = j.named(d);
                    if let Some(w) = d.weight {
                        x.push_str(&format!(":{w}"));
                    }
                    if d.original {
                        x.push_str(":orig");
                    }
                    x
                })
                .collect(),
            docs: j.docs(),
            steps: self.steps,
            params: self.run_params(),
            // The torch engine's job directory is the artefact; emitting
            // again is its resume.
            out: (!torch).then(|| j.out.to_path_buf()),
            engine: if torch { "torch" } else { "burn" }.to_string(),
            emit: torch.then(|| j.out.to_path_buf()),
            resume: j.resume && !torch,
            nodes: 1,
            tokenizer: None,
            json: j.json,
        })
    }
}
