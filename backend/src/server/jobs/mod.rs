//! Jobs: validated specs stored in SQLite, run as child processes of the
//! same binary (`moe-studio <kind> ...`) by a bounded pool, with progress
//! parsed from the child's output and broadcast as server-sent events.
//!
//! Why a child process per job rather than a thread: each job gets its own
//! log (the CLI's stderr), its own Ctrl-C handling (a SIGINT makes `train`
//! save a checkpoint), and a job that runs out of memory or panics takes
//! down only itself, never the server. The code run is the CLI's, so a job
//! and the same command typed by hand give the same numbers.
//!
//! `handlers`: the HTTP routes; `supervisor`: the queue and each job's child
//! process; `progress`: reading a train job's progress from its stdout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moe_shared::api::{DataRef, JobEvent, JobInfo, JobMemory};
use tokio::sync::{broadcast, watch, Semaphore};

use super::db::get_job;
use super::error::{AppError, AppResult};
use super::AppStateRef;

mod handlers;
mod progress;
mod supervisor;

pub use handlers::{artifact, artifacts, cancel, create, events, get_one, list, log, metrics, resume};
pub use supervisor::{begin_shutdown, recover, shutdown};

/// Set in a job's environment: the child exits when its stdin (a pipe from
/// the server) closes, so no job outlives a killed server.
pub const EXIT_WITH_PARENT_ENV: &str = "MOE_STUDIO_EXIT_WITH_PARENT";

/// Why the server killed a job (SIGKILL).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Killed {
    /// It did not stop within this long after the SIGINT of a cancel.
    Grace(Duration),
    /// Its memory went over its limit.
    Memory { peak: u64, limit: u64 },
}

struct Live {
    tx: broadcast::Sender<JobEvent>,
    pid: Option<u32>,
    /// The user cancelled this run (it ends `cancelled`).
    cancel: bool,
    /// This run has had its one SIGINT (from a cancel, or from a server
    /// stop): `train` takes a second one 2 s or more later as "quit without
    /// a checkpoint", so nothing sends another.
    interrupted: bool,
    /// Which start of a job this is (a cancel's SIGKILL timer kills only the start it cancelled).
    run: u64,
    /// The worker task that has claimed this job (its `run`), from its
    /// claim until the job's end is recorded: a second task for the same
    /// job (a resume while the first waited for a worker, two workers) sees
    /// it and leaves, touching none of the first's state or files.
    owner: Option<u64>,
    /// Why the server killed it, if it did.
    killed: Option<Killed>,
    /// The memory watch of the running child.
    memory: Option<Arc<super::limits::Watch>>,
}

/// The worker pool and the live state of running jobs.
pub struct Runner {
    sem: Arc<Semaphore>,
    live: Mutex<HashMap<String, Live>>,
    shutdown: watch::Sender<bool>,
    exe: PathBuf,
    runs: std::sync::atomic::AtomicU64,
}

impl Runner {
    /// A pool of `workers` slots running this executable.
    ///
    /// # Errors
    /// When the executable's path cannot be found.
    pub fn new(workers: usize) -> anyhow::Result<Runner> {
        Ok(Runner {
            sem: Arc::new(Semaphore::new(workers)),
            live: Mutex::new(HashMap::new()),
            shutdown: watch::channel(false).0,
            exe: std::env::current_exe()?,
            runs: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// The executable jobs run (this binary).
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    fn with_live<R>(&self, id: &str, f: impl FnOnce(&mut Live) -> R) -> R {
        let mut m = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let l = m.entry(id.to_string()).or_insert_with(|| Live {
            tx: broadcast::channel(256).0,
            pid: None,
            cancel: false,
            interrupted: false,
            owner: None,
            run: 0,
            killed: None,
            memory: None,
        });
        f(l)
    }

    /// Claims job `id` for the worker task starting its run `run`: resets
    /// the live state for that run and returns `true`, or returns `false`
    /// and changes nothing when another task holds it (until [`Runner::finish`]
    /// removes the entry).
    fn claim(&self, id: &str, run: u64) -> bool {
        self.with_live(id, |l| {
            if l.owner.is_some() {
                return false;
            }
            l.owner = Some(run);
            l.pid = None;
            l.cancel = false;
            l.interrupted = false;
            l.run = run;
            l.killed = None;
            l.memory = None;
            true
        })
    }

    /// `f` on the live state of `id` when there is one (never creates it).
    fn if_live<R>(&self, id: &str, f: impl FnOnce(&mut Live) -> R) -> Option<R> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).get_mut(id).map(f)
    }

    fn emit(&self, id: &str, ev: JobEvent) {
        self.with_live(id, |l| {
            let _ = l.tx.send(ev);
        });
    }

    /// Removes job `id`'s live state when the task that claimed it for run
    /// `run` is done with it (its end recorded, or its start lost); an entry
    /// another run owns is left alone.
    fn release(&self, id: &str, run: u64) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.get(id).is_some_and(|l| l.owner == Some(run)) {
            live.remove(id);
        }
    }

    /// Removes job `id`'s live state when no worker task has claimed it (a
    /// queued job cancelled before any task took it); a claimed entry is
    /// released by its task.
    fn finish_unclaimed(&self, id: &str) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.get(id).is_some_and(|l| l.owner.is_none()) {
            live.remove(id);
        }
    }

    fn live_pids(&self) -> Vec<u32> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).values().filter_map(|l| l.pid).collect()
    }

    /// The pids of running jobs that have had no SIGINT yet (a cancel's or
    /// the worker's), each marked as having had it: the ones a server
    /// stop's SIGINT goes to.
    fn take_uninterrupted_pids(&self) -> Vec<u32> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.values_mut()
            .filter(|l| !l.interrupted)
            .filter_map(|l| {
                let pid = l.pid?;
                l.interrupted = true;
                Some(pid)
            })
            .collect()
    }

    /// Marks job `id` cancelled: `(true, pid to signal)` the first time
    /// (the caller records the cancel, sends the SIGINT to the pid given,
    /// and starts the grace timer; no pid when the process is not spawned
    /// yet — the worker signals right after spawning — or when a server
    /// stop has already sent its SIGINT), `(false, None)` when a cancel came
    /// before. `train` takes a second SIGINT 2 s or more after the first as
    /// "quit without a checkpoint", so a run gets one SIGINT however often
    /// it is stopped. `None` when `id` has no live state (it has just
    /// finished: nothing to signal, and no entry is made that nothing would
    /// remove).
    fn mark_cancel(&self, id: &str) -> Option<(bool, Option<u32>)> {
        self.if_live(id, |l| {
            let first = !l.cancel;
            l.cancel = true;
            let signal = if first && !l.interrupted { l.pid } else { None };
            if signal.is_some() {
                l.interrupted = true;
            }
            (first, signal)
        })
    }

    /// The memory of running job `id` now.
    fn memory(&self, id: &str) -> Option<JobMemory> {
        self.if_live(id, |l| {
            l.memory.as_ref().map(|w| JobMemory {
                current_bytes: w.current(),
                peak_bytes: w.peak(),
                limit_bytes: w.limit,
            })
        })
        .flatten()
    }
}

/// Sends `sig` to the process group led by `pid` (jobs run in their own group).
pub fn signal_group(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory effects; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// `jobs/{id}` of a validated id.
fn job_dir(st: &AppStateRef, id: &str) -> PathBuf {
    st.data.join("jobs").join(id)
}

async fn load(st: &AppStateRef, id: &str) -> AppResult<JobInfo> {
    let idc = id.to_string();
    st.db
        .call(move |c| get_job(c, &idc).map_err(AppError::from))
        .await?
        .ok_or_else(|| AppError::not_found("id", format!("job {id}")))
}

fn data_ext(file_name: &str) -> &'static str {
    if file_name.ends_with(".jsonl") {
        ".jsonl"
    } else if file_name.ends_with(".json") {
        ".json"
    } else {
        ".txt"
    }
}

/// Relative path (from the job directory) of a dataset's file.
fn data_rel(d: &DataRef, heldout: bool, ext: &str) -> String {
    format!("data/{}{}{ext}", d.name, if heldout { ".heldout" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run gets one SIGINT: a second cancel, a server stop after a cancel,
    /// and a cancel during a server stop send no second one (which would
    /// stop `train` without its checkpoint); the final SIGKILL sweep still
    /// sees every job.
    #[test]
    fn a_job_gets_one_sigint_however_often_it_is_stopped() {
        let r = Runner::new(1).unwrap();
        r.with_live("a", |l| l.pid = Some(41));
        r.with_live("b", |l| l.pid = Some(42));
        r.with_live("c", |l| l.pid = None);
        assert_eq!(r.mark_cancel("a"), Some((true, Some(41))));
        assert_eq!(r.mark_cancel("a"), Some((false, None)));
        // A job that has just finished: nothing to signal, no entry left behind.
        assert_eq!(r.mark_cancel("gone"), None);
        assert!(r.if_live("gone", |_| ()).is_none());
        // The stop signals the others once, and a job not spawned yet not at all.
        assert_eq!(r.take_uninterrupted_pids(), vec![42]);
        assert_eq!(r.take_uninterrupted_pids(), Vec::<u32>::new());
        // A cancel during the stop is recorded but sends no second SIGINT.
        assert_eq!(r.mark_cancel("b"), Some((true, None)));
        let mut all = r.live_pids();
        all.sort_unstable();
        assert_eq!(all, vec![41, 42]);
    }

    /// A second worker task for a job that a first has claimed leaves it
    /// alone (before, it reset the running job's pid and cancel flag and
    /// removed its temporaries); once the job's end is recorded it can be
    /// claimed again.
    #[test]
    fn a_second_task_for_a_claimed_job_touches_nothing() {
        let r = Runner::new(2).unwrap();
        assert!(r.claim("a", 1));
        r.with_live("a", |l| l.pid = Some(7));
        assert_eq!(r.mark_cancel("a"), Some((true, Some(7))));
        assert!(!r.claim("a", 2));
        assert_eq!(r.if_live("a", |l| (l.pid, l.cancel, l.interrupted, l.run)), Some((Some(7), true, true, 1)));
        // Only its owner's release (or none) removes a claimed entry.
        r.finish_unclaimed("a");
        r.release("a", 2);
        assert!(r.if_live("a", |_| ()).is_some());
        r.release("a", 1);
        assert!(r.claim("a", 3));
        assert_eq!(r.if_live("a", |l| (l.pid, l.cancel, l.run)), Some((None, false, 3)));
        r.with_live("q", |_| ());
        r.finish_unclaimed("q");
        assert!(r.if_live("q", |_| ()).is_none());
    }
}
