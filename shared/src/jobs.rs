//! How a job runs: the job file the server writes into the job's
//! directory and runs with `moe-studio run-job job.json` ([`JobFile`]: the
//! spec, the backend and where each input is); the CLI turns the spec into
//! the subcommand's typed arguments, so a job and the command give the same
//! numbers. What each kind does, its command line, its output and its
//! form's inputs are the operation's own ([`crate::api::Operation`], one
//! file per operation in `api/jobs/`, registered by one line of
//! [`crate::job_operations!`]); [`JobKind`] (the Jobs page's selector) is
//! derived from that registry and re-exported here.
//!
//! Backend tests parse every kind's `cli_args` with the CLI's own parser
//! (every parameter reaches it; the parser's defaults are the operations'
//! `Default`s) and check that `run-job`'s typed arguments for the same job
//! are exactly the parsed ones.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::{DataRef, JobSpec};
pub use crate::api::{JobInputs, JobKind, ALLOCATION_FILE};
pub use crate::ops::form::{Field, Input};

/// The file the server writes into a job's directory and runs with
/// `moe-studio run-job job.json` ([`JobFile`]).
pub const JOB_FILE: &str = "job.json";

/// The directory, in the job's directory, its command writes (its model,
/// or train's checkpoints and `final/`).
pub const JOB_OUT: &str = "out";

/// A job as its command runs it: what to run, on which backend, and where
/// each input is (paths relative to the job's directory, the command's
/// working directory). The server writes it as [`JOB_FILE`] and runs
/// `moe-studio run-job job.json`; the CLI turns the spec into the
/// subcommand's typed arguments (backend `cli/run_job.rs`). Kept with the
/// job's artefacts, it is also the record of how the output was made, and
/// it runs again by hand from the job's directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// The Burn backend (`cpu`, `wgpu`, `cuda`, `auto`): the CLI's `--backend`.
    pub backend: String,
    /// What to run.
    pub spec: JobSpec,
    /// Train: continue from the last checkpoint in `out/` (`--resume`).
    #[serde(default)]
    pub resume: bool,
    /// Checkpoint id -> its model (a directory or a file).
    pub models: BTreeMap<String, String>,
    /// Dataset name -> its file; a held-out file under `NAME/heldout`
    /// ([`JobFile::data_key`]).
    pub data: BTreeMap<String, String>,
}

impl JobFile {
    /// The key of dataset `d`'s file (its held-out file when `heldout`) in
    /// [`JobFile::data`]: its name, or `NAME/heldout` (names hold no `/`).
    pub fn data_key(d: &DataRef, heldout: bool) -> String {
        if heldout {
            format!("{}/heldout", d.name)
        } else {
            d.name.clone()
        }
    }

    /// The file as the server would accept its spec
    /// ([`JobSpec::validate`]) and every input placed: each checkpoint of
    /// the spec in `models`, each dataset (and held-out file) in `data`.
    ///
    /// # Errors
    /// The spec's field and what was expected, or the input the file does
    /// not place (`spec.model: checkpoint ID is not in the job file's
    /// models`).
    pub fn check(&self) -> Result<(), String> {
        self.spec.validate().map_err(|e| format!("{}: {}", e.field.unwrap_or_default(), e.error))?;
        for (field, id) in self.spec.checkpoints() {
            if !self.models.contains_key(&id) {
                return Err(format!("{field}: checkpoint {id} is not in the job file's `models`"));
            }
        }
        for f in self.spec.data_files() {
            let key = Self::data_key(f.data, f.heldout);
            if !self.data.contains_key(&key) {
                return Err(format!("{}: `{key}` is not in the job file's `data`", f.field));
            }
        }
        Ok(())
    }
}

impl JobInputs for JobFile {
    fn model(&self, id: &str) -> String {
        self.models.get(id).cloned().unwrap_or_default()
    }
    fn data(&self, d: &DataRef, heldout: bool) -> String {
        self.data.get(&Self::data_key(d, heldout)).cloned().unwrap_or_default()
    }
}

/// Inputs named by their paths: a spec whose checkpoint ids are model
/// paths and whose uploads are data files (the recipe runner's stages).
#[derive(Debug, Clone, Copy, Default)]
pub struct PathInputs;

impl JobInputs for PathInputs {
    fn model(&self, id: &str) -> String {
        id.to_string()
    }
    fn data(&self, d: &DataRef, heldout: bool) -> String {
        if heldout {
            d.heldout.clone().unwrap_or_default()
        } else {
            d.upload.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_show_the_defaults() {
        let r = crate::ops::route::RouteParams::default();
        assert_eq!(JobKind::Route.field("lambda").unwrap().hint, format!("default {}", r.lambda));
        assert_eq!(JobKind::Upcycle.field("top_k").unwrap().hint, "default 2");
        assert_eq!(JobKind::Upcycle.field("frozen").unwrap().hint, "default 0; none");
        assert_eq!(JobKind::Train.field("seq_len").unwrap().hint, "default 256");
        for k in JobKind::ALL {
            assert_eq!(JobKind::parse(k.as_str()), Some(k));
            assert!(!k.fields().is_empty());
        }
    }
}
