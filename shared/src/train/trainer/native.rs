//! The run loop (native only): steps with periodic checkpoints of the
//! weights, the AdamW moments and the data position, resuming from the
//! newest one, and stopping cleanly on a flag.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::checkpoint::open_model;
use crate::model::{load_model_as, save_model};
use crate::tensor_io::DType;
use crate::train::checkpoint::{
    latest_checkpoint, list_checkpoints, periodic_step, read_state, record_from_bytes, record_to_bytes,
    unreadable_checkpoints, CHECKPOINT_PREFIX, FINAL_DIR, FINAL_OLD_DIR, OPTIMIZER_FILE, STATE_FILE,
};

/// How [`Trainer::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// All steps done; the final checkpoint.
    Finished(PathBuf),
    /// Stopped by the flag after `step` steps; the checkpoint written
    /// (`None` when no step had run).
    Stopped {
        /// Steps completed.
        step: usize,
        /// The checkpoint to resume from.
        checkpoint: Option<PathBuf>,
    },
}

impl<B: AutodiffBackend> Trainer<B> {
    /// Continues the run saved in checkpoint directory `dir`: loads its
    /// weights on `devices[0]`, the AdamW state, the step and the data
    /// position. `config` must equal the saved one except for `steps`,
    /// `save_every` and `keep`; `data` must be the same sources.
    ///
    /// # Errors
    /// I/O and format errors naming the checkpoint;
    /// [`StudioError::Config`] listing the options that differ;
    /// [`StudioError::Invalid`] when the data differs, or when `steps` is
    /// below the step the checkpoint reached (there would be nothing to
    /// train, and the run would report steps it never took).
    pub fn resume(dir: &Path, mut data: Mixture, config: TrainConfig, devices: Vec<B::Device>) -> Result<Self> {
        let st = read_state(dir)?;
        if config.steps < st.step {
            return Err(StudioError::Invalid(format!(
                "{}: --steps {} is below the {} steps this checkpoint has trained; give --steps {} or more to \
                 continue it",
                dir.display(),
                config.steps,
                st.step,
                st.step
            )));
        }
        let mut saved = st.config.clone();
        saved.steps = config.steps;
        saved.save_every = config.save_every;
        saved.keep = config.keep;
        if saved != config {
            let a = serde_json::to_value(&saved).expect("json");
            let b = serde_json::to_value(&config).expect("json");
            let diff: Vec<String> = a
                .as_object()
                .expect("object")
                .iter()
                .filter(|(k, v)| b.get(k.as_str()) != Some(v))
                .map(|(k, v)| format!("{k} (saved {v}, now {})", b[k.as_str()]))
                .collect();
            return Err(StudioError::config(
                dir.display(),
                format!(
                    "--resume needs the options of the saved run; these differ: {} (only --steps, --save-every \
                     and --keep may change)",
                    diff.join(", ")
                ),
            ));
        }
        if st.sources != data.fingerprint() {
            return Err(StudioError::Invalid(format!(
                "{}: --resume needs the same --data (the checkpoint was trained on {:?})",
                dir.display(),
                st.sources.iter().map(|s| format!("{} ({} tokens)", s.name, s.tokens)).collect::<Vec<_>>()
            )));
        }
        data.set_state(st.data.clone())?;
        let m = open_model(dir)?;
        let weights = crate::train::freeze::load_dtype(config.stage, config.frozen_dtype);
        let model = load_model_as::<B>(&m, &devices[0], weights)?;
        let mut t = Trainer::new(model, data, config, devices, &dir.display().to_string())?;
        let p = dir.join(OPTIMIZER_FILE);
        let bytes = std::fs::read(&p).map_err(|e| StudioError::io(p.display(), e))?;
        if bytes.len() != st.optimizer_bytes {
            return Err(StudioError::format(
                p.display(),
                "optimizer record",
                format!("{} bytes, the trainer state says {}", bytes.len(), st.optimizer_bytes),
            ));
        }
        let record = record_from_bytes::<B, <Adam<B> as Optimizer<Transformer<B>, B>>::Record>(bytes, &t.devices[0])?;
        t.optim = t.optim.load_record(record);
        t.step = st.step;
        t.tokens = st.tokens;
        t.last_loss = st.last_loss;
        Ok(t)
    }

    /// Writes a checkpoint into `dir` (which must not exist or be
    /// empty): f32 weights + config.json + extra files +
    /// `trainer_state.json` + `optimizer.bin`, atomically.
    ///
    /// # Errors
    /// I/O errors, an existing non-empty `dir`.
    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let opt = record_to_bytes::<B, _>(self.optim.to_record());
        let mut state = self.state();
        state.optimizer_bytes = opt.len();
        let mut extra: Vec<(&str, Vec<u8>)> = self.extra_files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        extra.push((STATE_FILE, serde_json::to_vec_pretty(&state).expect("json")));
        extra.push((OPTIMIZER_FILE, opt));
        let mut provenance = serde_json::json!({
            "method": format!("train/{}", self.config.stage.name()),
            "source": self.source,
            "step": self.step,
            "steps": self.config.steps,
            "data": self.data.fingerprint(),
        });
        if self.config.frozen_dtype != crate::model::WeightsDtype::F32 {
            // The frozen weights hold values rounded to it (`train::freeze::hold_frozen_in`).
            provenance["frozen_dtype"] = serde_json::json!(self.config.frozen_dtype);
        }
        save_model(self.model(), dir, DType::F32, extra, provenance, crate::layout::LayoutRequest::Auto)
    }

    /// Runs until `config.steps`, writing periodic checkpoints
    /// (`out/checkpoint-NNNNNN`, the newest `keep` kept) and the final
    /// one (`out/final`), calling `on_step` after each step. Checks
    /// `stop` before each step: when set, saves a checkpoint and returns
    /// [`RunOutcome::Stopped`].
    ///
    /// # Errors
    /// Those of [`Trainer::step`] and [`Trainer::save_checkpoint`].
    pub fn run(&mut self, out: &Path, stop: &AtomicBool, mut on_step: impl FnMut(&StepMetrics)) -> Result<RunOutcome> {
        std::fs::create_dir_all(out).map_err(|e| StudioError::io(out.display(), e))?;
        while self.step < self.config.steps {
            if stop.load(Ordering::SeqCst) {
                return self.stopped(out);
            }
            let m = self.step()?;
            on_step(&m);
            let every = self.config.save_every;
            if every > 0 && self.step.is_multiple_of(every) && self.step < self.config.steps {
                self.save_periodic(out)?;
            }
        }
        let fin = out.join(FINAL_DIR);
        let old = out.join(FINAL_OLD_DIR);
        if fin.exists() {
            match unreadable_checkpoints(out).into_iter().find(|u| u.dir == fin) {
                // A damaged `final` (cut short): removed; `final.old`, if any, stays until the
                // new one is written.
                Some(u) if u.damaged => std::fs::remove_dir_all(&fin).map_err(|e| StudioError::io(fin.display(), e))?,
                Some(u) => {
                    return Err(StudioError::Invalid(format!(
                        "{} exists and its state cannot be read ({}); not overwritten: move it away to finish",
                        fin.display(),
                        u.error
                    )))
                }
                None => {
                    if old.exists() {
                        std::fs::remove_dir_all(&old).map_err(|e| StudioError::io(old.display(), e))?;
                    }
                    std::fs::rename(&fin, &old).map_err(|e| StudioError::io(fin.display(), e))?;
                }
            }
        }
        self.save_checkpoint(&fin)?;
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| StudioError::io(old.display(), e))?;
        }
        Ok(RunOutcome::Finished(fin))
    }

    fn periodic_dir(&self, out: &Path) -> PathBuf {
        out.join(format!("{CHECKPOINT_PREFIX}{:06}", self.step))
    }

    fn save_periodic(&self, out: &Path) -> Result<PathBuf> {
        let dir = self.periodic_dir(out);
        let unreadable = unreadable_checkpoints(out);
        // Our own directory name with a damaged state is a copy of this step cut short (a power
        // cut on an older version, a hand edit): replaced. One unreadable for another reason
        // (permissions, a newer build's state) is not ours to remove.
        if let Some(u) = unreadable.iter().find(|u| u.dir == dir) {
            if !u.damaged {
                return Err(StudioError::Invalid(format!(
                    "{} exists and its state cannot be read ({}); not overwritten: move it away to continue",
                    dir.display(),
                    u.error
                )));
            }
            std::fs::remove_dir_all(&dir).map_err(|e| StudioError::io(dir.display(), e))?;
        }
        if !dir.exists() {
            self.save_checkpoint(&dir)?;
        }
        let step_of = |p: &Path| p.file_name().and_then(|n| periodic_step(&n.to_string_lossy()));
        let periodic: Vec<(usize, PathBuf)> =
            list_checkpoints(out).into_iter().filter(|(_, p)| step_of(p).is_some()).collect();
        let keep = self.config.keep.max(1);
        let prune: Vec<PathBuf> =
            periodic[..periodic.len().saturating_sub(keep)].iter().map(|(_, p)| p.clone()).collect();
        for p in &prune {
            std::fs::remove_dir_all(p).map_err(|e| StudioError::io(p.display(), e))?;
        }
        // Damaged periodic checkpoints of earlier steps: removed when possible (never
        // resumable, they would otherwise stay forever); one that cannot be removed (its owner,
        // say) does not stop the run.
        for u in unreadable.into_iter().filter(|u| u.damaged && step_of(&u.dir).is_some_and(|s| s < self.step)) {
            let _ = std::fs::remove_dir_all(&u.dir);
        }
        Ok(dir)
    }

    fn stopped(&self, out: &Path) -> Result<RunOutcome> {
        if self.step == 0 {
            return Ok(RunOutcome::Stopped { step: 0, checkpoint: None });
        }
        if let Some((s, p)) = latest_checkpoint(out) {
            if s == self.step {
                return Ok(RunOutcome::Stopped { step: self.step, checkpoint: Some(p) });
            }
        }
        let dir = self.save_periodic(out)?;
        Ok(RunOutcome::Stopped { step: self.step, checkpoint: Some(dir) })
    }
}
