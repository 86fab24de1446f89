//! Download: every checkpoint made in this tab, as one `.zip` named after
//! it (a folder `NAME/` with the files the CLI writes: `model.safetensors`,
//! `config.json`, `tokenizer.json`, extras), or file by file with the
//! checkpoint's name in front (`NAME.model.safetensors`).

use leptos::prelude::*;

use crate::components::message::{Message, MessageLine};
use crate::models::Models;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request};

/// The Download page.
#[component]
pub fn DownloadPage() -> impl IntoView {
    let models = Models::get();
    let msg = RwSignal::new(Message::None);
    let task = Task::new();
    let fetch = move |req: Request| {
        leptos::task::spawn_local(async move {
            match task.call(req, None).await {
                Ok((Reply::File(name), Some(blob))) => match crate::web::download(&name, &blob) {
                    Ok(()) => msg.set(Message::Ok(format!("saving {name}"))),
                    Err(e) => msg.set(Message::Error(e)),
                },
                Ok(_) => msg.set(Message::Error("the worker sent no file".into())),
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let rows = move || {
        models
            .0
            .get()
            .into_iter()
            .filter(|m| m.method.is_some())
            .map(|a| {
                let i = match a.r {
                    ModelRef::Artifact(i) => i,
                    ModelRef::Input(i) => i,
                };
                let buttons = a
                    .files
                    .iter()
                    .map(|(name, size)| {
                        let (r, file) = (a.r.clone(), name.clone());
                        view! {
                            <button class="secondary" data-testid=format!("dl-{i}-{name}")
                                on:click=move |_| fetch(Request::Download { model: r.clone(), file: file.clone() })>
                                {format!("{name} ({})", crate::format_bytes(*size))}
                            </button>
                        }
                    })
                    .collect_view();
                let total: u64 = a.files.iter().map(|(_, s)| s).sum();
                let r = a.r.clone();
                view! {
                    <tr data-testid=format!("artifact-{i}")>
                        <td><b>{a.name.clone()}</b></td>
                        <td>{a.method.clone().unwrap_or_default()}</td>
                        <td>{crate::format_params(a.numel())}</td>
                        <td>{format!("{:.1} s", a.millis / 1000.0)}</td>
                        <td><button data-testid=format!("dl-{i}-zip") on:click=move |_| fetch(Request::Archive { model: r.clone() })>
                            {format!("{}.zip ({})", a.name, crate::format_bytes(total))}</button></td>
                        <td class="files">{buttons}</td>
                    </tr>
                }
            })
            .collect_view()
    };
    let empty = move || models.0.with(|v| v.iter().all(|m| m.method.is_none()));
    view! {
        <h2>"Download results"</h2>
        <p class="lead">"Each checkpoint made in this tab, as the files " <code>"moe-studio"</code> " writes into its output directory \
            for the same inputs. The " <code>".zip"</code> " unpacks into a folder named after the checkpoint: load it with transformers (Mixtral layout) or the CLI. \
            Single files are saved with the checkpoint's name in front; rename them back (" <code>"model.safetensors"</code> ", ...) in one folder."</p>
        <table class="grid" data-testid="artifacts">
            <thead><tr><th>"checkpoint"</th><th>"made by"</th><th>"parameters"</th><th>"time"</th><th>"archive"</th><th>"files"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        {move || empty().then(|| view! { <p class="hint">"Nothing yet: upcycle, route, MoErge or graft a model first."</p> })}
        <crate::components::progress::Progress task=task/>
        <MessageLine msg=msg id="download"/>
    }
}
