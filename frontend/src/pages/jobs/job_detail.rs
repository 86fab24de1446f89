//! The followed job: its event stream (state, progress, log) over
//! server-sent events, the loss curve of training jobs, an eval job's
//! perplexities, the artefacts, Cancel / Resume and "Open in studio".

use std::cell::RefCell;

use leptos::prelude::*;
use moe_shared::api::{CheckpointInfo, FileInfo, JobEvent, JobInfo, JobState};

use super::state::{parse_eval, parse_tasks, short, Ctx, Live};
use crate::components::message::Message;
use crate::jobs::api;
use crate::jobs::events::{follow, Follow};
use crate::jobs::loss_chart::LossChart;
use crate::worker::protocol::{Reply, Request};

thread_local! {
    /// The event stream of the job shown (one at a time).
    static FOLLOW: RefCell<Option<Follow>> = const { RefCell::new(None) };
}

/// `1h 02m`, `3m 05s`, `12s`.
pub fn fmt_eta(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Lists job `id`'s artefacts; an eval or task job's `result.json` is read too.
fn load_artefacts(ctx: Ctx, id: String) {
    leptos::task::spawn_local(async move {
        let shown = || ctx.live.with_untracked(|l| l.job.as_deref() == Some(id.as_str()));
        match api::get::<Vec<FileInfo>>(&format!("api/jobs/{id}/artifacts")).await {
            Ok(v) if shown() => {
                let result = v.iter().any(|f| f.name == "result.json");
                ctx.artefacts.set(v);
                if result {
                    match api::get::<serde_json::Value>(&api::artifact_url(&id, "result.json")).await {
                        Ok(r) if shown() => ctx.live.update(|l| {
                            l.eval = parse_eval(&r);
                            l.tasks = parse_tasks(&r);
                        }),
                        Ok(_) => {}
                        Err(e) => ctx.fail("reading result.json", e),
                    }
                }
            }
            Ok(_) => {}
            Err(e) => ctx.fail("listing artefacts", e),
        }
    });
}

/// Merges job `id`'s logged steps (`GET api/jobs/{id}/metrics`, its
/// `metrics.jsonl`) into the loss curve: sorted by step, one point per step.
/// Called when the page starts following a job (the steps before it looked)
/// and when the job ends (steps whose live events were skipped).
fn load_metrics(ctx: Ctx, id: String) {
    let live = ctx.live;
    leptos::task::spawn_local(async move {
        if let Ok(m) = api::get::<Vec<serde_json::Value>>(&format!("api/jobs/{id}/metrics")).await {
            let pts: Vec<(usize, f64)> =
                m.iter().filter_map(|v| Some((v.get("step")?.as_u64()? as usize, v.get("loss")?.as_f64()?))).collect();
            live.update(|l| {
                if l.job.as_deref() == Some(id.as_str()) {
                    let mut all = pts;
                    all.extend(l.loss.iter().copied());
                    all.sort_by_key(|p| p.0);
                    all.dedup_by_key(|p| p.0);
                    l.loss = all;
                }
            });
        }
    });
}

/// Shows job `id` and follows its event stream.
pub fn watch(ctx: Ctx, id: String) {
    let live = ctx.live;
    FOLLOW.with(|f| f.borrow_mut().take());
    ctx.artefacts.set(Vec::new());
    let current = ctx.jobs.get_untracked().into_iter().find(|j| j.id == id);
    live.set(Live {
        job: Some(id.clone()),
        state: current.as_ref().map(|j| j.state),
        progress: current.as_ref().and_then(|j| j.progress.clone()),
        error: current.as_ref().and_then(|j| j.error.clone()),
        output_checkpoint: current.as_ref().and_then(|j| j.output_checkpoint.clone()),
        memory: current.as_ref().and_then(|j| j.memory),
        ..Live::default()
    });
    // Steps done before the page looked: from metrics.jsonl.
    load_metrics(ctx, id.clone());
    let id3 = id.clone();
    let on_event = move |ev: JobEvent| {
        let mut terminal = false;
        live.update(|l| {
            l.events += 1;
            l.stream = None;
            match ev {
                JobEvent::State { state, error, output_checkpoint } => {
                    l.state = Some(state);
                    l.error = error;
                    if output_checkpoint.is_some() {
                        l.output_checkpoint = output_checkpoint;
                    }
                    terminal = state.is_terminal();
                }
                JobEvent::Progress(p) => {
                    if let Some(loss) = p.loss.filter(|_| p.step > 0) {
                        if l.loss.last().is_none_or(|&(s, _)| s < p.step) {
                            l.loss.push((p.step, loss));
                        }
                    }
                    l.progress = Some(p);
                }
                JobEvent::Log { line } => {
                    l.log.push(line);
                    let n = l.log.len();
                    if n > 200 {
                        l.log.drain(..n - 200);
                    }
                }
                JobEvent::Memory(m) => l.memory = Some(m),
            }
        });
        if terminal {
            // Closing from inside the stream's own callback is not
            // allowed: do it on the next tick.
            let id = id3.clone();
            leptos::task::spawn_local(async move {
                FOLLOW.with(|f| {
                    if f.borrow().as_ref().is_some_and(|x| x.job == id) {
                        f.borrow_mut().take();
                    }
                });
                // Steps whose events the stream skipped (a slow tab lags
                // behind the server's broadcast): the whole curve again.
                load_metrics(ctx, id.clone());
                load_artefacts(ctx, id);
                ctx.refresh();
            });
        }
    };
    let on_error = move |e: String| live.update(|l| l.stream = Some(e));
    match follow(&id, on_event, on_error) {
        Ok(f) => FOLLOW.with(|x| *x.borrow_mut() = Some(f)),
        Err(e) => ctx.fail("following the job", e),
    }
    load_artefacts(ctx, id);
}

/// `POST api/jobs/{id}/{what}` (`cancel`, `resume`) for the followed job.
fn act(ctx: Ctx, what: &'static str) {
    let Some(id) = ctx.live.get_untracked().job else { return };
    leptos::task::spawn_local(async move {
        let url = format!("api/jobs/{id}/{what}");
        match api::send::<(), JobInfo>("POST", &url, &ctx.token.get_untracked(), None).await {
            Ok(j) => {
                ctx.msg.set(Message::Ok(format!("job {}: {what} → {}", short(&j.id), j.state.as_str())));
                ctx.jobs.update(|v| {
                    if let Some(x) = v.iter_mut().find(|x| x.id == j.id) {
                        *x = j.clone();
                    }
                });
                if what == "resume" {
                    watch(ctx, j.id);
                }
            }
            Err(e) => ctx.fail(&format!("{what} job"), e),
        }
    });
}

/// Loads the output checkpoint's files as a model of the studio (the
/// worker downloads and parses them with the Load page's parser).
fn open_in_studio(ctx: Ctx) {
    let Some(cid) = ctx.live.get_untracked().output_checkpoint else {
        return ctx.msg.set(Message::Error("this job has no output checkpoint (yet)".into()));
    };
    ctx.busy.set(true);
    ctx.msg.set(Message::None);
    leptos::task::spawn_local(async move {
        let r: Result<String, String> = async {
            let c: CheckpointInfo = api::get(&format!("api/checkpoints/{cid}")).await?;
            let files: Vec<(String, String)> = c
                .files
                .iter()
                .filter(|f| {
                    matches!(f.name.rsplit_once('.').map(|x| x.1), Some("safetensors" | "json" | "gguf" | "bin"))
                })
                .map(|f| (f.name.clone(), crate::web::absolute(&format!("api/checkpoints/{cid}/files/{}", f.name))))
                .collect();
            match crate::worker::client::call(Request::LoadUrls { name: c.name.clone(), files }).await? {
                (Reply::Model(m), _) => {
                    Ok(format!("opened {} in the studio: {}", m.name, crate::summary_line(&m.config, m.moe.as_ref())))
                }
                _ => Err("the worker gave no model".into()),
            }
        }
        .await;
        match r {
            Ok(l) => ctx.msg.set(Message::Ok(l)),
            Err(e) => ctx.fail("opening the output", e),
        }
        ctx.busy.set(false);
    });
}

/// The perplexities of an eval job.
fn eval_view(ctx: Ctx) -> impl IntoView {
    move || {
        ctx.live.with(|l| l.eval.clone()).map(|rows| {
            view! {
                <table class="grid small" data-testid="eval-result">
                    <thead><tr><th>"dataset"</th><th>"tokens"</th><th>"NLL"</th><th>"perplexity"</th><th>"mean load per expert"</th></tr></thead>
                    <tbody>
                        {rows.into_iter().map(|r| view! {
                            <tr>
                                <td>{r.name.clone()}</td>
                                <td>{r.tokens}</td>
                                <td>{format!("{:.5}", r.nll)}</td>
                                <td data-testid=format!("eval-ppl-{}", r.name) data-value=r.ppl.to_string()>{format!("{:.4}", r.ppl)}</td>
                                <td>{r.load_mean.map(|l| l.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(" / ")).unwrap_or_else(|| "dense".into())}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            }
        })
    }
}

/// The accuracies of a task job.
fn tasks_view(ctx: Ctx) -> impl IntoView {
    move || ctx.live.with(|l| l.tasks.clone()).map(|rows| crate::components::task_table::task_table("task", rows))
}

/// The followed job's card: rebuilt only when another job is shown; its
/// fields follow the events one by one (so an open log stays open).
pub fn job_detail(ctx: Ctx) -> impl IntoView {
    let live = ctx.live;
    let job_id = Memo::new(move |_| live.with(|l| l.job.clone()));
    let prog = move || live.with(|l| l.progress.clone().unwrap_or_default());
    let dash = || "–".to_string();
    move || {
        let id = job_id.get()?;
        let state = move || live.with(|l| l.state.map(|s| s.as_str()).unwrap_or("…"));
        let running = move || live.with(|l| matches!(l.state, Some(JobState::Running | JobState::Queued)));
        let resumable = move || {
            live.with(|l| matches!(l.state, Some(JobState::Interrupted | JobState::Cancelled | JobState::Failed)))
        };
        let pct = move || {
            let p = prog();
            if p.steps > 0 {
                p.step as f64 / p.steps as f64
            } else if live.with(|l| l.state == Some(JobState::Succeeded)) {
                1.0
            } else {
                0.0
            }
        };
        let id2 = id.clone();
        let arts = move || {
            let arts = ctx.artefacts.get();
            let id = id2.clone();
            (!arts.is_empty()).then(|| view! {
                <div data-testid="job-artifacts">
                    <b>"Artefacts"</b>
                    <ul class="small">
                        {arts.into_iter().map(|f| {
                            let url = api::artifact_url(&id, &f.name);
                            let file = f.name.rsplit('/').next().unwrap_or(&f.name).to_string();
                            view! { <li><a href=url download=file data-testid=format!("artifact-{}", f.name)>{f.name.clone()}</a>
                                {format!(" ({})", crate::format_bytes(f.size))}</li> }
                        }).collect_view()}
                    </ul>
                </div>
            })
        };
        Some(view! {
            <div class="card" data-testid="job-live" data-job=id.clone()>
                <h3>"Job " <code>{short(&id)}</code> " — " <span data-testid="job-state" class=move || format!("state {}", state())>{state}</span></h3>
                <progress max="1" value=move || pct().to_string()></progress>
                <table class="grid small">
                    <tr><th>"stage"</th><td data-testid="job-live-stage">{move || prog().stage}</td>
                        <th>"step"</th><td data-testid="job-step" data-step=move || prog().step.to_string()>{move || { let p = prog(); format!("{} / {}", p.step, p.steps) }}</td>
                        <th>"loss"</th><td data-testid="job-loss">{move || prog().loss.map(|x| format!("{x:.4}")).unwrap_or_else(dash)}</td></tr>
                    <tr><th>"tokens/s"</th><td data-testid="job-tps">{move || prog().tokens_per_s.map(|x| format!("{x:.0}")).unwrap_or_else(dash)}</td>
                        <th>"ETA"</th><td data-testid="job-eta">{move || prog().eta_s.map(fmt_eta).unwrap_or_else(dash)}</td>
                        <th>"events"</th><td data-testid="job-events">{move || live.with(|l| l.events)}</td></tr>
                    {let id = id.clone(); move || ctx.jobs.with(|js| js.iter().find(|j| j.id == id).and_then(|j| j.spec.engine())).map(|e| view! {
                        <tr><th>"engine"</th><td colspan="5" data-testid="job-live-engine" data-engine=e.name()>{e.describe()}</td></tr>
                    })}
                    <tr><th>"memory"</th><td colspan="5" data-testid="job-memory">{move || live.with(|l| l.memory.map(|m| format!(
                        "{} now · peak {} · limit {}", crate::format_bytes(m.current_bytes), crate::format_bytes(m.peak_bytes),
                        crate::format_bytes(m.limit_bytes))).unwrap_or_else(dash))}</td></tr>
                </table>
                {move || live.with(|l| l.stream.clone()).map(|s| view! { <p class="msg small">{s}</p> })}
                {move || live.with(|l| l.error.clone()).map(|e| view! { <pre class="msg error small" data-testid="job-error">{e}</pre> })}
                {eval_view(ctx)}
                {tasks_view(ctx)}
                <LossChart points=Signal::derive(move || live.with(|l| l.loss.clone()))/>
                <p>
                    <button data-testid="job-cancel" on:click=move |_| act(ctx, "cancel") disabled=move || !running()>"Cancel"</button>
                    " "
                    <button data-testid="job-resume" on:click=move |_| act(ctx, "resume") disabled=move || !resumable()>"Resume"</button>
                    " "
                    <button data-testid="job-open" on:click=move |_| open_in_studio(ctx) disabled=move || ctx.busy.get() || live.with(|l| l.output_checkpoint.is_none())>"Open in studio"</button>
                </p>
                {arts}
                <details>
                    <summary>{move || live.with(|l| format!("log ({} lines)", l.log.len()))}</summary>
                    <pre class="small" data-testid="job-log">{move || live.with(|l| l.log.join("\n"))}</pre>
                </details>
            </div>
        })
    }
}

#[cfg(test)]
mod tests {
    use super::fmt_eta;

    #[test]
    fn eta_reads_like_a_clock() {
        assert_eq!(fmt_eta(12.4), "12s");
        assert_eq!(fmt_eta(185.0), "3m 05s");
        assert_eq!(fmt_eta(3720.0), "1h 02m");
        assert_eq!(fmt_eta(-3.0), "0s");
    }
}
