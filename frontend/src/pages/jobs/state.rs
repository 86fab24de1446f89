//! What the Jobs page knows, shared by its parts: the server's lists
//! (uploads, checkpoints, jobs), the token, the message line, the new-job
//! form and the followed job. [`Ctx`] is `Copy` (signals only), so every
//! part takes it by value.

use std::collections::BTreeMap;

use leptos::prelude::*;
use moe_shared::api::{
    CheckpointInfo, FileInfo, JobInfo, JobState, ModelSummary, Progress, TaskEvalReport, TaskResult, UploadState,
    UploadStatus,
};

use super::form::{FieldError, FormState};
use crate::components::message::Message;
use crate::jobs::api;

/// The rows of an eval job's `result.json`: one per dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalRow {
    /// Dataset name.
    pub name: String,
    /// Scored tokens.
    pub tokens: u64,
    /// Mean NLL, nats per token.
    pub nll: f64,
    /// Perplexity.
    pub ppl: f64,
    /// Mean routing load per expert (MoE models).
    pub load_mean: Option<Vec<f64>>,
}

/// Reads `moe-studio eval --json`'s output (`{"datasets": [{"name",
/// "tokens", "nll", "ppl", "load_mean"}, ...]}`); `None` when it is not one.
pub fn parse_eval(v: &serde_json::Value) -> Option<Vec<EvalRow>> {
    v.get("datasets")?
        .as_array()?
        .iter()
        .map(|d| {
            Some(EvalRow {
                name: d.get("name")?.as_str()?.to_string(),
                tokens: d.get("tokens")?.as_u64()?,
                nll: d.get("nll")?.as_f64()?,
                ppl: d.get("ppl")?.as_f64()?,
                load_mean: d
                    .get("load_mean")
                    .and_then(|l| l.as_array())
                    .map(|l| l.iter().filter_map(|x| x.as_f64()).collect()),
            })
        })
        .collect()
}

/// Reads `moe-studio eval --task --json`'s output
/// ([`moe_shared::api::TaskEvalReport`]); `None` when it is not one.
pub fn parse_tasks(v: &serde_json::Value) -> Option<Vec<TaskResult>> {
    v.get("tasks")?;
    serde_json::from_value::<TaskEvalReport>(v.clone()).ok().map(|r| r.tasks)
}

/// What the page knows about the job it follows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Live {
    /// Job id.
    pub job: Option<String>,
    /// Last state.
    pub state: Option<JobState>,
    /// Last progress.
    pub progress: Option<Progress>,
    /// `(step, loss)` of every training step seen.
    pub loss: Vec<(usize, f64)>,
    /// The last log lines.
    pub log: Vec<String>,
    /// Error of a failed job.
    pub error: Option<String>,
    /// The checkpoint registered from its output.
    pub output_checkpoint: Option<String>,
    /// Events received.
    pub events: usize,
    /// A problem of the event stream (reconnecting, ...).
    pub stream: Option<String>,
    /// An eval job's result.
    pub eval: Option<Vec<EvalRow>>,
    /// A task job's result.
    pub tasks: Option<Vec<TaskResult>>,
    /// The job's memory (live while it runs, else its last attempt's peak).
    pub memory: Option<moe_shared::api::JobMemory>,
}

/// The page's state.
#[derive(Clone, Copy)]
pub struct Ctx {
    /// The bearer token (kept in `localStorage`).
    pub token: RwSignal<String>,
    /// The message line.
    pub msg: RwSignal<Message>,
    /// An upload, registration or submission is under way.
    pub busy: RwSignal<bool>,
    /// `GET api/uploads`.
    pub uploads: RwSignal<Vec<UploadStatus>>,
    /// `GET api/checkpoints`.
    pub checkpoints: RwSignal<Vec<CheckpointInfo>>,
    /// Summaries of the checkpoints (`GET api/checkpoints/{id}`), by id.
    pub summaries: RwSignal<BTreeMap<String, ModelSummary>>,
    /// `GET api/jobs`.
    pub jobs: RwSignal<Vec<JobInfo>>,
    /// The followed job.
    pub live: RwSignal<Live>,
    /// Its artefacts.
    pub artefacts: RwSignal<Vec<FileInfo>>,
    /// The new-job form.
    pub form: RwSignal<FormState>,
    /// Where the last submission went wrong.
    pub field_error: RwSignal<Option<FieldError>>,
}

impl Ctx {
    /// Fresh state; the token comes from `localStorage`.
    pub fn new() -> Self {
        Ctx {
            token: RwSignal::new(api::load(api::TOKEN_KEY).unwrap_or_default()),
            msg: RwSignal::new(Message::None),
            busy: RwSignal::new(false),
            uploads: RwSignal::new(Vec::new()),
            checkpoints: RwSignal::new(Vec::new()),
            summaries: RwSignal::new(BTreeMap::new()),
            jobs: RwSignal::new(Vec::new()),
            live: RwSignal::new(Live::default()),
            artefacts: RwSignal::new(Vec::new()),
            form: RwSignal::new(FormState::new()),
            field_error: RwSignal::new(None),
        }
    }

    /// Shows `what: e` as an error.
    pub fn fail(self, what: &str, e: impl Into<String>) {
        self.msg.set(Message::Error(format!("{what}: {}", e.into())));
    }

    /// Completed text uploads (`.txt`, `.jsonl`): `(id, file name)`; a
    /// tracked read, for views that list them.
    pub fn texts(self) -> Vec<(String, String)> {
        self.uploads.with(|u| text_uploads(u))
    }

    /// [`Ctx::texts`] read untracked, for event handlers and async tasks
    /// (outside a reactive context, where a tracked read warns).
    pub fn texts_untracked(self) -> Vec<(String, String)> {
        self.uploads.with_untracked(|u| text_uploads(u))
    }

    /// Reloads uploads, checkpoints (and the summaries not fetched yet)
    /// and jobs; fills the form's empty pickers.
    pub fn refresh(self) {
        leptos::task::spawn_local(async move {
            match api::get::<Vec<UploadStatus>>("api/uploads").await {
                Ok(v) => self.uploads.set(v),
                Err(e) => self.fail("listing uploads", e),
            }
            match api::get::<Vec<CheckpointInfo>>("api/checkpoints").await {
                Ok(v) => {
                    let missing: Vec<String> = v
                        .iter()
                        .map(|c| c.id.clone())
                        .filter(|id| !self.summaries.with_untracked(|s| s.contains_key(id)))
                        .collect();
                    self.checkpoints.set(v);
                    for id in missing {
                        if let Ok(c) = api::get::<CheckpointInfo>(&format!("api/checkpoints/{id}")).await {
                            if let Some(s) = c.summary {
                                self.summaries.update(|m| {
                                    m.insert(id, s);
                                });
                            }
                        }
                    }
                }
                Err(e) => self.fail("listing checkpoints", e),
            }
            let first = self.checkpoints.with_untracked(|c| c.first().map(|c| c.id.clone()));
            let texts = self.texts_untracked();
            self.form.update(|f| f.fill_defaults(first.as_deref(), &texts));
            match api::get::<Vec<JobInfo>>("api/jobs").await {
                Ok(v) => self.jobs.set(v),
                Err(e) => self.fail("listing jobs", e),
            }
        });
    }
}

impl Default for Ctx {
    fn default() -> Self {
        Self::new()
    }
}

fn text_uploads(u: &[UploadStatus]) -> Vec<(String, String)> {
    u.iter()
        .filter(|u| u.state == UploadState::Complete && is_text(&u.file_name))
        .map(|u| (u.id.clone(), u.file_name.clone()))
        .collect()
}

/// Whether an uploaded file is a corpus (`.txt`, `.jsonl`).
pub fn is_text(file_name: &str) -> bool {
    file_name.ends_with(".txt") || file_name.ends_with(".jsonl")
}

/// The first 8 characters of an id.
pub fn short(id: &str) -> String {
    id.chars().take(8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_results_are_read_from_the_cli_json() {
        let v = serde_json::json!({"model": "m", "routing": "learned", "moe": true, "datasets": [
            {"name": "hu", "file": "data/hu.txt", "tokens": 1999, "nll": 2.5, "ppl": 12.182493960703473,
             "load_mean": [0.5, 0.5], "load_per_layer": [[0.5, 0.5]]},
            {"name": "en", "file": "data/en.txt", "tokens": 10, "nll": 1.0, "ppl": 2.5, "load_mean": null}]});
        let rows = parse_eval(&v).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].name.as_str(), rows[0].tokens, rows[0].ppl), ("hu", 1999, 12.182493960703473));
        assert_eq!(rows[0].load_mean, Some(vec![0.5, 0.5]));
        assert_eq!(rows[1].load_mean, None);
        assert_eq!(parse_eval(&serde_json::json!({"state": "x"})), None);
        assert!(is_text("hu.txt") && is_text("a.jsonl") && !is_text("model.bin"));
        assert_eq!(parse_tasks(&v), None);
        let t = serde_json::json!({"model": "m", "routing": "learned", "moe": false, "tasks": [
            {"name": "en", "file": "data/en.jsonl", "items": 2, "truncated": 0, "target_delimiter": "",
             "acc": 0.5, "acc_stderr": 0.5, "acc_norm": 1.0, "acc_norm_stderr": 0.0, "acc_bytes": 1.0,
             "acc_bytes_stderr": 0.0, "samples": []}]});
        let rows = parse_tasks(&t).unwrap();
        assert_eq!((rows[0].name.as_str(), rows[0].items, rows[0].acc, rows[0].acc_stderr), ("en", 2, 0.5, Some(0.5)));
        assert_eq!(parse_eval(&t), None);
        assert_eq!(short("123e4567-e89b"), "123e4567");
    }
}
