//! Download: every checkpoint made in this tab, as the files the CLI writes
//! (`model.safetensors`, `config.json`, `tokenizer.json`, extras).

use leptos::prelude::*;

use crate::components::message::{Message, MessageLine};
use crate::store::{with_store, Revision};

/// The Download page.
#[component]
pub fn DownloadPage() -> impl IntoView {
    let rev = Revision::get();
    let msg = RwSignal::new(Message::None);
    let rows = move || {
        rev.track();
        with_store(|s| {
            s.live_artifacts()
                .map(|(i, a)| {
                    let mut files: Vec<(String, u64)> = vec![
                        ("model.safetensors".into(), a.safetensors.len() as u64),
                        ("config.json".into(), a.config_json.len() as u64),
                    ];
                    if let Some(t) = &a.tokenizer_json {
                        files.push(("tokenizer.json".into(), t.len() as u64));
                    }
                    files.extend(a.extra.iter().map(|(n, b)| (n.clone(), b.len() as u64)));
                    let buttons = files
                        .into_iter()
                        .map(|(name, size)| {
                            let n2 = name.clone();
                            let click = move |_| {
                                // Straight from the stored bytes into a JS Blob: no
                                // second copy in wasm memory (which ends at 4 GiB).
                                let saved = with_store(|s| {
                                    let a = s.artifacts.get(i)?.as_ref()?;
                                    let bytes: &[u8] = match n2.as_str() {
                                        "model.safetensors" => a.safetensors.as_slice(),
                                        "config.json" => &a.config_json,
                                        "tokenizer.json" => a.tokenizer_json.as_deref()?,
                                        other => &a.extra.iter().find(|(n, _)| n == other)?.1,
                                    };
                                    Some(crate::web::download(&n2, bytes))
                                });
                                match saved {
                                    Some(Ok(())) => msg.set(Message::Ok(format!("saving {n2}"))),
                                    Some(Err(e)) => msg.set(Message::Error(e)),
                                    None => {}
                                }
                            };
                            view! {
                                <button class="secondary" data-testid=format!("dl-{i}-{name}") on:click=click>
                                    {format!("{name} ({})", crate::format_bytes(size))}
                                </button>
                            }
                        })
                        .collect_view();
                    view! {
                        <tr data-testid=format!("artifact-{i}")>
                            <td><b>{a.name.clone()}</b></td>
                            <td>{a.method}</td>
                            <td>{crate::format_params(a.model.source.tensors().iter().map(|t| t.numel() as u64).sum())}</td>
                            <td>{format!("{:.0} ms", a.millis)}</td>
                            <td class="files">{buttons}</td>
                        </tr>
                    }
                })
                .collect_view()
        })
    };
    view! {
        <h2>"Download results"</h2>
        <p class="lead">"Each checkpoint made in this tab, as the files " <code>"moe-studio"</code> " writes into its output directory \
            for the same inputs: put them in one folder and load it with transformers (Mixtral layout) or the CLI."</p>
        <table class="grid" data-testid="artifacts">
            <thead><tr><th>"checkpoint"</th><th>"made by"</th><th>"parameters"</th><th>"time"</th><th>"files"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        {move || { rev.track(); with_store(|s| s.live_artifacts().next().is_none()).then(|| view! { <p class="hint">"Nothing yet: upcycle, route, MoErge or graft a model first."</p> }) }}
        <MessageLine msg=msg id="download"/>
    }
}
