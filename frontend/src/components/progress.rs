//! Progress bar with a Cancel button for a running [`Task`]: the worker's
//! real units of work (`412 / 1,024 tokens`) and the page's wall clock.

use leptos::prelude::*;

use crate::task::Task;

/// Shown while `task` runs.
#[component]
pub fn Progress(task: Task) -> impl IntoView {
    // Re-render every 200 ms while running, for the clock.
    let tick = RwSignal::new(0u64);
    let handle = set_interval_with_handle(move || tick.update(|t| *t += 1), std::time::Duration::from_millis(200)).ok();
    on_cleanup(move || {
        if let Some(h) = handle {
            h.clear();
        }
    });
    move || {
        tick.track();
        task.progress.get().map(|r| {
            let now = crate::web::now_ms();
            let (frac, line) = match (&r.started_ms, &r.step) {
                (None, _) => {
                    let behind = crate::worker::client::running().map(|q| q.describe()).unwrap_or("another task");
                    (0.0, format!("{}: waiting for the studio's worker ({behind} is running)", r.what))
                }
                (Some(_), None) => (0.0, format!("{}: starting", r.what)),
                (Some(_), Some(s)) => (
                    s.fraction(),
                    format!("{}: {} — {} / {} {} ({:.0}%)", r.what, s.what, s.done, s.total, s.unit, 100.0 * s.fraction()),
                ),
            };
            let elapsed = (now - r.sent_ms) / 1000.0;
            view! {
                <div class="progress" data-testid="progress">
                    <div class="bar"><div class="fill" style=format!("width:{:.0}%", frac * 100.0)></div></div>
                    <span data-testid="progress-line">{line}</span>
                    <span class="small" data-testid="progress-clock">{format!("{elapsed:.1} s")}</span>
                    <button class="secondary" data-testid="cancel" on:click=move |_| crate::worker::client::restart()>"Cancel"</button>
                </div>
            }
        })
    }
}
