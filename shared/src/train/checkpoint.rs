//! Training checkpoints: the model (through `model::save_model`, so every
//! checkpoint is also a loadable Hugging Face / Mixtral / studio directory,
//! weights in f32), `trainer_state.json` (step, configuration, data
//! position, generator state) and `optimizer.bin` (Burn's AdamW record,
//! bincode with full precision).
//!
//! Exact resume needs three things this module provides:
//! - stable parameter ids ([`assign_param_ids`]): Burn keys optimizer state
//!   by `ParamId`, which is random at load time; the trainer renumbers every
//!   parameter by its position in the module tree, so a reloaded model gets
//!   the same ids and the saved moments find their parameters;
//! - a parametrisation that survives the round trip
//!   ([`fold_router_temperatures`]): every public layout folds a router
//!   temperature `T` into the router weight, so the trainer folds it before
//!   the first step (same function, and the saved weight is then the
//!   trained weight);
//! - f32 weights and an atomic write (a checkpoint directory appears
//!   complete or not at all; the writer renames a finished temporary
//!   directory into place).

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::{backend::Backend, Tensor};
use serde::{Deserialize, Serialize};

use super::data::{MixtureState, SourceFingerprint};
use super::trainer::TrainConfig;
use crate::model::transformer::Mlp;
use crate::model::Transformer;

/// File name of the trainer state inside a checkpoint directory.
pub const STATE_FILE: &str = "trainer_state.json";
/// File name of the optimizer record inside a checkpoint directory.
pub const OPTIMIZER_FILE: &str = "optimizer.bin";
/// Directory name of the final checkpoint inside `--out`.
pub const FINAL_DIR: &str = "final";
/// Prefix of periodic checkpoint directories (`checkpoint-000100`).
pub const CHECKPOINT_PREFIX: &str = "checkpoint-";

/// `trainer_state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Always `"moe-studio-trainer-state"`.
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// Optimizer steps completed.
    pub step: usize,
    /// Training tokens consumed (inputs).
    pub tokens: u64,
    /// The configuration the run was started with.
    pub config: TrainConfig,
    /// The data position after `step` steps.
    pub data: MixtureState,
    /// The data sources (resume refuses different data).
    pub sources: Vec<SourceFingerprint>,
    /// Size of `optimizer.bin` in bytes (a truncated file is refused).
    pub optimizer_bytes: usize,
    /// Loss of the last step (for humans).
    pub last_loss: Option<f64>,
}

struct Renumber(u64);

impl<B: Backend> ModuleMapper<B> for Renumber {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (_, tensor, mapper) = param.consume();
        self.0 += 1;
        Param::from_mapped_value(ParamId::from(self.0), tensor, mapper)
    }
}

/// Gives every parameter the id `1, 2, 3, ...` in module-visit order
/// (deterministic for one architecture), keeping values and gradient
/// requirements.
pub fn assign_param_ids<B: Backend, M: Module<B>>(module: M) -> M {
    module.map(&mut Renumber(0))
}

/// Folds each MoE layer's router temperature into its router weight
/// (`W * (1/T)` in f32, `T := 1`) when the model would be saved in the
/// layout `auto` picks (every public layout stores it folded the same
/// way; the studio layout keeps `T`); otherwise returns the model
/// unchanged. The function computed is the same.
pub fn fold_router_temperatures<B: Backend>(mut model: Transformer<B>) -> Transformer<B> {
    let Some(moe) = model.moe_config() else {
        return model;
    };
    let Ok(choice) = crate::layout::choose(&model.config, &moe, crate::layout::LayoutRequest::Auto) else {
        return model;
    };
    if choice.layout.keeps_temperature() {
        return model;
    }
    for (block, scale) in model.layers.iter_mut().zip(choice.router_scale) {
        if let Mlp::Moe(m) = &mut block.mlp {
            if scale != 1.0 {
                let s = scale as f32;
                m.gate.weight = m.gate.weight.clone().map(|w| {
                    let g = w.is_require_grad();
                    let w = w.mul_scalar(s);
                    if g {
                        w.detach().require_grad()
                    } else {
                        w.detach()
                    }
                });
                m.temperature = 1.0;
            }
        }
    }
    model
}

/// Serialises an optimizer record (bincode, full precision).
pub fn record_to_bytes<B: Backend, R: burn::record::Record<B>>(record: R) -> Vec<u8> {
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    Recorder::<B>::record(&BinBytesRecorder::<FullPrecisionSettings>::default(), record, ())
        .expect("bincode encoding of an in-memory record")
}

/// Reads an optimizer record written by [`record_to_bytes`].
///
/// # Errors
/// [`crate::StudioError::Invalid`] when the bytes do not decode.
pub fn record_from_bytes<B: Backend, R: burn::record::Record<B>>(
    bytes: Vec<u8>,
    device: &B::Device,
) -> crate::Result<R> {
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    // bincode decoding panics on malformed input inside Burn; contain it.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Recorder::<B>::load(&BinBytesRecorder::<FullPrecisionSettings>::default(), bytes, device)
    }));
    match r {
        Ok(Ok(rec)) => Ok(rec),
        Ok(Err(e)) => Err(crate::StudioError::Invalid(format!("{OPTIMIZER_FILE}: {e}"))),
        Err(_) => Err(crate::StudioError::Invalid(format!("{OPTIMIZER_FILE}: the optimizer record does not decode"))),
    }
}

/// The trainer state of a checkpoint directory (native only).
///
/// # Errors
/// [`crate::StudioError::Io`] when `trainer_state.json` cannot be read,
/// [`crate::StudioError::Format`] when it does not parse.
#[cfg(not(target_arch = "wasm32"))]
pub fn read_state(dir: &std::path::Path) -> crate::Result<TrainerState> {
    read_state_classified(dir).map_err(|(e, _)| e)
}

/// [`read_state`], with whether a failure shows the directory is damaged:
/// its state file is missing, or cut short / not JSON (a syntax or EOF
/// error) — what a copy cut short or a power cut leaves. Other failures (a
/// permission error, a state a newer build wrote) are not damage: nothing
/// removes such a directory.
#[cfg(not(target_arch = "wasm32"))]
fn read_state_classified(dir: &std::path::Path) -> Result<TrainerState, (crate::StudioError, bool)> {
    let p = dir.join(STATE_FILE);
    let raw = std::fs::read(&p).map_err(|e| {
        let missing = e.kind() == std::io::ErrorKind::NotFound;
        (crate::StudioError::io(p.display(), e), missing)
    })?;
    serde_json::from_slice(&raw).map_err(|e| {
        let damaged = matches!(e.classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof);
        (crate::StudioError::format(p.display(), "trainer_state.json", e.to_string()), damaged)
    })
}

/// Directory name of the previous final checkpoint while a run that was
/// resumed past its end saves the new one (`final` is renamed to it, and
/// removed once the new `final` is written).
pub const FINAL_OLD_DIR: &str = "final.old";

/// The step a periodic checkpoint's directory name gives
/// (`checkpoint-000040` -> 40); `None` for any other name.
#[cfg(not(target_arch = "wasm32"))]
pub fn periodic_step(name: &str) -> Option<usize> {
    let digits = name.strip_prefix(CHECKPOINT_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Rank of a checkpoint directory name among those of one step (higher
/// wins a tie), `None` when the name is not a checkpoint's.
#[cfg(not(target_arch = "wasm32"))]
fn checkpoint_rank(name: &str) -> Option<u8> {
    match name {
        FINAL_DIR => Some(2),
        FINAL_OLD_DIR => Some(0),
        n if periodic_step(n).is_some() => Some(1),
        _ => None,
    }
}

/// Checkpoint directories (`checkpoint-NNNNNN`, `final`, and `final.old` —
/// left by a run stopped while it re-saved `final`) under `out`, with their
/// steps, oldest first (native only). Directories without a readable state
/// are left out: [`unreadable_checkpoints`] lists them.
#[cfg(not(target_arch = "wasm32"))]
pub fn list_checkpoints(out: &std::path::Path) -> Vec<(usize, std::path::PathBuf)> {
    let mut found: Vec<(usize, u8, std::path::PathBuf)> =
        checkpoint_dirs(out).into_iter().filter_map(|(rank, p)| Some((read_state(&p).ok()?.step, rank, p))).collect();
    found.sort();
    found.into_iter().map(|(s, _, p)| (s, p)).collect()
}

/// A checkpoint directory whose `trainer_state.json` cannot be read.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug)]
pub struct Unreadable {
    /// The directory.
    pub dir: std::path::PathBuf,
    /// Why its state cannot be read.
    pub error: crate::StudioError,
    /// Whether that shows damage (state missing, cut short or not JSON):
    /// the trainer replaces or prunes a damaged periodic checkpoint, and
    /// never touches the others.
    pub damaged: bool,
}

/// Checkpoint directories under `out` whose `trainer_state.json` cannot be
/// read (a copy cut short, a file edited by hand, a newer build's state),
/// in name order (native only). They are never resumed from; `train`
/// names them.
#[cfg(not(target_arch = "wasm32"))]
pub fn unreadable_checkpoints(out: &std::path::Path) -> Vec<Unreadable> {
    let mut bad: Vec<Unreadable> = checkpoint_dirs(out)
        .into_iter()
        .filter_map(|(_, dir)| {
            read_state_classified(&dir).err().map(|(error, damaged)| Unreadable { dir, error, damaged })
        })
        .collect();
    bad.sort_by(|a, b| a.dir.cmp(&b.dir));
    bad
}

#[cfg(not(target_arch = "wasm32"))]
fn checkpoint_dirs(out: &std::path::Path) -> Vec<(u8, std::path::PathBuf)> {
    let Ok(rd) = std::fs::read_dir(out) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| Some((checkpoint_rank(&e.file_name().to_string_lossy())?, e.path())))
        .collect()
}

/// The checkpoint to resume from: the highest step (the final one on a
/// tie) under `out` (native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn latest_checkpoint(out: &std::path::Path) -> Option<(usize, std::path::PathBuf)> {
    list_checkpoints(out).pop()
}
