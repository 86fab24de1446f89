//! The three papers as guided lessons on the teaching preset: one page per
//! paper that walks its steps in order. Each step says what it does, runs
//! with one click (the same worker requests the tool pages send), shows
//! the chart or table it produces, and then one sentence of what to notice
//! — written from the numbers just computed, saying where the demo's
//! number differs from the paper's and why.
//!
//! Test ids: a lesson `slug`'s step `n` has `{slug}-{n}-run` (its button),
//! `{slug}-{n}-ok` / `{slug}-{n}-error` (its result line) and
//! `{slug}-{n}-notice` (what to notice).

pub mod deltamoe;
pub mod dume;
pub mod neuronmoe;

use leptos::prelude::*;

use crate::app::Shared;
use crate::components::message::{Message, MessageLine};
use crate::components::progress::Progress;
use crate::load::{preset_manifest, PresetManifest};
use crate::task::Task;

/// A lesson's header: the paper, its claim in one sentence, and what the
/// demo can and cannot show of it.
#[component]
pub fn LessonHeader(
    #[prop(into)] paper: String,
    #[prop(into)] claim: String,
    #[prop(into)] scale: String,
) -> impl IntoView {
    view! {
        <p class="paper">{paper}</p>
        <p class="claim"><b>"The claim: "</b>{claim}</p>
        <p class="small">{scale}</p>
    }
}

/// One step of a lesson: its number and title, what it does, its controls
/// and results (`children`), and the sentence of what to notice once the
/// step has run.
#[component]
pub fn LessonStep(
    #[prop(into)] slug: String,
    n: usize,
    #[prop(into)] title: String,
    #[prop(into)] does: String,
    notice: Signal<Option<String>>,
    children: Children,
) -> impl IntoView {
    let id = format!("{slug}-{n}-notice");
    view! {
        <section class="lesson-step" data-testid=format!("{slug}-step-{n}")>
            <h3>{format!("Step {n} · {title}")}</h3>
            <p class="small">{does}</p>
            {children()}
            {move || notice.get().map(|t| view! { <p class="notice-line" data-testid=id.clone()><b>"What to notice: "</b>{t}</p> })}
        </section>
    }
}

/// Step 1 of every lesson: load the teaching preset (or say that it is
/// loaded already; the pages share it).
#[component]
pub fn LoadStep(#[prop(into)] slug: String) -> impl IntoView {
    let shared = Shared::get();
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let manifest = RwSignal::new(None::<PresetManifest>);
    leptos::task::spawn_local(async move { manifest.set(preset_manifest().await) });
    let slug2 = slug.clone();
    let load = move |_| {
        let Some(p) = manifest.get_untracked() else { return };
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            match super::load::load_preset_models(task, &p).await {
                Ok((loaded, names)) => {
                    shared.preset.set(Some(loaded));
                    msg.set(Message::Ok(format!("loaded {} ({})", names.join(", "), task.wall())));
                }
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let notice = Signal::derive(move || {
        let p = shared.preset.get()?;
        Some(format!(
            "the base ({}) and its {} fine-tuned copies ({}) differ only in their FFNs — the experts were fine-tuned with \
             attention, embeddings and norms frozen — so every method below can put them side by side as experts.",
            p.base_name,
            p.experts.len() + 1,
            p.splits.iter().map(|t| t.name.clone()).chain(std::iter::once(p.ability.0.clone())).collect::<Vec<_>>().join(", "),
        ))
    });
    let body = move || {
        match (manifest.get(), shared.preset.get()) {
        (_, Some(_)) => view! {
            <p class="msg ok" data-testid=format!("{slug2}-1-ok")>"The teaching demo is loaded."</p>
        }
        .into_any(),
        (Some(p), None) => view! {
            <p>{format!("{}: its base model, {} domain experts and an \"instruct\" model, with one text per domain.", p.name, p.experts.len())}</p>
            <button data-testid=format!("{slug2}-1-run") on:click=load disabled=move || task.running()>"Load the teaching demo"</button>
        }
        .into_any(),
        (None, None) => view! {
            <p class="notice" data-testid=format!("{slug2}-no-preset")>"This build has no teaching demo (see the Load page for why); \
                the tool pages work on any model you load."</p>
        }
        .into_any(),
    }
    };
    view! {
        <LessonStep slug=slug.clone() n=1 title="Load the teaching demo" notice=notice
            does="A small base model, domain experts fine-tuned from it by the CLI, an \"instruct\" model and their texts (built and checked when the studio was built).">
            {body}
            <Progress task=task/>
            <MessageLine msg=msg id=format!("{slug}-1")/>
        </LessonStep>
    }
}

/// How much `b` is below `a`, in percent (`61.2%`).
pub fn fall(a: f64, b: f64) -> String {
    format!("{:.1}%", 100.0 * (1.0 - b / a))
}

/// `a → b` as a signed percentage change (`+3.1%`).
pub fn pct(a: f64, b: f64) -> String {
    format!("{:+.1}%", 100.0 * (b / a - 1.0))
}
