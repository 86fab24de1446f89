//! Progress of a running method in real units of work (tensors, texts,
//! tokens, layers), reported from inside the method.
//!
//! The methods run in the studio's Web Worker ([`crate::worker`]), where
//! nothing waits for the page: a report is a message to the page
//! (throttled), and cancelling terminates the worker, so a report never
//! fails and a method never has to yield.

use std::cell::Cell;

/// One progress report: `done` of `total` `unit`s of `what`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// What is being done (`copying FFNs into experts`).
    pub what: String,
    /// Units done.
    pub done: u64,
    /// Units in all (>= 1).
    pub total: u64,
    /// The unit (`tensors`, `texts`, `tokens`, `layers`).
    pub unit: String,
}

impl Step {
    /// `done / total` in `0..=1`.
    pub fn fraction(&self) -> f64 {
        (self.done as f64 / self.total.max(1) as f64).clamp(0.0, 1.0)
    }
}

/// Least milliseconds between two reports of the same step.
pub const THROTTLE_MS: f64 = 50.0;

/// Where a method's reports go.
pub struct Progress {
    sink: Box<dyn Fn(Step)>,
    last: Cell<f64>,
    last_what: std::cell::RefCell<String>,
}

impl Progress {
    /// Reports to `sink` (at most one report per [`THROTTLE_MS`] per step,
    /// plus the first and the last of each step).
    pub fn new(sink: impl Fn(Step) + 'static) -> Self {
        Progress { sink: Box::new(sink), last: Cell::new(f64::NEG_INFINITY), last_what: Default::default() }
    }

    /// A progress that reports nothing (tests, native callers).
    pub fn silent() -> Self {
        Progress::new(|_| {})
    }

    /// Reports `done` of `total` `unit`s of `what`.
    pub fn step(&self, what: &str, done: u64, total: u64, unit: &str) {
        let now = crate::web::now_ms();
        let new_step = *self.last_what.borrow() != what;
        if !new_step && done < total && now - self.last.get() < THROTTLE_MS {
            return;
        }
        self.last.set(now);
        if new_step {
            *self.last_what.borrow_mut() = what.to_string();
        }
        (self.sink)(Step {
            what: what.to_string(),
            done: done.min(total),
            total: total.max(1),
            unit: unit.to_string(),
        });
    }
}
