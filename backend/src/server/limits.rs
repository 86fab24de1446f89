//! Memory limits of the server's child processes (jobs and checkpoint
//! registration) and what the host has.
//!
//! A child runs in its own process group. Its memory is the anonymous and
//! shared-memory resident set (`RssAnon + RssShmem` of `/proc/PID/status`)
//! summed over the group: file-backed pages — a memory-mapped checkpoint —
//! are page cache the kernel can drop, so they do not count. Where the
//! server's cgroup (v2) delegates the `memory` controller and is writable,
//! each child also gets its own cgroup with `memory.max` (the kernel then
//! enforces the limit); elsewhere the server polls every
//! [`POLL`] and kills the group (SIGKILL) above the limit. `RLIMIT_AS` is
//! not used: memory-mapped checkpoints and CUDA's address-space
//! reservations exceed any useful address-space limit without using memory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often a child's memory is measured (every tenth of it in its first second).
pub const POLL: Duration = Duration::from_millis(100);

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, bytes (`None` when unreadable).
pub fn host_memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |k: &str| -> Option<u64> {
        let l = text.lines().find(|l| l.starts_with(k))?;
        l[k.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|kb| kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// Resident anonymous + shared memory of one process, bytes (0 when gone).
fn process_memory(pid: u32) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return 0 };
    let kb = |k: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l[k.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (kb("RssAnon:") + kb("RssShmem:")) * 1024
}

/// The process group of `pid` (field 5 of `/proc/PID/stat`).
fn pgrp(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// Memory of every process in the process group led by `leader`, bytes.
pub fn group_memory(leader: u32) -> u64 {
    let Ok(rd) = std::fs::read_dir("/proc") else { return process_memory(leader) };
    let mut total = 0;
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == leader || pgrp(pid) == Some(leader) {
            total += process_memory(pid);
        }
    }
    total
}

/// A cgroup v2 of one child, removed on drop.
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// Creates `NAME` under the server's own cgroup with `memory.max =
    /// limit`, when the hierarchy is cgroup v2, delegates `memory` to its
    /// children and is writable; `None` otherwise.
    pub fn create(name: &str, limit: u64) -> Option<Cgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim().trim_start_matches('/').to_string();
        let base = Path::new("/sys/fs/cgroup").join(rel);
        let ctl = std::fs::read_to_string(base.join("cgroup.subtree_control")).ok()?;
        if !ctl.split_whitespace().any(|c| c == "memory") {
            return None;
        }
        let dir = base.join(name);
        std::fs::create_dir(&dir).ok()?;
        let g = Cgroup { dir };
        std::fs::write(g.dir.join("memory.max"), limit.to_string()).ok()?;
        let _ = std::fs::write(g.dir.join("memory.swap.max"), "0");
        Some(g)
    }

    /// Moves `pid` into the cgroup.
    pub fn add(&self, pid: u32) -> bool {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).is_ok()
    }

    /// `memory.current`, bytes.
    pub fn current(&self) -> Option<u64> {
        std::fs::read_to_string(self.dir.join("memory.current")).ok()?.trim().parse().ok()
    }

    /// Whether the kernel killed a process of the cgroup for its limit.
    pub fn oom_killed(&self) -> bool {
        std::fs::read_to_string(self.dir.join("memory.events")).ok().is_some_and(|t| {
            t.lines().any(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0) > 0)
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Possible only once its processes are gone.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The memory watch of one running child process group.
pub struct Watch {
    /// The limit, bytes.
    pub limit: u64,
    current: AtomicU64,
    peak: AtomicU64,
    over: AtomicBool,
    done: AtomicBool,
    cgroup: Option<Cgroup>,
}

impl Watch {
    /// Memory now, bytes.
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }
    /// Highest memory seen, bytes.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
    /// Whether the child went over the limit (and was killed for it).
    pub fn over_limit(&self) -> bool {
        self.over.load(Ordering::Relaxed) || self.cgroup.as_ref().is_some_and(Cgroup::oom_killed)
    }
    /// Whether the kernel enforces the limit (cgroup `memory.max`).
    pub fn enforced_by_cgroup(&self) -> bool {
        self.cgroup.is_some()
    }
    /// Stops the polling (the child exited).
    pub fn stop(&self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Watches the process group led by `pid` (just spawned) against `limit`
/// bytes: moves it into its own cgroup `name` where possible, and polls
/// its memory every [`POLL`] until [`Watch::stop`], killing the group with
/// SIGKILL above the limit.
pub fn watch(pid: u32, limit: u64, name: &str) -> Arc<Watch> {
    let cgroup = Cgroup::create(name, limit).filter(|g| g.add(pid));
    let w = Arc::new(Watch {
        limit,
        current: AtomicU64::new(0),
        peak: AtomicU64::new(0),
        over: AtomicBool::new(false),
        done: AtomicBool::new(false),
        cgroup,
    });
    let w2 = w.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut first = true;
        while !w2.done.load(Ordering::Relaxed) {
            // Every 10 ms in the first second (short jobs get measured too), then every POLL.
            if !first {
                tokio::time::sleep(if started.elapsed() < Duration::from_secs(1) { POLL / 10 } else { POLL }).await;
            }
            first = false;
            let w3 = w2.clone();
            let m = tokio::task::spawn_blocking(move || match w3.cgroup.as_ref().and_then(Cgroup::current) {
                Some(c) => c,
                None => group_memory(pid),
            })
            .await
            .unwrap_or(0);
            if w2.done.load(Ordering::Relaxed) {
                break;
            }
            w2.current.store(m, Ordering::Relaxed);
            w2.peak.fetch_max(m, Ordering::Relaxed);
            if m > w2.limit && w2.cgroup.is_none() {
                w2.over.store(true, Ordering::Relaxed);
                super::jobs::signal_group(pid, libc::SIGKILL);
                break;
            }
        }
    });
    w
}

/// `n` bytes for people: `1.50 GB`, `12.3 MB`, `512 B`.
pub fn human(n: u64) -> String {
    let f = n as f64;
    if f >= 1e9 {
        format!("{:.2} GB", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.1} MB", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.1} kB", f / 1e3)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_memory_is_measured() {
        let me = std::process::id();
        // The other unit tests of this binary run in parallel threads of
        // the same process and may free memory between the two readings
        // (CI once saw +14.3 MiB for a 16 MiB block): the block is large
        // against them. A reading in pages or kB, or doubled, fails.
        let before = process_memory(me);
        let block = vec![1u8; 64 << 20];
        let after = process_memory(me);
        assert!(after >= before + (48 << 20), "{before} -> {after} for a 64 MiB block");
        assert!(after <= before + (64 << 20) + (512 << 20), "{before} -> {after} for a 64 MiB block");
        assert_eq!(block[(64 << 20) - 1], 1);
        assert_eq!(group_memory(u32::MAX - 1), 0);
        drop(block);
        assert_eq!(process_memory(u32::MAX), 0);
        let (total, avail) = host_memory().unwrap();
        assert!(total >= avail && avail > 0);
        assert_eq!(human(1_500_000_000), "1.50 GB");
        assert_eq!(human(512), "512 B");
    }
}
