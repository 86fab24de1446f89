//! Graft: add `scale × (instruct − base)` to an MoE (every expert of layer
//! l gets layer l's FFN delta) or a dense model; per-tensor delta norms.

use leptos::prelude::*;

use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{DeltaRow, Reply, Request};

/// The Graft page.
#[component]
pub fn GraftPage() -> impl IntoView {
    let shared = crate::app::Shared::get();
    let use_gpu = RwSignal::new(true);
    let target = RwSignal::new(None::<ModelRef>);
    let base = RwSignal::new(None::<ModelRef>);
    let instruct = RwSignal::new(None::<ModelRef>);
    let scale = RwSignal::new("1.0".to_string());
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let stats = RwSignal::new(Vec::<DeltaRow>::new());
    Effect::new(move |_| {
        let _ = (target.get(), base.get(), instruct.get(), scale.get());
        msg.set(Message::None);
    });
    let run = move |_| {
        let get = |s: RwSignal<Option<ModelRef>>, what: &str| {
            s.get_untracked().ok_or_else(|| format!("choose the {what} model"))
        };
        let picked = (|| Ok::<_, String>((get(target, "target")?, get(base, "base")?, get(instruct, "instruct")?)))();
        let (t, b, i) = match picked {
            Ok(x) => x,
            Err(e) => return msg.set(Message::Error(e)),
        };
        let Ok(s) = scale.get_untracked().trim().parse::<f64>() else {
            return msg.set(Message::Error("scale must be a number (1.0 = the paper)".into()));
        };
        if let Err(e) = crate::validate::graft(s) {
            return msg.set(Message::Error(e.message));
        }
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            let engine = crate::compute::gpu::Engine::choose(&shared.gpu.get_untracked());
            let on_gpu = engine == crate::compute::gpu::Engine::WebGpu && use_gpu.get_untracked();
            let req = Request::Graft { target: t, base: b, instruct: i, scale: s, use_gpu: on_gpu };
            match task.call(req, None).await {
                Ok((Reply::Graft(a, (grafted, tensors, experts, routers), rows), _)) => {
                    msg.set(Message::Ok(format!(
                        "made {}: grafted {grafted} of {tensors} tensors ({experts} expert tensors, {routers} routers unchanged) on {}, {} in {}",
                        a.name,
                        if on_gpu { "WebGPU" } else { "the CPU" },
                        crate::format_bytes(a.bytes),
                        task.wall()
                    )));
                    stats.set(rows);
                }
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let table = move || {
        let s = stats.get();
        if s.is_empty() {
            return None;
        }
        let top = s.iter().map(|d| d.relative).fold(0.0, f64::max).max(1e-30);
        Some(view! {
            <h3>"Delta per tensor"</h3>
            <p class="small">"‖Δ‖ = ‖instruct − base‖₂; the bar shows ‖Δ‖ / ‖base‖ relative to the largest. FFN deltas are applied to every expert of their layer."</p>
            <div class="scroll">
            <table class="grid" data-testid="delta-table">
                <thead><tr><th>"tensor"</th><th>"shape"</th><th>"‖Δ‖"</th><th>"‖Δ‖/‖base‖"</th><th>"max |Δ|"</th><th>"applied to"</th><th></th></tr></thead>
                <tbody>
                    {s.into_iter().map(|d| view! {
                        <tr>
                            <td><code>{d.name.clone()}</code></td>
                            <td>{format!("{:?}", d.shape)}</td>
                            <td>{format!("{:.3e}", d.delta_l2)}</td>
                            <td>{format!("{:.3e}", d.relative)}</td>
                            <td>{format!("{:.3e}", d.max_abs)}</td>
                            <td>{d.applied_to}</td>
                            <td class="barcell"><div class="hbar" style=format!("width:{:.0}%", 100.0 * d.relative / top)></div></td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
            </div>
        })
    };
    view! {
        <h2>"Graft a post-training delta"</h2>
        <p class="lead">"DeltaMoE phase 2: the difference between an instruct (post-trained) model and its base is added to the target. \
            Shared tensors get their own delta, every expert gets its layer's FFN delta, routers get none. On a dense target this is task arithmetic."</p>
        <div class="form">
            <label>"Target (MoE or dense)" <ModelSelect value=target filter=Filter::Any id="graft-target"/></label>
            <label>"Base (dense)" <ModelSelect value=base filter=Filter::Dense id="graft-base" prefer_first=true/></label>
            <label>"Instruct (dense, post-trained from the base)" <ModelSelect value=instruct filter=Filter::Dense id="graft-instruct"/></label>
            <label>"scale λ" <input type="number" step="0.1" class="short" data-testid="graft-scale" prop:value=move || scale.get() on:input=move |ev| scale.set(event_target_value(&ev))/></label>
        </div>
        <label class="inline"><input type="checkbox" data-testid="graft-use-gpu" prop:checked=move || use_gpu.get()
            on:change=move |ev| use_gpu.set(event_target_checked(&ev))/>"use the WebGPU kernel when available (uncheck to compare with the CPU path)"</label>
        <crate::components::engine_note::EngineNote/>
        <button data-testid="graft-run" on:click=run disabled=move || task.running()>"Graft"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="graft"/>
        {table}
    }
}
