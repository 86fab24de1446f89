//! Jobs: server-side work (continued pre-training, router tuning, big
//! merges) through `moe-studio serve`. Served as static files, the page
//! explains that and stays disabled.

use leptos::prelude::*;

use crate::app::Shared;

/// The Jobs page.
#[component]
pub fn JobsPage() -> impl IntoView {
    let shared = Shared::get();
    let jobs = RwSignal::new(None::<Result<serde_json::Value, String>>);
    Effect::new(move |_| {
        if shared.backend.get() == Some(true) {
            leptos::task::spawn_local(async move {
                let r = crate::web::fetch_bytes("api/jobs")
                    .await
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("api/jobs: {e}")));
                jobs.set(Some(r));
            });
        }
    });
    let off = move || shared.backend.get() != Some(true);
    view! {
        <h2>"Server jobs"</h2>
        <p class="lead">"Full-scale work — continued pre-training of the new experts, router tuning with replay, merges of 7B models — \
            runs on a server with " <code>"moe-studio serve"</code> " (CUDA / wgpu / CPU). This page uploads checkpoints to it and follows the jobs live."</p>
        {move || off().then(|| view! {
            <div class="notice" data-testid="jobs-static">
                <b>"No server: this studio is served as static files."</b>
                " Everything on the other pages still works in this tab. To run server jobs, start "
                <code>"moe-studio serve"</code> " and open the address it prints."
            </div>
        })}
        <fieldset class="form" disabled=off>
            <legend>"New job"</legend>
            <label>"kind " <select><option>"train experts (DeltaMoE CPT)"</option><option>"train router (MoE-LPR stage 2)"</option><option>"moerge + route"</option></select></label>
            <label>"checkpoint " <input type="file"/></label>
            <button>"Submit"</button>
        </fieldset>
        {move || jobs.get().map(|r| match r {
            Ok(v) => view! { <pre class="small">{serde_json::to_string_pretty(&v).unwrap_or_default()}</pre> }.into_any(),
            Err(e) => view! { <p class="msg error">{e}</p> }.into_any(),
        })}
    }
}
