//! One page's long-running step: it runs in the studio's worker
//! ([`crate::worker`]); here it is a progress bar (real units of work, the
//! page's wall clock) and a Cancel button.

use leptos::prelude::*;

use crate::compute::progress::Step;
use crate::worker::client::{self, Answer};
use crate::worker::protocol::Request;

/// What a task's bar shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Running {
    /// What the page asked for (`neuron analysis`).
    pub what: String,
    /// The worker's last step (`None`: waiting for the worker, or started
    /// and not yet reported).
    pub step: Option<Step>,
    /// When the page sent it (`performance.now()`, ms).
    pub sent_ms: f64,
    /// When the worker took it up.
    pub started_ms: Option<f64>,
}

/// Progress of one page's step, shared between the page and its bar.
#[derive(Clone, Copy)]
pub struct Task {
    /// While running, what the bar shows; `None` when idle.
    pub progress: RwSignal<Option<Running>>,
    /// Wall time of the last finished call, in ms (sent to answered).
    pub last_ms: RwSignal<f64>,
}

impl Task {
    /// An idle task (create it inside a component).
    pub fn new() -> Self {
        Task { progress: RwSignal::new(None), last_ms: RwSignal::new(0.0) }
    }

    /// Whether a step is running (or waiting for the worker).
    pub fn running(&self) -> bool {
        self.progress.with(Option::is_some)
    }

    /// Runs `request` in the worker (`files` beside it) and returns its
    /// answer; the bar follows it. With `?inject-panic` in the page's URL
    /// the first such call panics in the worker instead (the crash-path
    /// test).
    pub async fn call(&self, request: Request, files: Option<js_sys::Array>) -> Answer {
        self.call_observed(request, files, None).await
    }

    /// [`Task::call`], with `on_point` for every training step the worker
    /// reports.
    pub async fn call_observed(
        &self,
        request: Request,
        files: Option<js_sys::Array>,
        on_point: Option<std::rc::Rc<dyn Fn(crate::compute::train::TrainPoint)>>,
    ) -> Answer {
        let what = request.describe().to_string();
        let request = if client::take_injected_panic() { Request::Panic } else { request };
        let sent = crate::web::now_ms();
        self.progress.set(Some(Running { what, step: None, sent_ms: sent, started_ms: None }));
        let (p1, p2) = (self.progress, self.progress);
        let answer = client::call_observed(
            request,
            files,
            move || {
                p1.update(|r| {
                    if let Some(r) = r {
                        r.started_ms = Some(crate::web::now_ms());
                    }
                })
            },
            move |step| {
                p2.update(|r| {
                    if let Some(r) = r {
                        r.step = Some(step);
                    }
                })
            },
            on_point,
        )
        .await;
        self.last_ms.set(crate::web::now_ms() - sent);
        self.progress.set(None);
        answer
    }

    /// Wall time of the last call as `1.2 s`.
    pub fn wall(&self) -> String {
        format!("{:.1} s", self.last_ms.get_untracked() / 1000.0)
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
