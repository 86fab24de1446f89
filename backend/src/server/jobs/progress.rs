//! A running job's progress, read from its child's stdout: a train job runs
//! `moe-studio train --json`, which prints one JSON object per optimizer
//! step (a [`moe_shared::train::StepMetrics`]); every other stdout line is a
//! log line.
//!
//! The line is read by key (`step`, `steps`, `loss`, `ce_loss`, `lr`,
//! `tokens_per_s`, `seconds`) rather than parsed as `StepMetrics`:
//! serde_json writes a non-finite float (an overflowed `grad_norm`, an
//! infinite `tokens_per_s`) as `null`, which `StepMetrics` would refuse, and
//! such a step must still count as progress. The test below ties the keys to
//! `StepMetrics`' field names.

use std::time::Instant;

use moe_shared::api::{JobSpec, Progress};

/// What a job's progress calls its stage: `train/STAGE` for a train job,
/// else the job's kind.
pub(super) fn job_stage(spec: &JobSpec) -> String {
    match spec {
        JobSpec::Train(s) => format!("train/{}", s.stage.name()),
        other => other.kind().to_string(),
    }
}

/// Turns a job's step lines into [`Progress`], with the time left estimated
/// from the pace since the first step this reader saw (a resumed job starts
/// its clock at its first new step).
pub(super) struct StepReader {
    stage: String,
    /// The step before the first one seen, and when it was seen.
    first: Option<(usize, Instant)>,
}

impl StepReader {
    /// A reader reporting progress of `stage` ([`job_stage`]).
    pub(super) fn new(stage: String) -> Self {
        StepReader { stage, first: None }
    }

    /// The progress a stdout line reports, or `None` when it is not a step
    /// line (a JSON object with an integer `step` and a numeric `loss`).
    pub(super) fn read(&mut self, line: &str) -> Option<Progress> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let step = v.get("step").and_then(|s| s.as_u64())? as usize;
        let loss = v.get("loss").and_then(|s| s.as_f64())?;
        let f = |k: &str| v.get(k).and_then(|s| s.as_f64());
        let steps = v.get("steps").and_then(|s| s.as_u64()).unwrap_or(0) as usize;
        let (s0, t0) = *self.first.get_or_insert((step.saturating_sub(1), Instant::now()));
        let per = if step > s0 { t0.elapsed().as_secs_f64() / (step - s0) as f64 } else { 0.0 };
        let per = if per > 0.0 { per } else { f("seconds").unwrap_or(0.0) };
        Some(Progress {
            stage: self.stage.clone(),
            step,
            steps,
            loss: Some(loss),
            ce_loss: f("ce_loss"),
            lr: f("lr"),
            tokens_per_s: f("tokens_per_s"),
            eta_s: Some(per * steps.saturating_sub(step) as f64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_shared::train::StepMetrics;

    fn metrics(step: usize) -> StepMetrics {
        StepMetrics {
            step,
            steps: 10,
            loss: 2.5,
            ce_loss: 2.25,
            lb_loss: Some(0.25),
            prior_loss: None,
            z_loss: None,
            lr: 3e-4,
            grad_norm: 1.0,
            tokens: 512,
            tokens_seen: 512 * step as u64,
            seconds: 0.5,
            tokens_per_s: 1024.0,
            expert_load: vec![None],
            source_sequences: vec![4],
            selection_bias: Vec::new(),
        }
    }

    #[test]
    fn step_metrics_lines_are_progress_and_other_lines_are_not() {
        let mut r = StepReader::new("train/experts".into());
        let p = r.read(&serde_json::to_string(&metrics(1)).unwrap()).expect("a step line");
        assert_eq!((p.stage.as_str(), p.step, p.steps), ("train/experts", 1, 10));
        assert_eq!((p.loss, p.ce_loss, p.lr, p.tokens_per_s), (Some(2.5), Some(2.25), Some(3e-4), Some(1024.0)));
        // 9 steps left at the pace measured since the first step seen.
        let eta = p.eta_s.unwrap();
        assert!(eta > 0.0 && eta < 9.0 * 0.5 + 5.0, "{eta}");
        // A non-finite field is written as null: still progress, without it.
        let mut m = metrics(2);
        m.tokens_per_s = f64::INFINITY;
        m.grad_norm = f64::NAN;
        let p = r.read(&serde_json::to_string(&m).unwrap()).expect("a step line with nulls");
        assert_eq!((p.step, p.tokens_per_s), (2, None));
        assert!(r.read("resuming from out/checkpoint-4 (step 4)").is_none());
        assert!(r.read(r#"{"finished": true, "model": "out"}"#).is_none());
        assert!(r.read(r#"{"step": 3}"#).is_none());
    }

    #[test]
    fn stage_names_the_train_stage() {
        let spec: JobSpec = serde_json::from_str(
            r#"{"kind":"train","model":"m","stage":"router","steps":1,"data":[{"name":"a","upload":"u"}]}"#,
        )
        .unwrap();
        assert_eq!(job_stage(&spec), "train/router");
        let spec: JobSpec = serde_json::from_str(r#"{"kind":"eval","model":"m","data":[]}"#).unwrap();
        assert_eq!(job_stage(&spec), "eval");
    }
}
