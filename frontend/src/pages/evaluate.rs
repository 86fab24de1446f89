//! Evaluate: multiple-choice task accuracy of one or more models on a
//! JSONL task (pasted or from a file), with the lm-evaluation-harness
//! semantics of `moe-studio eval --task` (the same `moe_shared` function:
//! `acc`, `acc_norm` per character, `acc_bytes` per byte, with standard
//! errors). docs/methods.md "Task accuracy".

use leptos::prelude::*;

use crate::components::message::{Message, MessageLine};
use crate::components::progress::Progress;
use crate::components::task_table::task_table;
use crate::models::Models;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request};

/// The task shown first: 12 hand-written story items (not from any
/// corpus), the task of `tests/reference/golden/task_eval.json`.
const SAMPLE: &str = include_str!("../../../tests/reference/tasks/tiny_stories_mc.jsonl");

/// Items scored by default (the tab scores on one CPU thread).
const DEFAULT_LIMIT: &str = "50";

/// The Evaluate page.
#[component]
pub fn EvaluatePage() -> impl IntoView {
    let models = Models::get();
    let chosen = RwSignal::new(Vec::<ModelRef>::new());
    let name = RwSignal::new("tiny_stories".to_string());
    let text = RwSignal::new(SAMPLE.to_string());
    let delimiter = RwSignal::new("space".to_string());
    let limit = RwSignal::new(DEFAULT_LIMIT.to_string());
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let rows = RwSignal::new(Vec::new());
    // Until the user ticks models, the newest one is scored.
    let picked = move || {
        let c = chosen.get_untracked();
        if !c.is_empty() {
            return c;
        }
        models.0.with_untracked(|v| v.last().map(|m| vec![m.r.clone()])).unwrap_or_default()
    };
    let on_file = move |ev: leptos::ev::Event| {
        let input = event_target::<web_sys::HtmlInputElement>(&ev);
        let files = input.files();
        leptos::task::spawn_local(async move {
            if let Ok(mut f) = crate::web::read_files(files).await {
                if let Some(f) = f.pop() {
                    name.set(f.name.trim_end_matches(".jsonl").to_string());
                    text.set(String::from_utf8_lossy(&f.bytes).into_owned());
                }
            }
        });
    };
    let run = move |_| {
        let ms = picked();
        if ms.is_empty() {
            return msg.set(Message::Error("load a model first (Load page)".into()));
        }
        let lim = match limit.get_untracked().trim() {
            "" | "all" => None,
            s => match s.parse::<usize>() {
                Ok(n) if n >= 1 => Some(n),
                _ => return msg.set(Message::Error("items must be a whole number >= 1 (or empty: all)".into())),
            },
        };
        let target_delimiter = if delimiter.get_untracked() == "none" { String::new() } else { " ".to_string() };
        let params = moe_shared::ops::task::TaskParams { target_delimiter, limit: lim };
        if let Err(e) = params.check() {
            return msg.set(Message::Error(e.to_string()));
        }
        let req = Request::Task { models: ms, name: name.get_untracked(), task: text.get_untracked(), params };
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            match task.call(req, None).await {
                Ok((Reply::Task(r), _)) => {
                    let items = r.first().map(|x| x.items).unwrap_or(0);
                    msg.set(Message::Ok(format!(
                        "scored {items} item(s) with {} model(s) in {}",
                        r.len(),
                        task.wall()
                    )));
                    rows.set(r);
                }
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let boxes = move || {
        models
            .choices()
            .into_iter()
            .map(|(r, label, _)| {
                let (r2, r3) = (r.clone(), r.clone());
                let id = format!("evaluate-pick-{}", r.key());
                view! {
                    <label class="inline"><input type="checkbox" data-testid=id prop:checked=move || chosen.get().contains(&r2)
                        on:change=move |ev| {
                            let on = event_target_checked(&ev);
                            chosen.update(|c| { c.retain(|x| x != &r3); if on { c.push(r3.clone()); } });
                        }/>{label}</label>
                }
            })
            .collect_view()
    };
    let table = move || {
        let r = rows.get();
        (!r.is_empty()).then(|| view! { <h3>"Accuracy (rows: models)"</h3> {task_table("model", r)} })
    };
    view! {
        <h2>"Evaluate: task accuracy"</h2>
        <p class="lead">"Multiple-choice accuracy as lm-evaluation-harness computes it: each choice is scored by the summed log-probability of its tokens after the context; "
            <b>"acc"</b>" takes the most likely choice, "<b>"acc_norm"</b>" divides by the choice's length in characters, "<b>"acc_bytes"</b>" by its UTF-8 bytes. "
            "The same numbers as " <code>"moe-studio eval MODEL --task NAME=FILE.jsonl"</code> " and a server job of kind task."</p>
        <p class="small">"Tick the models to score (none ticked: the newest one)."</p>
        <div class="checklist">{boxes}</div>
        <div class="form">
            <label>"task name " <input type="text" class="short" data-testid="evaluate-name" prop:value=move || name.get()
                on:input=move |ev| name.set(event_target_value(&ev))/></label>
            <input type="file" accept=".jsonl,application/jsonl,text/plain" data-testid="evaluate-file" on:change=on_file/>
            <label>"delimiter " <select data-testid="evaluate-delimiter" on:change=move |ev| delimiter.set(event_target_value(&ev))>
                <option value="space" selected=move || delimiter.get() == "space">"space (lm-eval's default)"</option>
                <option value="none" selected=move || delimiter.get() == "none">"none (contexts that end in a newline)"</option>
            </select></label>
            <label>"items " <input type="text" class="short" data-testid="evaluate-limit" prop:value=move || limit.get()
                on:input=move |ev| limit.set(event_target_value(&ev))/></label>
        </div>
        <p class="small">"One JSON object per line: " <code>"{\"context\": \"…\", \"choices\": [\"…\", \"…\"], \"gold\": 0}"</code>
            {move || format!(" — {} line(s)", text.with(|t| t.lines().filter(|l| !l.trim().is_empty()).count()))}</p>
        <textarea rows="6" data-testid="evaluate-task" prop:value=move || text.get() on:input=move |ev| text.set(event_target_value(&ev))></textarea>
        <button data-testid="evaluate-run" on:click=run disabled=move || task.running()>"Score"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="evaluate"/>
        {table}
    }
}
