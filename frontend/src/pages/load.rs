//! Load: the bundled demo model or local files (nothing is uploaded), the
//! models in the studio, and the browser storage that keeps them across a
//! reload.

use leptos::prelude::*;

use crate::components::message::{Message, MessageLine};
use crate::components::progress::Progress;
use crate::load::{demo_manifest, page_url, preset_manifest, DemoManifest, PresetManifest, PRESET_DIR};
use crate::models::Models;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request, StorageInfo};

fn loaded_line(m: &crate::worker::protocol::ModelInfo, wall: &str) -> String {
    format!("loaded {}: {} ({wall})", m.name, crate::summary_line(&m.config, m.moe.as_ref()))
}

/// The Load page.
#[component]
pub fn LoadPage() -> impl IntoView {
    let models = Models::get();
    let msg = RwSignal::new(Message::None);
    let task = Task::new();
    let custom_name = RwSignal::new(String::new());
    let storage = RwSignal::new(None::<StorageInfo>);
    let refresh_storage = move || {
        leptos::task::spawn_local(async move {
            if let Ok((Reply::Storage(s), _)) = crate::worker::client::call(Request::Storage).await {
                storage.set(Some(s));
            }
        });
    };
    // The storage line follows the model list.
    Effect::new(move |_| {
        models.0.track();
        refresh_storage();
    });
    // What the build's demo is (scripts/demo_model.sh writes the manifest).
    let demo_text = RwSignal::new(DemoManifest::default().description.unwrap_or_default());
    leptos::task::spawn_local(async move {
        if let Ok(m) = demo_manifest().await {
            demo_text.set(m.description.unwrap_or(m.name));
        }
    });
    let show = move |answer: crate::worker::client::Answer| match answer {
        Ok((Reply::Model(m), _)) => msg.set(Message::Ok(loaded_line(&m, &task.wall()))),
        Ok(_) => {}
        Err(e) => msg.set(Message::Error(format!("could not load the model: {e}"))),
    };
    let load_demo = move |_| {
        msg.set(Message::None);
        leptos::task::spawn_local(async move { show(task.call(Request::LoadDemo, None).await) });
    };
    // The teaching preset (scripts/demo_preset.sh), when the build has one.
    let preset = RwSignal::new(None::<PresetManifest>);
    leptos::task::spawn_local(async move { preset.set(preset_manifest().await) });
    let shared = crate::app::Shared::get();
    let load_preset = move |_| {
        let Some(p) = preset.get_untracked() else { return };
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            let mut names = Vec::new();
            let demo = task.call(Request::LoadDemo, None).await;
            match demo {
                Ok((Reply::Model(m), _)) => names.push(m.name),
                Ok(_) => {}
                Err(e) => return msg.set(Message::Error(format!("could not load the preset's base model: {e}"))),
            }
            for m in p.experts.iter().chain(std::iter::once(&p.instruct)) {
                let files = m
                    .files
                    .iter()
                    .map(|f| {
                        let file = f.rsplit('/').next().unwrap_or(f).to_string();
                        (file, page_url(&format!("{PRESET_DIR}/{f}")))
                    })
                    .collect();
                match task.call(Request::LoadUrls { name: m.name.clone(), files }, None).await {
                    Ok((Reply::Model(i), _)) => names.push(i.name),
                    Ok(_) => {}
                    Err(e) => return msg.set(Message::Error(format!("could not load {} of the preset: {e}", m.name))),
                }
            }
            let mut texts = Vec::new();
            for m in &p.experts {
                let Some(t) = &m.text else { continue };
                match crate::web::fetch_bytes(&format!("{PRESET_DIR}/{t}")).await {
                    Ok(b) => texts.push((
                        m.name.rsplit('-').next().unwrap_or(&m.name).to_string(),
                        String::from_utf8_lossy(&b).into_owned(),
                    )),
                    Err(e) => return msg.set(Message::Error(format!("the preset's text {t}: {e}"))),
                }
            }
            shared.preset_texts.set(texts);
            msg.set(Message::Ok(format!(
                "loaded the teaching preset: {} ({}); the router page has one text per expert",
                names.join(", "),
                task.wall()
            )));
        });
    };
    let on_files = move |ev: leptos::ev::Event| {
        let input = event_target::<web_sys::HtmlInputElement>(&ev);
        let Some(list) = input.files() else { return };
        // The File objects go to the worker as they are (it reads them).
        let files = js_sys::Array::new();
        for i in 0..list.length() {
            if let Some(f) = list.get(i) {
                files.push(&f);
            }
        }
        let name = custom_name.get_untracked().trim().to_string();
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            let answer = task.call(Request::LoadFiles { name }, Some(files)).await;
            if answer.is_ok() {
                custom_name.set(String::new());
            }
            show(answer);
            input.set_value("");
        });
    };
    let remove = move |r: ModelRef, name: String| {
        leptos::task::spawn_local(async move {
            match crate::worker::client::call(Request::Remove(r)).await {
                Ok(_) => msg.set(Message::Ok(format!("removed {name}"))),
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let clear = move |_| {
        leptos::task::spawn_local(async move {
            match crate::worker::client::call(Request::ClearStorage).await {
                Ok(_) => msg.set(Message::Ok(
                    "cleared: no model is kept in this browser any more (they stay loaded until you reload)".into(),
                )),
                Err(e) => msg.set(Message::Error(e)),
            }
            refresh_storage();
        });
    };
    let kept = |k: bool| if k { "kept" } else { "not kept" };
    let rows = move || {
        models
            .0
            .get()
            .into_iter()
            .filter(|m| m.method.is_none())
            .map(|m| {
                let c = &m.config;
                let kind = match &m.moe {
                    Some(moe) => format!("MoE, {} experts in all", moe.total_experts()),
                    None => format!("dense ({})", m.format),
                };
                let (r, name) = (m.r.clone(), m.name.clone());
                let key = m.r.key();
                view! {
                    <tr>
                        <td><b>{m.name.clone()}</b></td>
                        <td>{kind}</td>
                        <td>{format!("{} · {} layers · d={} · FFN {} · vocab {}", c.architecture.model_type(), c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size)}</td>
                        <td data-testid=format!("params-{key}")>{crate::load::params_label(c, m.moe.as_ref())}</td>
                        <td>{crate::format_bytes(m.bytes)}</td>
                        <td>{if m.tokenizer { "yes" } else { "no" }}</td>
                        <td data-testid=format!("kept-{key}")>{kept(m.kept)}</td>
                        <td><button class="secondary" data-testid=format!("remove-{key}") on:click=move |_| remove(r.clone(), name.clone())>"remove"</button></td>
                    </tr>
                }
            })
            .collect_view()
    };
    let made = move || {
        models
            .0
            .get()
            .into_iter()
            .filter(|m| m.method.is_some())
            .map(|m| {
                let (r, name) = (m.r.clone(), m.name.clone());
                let key = m.r.key();
                view! {
                    <tr>
                        <td><b>{m.name.clone()}</b></td>
                        <td>{m.method.clone().unwrap_or_default()}</td>
                        <td data-testid=format!("params-{key}")>{crate::load::params_label(&m.config, m.moe.as_ref())}</td>
                        <td>{crate::format_bytes(m.bytes)}</td>
                        <td data-testid=format!("kept-{key}")>{kept(m.kept)}</td>
                        <td><button class="secondary" data-testid=format!("remove-{key}") on:click=move |_| remove(r.clone(), name.clone())>"remove"</button></td>
                    </tr>
                }
            })
            .collect_view()
    };
    let storage_line = move || {
        storage.get().map(|s| {
            let kept = match &s.unavailable {
                None => format!(
                    "Kept in this browser: {} model(s), {} of {} this site may use. Kept models come back after a reload or a cancelled task.",
                    s.kept,
                    crate::format_bytes(s.usage),
                    crate::format_bytes(s.quota)
                ),
                Some(why) => format!("Models are not kept across a reload: {why}."),
            };
            view! {
                <p class="small" data-testid="storage">{kept}" "
                    <button class="secondary" data-testid="clear-storage" on:click=clear>"forget the kept copies"</button></p>
                <p class="small" data-testid="memory">{format!("Memory of the studio's worker: {}. A tab's WebAssembly memory ends at 4 GiB; remove models you no longer need before a big step.", s.memory)}</p>
            }
        })
    };
    view! {
        <h2>"Load models"</h2>
        <p class="lead">"Start here. Pick the demo to try every step in seconds, or load your own dense model from disk. \
            Files are read in this tab; nothing leaves your computer."</p>
        <div class="cards">
            <div class="card">
                <h3>"Demo model"</h3>
                <p data-testid="demo-description">{move || demo_text.get()}</p>
                <button data-testid="load-demo" on:click=load_demo disabled=move || task.running()>"Load the demo model"</button>
            </div>
            {move || preset.get().map(|p| view! {
                <div class="card">
                    <h3>"Teaching preset"</h3>
                    <p data-testid="preset-description">{format!(
                        "{}: the demo model, {} domain experts fine-tuned from it ({}) and an \"instruct\" model ({}) for the graft, with one text per domain.",
                        p.name,
                        p.experts.len(),
                        p.experts.iter().map(|e| e.name.clone()).collect::<Vec<_>>().join(", "),
                        p.instruct.name
                    )}</p>
                    <button data-testid="load-preset" on:click=load_preset disabled=move || task.running()>"Load the teaching preset"</button>
                </div>
            })}
            <div class="card">
                <h3>"Your model"</h3>
                <p>"Choose all files of one model at once:"</p>
                <ul class="small">
                    <li>"Hugging Face: " <code>"*.safetensors"</code> " + " <code>"config.json"</code> " + " <code>"tokenizer.json"</code></li>
                    <li>"GGUF: one " <code>".gguf"</code> " file (tokenizer inside)"</li>
                    <li>"llama2.c: the " <code>".bin"</code> " checkpoint + its tokenizer " <code>"tok*.bin"</code> " / " <code>"tokenizer.bin"</code></li>
                </ul>
                <label>"name (optional) " <input type="text" placeholder="e.g. my-model-instruct" data-testid="model-name"
                    prop:value=move || custom_name.get() on:input=move |ev| custom_name.set(event_target_value(&ev))/></label>
                <input type="file" multiple data-testid="model-files" on:change=on_files disabled=move || task.running()/>
            </div>
        </div>
        <Progress task=task/>
        <MessageLine msg=msg id="load"/>
        <h3>"Loaded models"</h3>
        <table class="grid" data-testid="loaded-models">
            <thead><tr><th>"name"</th><th>"kind"</th><th>"architecture"</th><th>"parameters"</th><th>"files"</th><th>"tokenizer"</th><th>"storage"</th><th></th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        <h3>"Checkpoints made in this tab"</h3>
        <table class="grid" data-testid="made-models">
            <thead><tr><th>"name"</th><th>"made by"</th><th>"parameters"</th><th>"model.safetensors"</th><th>"storage"</th><th></th></tr></thead>
            <tbody>{made}</tbody>
        </table>
        {storage_line}
        <p class="hint">"Next: " <b>"Upcycle"</b> " turns a dense model into an MoE; " <b>"MoErge + router"</b> " combines several; "
            <b>"Neurons"</b> " decides how many experts each layer should get."</p>
    }
}
