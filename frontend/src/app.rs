//! The studio shell: header with the WebGPU / backend status, the page
//! tabs, and the context every page shares.

use leptos::prelude::*;

use crate::pages::{self, Page};
use crate::store::Revision;
use crate::web::{backend_available, detect_webgpu, GpuStatus};

/// State shared by the pages (provided as context).
#[derive(Clone, Copy)]
pub struct Shared {
    /// The page shown.
    pub page: RwSignal<Page>,
    /// What WebGPU offers in this browser.
    pub gpu: RwSignal<GpuStatus>,
    /// Whether `moe-studio serve` answers (`None`: not checked yet).
    pub backend: RwSignal<Option<bool>>,
    /// An allocation JSON handed from Neurons to Upcycle.
    pub allocation: RwSignal<Option<String>>,
}

impl Shared {
    /// The app's shared state.
    pub fn get() -> Self {
        use_context::<Shared>().expect("Shared is provided by App")
    }

    /// Shows `page` (and records it in the URL hash).
    pub fn go(&self, page: Page) {
        self.page.set(page);
        if let Some(w) = web_sys::window() {
            let _ = w.location().set_hash(page.slug());
        }
    }
}

fn initial_page() -> Page {
    let hash = web_sys::window().and_then(|w| w.location().hash().ok()).unwrap_or_default();
    Page::from_slug(hash.trim_start_matches('#')).unwrap_or(Page::Load)
}

/// The root component.
#[component]
pub fn App() -> impl IntoView {
    let shared = Shared {
        page: RwSignal::new(initial_page()),
        gpu: RwSignal::new(GpuStatus::Unknown),
        backend: RwSignal::new(None),
        allocation: RwSignal::new(None),
    };
    provide_context(shared);
    provide_context(Revision(RwSignal::new(0)));
    leptos::task::spawn_local(async move {
        let status = detect_webgpu().await;
        let status = match status {
            GpuStatus::Available(a) => match crate::compute::gpu::init().await {
                Ok(_) => GpuStatus::Available(a),
                Err(e) => GpuStatus::Missing(format!("adapter {a} found, but the WGSL kernels could not start: {e}")),
            },
            other => other,
        };
        shared.gpu.set(status);
        shared.backend.set(Some(backend_available().await));
    });
    let gpu_badge = move || match shared.gpu.get() {
        GpuStatus::Unknown => view! { <span class="badge">"WebGPU: checking…"</span> }.into_any(),
        GpuStatus::Available(a) => {
            view! { <span class="badge good" data-testid="webgpu" title=a.clone()>{format!("WebGPU: {a}")}</span> }
                .into_any()
        }
        GpuStatus::Missing(why) => view! {
            <span class="badge warn" data-testid="webgpu" title=why.clone()>"WebGPU missing — CPU fallback"</span>
        }
        .into_any(),
    };
    let backend_badge = move || {
        match shared.backend.get() {
        None => view! { <span class="badge">"server: checking…"</span> }.into_any(),
        Some(true) => view! { <span class="badge good">"server: moe-studio serve"</span> }.into_any(),
        Some(false) => view! { <span class="badge" title="Served as static files: server jobs are off">"server: none (static)"</span> }.into_any(),
    }
    };
    view! {
        <header>
            <h1>"moe-studio"</h1>
            <span class="tagline">"dense → Mixture-of-Experts, in your browser"</span>
            <div class="badges">{gpu_badge}{backend_badge}</div>
        </header>
        <nav>
            {Page::ALL
                .iter()
                .map(|&p| {
                    view! {
                        <button class="tab" class:active=move || shared.page.get() == p data-testid=format!("tab-{}", p.slug())
                            on:click=move |_| shared.go(p)>{p.title()}</button>
                    }
                })
                .collect_view()}
        </nav>
        <main>
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
        <footer>"Everything runs in this tab; nothing is uploaded unless you use the server's Jobs page."</footer>
    }
}
