//! Long-running steps: progress, cancellation and yielding to the browser's
//! event loop so that the page stays responsive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use leptos::prelude::*;

/// Progress of one running step, shared between the worker and its bar.
#[derive(Clone, Copy)]
pub struct Task {
    /// `(what, fraction in 0..=1)` while running, `None` when idle.
    pub progress: RwSignal<Option<(String, f64)>>,
    cancel: StoredValue<Arc<AtomicBool>>,
}

/// The error a cancelled step returns.
pub const CANCELLED: &str = "cancelled by the user";

impl Task {
    /// An idle task (create it inside a component).
    pub fn new() -> Self {
        Task { progress: RwSignal::new(None), cancel: StoredValue::new(Arc::new(AtomicBool::new(false))) }
    }

    /// Whether a step is running.
    pub fn running(&self) -> bool {
        self.progress.with(Option::is_some)
    }

    /// Marks the start of a step (clears an earlier cancel request).
    pub fn start(&self, what: &str) {
        self.cancel.with_value(|c| c.store(false, Ordering::SeqCst));
        self.progress.set(Some((what.to_string(), 0.0)));
    }

    /// Asks the running step to stop at its next yield point.
    pub fn request_cancel(&self) {
        self.cancel.with_value(|c| c.store(true, Ordering::SeqCst));
    }

    /// Marks the end of a step.
    pub fn finish(&self) {
        self.progress.set(None);
    }

    /// Reports progress, yields to the event loop (so the page repaints and
    /// the Cancel button works) and fails with [`CANCELLED`] when the user
    /// asked to stop.
    ///
    /// # Errors
    /// [`CANCELLED`].
    pub async fn step(&self, what: &str, fraction: f64) -> Result<(), String> {
        self.progress.set(Some((what.to_string(), fraction.clamp(0.0, 1.0))));
        yield_now().await;
        if self.cancel.with_value(|c| c.load(Ordering::SeqCst)) {
            return Err(CANCELLED.to_string());
        }
        Ok(())
    }
}

impl Default for Task {
    fn default() -> Self {
        Self::new()
    }
}

/// Lets the browser run pending events and paint (a zero-delay timer).
pub async fn yield_now() {
    gloo_timers::future::TimeoutFuture::new(0).await;
}
