//! Load: the bundled demo model or local files (nothing is uploaded).

use leptos::prelude::*;

use crate::components::message::{Message, MessageLine};
use crate::load::{demo_manifest, demo_model, model_from_files, DemoManifest};
use crate::store::{update_store, with_store, InputModel, ModelRef, Revision};
use crate::web::read_files;

fn add(rev: Revision, name: String, model: moe_shared::checkpoint::LoadedModel, bytes: u64) -> String {
    let line = format!("loaded {name}: {}", crate::summary_line(&model.config, model.moe.as_ref()));
    update_store(rev, |s| {
        s.add_input(InputModel { name, model, file_bytes: bytes });
    });
    line
}

/// The Load page.
#[component]
pub fn LoadPage() -> impl IntoView {
    let rev = Revision::get();
    let msg = RwSignal::new(Message::None);
    let busy = RwSignal::new(false);
    let custom_name = RwSignal::new(String::new());
    // What the build's demo is (scripts/demo_model.sh writes the manifest).
    let demo_text = RwSignal::new(DemoManifest::default().description.unwrap_or_default());
    leptos::task::spawn_local(async move {
        if let Ok(m) = demo_manifest().await {
            demo_text.set(m.description.unwrap_or(m.name));
        }
    });
    let load_demo = move |_| {
        busy.set(true);
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            crate::task::yield_now().await;
            match demo_model().await {
                Ok((n, m, b)) => msg.set(Message::Ok(add(rev, n, m, b))),
                Err(e) => msg.set(Message::Error(e)),
            }
            busy.set(false);
        });
    };
    let on_files = move |ev: leptos::ev::Event| {
        let input = event_target::<web_sys::HtmlInputElement>(&ev);
        let files = input.files();
        busy.set(true);
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            crate::task::yield_now().await;
            let result = match read_files(files).await {
                Ok(f) => model_from_files(f),
                Err(e) => Err(e),
            };
            match result {
                Ok((n, m, b)) => {
                    let given = custom_name.get_untracked().trim().to_string();
                    let name = if given.is_empty() { n } else { given };
                    custom_name.set(String::new());
                    msg.set(Message::Ok(add(rev, name, m, b)))
                }
                Err(e) => msg.set(Message::Error(format!("could not load the model: {e}"))),
            }
            input.set_value("");
            busy.set(false);
        });
    };
    let remove = move |r: ModelRef| {
        update_store(rev, |s| s.remove(&r));
        msg.set(Message::Ok(format!("removed; {}", crate::memory::summary())));
    };
    let rows = move || {
        rev.track();
        with_store(|s| {
            s.live_inputs()
                .map(|(i, m)| {
                    let c = &m.model.config;
                    let kind = match (&m.model.moe, m.model.format) {
                        (Some(moe), _) => format!("MoE, {} experts in all", moe.total_experts()),
                        (None, f) => format!("dense ({f:?})"),
                    };
                    view! {
                        <tr>
                            <td><b>{m.name.clone()}</b></td>
                            <td>{kind}</td>
                            <td>{format!("{} · {} layers · d={} · FFN {} · vocab {}", c.architecture.model_type(), c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size)}</td>
                            <td data-testid=format!("params-i{i}")>{crate::load::params_label(c, m.model.moe.as_ref())}</td>
                            <td>{crate::format_bytes(m.file_bytes)}</td>
                            <td>{if m.model.tokenizer.is_some() { "yes" } else { "no" }}</td>
                            <td><button class="secondary" data-testid=format!("remove-i{i}") on:click=move |_| remove(ModelRef::Input(i))>"remove"</button></td>
                        </tr>
                    }
                })
                .collect_view()
        })
    };
    let made = move || {
        rev.track();
        with_store(|s| {
            s.live_artifacts()
                .map(|(i, a)| {
                    view! {
                        <tr>
                            <td><b>{a.name.clone()}</b></td>
                            <td>{a.method}</td>
                            <td data-testid=format!("params-a{i}")>{crate::load::params_label(&a.model.config, a.model.moe.as_ref())}</td>
                            <td>{crate::format_bytes(a.safetensors.len() as u64)}</td>
                            <td><button class="secondary" data-testid=format!("remove-a{i}") on:click=move |_| remove(ModelRef::Artifact(i))>"remove"</button></td>
                        </tr>
                    }
                })
                .collect_view()
        })
    };
    let memory = move || {
        rev.track();
        format!("Memory of this tab: {}.", crate::memory::summary())
    };
    view! {
        <h2>"Load models"</h2>
        <p class="lead">"Start here. Pick the tiny demo model to try every step in seconds, or load your own dense model from disk. \
            Files are read in this tab; nothing leaves your computer."</p>
        <div class="cards">
            <div class="card">
                <h3>"Demo model"</h3>
                <p data-testid="demo-description">{move || demo_text.get()}</p>
                <button data-testid="load-demo" on:click=load_demo disabled=move || busy.get()>"Load the demo model"</button>
            </div>
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
                <input type="file" multiple data-testid="model-files" on:change=on_files disabled=move || busy.get()/>
            </div>
        </div>
        {move || busy.get().then(|| view! { <p class="busy">"Reading…"</p> })}
        <MessageLine msg=msg id="load"/>
        <h3>"Loaded models"</h3>
        <table class="grid" data-testid="loaded-models">
            <thead><tr><th>"name"</th><th>"kind"</th><th>"architecture"</th><th>"parameters"</th><th>"files"</th><th>"tokenizer"</th><th></th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        <h3>"Checkpoints made in this tab"</h3>
        <table class="grid" data-testid="made-models">
            <thead><tr><th>"name"</th><th>"made by"</th><th>"parameters"</th><th>"model.safetensors"</th><th></th></tr></thead>
            <tbody>{made}</tbody>
        </table>
        <p class="small" data-testid="memory">{memory}" A tab's WebAssembly memory ends at 4 GiB; remove models you no longer need before a big step."</p>
        <p class="hint">"Next: " <b>"Upcycle"</b> " turns a dense model into an MoE; " <b>"MoErge + router"</b> " combines several; "
            <b>"Neurons"</b> " decides how many experts each layer should get."</p>
    }
}
