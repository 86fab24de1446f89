//! The "New job" form: a kind selector, the kind's inputs (one per field
//! of its spec type, drawn by [`super::fields`] from [`Kind::fields`]), the
//! job's name and the submission; an error of the form or the server's 422
//! is shown next to the input it names.

use leptos::prelude::*;
use moe_shared::api::JobInfo;

use super::fields::{error_line, form_field};
use super::form::{FieldError, Kind};
use super::job_detail::watch;
use super::state::{short, Ctx};
use crate::components::message::Message;
use crate::jobs::api::{self, ApiFailure};

/// Builds the request from the form and posts it; follows the new job.
pub fn submit(ctx: Ctx) {
    let form = ctx.form.get_untracked();
    ctx.field_error.set(None);
    let req = match form.build() {
        Ok(r) => r,
        Err(e) => {
            ctx.msg.set(Message::Error(format!("{}: {}", if e.key.is_empty() { "job" } else { &e.key }, e.text())));
            ctx.field_error.set(Some(e));
            return;
        }
    };
    ctx.busy.set(true);
    ctx.msg.set(Message::None);
    leptos::task::spawn_local(async move {
        match api::send::<_, JobInfo>("POST", "api/jobs", &ctx.token.get_untracked(), Some(&req)).await {
            Ok(j) => {
                ctx.msg.set(Message::Ok(format!("job {} ({}) submitted", short(&j.id), j.kind)));
                ctx.jobs.update(|v| v.insert(0, j.clone()));
                watch(ctx, j.id);
            }
            Err(e) => {
                if let ApiFailure::Http { reason: Some(r), .. } = &e {
                    let fe = FieldError::from_server(form.kind, r.field.as_deref(), &r.error);
                    ctx.field_error.set((!fe.key.is_empty()).then_some(fe));
                }
                ctx.fail("submitting the job", e);
            }
        }
        ctx.busy.set(false);
    });
}

/// The form.
pub fn new_job_form(ctx: Ctx, off: Signal<bool>) -> impl IntoView {
    let form = ctx.form;
    let kind = Memo::new(move |_| form.with(|f| f.kind));
    let inputs = move || {
        let k = kind.get();
        let (basic, more): (Vec<_>, Vec<_>) = k.fields().iter().partition(|f| !f.advanced);
        view! {
            <div class="job-fields" data-testid=format!("job-form-{}", k.as_str())>
                {basic.into_iter().map(|fd| form_field(ctx, fd)).collect_view()}
                {(!more.is_empty()).then(|| view! {
                    <details class="more">
                        <summary class="small">"more options"</summary>
                        {more.into_iter().map(|fd| form_field(ctx, fd)).collect_view()}
                    </details>
                })}
            </div>
        }
    };
    view! {
        <fieldset class="form" disabled=move || off.get()>
            <legend>"New job"</legend>
            <label>"kind " <select data-testid="job-kind" prop:value=move || kind.get().as_str()
                on:change=move |ev| {
                    if let Some(k) = Kind::parse(&event_target_value(&ev)) {
                        ctx.field_error.set(None);
                        form.update(|f| f.kind = k);
                    }
                }>
                {Kind::ALL.into_iter().map(|k| view! {
                    <option value=k.as_str() selected=form.with_untracked(|f| f.kind) == k>{k.label()}</option>
                }).collect_view()}
            </select></label>
            {inputs}
            <div class="job-field" data-field="name">
                <span class="job-label">"job name"</span> " "
                <input type="text" size="16" data-testid="job-name" placeholder="optional"
                    prop:value=move || form.with(|f| f.name.clone())
                    on:input=move |ev| form.update(|f| f.name = event_target_value(&ev))/>
                {error_line(ctx, "name")}
            </div>
            <div>
                <button data-testid="job-submit" on:click=move |_| submit(ctx) disabled=move || ctx.busy.get()>"Start job"</button>
            </div>
        </fieldset>
    }
}
