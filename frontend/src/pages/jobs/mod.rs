//! Jobs: server-side work through `moe-studio serve` — every job kind the
//! server runs (upcycle, train, eval, moerge, route, graft, merge,
//! neurons) — with the token, chunked resumable uploads, checkpoints, live
//! progress over server-sent events with a loss curve, eval results,
//! artefact downloads and "Open in studio". Served as static files, the
//! page explains that and stays disabled.
//!
//! Layout: [`state`] (what the page knows, shared by the parts),
//! [`uploads`], [`checkpoints`], [`new_job`] (the form, made of
//! [`fields`] over the pure [`form`]), [`job_list`] and [`job_detail`].

pub mod checkpoints;
pub mod fields;
pub mod form;
pub mod job_detail;
pub mod job_list;
pub mod new_job;
pub mod state;
pub mod uploads;

use leptos::prelude::*;
use moe_shared::api::ServerInfo;

use crate::app::Shared;
use crate::components::message::MessageLine;
use crate::jobs::api;
use state::Ctx;

/// The Jobs page.
#[component]
pub fn JobsPage() -> impl IntoView {
    let shared = Shared::get();
    let ctx = Ctx::new();
    let info = RwSignal::new(None::<ServerInfo>);
    let (msg, token) = (ctx.msg, ctx.token);

    // Counts messages, so a test can wait for the next one.
    let msg_seq = RwSignal::new(0u64);
    Effect::new(move |_| {
        msg.track();
        msg_seq.update(|n| *n += 1);
    });

    // The server's description (`api/info`): shown on the page; it also
    // marks the backend as present if the studio's first probe failed.
    Effect::new(move |_| {
        if shared.backend.get().is_some() && info.get_untracked().is_none() {
            leptos::task::spawn_local(async move {
                if let Ok(i) = api::get::<ServerInfo>("api/info").await {
                    info.set(Some(i));
                    if shared.backend.get_untracked() != Some(true) {
                        shared.backend.set(Some(true));
                    }
                    // Every list needs the token (issue 18): without one
                    // there is nothing to read yet (no 401s in the console).
                    if !token.get_untracked().trim().is_empty() {
                        ctx.refresh();
                    }
                }
            });
        }
    });
    Effect::new(move |_| {
        let t = token.get();
        api::save(api::TOKEN_KEY, t.trim());
        // The read cookie for the event streams and download links; then
        // what the token may read.
        let t = t.trim().to_string();
        leptos::task::spawn_local(async move {
            if api::open_session(&t).await && token.get_untracked().trim() == t {
                ctx.refresh();
            }
        });
    });

    let off = Signal::derive(move || shared.backend.get() != Some(true) || info.get().is_none());

    view! {
        <h2>"Server jobs"</h2>
        <p class="lead">"Full-scale work — continued pre-training of the new experts, router tuning with replay, merges of 7B models — \
            runs on a server with " <code>"moe-studio serve"</code> " (CUDA / wgpu / CPU). This page uploads checkpoints to it and follows the jobs live."</p>
        {move || off.get().then(|| view! {
            <div class="notice" data-testid="jobs-static">
                <b>"No server: this studio is served as static files."</b>
                " Everything on the other pages still works in this tab. To run server jobs, start "
                <code>"moe-studio serve"</code> " and open the address it prints."
            </div>
        })}
        <fieldset class="form" disabled=move || off.get() data-testid="jobs-server">
            <legend>"Server"</legend>
            <p class="small" data-testid="server-info">{move || info.get().map(|i| format!(
                "moe-studio {} · backends {} (default {}) · {} worker(s) · uploads up to {}",
                i.version, i.backends.join(", "), i.default_backend, i.workers, crate::format_bytes(i.max_upload_bytes)))}</p>
            <label>"token " <input type="password" size="40" data-testid="jobs-token" placeholder="printed by moe-studio serve (DATA_DIR/token)"
                prop:value=move || token.get() on:input=move |ev| token.set(event_target_value(&ev))/></label>
            " "
            <button class="secondary" data-testid="jobs-refresh" on:click=move |_| ctx.refresh()>"Refresh"</button>
        </fieldset>
        <div data-testid="jobs-msg" data-seq=move || msg_seq.get().to_string()>
            <MessageLine msg=msg id="jobs"/>
        </div>
        {uploads::uploads_section(ctx, info, off)}
        <h3>"Checkpoints"</h3>
        {checkpoints::checkpoint_table(ctx)}
        {new_job::new_job_form(ctx, off)}
        <h3>"Jobs"</h3>
        {job_list::job_list(ctx)}
        {job_detail::job_detail(ctx)}
    }
}
