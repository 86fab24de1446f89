//! One line saying where a page's elementwise / Gram work runs (WebGPU
//! kernels or the CPU fallback), so the user always knows.

use leptos::prelude::*;

use crate::app::Shared;
use crate::compute::gpu::Engine;
use crate::web::GpuStatus;

/// The compute-path notice.
#[component]
pub fn EngineNote() -> impl IntoView {
    let shared = Shared::get();
    move || {
        let gpu = shared.gpu.get();
        let engine = Engine::choose(&gpu);
        let cls = if matches!(gpu, GpuStatus::Missing(_)) { "notice" } else { "small" };
        view! { <p class=cls data-testid="engine-note">{format!("Compute: {}", engine.describe(&gpu))}</p> }
    }
}
