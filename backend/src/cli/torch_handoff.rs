//! `moe-studio train ... --engine torch --emit DIR`: the hand-off to PyTorch
//! for a training stage past one machine (docs/scaling.md: one process,
//! Burn; several machines, this job).
//!
//! Instead of training, writes a ready-to-run PyTorch FSDP2 job for the
//! same stage into `DIR` (atomically: a hidden sibling renamed into place;
//! an existing non-empty `DIR` is refused):
//!
//! - `model/` — the model prepared exactly as [`Trainer::new`] prepares it
//!   (routing options applied, router temperatures folded where the layout
//!   folds them, the stage checked), in f32 (stages `experts`, `router`,
//!   `dense` and `ffn`; `all` trains on Burn): a dense model (stages
//!   `dense` and `ffn`, DUME's domain experts) in its family's own form,
//!   an MoE in one of two (`job.json` `modeling`):
//!   - `transformers`: a layout a transformers class loads exactly
//!     (`mixtral` or `qwen2_moe`, [`moe_shared::layout`]; the input's own
//!     when it is one of them);
//!   - `studio`: the studio layout (`moe_studio`) for every model no such
//!     class holds — per-layer expert counts with dense layers (NeuronMoE),
//!     a router bias (DUME), the aux-loss-free selection bias, several
//!     shared experts gated or not, granular experts, router temperatures.
//!     `train.py` builds the base family's transformers class (the dense
//!     `config.json` is `job.json` `base_config`) and swaps each MoE
//!     layer's FFN for `studio_moe.StudioMoeBlock` ([`STUDIO_MOE_PY`], the
//!     PyTorch twin of shared/src/model/moe.rs);
//! - `data/tokens.u32` — the packed sequences the Burn trainer would draw,
//!   in its order (drawn from the trainer's own [`Mixture`]):
//!   `rows = steps x grad_accum x batch x devices` rows of `seq_len + 1`
//!   little-endian u32 token ids (inputs = `row[..L]`, targets =
//!   `row[1..]`), plus `data/original.u8` (the language-prior tag per row)
//!   and `data/source.u16` (the source index per row);
//! - `job.json` — [`TrainConfig`] as the Burn trainer saves it, the
//!   sources, the layout and modeling, the parameter counts;
//! - `train.py` ([`TRAIN_PY`]), `studio_moe.py`, `requirements.txt`,
//!   `README.md` with the launch commands (1 node x 8 GPUs, `torchrun
//!   --nnodes` on several nodes, Slurm).
//!
//! The job's output (`DIR/out/final`, `checkpoint-NNNNNN/`) is a model
//! directory in the same layout, read back by `graft`, `route`, `eval`,
//! `neurons`. What is equal and what differs between the engines (AdamW
//! rounding, load balancing over the global batch) is in docs/scaling.md
//! "Engines"; `scripts/torch_handoff_check.sh` runs the job against the
//! Burn trainer per method, and tests/golden/torch_handoff/ holds the
//! structure it checked ([`summary`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use burn::tensor::backend::AutodiffBackend;
use moe_shared::layout::{self, LayoutRequest};
use moe_shared::model::save::tensor_plan;
use moe_shared::model::{save_model, Transformer};
use moe_shared::tensor_io::DType;
use moe_shared::train::{Mixture, Stage, TrainConfig, Trainer};

/// The training script (`train.py` in the job directory).
pub const TRAIN_PY: &str = include_str!("torch_handoff/train.py");

/// The studio's MoE FFN in PyTorch (`studio_moe.py` in the job directory),
/// for the `studio` modeling.
pub const STUDIO_MOE_PY: &str = include_str!("torch_handoff/studio_moe.py");

/// The `job.json` format name read by `train.py`.
pub const JOB_FORMAT: &str = "moe-studio-torch-job";

/// The `job.json` version: 2 adds `modeling`, `base_config` and
/// `activation` (a version-1 job is a `transformers` one).
pub const JOB_VERSION: u32 = 2;

/// What a job needs, pinned to the versions the hand-off was checked with
/// (`scripts/torch_handoff_check.sh`; tests/reference/requirements.txt).
pub const REQUIREMENTS: &str = "# the versions scripts/torch_handoff_check.sh checked the hand-off with\n\
torch==2.15.0\ntransformers==5.24.0\nsafetensors==0.8.0\nnumpy==2.4.6\n";

/// The `job.json` `layout` of a dense model (stages `dense`, `ffn`: the family's
/// own `config.json` and tensor names).
pub const DENSE_LAYOUT: &str = "dense";

/// Layouts a transformers 5 class trains as they are (fused experts
/// `mlp.experts.gate_up_proj` / `down_proj`), tried before the studio
/// modeling.
pub const TORCH_LAYOUTS: [&str; 2] = ["mixtral", "qwen2_moe"];

/// How `train.py` builds the model (`job.json` `modeling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modeling {
    /// A transformers MoE class loads `model/` (one of [`TORCH_LAYOUTS`]).
    Transformers,
    /// `model/` is in the studio layout; the base family's transformers
    /// class with `studio_moe.StudioMoeBlock` FFNs.
    Studio,
}

impl Modeling {
    /// The `job.json` name.
    pub fn name(self) -> &'static str {
        match self {
            Modeling::Transformers => "transformers",
            Modeling::Studio => "studio",
        }
    }
}

/// What [`emit`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emitted {
    /// The layout of `model/` ([`DENSE_LAYOUT`] for a dense model).
    pub layout: &'static str,
    /// How `train.py` builds it.
    pub modeling: Modeling,
}

/// Where and how [`emit`] writes the job.
pub struct Target<'a> {
    /// The job directory (must not exist or be empty).
    pub dir: &'a Path,
    /// Names the model in errors and provenance.
    pub source: &'a str,
    /// Files written beside the weights (the tokenizer).
    pub extra_files: Vec<(String, Vec<u8>)>,
    /// The emitting command line (job.json, README).
    pub command: String,
    /// The input's layout, kept when it is one of [`TORCH_LAYOUTS`] and
    /// holds the prepared model (else the first that does, else the studio
    /// layout).
    pub prefer: Option<&'static dyn layout::MoeLayout>,
}

/// The layout and modeling for `moe` on `base`: the preferred layout when
/// it is one of [`TORCH_LAYOUTS`] and holds the model exactly, else the
/// first of them that does, else the studio layout.
pub fn choose_layout(
    base: &moe_shared::config::ModelConfig,
    moe: &moe_shared::config::MoeConfig,
    prefer: Option<&'static dyn layout::MoeLayout>,
) -> (&'static dyn layout::MoeLayout, Modeling) {
    let order = prefer.into_iter().map(|l| l.name()).chain(TORCH_LAYOUTS).filter(|n| TORCH_LAYOUTS.contains(n));
    match order.filter_map(layout::by_name).find(|l| l.check(base, moe).is_ok()) {
        Some(l) => (l, Modeling::Transformers),
        None => (&layout::studio::Studio, Modeling::Studio),
    }
}

/// Writes the job for `config` over `model` (on the trainer's first
/// device) and `data` into `to.dir`.
///
/// Returns the layout and modeling written.
///
/// # Errors
/// A non-empty `dir`; the checks of [`Trainer::new`]; I/O errors naming
/// the file. Nothing is left at `dir` on error.
pub fn emit<B: AutodiffBackend>(
    model: Transformer<B>,
    data: Mixture,
    config: TrainConfig,
    devices: Vec<B::Device>,
    to: &Target<'_>,
) -> anyhow::Result<Emitted> {
    let (dir, source, command, prefer) = (to.dir, to.source, to.command.as_str(), to.prefer);
    if dir.exists() && std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("--emit {}: the directory exists and is not empty (choose a new one)", dir.display());
    }
    if config.frozen_dtype != moe_shared::model::WeightsDtype::F32 {
        bail!(
            "--frozen-dtype {}: the PyTorch job keeps its weights in f32 (FSDP2's mixed precision is its own); drop \
             --frozen-dtype with --engine torch",
            config.frozen_dtype
        );
    }
    if !matches!(config.stage, Stage::Experts | Stage::Router | Stage::Dense | Stage::Ffn) {
        bail!(
            "--engine torch trains the stages experts, router, dense and ffn; --stage {} trains on burn (--engine \
             burn)",
            config.stage.name()
        );
    }
    let trainer = Trainer::new(model, data, config.clone(), devices, source)?;
    for w in trainer.warnings() {
        eprintln!("warning: {w}");
    }
    let (_, moe) = tensor_plan(trainer.model());
    let base = &trainer.model().config;
    // A dense model (stages dense, ffn) is its family's own transformers class.
    let (layout, modeling) = match &moe {
        Some(moe) => {
            let (l, m) = choose_layout(base, moe, prefer);
            (Some(l), m)
        }
        None => (None, Modeling::Transformers),
    };
    let layout_name = layout.map_or(DENSE_LAYOUT, |l| l.name());
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = dir.file_name().context("--emit needs a directory name")?.to_string_lossy().into_owned();
    let tmp = parent.join(format!(".{name}.tmp-emit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let guard = RemoveOnDrop(Some(tmp.clone()));
    std::fs::create_dir_all(tmp.join("data")).with_context(|| format!("creating {}", tmp.display()))?;

    // The model, as the Burn trainer would start from it.
    let extra: Vec<(&str, Vec<u8>)> = to.extra_files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let provenance = serde_json::json!({
        "method": format!("train/{}/torch-handoff", config.stage.name()),
        "source": source,
    });
    let request = layout.map_or(LayoutRequest::Auto, LayoutRequest::Named);
    save_model(trainer.model(), &tmp.join("model"), DType::F32, extra, provenance, request)?;

    // The data, in the trainer's order.
    let mut mix = trainer.data().clone();
    let global = config.batch_size * config.devices;
    let micro_steps = config.steps * config.grad_accum;
    let rows = micro_steps * global;
    let l = config.seq_len;
    let (mut tokens, mut original, mut src) =
        (writer(&tmp.join("data/tokens.u32"))?, Vec::with_capacity(rows), Vec::with_capacity(rows * 2));
    let mut buf = Vec::with_capacity((l + 1) * 4);
    for _ in 0..micro_steps {
        let b = mix.next_batch(global);
        for r in 0..b.batch {
            buf.clear();
            let inp = &b.inputs[r * l..(r + 1) * l];
            let last = b.targets[(r + 1) * l - 1];
            for &t in inp.iter().chain(std::iter::once(&last)) {
                let t = u32::try_from(t).context("token id out of u32 range")?;
                buf.extend_from_slice(&t.to_le_bytes());
            }
            tokens.write_all(&buf).context("writing data/tokens.u32")?;
            original.push(u8::from(b.original[r]));
            let s = u16::try_from(b.sources[r]).context("more than 65535 data sources")?;
            src.extend_from_slice(&s.to_le_bytes());
        }
    }
    tokens.flush().context("writing data/tokens.u32")?;
    drop(tokens);
    write(&tmp.join("data/original.u8"), &original)?;
    write(&tmp.join("data/source.u16"), &src)?;

    let counts = trainer.param_counts();
    let sources: Vec<serde_json::Value> = trainer
        .data()
        .sources()
        .iter()
        .zip(trainer.data().fingerprint())
        .map(|(s, f)| {
            serde_json::json!({"name": s.spec.name, "path": s.spec.path, "weight": s.spec.weight,
                "original": s.spec.original, "tokens": f.tokens, "sequences": f.sequences})
        })
        .collect();
    let mut job = serde_json::json!({
        "format": JOB_FORMAT,
        "version": JOB_VERSION,
        "emitted_by": command,
        "moe_studio_version": env!("CARGO_PKG_VERSION"),
        "model": "model",
        "layout": layout_name,
        "modeling": modeling.name(),
        "global_batch": global,
        "data": {"tokens": "data/tokens.u32", "original": "data/original.u8", "source": "data/source.u16",
                 "rows": rows, "row_len": l + 1},
        "sources": sources,
        "parameters": {"trainable": counts.trainable, "frozen": counts.frozen},
        "train": config,
    });
    if modeling == Modeling::Studio {
        // The dense base as transformers builds it; train.py swaps the MoE FFNs in.
        job["base_config"] = base.to_config_json(None);
        job["activation"] = match base.architecture.family().activation {
            moe_shared::config::family::GateActivation::Silu => "silu",
            moe_shared::config::family::GateActivation::GeluTanh => "gelu_tanh",
        }
        .into();
    }
    write(&tmp.join("job.json"), &serde_json::to_vec_pretty(&job).expect("json"))?;
    write(&tmp.join("train.py"), TRAIN_PY.as_bytes())?;
    write(&tmp.join("studio_moe.py"), STUDIO_MOE_PY.as_bytes())?;
    write(&tmp.join("requirements.txt"), REQUIREMENTS.as_bytes())?;
    let emitted = Emitted { layout: layout_name, modeling };
    write(&tmp.join("README.md"), readme(&config, emitted, rows, counts.trainable, command).as_bytes())?;
    if dir.exists() {
        std::fs::remove_dir(dir).with_context(|| format!("replacing the empty {}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir).with_context(|| format!("moving the job into {}", dir.display()))?;
    std::mem::forget(guard);
    Ok(emitted)
}

struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn writer(p: &Path) -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
    let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
    Ok(std::io::BufWriter::with_capacity(1 << 20, f))
}

fn write(p: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(p, bytes).with_context(|| format!("writing {}", p.display()))
}

/// The job's README: what it is, the launch commands (one node, several
/// nodes with `torchrun --nnodes`, Slurm), resuming, what differs.
fn readme(c: &TrainConfig, e: Emitted, rows: usize, trainable: usize, command: &str) -> String {
    let global = c.batch_size * c.devices;
    let modeling = match e.modeling {
        Modeling::Transformers => {
            format!("transformers loads it with its own class (`AutoModelForCausalLM`, the {} layout)", e.layout)
        }
        Modeling::Studio => "no transformers MoE class holds this model exactly, so it is in the studio \
layout (`model_type: moe_studio`); `train.py` builds the base family's transformers class \
(`job.json` `base_config`) and replaces each MoE layer's FFN by `studio_moe.StudioMoeBlock` \
(`studio_moe.py`: per-layer expert counts, dense layers, router bias and temperature, the \
aux-loss-free selection bias, shared experts gated or not, the studio's top-k rule)"
            .to_string(),
    };
    format!(
        r#"# PyTorch FSDP job: moe-studio stage `{stage}`

Written by `{command}`.
The same stage as moe-studio's Burn trainer on the same data: the model in
`model/` ({layout} layout, f32; {modeling}), {rows} packed sequences of {l}
tokens in `data/tokens.u32` (the trainer's order; nothing is
re-tokenised), the hyper-parameters in `job.json` ({steps} steps, lr
{lr:e}, warm-up {warmup}, cosine to {min_lr} x lr, AdamW betas ({b1}, {b2})
eps {eps:e} weight decay {wd}, clip {clip}, balance {balance}, alpha
{alpha} ({lb_form}), prior {prior}, z-loss {z}, checkpoint every {every}
steps, seed {seed}). {trainable} parameters train.

`train.py` shards parameters, gradients and AdamW state over every rank
with FSDP2 (`fully_shard` per decoder layer and the root: FULL_SHARD, the
ZeRO-3 partitioning). Each optimizer step takes {ga} micro-step(s) of
{global} sequences in all; the number of ranks (nodes x processes per
node) must divide {global}.

## Install

    python3 -m venv venv && venv/bin/pip install -r requirements.txt

## Launch

One node, 8 GPUs (NCCL; `--dtype bf16` computes in bf16 with f32 master
weights and f32 gradient reduction; drop it for f32):

    torchrun --standalone --nproc-per-node 8 train.py --dtype bf16

Several nodes, here N = 4 nodes of 8 GPUs. Every node needs this
directory at the same path (a shared file system, or a copy: only node 0's
rank 0 writes `out/`, so `out/` must be shared for `--resume`). Pick node
0's address as HOST and a free port; then on node R (R = 0 .. N-1):

    torchrun --nnodes 4 --nproc-per-node 8 --node-rank R \
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id moe-job \
        train.py --dtype bf16

e.g. node 0 runs it with `--node-rank 0`, node 3 with `--node-rank 3`.
The c10d rendezvous (torch.distributed's TCPStore at HOST:PORT) gathers
the nodes; every rank then reads its share of each micro-batch by its
global rank, so the result does not depend on which node got which rank.
The port is torch.distributed's: reachable by the nodes only, it takes no
authentication (run it on the cluster's private network).

Slurm (one `torchrun` per node, `srun` starts them; `sbatch job.sh`):

    #!/bin/bash
    #SBATCH --job-name=moe-job
    #SBATCH --nodes=4
    #SBATCH --ntasks-per-node=1
    #SBATCH --gpus-per-node=8
    #SBATCH --cpus-per-task=32
    HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --node-rank "$SLURM_NODEID" \
        --rdzv-backend c10d --rdzv-endpoint "$HOST:29500" --rdzv-id "$SLURM_JOB_ID" \
        train.py --dtype bf16

CPU (gloo, f32; how `scripts/torch_handoff_check.sh` verifies the job
against the Burn trainer):

    torchrun --standalone --nproc-per-node 2 train.py --device cpu

## Resume

{cadence} (each renamed into place only when complete; the newest {keep}
kept). After a
crash, a kill or the end of a Slurm allocation, run the same command plus
`--resume`: the newest complete checkpoint's sharded model and AdamW state
(`dcp/`, torch.distributed.checkpoint) are loaded and the run continues
with the same losses as one that was never interrupted
(`scripts/torch_handoff_check.sh` checks it). The number of ranks may
change between the runs if it still divides {global}.

## Output

`out/metrics.jsonl` (one line per step, moe-studio's metric fields),
`out/checkpoint-NNNNNN/` (a model directory + `dcp/` + `trainer_state.json`)
and `out/final/`, a model directory in the {layout} layout that
`moe-studio graft`, `route`, `eval`, `neurons` and `inspect` read as they
are.

## What equals the Burn trainer, and what does not

- Equal: freezing (frozen experts and every non-FFN tensor in stage
  `experts`, bit for bit; the routers only in stage `router`), the routing
  (top-k with ties to the lower expert index, the selection bias moving
  the choice only, renormalised or full-softmax weights), the losses and
  their coefficients, the data and its order, the schedule, clipping by
  the global gradient norm, the aux-free bias update, the checkpoint
  cadence. An expert that no token of a whole step chose gets no update,
  as in the Burn trainer.
- Load balancing, the language prior and the aux-free loads are computed
  over the whole micro-batch of all ranks (routing counts all-reduced), as
  the Burn trainer computes them over its batch on one device: the result
  does not depend on the number of ranks (Burn's `--devices` replicas
  all-reduce them the same way).
- AdamW: Burn's own update. `train.py`'s `BurnAdamW` is Burn 0.21's
  `AdamW` re-implemented operation by operation in f32 (bias corrections
  `1 - b^t` in f32, `sqrt(v / (1 - b2^t))`, weight decay `p (1 - lr wd)`
  before subtracting `lr u`, a correctly rounded square root), because
  torch.optim.AdamW rounds differently (f64 bias corrections, a fused
  `addcdiv`) and Adam carries those bits from step to step: the same
  gradient gives bit-identical weights in both engines. The gradients
  themselves differ in rounding (another summation order over ranks and
  kernels).
"#,
        stage = c.stage.name(),
        layout = e.layout,
        l = c.seq_len,
        steps = c.steps,
        lr = c.lr,
        warmup = c.warmup,
        min_lr = c.min_lr_ratio,
        b1 = c.beta1,
        b2 = c.beta2,
        eps = c.eps,
        wd = c.weight_decay,
        clip = c.clip.map_or("none".to_string(), |x| x.to_string()),
        balance = c.balance.name(),
        alpha = if c.balance == moe_shared::train::Balance::Aux { c.alpha } else { 0.0 },
        lb_form = match c.lb_form {
            moe_shared::train::LbForm::PerLayer => "per-layer",
            moe_shared::train::LbForm::HfMixtral => "hf-mixtral",
        },
        prior = c.prior,
        z = c.z_loss,
        every = c.save_every,
        seed = c.seed,
        ga = c.grad_accum,
        keep = c.keep.max(1),
        cadence = if c.save_every > 0 {
            format!("A checkpoint is written every {} steps as `out/checkpoint-NNNNNN/`", c.save_every)
        } else {
            "No periodic checkpoint is written (`--save-every 0` when emitted): re-emit with `--save-every N` to \
             be able to resume"
                .to_string()
        },
    )
}
