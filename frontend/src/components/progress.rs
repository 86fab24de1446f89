//! Progress bar with a Cancel button for a running [`Task`].

use leptos::prelude::*;

use crate::task::Task;

/// Shown while `task` runs.
#[component]
pub fn Progress(task: Task) -> impl IntoView {
    move || {
        task.progress.get().map(|(what, f)| {
            view! {
                <div class="progress" data-testid="progress">
                    <div class="bar"><div class="fill" style=format!("width:{:.0}%", f * 100.0)></div></div>
                    <span>{format!("{what} — {:.0}%", f * 100.0)}</span>
                    <button class="secondary" on:click=move |_| task.request_cancel()>"Cancel"</button>
                </div>
            }
        })
    }
}
