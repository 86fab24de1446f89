//! The studio shell: header with the WebGPU / backend status, the page
//! tabs (the URL hash names the page, so Back and Forward work), the
//! studio's worker, and the context every page shares.

use leptos::prelude::*;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::models::Models;
use crate::pages::{self, Page};
use crate::store::ModelRef;
use crate::web::{backend_available, GpuStatus};
use crate::worker::client;
use crate::worker::protocol::{Reply, Request};

/// The teaching preset as loaded in this tab (`scripts/demo_preset.sh`,
/// issue 19 item 3): the defaults of every page so that Load -> Upcycle ->
/// MoErge + router -> Graft -> Neurons -> Inspect -> Download each succeed
/// on the first click.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedPreset {
    /// The base model's name (`stories260K`, `scratch260K`, ...).
    pub base_name: String,
    /// The base model (stories260K or scratch260K): Upcycle's and Neurons' source, the
    /// graft's base.
    pub base: ModelRef,
    /// The domain experts, in expert order: MoErge's inputs.
    pub experts: Vec<ModelRef>,
    /// The "instruct" model (base fine-tuned on the ability): the graft's
    /// instruct side.
    pub instruct: ModelRef,
    /// One text `(domain, text)` per expert, in expert order: the training
    /// slice followed by the held-out lines, so that the router page's
    /// last 10% (its held-out part) is text no expert was trained on.
    pub texts: Vec<(String, String)>,
    /// The same texts with the training slice and the held-out lines
    /// apart, in expert order (the training pages' inputs: a stage trains
    /// on `train` and scores `heldout`).
    pub splits: Vec<crate::compute::train::LangText>,
    /// The ability's held-out text `(name, text)`: the graft's check.
    pub ability: (String, String),
    /// The settings of the preset's own CLI run (the pages' defaults).
    pub settings: crate::load::PresetSettings,
}

/// State shared by the pages (provided as context).
#[derive(Clone, Copy)]
pub struct Shared {
    /// The page shown.
    pub page: RwSignal<Page>,
    /// What WebGPU offers to the studio's worker (where the kernels run):
    /// `Unknown` while the worker's background start is pending (the
    /// methods run on the CPU meanwhile).
    pub gpu: RwSignal<GpuStatus>,
    /// Whether the studio's worker is up and takes requests.
    pub worker_ready: RwSignal<bool>,
    /// The teaching preset once it is loaded: every page takes its
    /// defaults from it (which models, which texts).
    pub preset: RwSignal<Option<LoadedPreset>>,
    /// Whether `moe-studio serve` answers (`None`: not checked yet).
    pub backend: RwSignal<Option<bool>>,
    /// An allocation JSON handed from Neurons to Upcycle.
    pub allocation: RwSignal<Option<String>>,
    /// What the worker is doing outside a page's task (starting,
    /// restoring the kept models), or why it restarted.
    pub worker_note: RwSignal<Option<String>>,
}

impl Shared {
    /// The app's shared state.
    pub fn get() -> Self {
        use_context::<Shared>().expect("Shared is provided by App")
    }

    /// Shows `page` and records it in the URL hash (a history entry, so
    /// Back returns to the previous page).
    ///
    /// The hash is written with `history.pushState`, not `location.hash`:
    /// the latter is a same-document navigation that scrolls to a fragment
    /// and lays the whole page out inside the click (14-26 ms of a 55-75 ms
    /// click task in a trace of the teaching walk, 2026-12-04). The page
    /// itself is switched in a task of its own (`setTimeout(0)`), so that
    /// the click returns at once and the newly shown page's style and layout
    /// (its first one, the costly one, 20-45 ms here) fall in the next frame
    /// instead of being forced inside the click's mouse-release handling.
    /// Back / Forward between entries still fire `hashchange` (App).
    pub fn go(&self, page: Page) {
        if let Some(w) = web_sys::window() {
            let slug = format!("#{}", page.slug());
            if w.location().hash().ok().as_deref() != Some(slug.as_str()) {
                if let Ok(h) = w.history() {
                    let _ = h.push_state_with_url(&JsValue::NULL, "", Some(&slug));
                }
            }
        }
        let signal = self.page;
        set_timeout(move || signal.set(page), std::time::Duration::ZERO);
    }
}

fn hash_page() -> Option<Page> {
    let hash = web_sys::window().and_then(|w| w.location().hash().ok()).unwrap_or_default();
    Page::from_slug(hash.trim_start_matches('#'))
}

/// The worker's session, once it says `Ready`: the kept models come back
/// (WebGPU starts on its own in the worker and never delays this).
fn start_session(shared: Shared) {
    shared.worker_ready.set(true);
    leptos::task::spawn_local(async move {
        match client::call(Request::Restore).await {
            Ok((Reply::Restored { models, failed }, _)) => {
                let mut note = (models > 0).then(|| format!("restored {models} model(s) kept in this browser"));
                if !failed.is_empty() {
                    note = Some(format!("{} could not be restored: {}", failed.len(), failed.join("; ")));
                }
                shared.worker_note.update(|n| {
                    *n = match (n.take(), note) {
                        (Some(a), Some(b)) => Some(format!("{a} — {b}")),
                        (a, b) => a.or(b),
                    }
                });
            }
            Ok(_) => {}
            Err(e) => shared.worker_note.set(Some(format!("restoring the kept models failed: {e}"))),
        }
    });
}

/// The root component.
#[component]
pub fn App() -> impl IntoView {
    let shared = Shared {
        page: RwSignal::new(hash_page().unwrap_or(Page::Load)),
        gpu: RwSignal::new(GpuStatus::Unknown),
        worker_ready: RwSignal::new(false),
        preset: RwSignal::new(None),
        backend: RwSignal::new(None),
        allocation: RwSignal::new(None),
        worker_note: RwSignal::new(None),
    };
    let models = Models(RwSignal::new(Vec::new()));
    provide_context(shared);
    provide_context(models);
    let inject =
        web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default().contains("inject-panic");
    client::configure(
        client::Handlers {
            on_models: Box::new(move |m| models.0.set(m)),
            on_restart: Box::new(move |why| {
                shared.worker_ready.set(false);
                shared.worker_note.set(Some(format!("{why} — the studio restarted its worker")));
            }),
            on_ready: Box::new(move || start_session(shared)),
            // A restarted worker asks again: keep a known adapter's status
            // shown until it answers, and take every answer it gives.
            on_gpu: Box::new(move |r| {
                shared.gpu.set(match r {
                    Ok(a) => GpuStatus::Available(a),
                    Err(why) => GpuStatus::Missing(why),
                })
            }),
        },
        inject,
    );
    if let Err(e) = client::spawn() {
        shared.gpu.set(GpuStatus::Missing(format!("the studio's worker did not start: {e}")));
        shared.worker_note.set(Some(format!("the studio's worker did not start: {e}")));
    }
    // Back / Forward: the hash names the page.
    let on_hash = Closure::<dyn FnMut()>::new(move || {
        // No hash (the entry the studio was opened on) is the Load page.
        shared.page.set(hash_page().unwrap_or(Page::Load));
    });
    if let Some(w) = web_sys::window() {
        let _ = w.add_event_listener_with_callback("hashchange", on_hash.as_ref().unchecked_ref());
    }
    on_hash.forget();
    // The page itself never asks for a GPU adapter (the request can be slow
    // or hang on a software adapter): the worker does, in the background.
    leptos::task::spawn_local(async move {
        shared.backend.set(Some(backend_available().await));
    });
    let worker_badge = move || {
        if shared.worker_ready.get() {
            view! { <span class="badge good" data-testid="worker-ready" title="the studio's Web Worker runs the methods">"worker: ready"</span> }.into_any()
        } else {
            view! { <span class="badge" data-testid="worker-starting">"worker: starting…"</span> }.into_any()
        }
    };
    let gpu_badge = move || {
        match shared.gpu.get() {
        GpuStatus::Unknown => view! {
            <span class="badge" data-testid="webgpu-pending" title="the studio's worker is asking for a WebGPU adapter; the methods run on the CPU meanwhile">
                "WebGPU: checking… (CPU meanwhile)"</span>
        }
        .into_any(),
        GpuStatus::Available(a) => {
            view! { <span class="badge good" data-testid="webgpu" title=a.clone()>{format!("WebGPU: {a}")}</span> }
                .into_any()
        }
        GpuStatus::Missing(why) => view! {
            <span class="badge warn" data-testid="webgpu" title=why.clone()>"WebGPU missing — CPU fallback"</span>
            <span class="small" data-testid="webgpu-reason">{why.clone()}</span>
        }
        .into_any(),
    }
    };
    let backend_badge = move || {
        match shared.backend.get() {
        None => view! { <span class="badge">"server: checking…"</span> }.into_any(),
        Some(true) => view! { <span class="badge good">"server: moe-studio serve"</span> }.into_any(),
        Some(false) => view! { <span class="badge" title="Served as static files: server jobs are off">"server: none (static)"</span> }.into_any(),
    }
    };
    let note = move || {
        shared.worker_note.get().map(|n| {
            view! {
                <div class="notice" data-testid="worker-note">{n}
                    <button class="secondary" on:click=move |_| shared.worker_note.set(None)>"OK"</button></div>
            }
        })
    };
    view! {
        <header>
            <h1>"moe-studio"</h1>
            <span class="tagline">"dense → Mixture-of-Experts, in your browser"</span>
            <div class="badges">{worker_badge}{gpu_badge}{backend_badge}</div>
        </header>
        <nav>
            <span class="sep">"Learn:"</span>
            {Page::ALL
                .iter()
                .map(|&p| {
                    let first_tool = p == Page::Load;
                    view! {
                        {first_tool.then(|| view! { <span class="sep">"Tools:"</span> })}
                        <button class="tab" class:lesson=p.is_lesson() class:active=move || shared.page.get() == p data-testid=format!("tab-{}", p.slug())
                            on:click=move |_| shared.go(p)>{p.title()}</button>
                    }
                })
                .collect_view()}
        </nav>
        <main>
            {note}
            // Every page stays mounted (its inputs and results survive tab
            // switches); only the active one is shown.
            {Page::ALL
                .iter()
                .map(|&p| {
                    view! {
                        <section class="page" data-testid=format!("page-{}", p.slug())
                            style:display=move || if shared.page.get() == p { "block" } else { "none" }>
                            {pages::render(p)}
                        </section>
                    }
                })
                .collect_view()}
        </main>
        <footer>"Everything runs in this tab (in a Web Worker); nothing is uploaded unless you use the server's Jobs page."</footer>
    }
}
