//! Load: the bundled demo model or local files (nothing is uploaded), the
//! models in the studio, and the browser storage that keeps them across a
//! reload.

use leptos::prelude::*;

use crate::app::LoadedPreset;
use crate::components::message::{Message, MessageLine};
use crate::components::progress::Progress;
use crate::compute::train::LangText;
use crate::load::{demo_manifest, page_url, preset_manifest, real_manifest, DemoManifest, PresetManifest, PRESET_DIR};
use crate::models::Models;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request, StorageInfo};

fn loaded_line(m: &crate::worker::protocol::ModelInfo, wall: &str) -> String {
    format!("loaded {}: {} ({wall})", m.name, crate::summary_line(&m.config, m.moe.as_ref()))
}

/// Characters of a domain's training text the router page gets from the
/// preset: about the router's 10 000 statistics tokens on stories260K's
/// 512-token vocabulary, and a textarea the page lays out quickly (the
/// whole files are 64-125 KB).
const TRAIN_CHARS: usize = 27_000;

/// Characters of the preset's held-out documents kept: all of them
/// (`scripts/demo_preset.sh` writes 12,000), so the router page's accuracy
/// and perplexity table and the graft's domain check score the documents
/// the preset's CLI checks scored.
const HELDOUT_CHARS: usize = 12_000;

/// The whole lines of `text` that fit in `max` bytes (at least one line).
pub(crate) fn first_lines(text: &str, max: usize) -> String {
    let mut out = String::new();
    for l in text.lines() {
        if !out.is_empty() && out.len() + l.len() + 1 > max {
            break;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(l);
    }
    out
}

/// Loads the teaching preset: the build's demo model (the base), each
/// expert and the "instruct" model from `demo/preset/`, and the texts;
/// returns what the pages take their defaults from and the names loaded.
///
/// # Errors
/// The first model or text that could not be fetched or parsed, named.
pub(crate) async fn load_preset_models(task: Task, p: &PresetManifest) -> Result<(LoadedPreset, Vec<String>), String> {
    let mut infos = Vec::new();
    match task.call(Request::LoadDemo, None).await {
        Ok((Reply::Model(m), _)) => infos.push(m),
        Ok(_) => return Err("the preset's base model: no model came back".into()),
        Err(e) => return Err(format!("could not load the preset's base model: {e}")),
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
            Ok((Reply::Model(i), _)) => infos.push(i),
            Ok(_) => return Err(format!("{} of the preset: no model came back", m.name)),
            Err(e) => return Err(format!("could not load {} of the preset: {e}", m.name)),
        }
    }
    let fetch = |t: String| async move {
        crate::web::fetch_bytes(&format!("{PRESET_DIR}/{t}"))
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| format!("the preset's text {t}: {e}"))
    };
    let mut texts = Vec::new();
    let mut splits = Vec::new();
    for m in &p.experts {
        let Some(t) = &m.text else { return Err(format!("the preset names no text for {}", m.name)) };
        let name = m.name.rsplit('-').next().unwrap_or(&m.name).to_string();
        let train = first_lines(&fetch(t.clone()).await?, TRAIN_CHARS);
        let heldout = match &m.heldout {
            Some(h) => first_lines(&fetch(h.clone()).await?, HELDOUT_CHARS),
            None => String::new(),
        };
        let text = if heldout.is_empty() { train.clone() } else { format!("{train}\n{heldout}") };
        texts.push((name.clone(), text));
        splits.push(LangText { name, train, heldout });
    }
    let ability_file =
        p.instruct.text.clone().ok_or_else(|| format!("the preset names no text for {}", p.instruct.name))?;
    let ability =
        (p.instruct.name.rsplit('-').next().unwrap_or(&p.instruct.name).to_string(), fetch(ability_file).await?);
    let names = infos.iter().map(|m| m.name.clone()).collect();
    let refs: Vec<ModelRef> = infos.into_iter().map(|m| m.r).collect();
    let n = p.experts.len();
    Ok((
        LoadedPreset {
            base_name: p.base.as_ref().map_or("stories260K".to_string(), |b| b.name.clone()),
            base: refs[0].clone(),
            experts: refs[1..=n].to_vec(),
            instruct: refs[n + 1].clone(),
            texts,
            splits,
            ability,
            settings: p.settings.clone(),
        },
        names,
    ))
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
    // What the build's demo is (scripts/demo_model.sh writes the manifest),
    // and why the teaching preset is absent when it is.
    let demo_text = RwSignal::new(DemoManifest::default().description.unwrap_or_default());
    let preset_absent = RwSignal::new(None::<String>);
    leptos::task::spawn_local(async move {
        if let Ok(m) = demo_manifest().await {
            demo_text.set(m.description.clone().unwrap_or(m.name));
            preset_absent.set(m.preset_absent);
        }
    });
    // The "real model" beside a small demo (scripts/demo_dist.sh).
    let real = RwSignal::new(None::<DemoManifest>);
    leptos::task::spawn_local(async move { real.set(real_manifest().await) });
    let show = move |answer: crate::worker::client::Answer| match answer {
        Ok((Reply::Model(m), _)) => msg.set(Message::Ok(loaded_line(&m, &task.wall()))),
        Ok(_) => {}
        Err(e) => msg.set(Message::Error(format!("could not load the model: {e}"))),
    };
    let load_demo = move |_| {
        msg.set(Message::None);
        leptos::task::spawn_local(async move { show(task.call(Request::LoadDemo, None).await) });
    };
    let load_real = move |_| {
        msg.set(Message::None);
        leptos::task::spawn_local(async move { show(task.call(Request::LoadReal, None).await) });
    };
    // The teaching preset (scripts/demo_preset.sh), when the build has one.
    let preset = RwSignal::new(None::<PresetManifest>);
    leptos::task::spawn_local(async move { preset.set(preset_manifest().await) });
    let shared = crate::app::Shared::get();
    let load_preset = move |_| {
        let Some(p) = preset.get_untracked() else { return };
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            match load_preset_models(task, &p).await {
                Ok((loaded, names)) => {
                    shared.preset.set(Some(loaded));
                    msg.set(Message::Ok(format!(
                        "loaded the teaching demo: {} ({}); every page now has its defaults — next: Upcycle",
                        names.join(", "),
                        task.wall()
                    )));
                }
                Err(e) => msg.set(Message::Error(e)),
            }
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
        <p class="lead">"Start here. Pick the teaching demo to try every step in seconds (each page's defaults run on it), \
            the real model, or your own dense model from disk. Files are read in this tab; nothing leaves your computer."</p>
        {move || preset_absent.get().map(|why| view! {
            <p class="notice" data-testid="preset-absent">{format!(
                "The teaching demo is not in this build: {why}. The demo below is the real model instead."
            )}</p>
        })}
        <div class="cards">
            {move || preset.get().map(|p| view! {
                <div class="card default">
                    <h3>{format!("Teaching demo ({} experts) — default", p.base.as_ref().map_or("stories260K", |b| b.name.as_str()))}</h3>
                    <p data-testid="preset-description">{format!(
                        "{}: the base model, {} domain experts fine-tuned from it by the CLI ({}) and an \"instruct\" model ({}) for the graft, with one text per domain. \
                        Every page's defaults then run on it, each step in seconds.",
                        p.name,
                        p.experts.len(),
                        p.experts.iter().map(|e| e.name.clone()).collect::<Vec<_>>().join(", "),
                        p.instruct.name
                    )}</p>
                    <button data-testid="load-preset" on:click=load_preset disabled=move || task.running()>"Load the teaching demo"</button>
                </div>
            })}
            <div class="card">
                <h3>{move || if preset.get().is_some() { "Base model only" } else { "Demo model" }}</h3>
                <p data-testid="demo-description">{move || demo_text.get()}</p>
                <button data-testid="load-demo" class=move || if preset.get().is_some() { "secondary" } else { "" }
                    on:click=load_demo disabled=move || task.running()>"Load the demo model"</button>
            </div>
            {move || real.get().map(|r| view! {
                <div class="card">
                    <h3>"Real model"</h3>
                    <p data-testid="real-description">{r.description.clone().unwrap_or(r.name.clone())}</p>
                    <button data-testid="load-real" class="secondary" on:click=load_real disabled=move || task.running()>{format!("Load {}", r.name)}</button>
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

#[cfg(test)]
mod tests {
    use super::first_lines;

    #[test]
    fn preset_texts_are_cut_on_whole_lines() {
        assert_eq!(first_lines("aaaa\nbbbb\ncccc", 9), "aaaa\nbbbb");
        assert_eq!(first_lines("aaaa\nbbbb\ncccc", 8), "aaaa");
        // One line longer than the budget is kept whole (never an empty text).
        assert_eq!(first_lines("aaaaaaaaaa\nb", 4), "aaaaaaaaaa");
        assert_eq!(first_lines("", 4), "");
    }
}
