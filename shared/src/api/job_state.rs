//! A submitted job as the server reports it: state, progress, memory and
//! the events of its stream.

use serde::{Deserialize, Serialize};

use super::JobSpec;

/// Job state. `queued -> running -> succeeded | failed | cancelled`;
/// a job running when the server stopped is `interrupted` after restart
/// (a `train` job can then be resumed from its last checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// Running.
    Running,
    /// Finished without error.
    Succeeded,
    /// Finished with an error (`JobInfo::error`).
    Failed,
    /// Cancelled by a user.
    Cancelled,
    /// The server stopped while it ran.
    Interrupted,
}

impl JobState {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Interrupted => "interrupted",
        }
    }
    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<JobState> {
        [
            JobState::Queued,
            JobState::Running,
            JobState::Succeeded,
            JobState::Failed,
            JobState::Cancelled,
            JobState::Interrupted,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
    /// Whether the job will not change again by itself.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

/// Live progress of a job (training jobs fill the step fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// What the job is doing (`loading`, the training stage, `writing`, ...).
    pub stage: String,
    /// Steps done.
    pub step: usize,
    /// Steps in all.
    pub steps: usize,
    /// Training loss of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Cross-entropy part of the loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ce_loss: Option<f64>,
    /// Learning rate of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Tokens per second of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Estimated seconds left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_s: Option<f64>,
}

/// A job (`GET /api/jobs`, `GET /api/jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    /// Job id.
    pub id: String,
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `train`, `upcycle`, ...
    pub kind: String,
    /// The spec as submitted.
    pub spec: JobSpec,
    /// Backend it runs on.
    pub backend: String,
    /// State.
    pub state: JobState,
    /// Error message of a failed job (the last lines of its log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Latest progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The checkpoint registered from its output model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_checkpoint: Option<String>,
    /// Times it was started (resumes count).
    pub attempts: u32,
    /// Submission time, Unix ms.
    pub created_at: u64,
    /// Last start, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// End, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Memory of its process (last attempt), once it has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<JobMemory>,
}

/// The memory of a job's process group: resident anonymous + shared memory
/// (memory-mapped checkpoint files are page cache and do not count),
/// measured while it runs, against the limit it runs under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMemory {
    /// Last measured, bytes (0 once the job ended).
    pub current_bytes: u64,
    /// Highest measured, bytes.
    pub peak_bytes: u64,
    /// The limit, bytes: over it the job is killed and fails saying so.
    pub limit_bytes: u64,
}

/// One server-sent event of `GET /api/jobs/{id}/events`; the SSE `event:`
/// field is the variant name (`state`, `progress`, `log`, `memory`) and `data:` is
/// this value as JSON. The stream starts with the current `state` (and the
/// last `progress`) and ends after a terminal state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum JobEvent {
    /// The job changed state.
    State {
        /// New state.
        state: JobState,
        /// Error of a failed job.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Checkpoint registered from its output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_checkpoint: Option<String>,
    },
    /// A step (or phase) finished.
    Progress(Progress),
    /// A line of the job's log.
    Log {
        /// The line.
        line: String,
    },
    /// The memory of the running job (every second).
    Memory(JobMemory),
}

impl JobEvent {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            JobEvent::State { .. } => "state",
            JobEvent::Progress(_) => "progress",
            JobEvent::Log { .. } => "log",
            JobEvent::Memory(_) => "memory",
        }
    }
}
