//! Types that cross the wire between the browser app and the server (and
//! the CLI's `--json` output). One definition, used by both sides.
//!
//! One file per resource; every type is re-exported here, so callers name
//! them `api::X`:
//! - `models`: what `inspect` reports about a model ([`ModelSummary`]);
//! - `server`: the error body ([`ApiError`]), id and name checks, `GET /api/info`;
//! - `uploads`, `checkpoints`: the routes of those names;
//! - `jobs`: what a job does ([`JobSpec`], one spec per kind) and its checks;
//! - `results`: what a task job writes ([`TaskEvalReport`]);
//! - `job_state`: a submitted job ([`JobInfo`], [`JobState`], [`Progress`], [`JobEvent`]).
//!
//! The server API (`moe-studio serve`): the routes, their bodies and the
//! error shape are documented in `backend/src/server/mod.rs` (and its README
//! section). Ids are lowercase hyphenated UUIDs; times are Unix milliseconds.

mod checkpoints;
mod job_state;
mod jobs;
mod models;
mod results;
mod server;
mod uploads;

pub use checkpoints::*;
pub use job_state::*;
pub use jobs::*;
pub use models::*;
pub use results::*;
pub use server::*;
pub use uploads::*;
