//! Graft: add `scale × (instruct − base)` to an MoE (every expert of layer
//! l gets layer l's FFN delta) or a dense model; per-tensor delta norms.

use leptos::prelude::*;

use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{DeltaRow, Reply, Request};

/// The largest rise of a domain's perplexity the teaching preset allows
/// the graft (`scripts/demo_preset.sh` checks it; DeltaMoE's claim that the
/// delta adds the ability without erasing the domains).
pub const GRAFT_DOMAIN_BOUND: f64 = 0.15;

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
    // The ability the delta should carry: a text scored before and after
    // the graft (empty: no check).
    let ability_name = RwSignal::new(String::new());
    let ability = RwSignal::new(String::new());
    let ppl = RwSignal::new(Message::None);
    let ppl_task = Task::new();
    // What the graft costs the other domains: each domain's held-out text
    // scored on the target and the grafted model (the teaching preset's
    // domains; `(domain, before, after)`).
    let domains = RwSignal::new(Vec::<(String, String)>::new());
    let domain_rows = RwSignal::new(Vec::<(String, f64, f64)>::new());
    // The teaching preset: its base, its "instruct" model and its
    // ability's held-out text.
    Effect::new(move |_| {
        if let Some(p) = shared.preset.get() {
            base.set(Some(p.base));
            instruct.set(Some(p.instruct));
            ability_name.set(p.ability.0);
            ability.set(p.ability.1);
            domains.set(
                p.splits
                    .iter()
                    .filter(|t| !t.heldout.trim().is_empty())
                    .map(|t| (t.name.clone(), t.heldout.clone()))
                    .collect(),
            );
        }
    });
    Effect::new(move |_| {
        let _ = (target.get(), base.get(), instruct.get(), scale.get(), ability.get());
        msg.set(Message::None);
        ppl.set(Message::None);
        domain_rows.set(Vec::new());
    });
    // Perplexity of the ability text: the target vs the grafted model.
    let score = move |before: ModelRef, after: ModelRef, name: String| {
        let text = ability.get_untracked();
        if text.trim().is_empty() {
            return;
        }
        let what = match ability_name.get_untracked().trim() {
            "" => "the ability text".to_string(),
            n => format!("the ability text ({n})"),
        };
        leptos::task::spawn_local(async move {
            match ppl_task.call(Request::Perplexity { models: vec![before.clone(), after.clone()], text }, None).await {
                Ok((Reply::Perplexity(v), _)) if v.len() == 2 => {
                    let drop = 100.0 * (1.0 - v[1] / v[0]);
                    ppl.set(Message::Ok(format!(
                        "perplexity of {what}: {:.3} before the graft -> {:.3} with it ({name}): {} by {:.1}% ({})",
                        v[0],
                        v[1],
                        if drop >= 0.0 { "lower" } else { "higher" },
                        drop.abs(),
                        ppl_task.wall()
                    )));
                }
                Ok(_) => {}
                Err(e) => return ppl.set(Message::Error(format!("perplexity of {what}: {e}"))),
            }
            // Then each domain's held-out text, on the same two models.
            for (d, t) in domains.get_untracked() {
                let req = Request::Perplexity { models: vec![before.clone(), after.clone()], text: t };
                match ppl_task.call(req, None).await {
                    Ok((Reply::Perplexity(v), _)) if v.len() == 2 => domain_rows.update(|r| r.push((d, v[0], v[1]))),
                    Ok(_) => {}
                    Err(e) => return ppl.set(Message::Error(format!("perplexity of the {d} held-out text: {e}"))),
                }
            }
        });
    };
    // Every domain's perplexity before and after the graft, and its rise
    // against the bound the teaching preset checks (DeltaMoE: the delta
    // brings the ability without erasing what the MoE knew).
    let domain_table = move || {
        let rows = domain_rows.get();
        (!rows.is_empty()).then(|| {
            let worst = rows.iter().map(|(_, b, a)| a / b - 1.0).fold(f64::NEG_INFINITY, f64::max);
            view! {
                <h3>"What the graft costs each domain"</h3>
                <table class="grid" data-testid="graft-domains">
                    <thead><tr><th>"domain (held-out text)"</th><th>"before the graft"</th><th>"with it"</th><th>"change"</th></tr></thead>
                    <tbody>{rows.into_iter().map(|(d, b, a)| {
                        let change = 100.0 * (a / b - 1.0);
                        let class = if change > 100.0 * GRAFT_DOMAIN_BOUND { "bad" } else { "" };
                        view! { <tr><td>{d}</td><td>{format!("{b:.3}")}</td><td>{format!("{a:.3}")}</td>
                            <td class=class>{format!("{change:+.1}%")}</td></tr> }
                    }).collect_view()}</tbody>
                </table>
                <p class="small" data-testid="graft-domains-summary">{format!(
                    "largest rise {:+.1}% (the teaching preset is built so that every domain stays within +{:.0}%)",
                    100.0 * worst, 100.0 * GRAFT_DOMAIN_BOUND
                )}</p>
            }
        })
    };
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
        let params = moe_shared::ops::graft::GraftParams { scale: s };
        if let Err(e) = crate::validate::graft(&params) {
            return msg.set(Message::Error(e.message));
        }
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            let engine = crate::compute::gpu::Engine::choose(&shared.gpu.get_untracked());
            let on_gpu = engine == crate::compute::gpu::Engine::WebGpu && use_gpu.get_untracked();
            let req = Request::Graft { target: t.clone(), base: b, instruct: i, params, use_gpu: on_gpu };
            match task.call(req, None).await {
                Ok((Reply::Graft(a, (grafted, tensors, experts, routers), rows), _)) => {
                    score(t.clone(), a.r.clone(), a.name.clone());
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
            <label>"Target (MoE or dense)" <ModelSelect value=target filter=Filter::Any id="graft-target" follow=true hold=Signal::derive(move || task.running())/></label>
            <label>"Base (dense)" <ModelSelect value=base filter=Filter::Dense id="graft-base" prefer_first=true/></label>
            <label>"Instruct (dense, post-trained from the base)" <ModelSelect value=instruct filter=Filter::Dense id="graft-instruct"/></label>
            <label>"scale λ" <input type="number" step="0.1" class="short" data-testid="graft-scale" prop:value=move || scale.get() on:input=move |ev| scale.set(event_target_value(&ev))/></label>
        </div>
        <details class="ability">
            <summary data-testid="graft-ability-summary">{move || match ability.with(String::len) {
                0 => "Ability check (optional): a text the instruct model is good at, scored before and after the graft".to_string(),
                n => format!("Ability check: the {} text ({n} characters) is scored before and after the graft — open to see or edit it", ability_name.get()),
            }}</summary>
            <label>"name " <input type="text" class="short" data-testid="graft-ability-name" prop:value=move || ability_name.get()
                on:input=move |ev| ability_name.set(event_target_value(&ev))/></label>
            <span class="small">{move || format!(" {} characters", ability.with(String::len))}</span>
            <textarea rows="3" data-testid="graft-ability" prop:value=move || ability.get() on:input=move |ev| ability.set(event_target_value(&ev))></textarea>
        </details>
        <label class="inline"><input type="checkbox" data-testid="graft-use-gpu" prop:checked=move || use_gpu.get()
            on:change=move |ev| use_gpu.set(event_target_checked(&ev))/>"use the WebGPU kernel when available (uncheck to compare with the CPU path)"</label>
        <crate::components::engine_note::EngineNote/>
        <button data-testid="graft-run" on:click=run disabled=move || task.running()>"Graft"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="graft"/>
        <Progress task=ppl_task/>
        <MessageLine msg=ppl id="graft-ppl"/>
        {domain_table}
        {table}
    }
}
