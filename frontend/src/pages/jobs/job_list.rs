//! The server's jobs, newest first, each with a "Show" button that
//! follows it in [`super::job_detail`].

use leptos::prelude::*;

use super::job_detail::watch;
use super::state::{short, Ctx};

/// The jobs table.
pub fn job_list(ctx: Ctx) -> impl IntoView {
    move || {
        view! {
            <table class="grid" data-testid="jobs-table">
                <thead><tr><th>"job"</th><th>"kind"</th><th>"state"</th><th>"progress"</th><th>"output"</th><th></th></tr></thead>
                <tbody>
                    {ctx.jobs.get().into_iter().map(|j| {
                        let id = j.id.clone();
                        let prog = j.progress.as_ref().map(|p| if p.steps > 0 { format!("{} {}/{}", p.stage, p.step, p.steps) } else { p.stage.clone() }).unwrap_or_default();
                        view! {
                            <tr data-testid=format!("job-row-{}", j.id)>
                                <td><code>{short(&j.id)}</code> " " {j.name.clone().unwrap_or_default()}</td>
                                <td data-testid=format!("job-row-kind-{}", j.id)>{match j.spec.engine() {
                                    Some(e) => format!("{} ({})", j.kind, e.name()),
                                    None => j.kind.clone(),
                                }}</td>
                                <td class=format!("state {}", j.state.as_str())>{j.state.as_str()}</td>
                                <td>{prog}</td>
                                <td>{j.output_checkpoint.as_deref().map(short).unwrap_or_default()}</td>
                                <td><button class="secondary" data-testid=format!("job-follow-{}", j.id) on:click=move |_| watch(ctx, id.clone())>"Show"</button></td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
        }
    }
}
