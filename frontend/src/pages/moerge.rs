//! MoErge + ridge router (DUME): merge N dense models into an MoE with one
//! expert each, then solve each layer's router from one text per domain;
//! per-layer routing accuracy and per-domain perplexity (DUME vs averaging
//! vs oracle).

use leptos::prelude::*;

use crate::components::chart::{BarChart, Series};
use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::compute::route::{mean, DomainText, PplRow};
use crate::models::Models;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request};
use moe_shared::ops::route::RouteParams;

#[derive(Clone, Copy)]
struct Domain {
    name: RwSignal<String>,
    text: RwSignal<String>,
    /// The teaching preset's held-out documents of the domain (scored
    /// instead of the text's last 10%, as the preset's CLI run scores them).
    heldout: RwSignal<Option<String>>,
}

impl Domain {
    fn new(name: &str, text: &str) -> Self {
        Domain { name: RwSignal::new(name.into()), text: RwSignal::new(text.into()), heldout: RwSignal::new(None) }
    }
}

/// Results shown under the router form.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteView {
    /// Domain names, expert order.
    pub names: Vec<String>,
    /// `[domain][layer]` held-out routing accuracy.
    pub accuracy: Vec<Vec<Option<f64>>>,
    /// Statistics tokens per domain.
    pub tokens: Vec<usize>,
    /// The perplexity table.
    pub ppl: Vec<PplRow>,
}

/// The router's results: held-out routing accuracy per layer and the
/// perplexity table (DUME, averaging, oracle, and DUME's retention).
#[component]
pub fn RouteResult(r: RouteView) -> impl IntoView {
    let layers = r.accuracy.first().map(Vec::len).unwrap_or(0);
    let series: Vec<Series> =
        r.names.iter().zip(&r.accuracy).map(|(n, a)| Series { label: n.clone(), values: a.clone() }).collect();
    let chance = 1.0 / r.names.len().max(1) as f64;
    view! {
        <BarChart title="Held-out routing accuracy per layer (fraction of a domain's tokens sent to its own expert)"
            x_label="layer" groups=(0..layers).map(|l| l.to_string()).collect() series=series max=1.0
            reference=(chance, format!("chance {chance:.2}"))/>
        {(!r.ppl.is_empty()).then(|| view! { <h4>"Perplexity on each domain's held-out text (lower is better)"</h4> })}
        <table class="grid" data-testid="ppl-table">
            <thead><tr><th>"domain"</th><th>"tokens (stats / held-out)"</th><th>"DUME (ridge router)"</th><th>"averaging"</th><th>"oracle expert"</th><th>"DUME retention (oracle / DUME)"</th></tr></thead>
            <tbody>{r.ppl.iter().zip(&r.tokens).map(|(p, t)| view! {
                <tr><td>{p.domain.clone()}</td><td>{format!("{t} / {}", p.tokens)}</td><td>{format!("{:.3}", p.dume)}</td><td>{format!("{:.3}", p.averaging)}</td><td>{format!("{:.3}", p.oracle)}</td>
                    <td>{format!("{:.1}%", 100.0 * p.oracle / p.dume)}</td></tr>
            }).collect_view()}</tbody>
        </table>
        <p class="small">"DUME routes each token by the solved router; averaging merges all experts into one dense FFN; the oracle sends every token to its domain's own expert. \
            For an upcycled MoE the experts are still identical copies, so the three agree until the experts are trained (or come from different models)."</p>
    }
}

#[component]
fn MoergeForm() -> impl IntoView {
    let models = Models::get();
    let shared = crate::app::Shared::get();
    let use_gpu = RwSignal::new(true);
    let chosen = RwSignal::new(Vec::<ModelRef>::new());
    let top_k = RwSignal::new("1".to_string());
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    // The teaching preset ticks its domain experts, in expert order.
    Effect::new(move |_| {
        if let Some(p) = shared.preset.get() {
            chosen.set(p.experts);
        }
    });
    let run = move |_| {
        let picked: Vec<ModelRef> = chosen.get_untracked();
        let Ok(k) = top_k.get_untracked().trim().parse::<usize>() else {
            return msg.set(Message::Error("top-k must be a whole number".into()));
        };
        if picked.len() < 2 {
            return msg.set(Message::Error("tick two or more dense models (one per domain)".into()));
        }
        let params = moe_shared::ops::moerge::MoergeParams { top_k: k, ..Default::default() };
        if let Err(e) = crate::validate::moerge(picked.len(), &params) {
            return msg.set(Message::Error(e.message));
        }
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            let engine = crate::compute::gpu::Engine::choose(&shared.gpu.get_untracked());
            let on_gpu = engine == crate::compute::gpu::Engine::WebGpu && use_gpu.get_untracked();
            match task.call(Request::Moerge { models: picked, params, use_gpu: on_gpu }, None).await {
                Ok((Reply::Moerge(a, (tensors, gpu, cpu)), _)) => {
                    let averaged = if on_gpu {
                        format!("averaged {gpu} shared tensors on WebGPU and {cpu} on the CPU")
                    } else {
                        format!("averaged {cpu} shared tensors on the CPU")
                    };
                    msg.set(Message::Ok(format!(
                        "made {}: {tensors} tensors, {averaged}, {} in {}",
                        a.name,
                        crate::format_bytes(a.bytes),
                        task.wall()
                    )));
                }
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let boxes = move || {
        models
            .choices()
            .into_iter()
            .filter(|(_, _, moe)| !moe)
            .map(|(r, label, _)| {
                let r2 = r.clone();
                let r3 = r.clone();
                let id = format!("moerge-pick-{}", r.key());
                view! {
                    <label class="inline"><input type="checkbox" data-testid=id prop:checked=move || chosen.get().contains(&r2)
                        on:change=move |ev| {
                            let on = event_target_checked(&ev);
                            chosen.update(|c| { c.retain(|x| x != &r3); if on { c.push(r3.clone()); } });
                        }/>{label}</label>
                }
            })
            .collect_view()
    };
    view! {
        <h3>"A · MoErge dense models"</h3>
        <p class="small">"Tick two or more dense models fine-tuned from one base (one per domain), in domain order. Shared tensors are averaged; each model's FFN becomes one expert."</p>
        <div class="checklist">{boxes}</div>
        <label>"top-k " <input type="number" min="1" class="short" prop:value=move || top_k.get() on:input=move |ev| top_k.set(event_target_value(&ev))/></label>
        <label class="inline"><input type="checkbox" data-testid="moerge-use-gpu" prop:checked=move || use_gpu.get()
            on:change=move |ev| use_gpu.set(event_target_checked(&ev))/>"average on the WebGPU kernel when available (uncheck to compare with the CPU path; three or more models, or shapes that differ, always average on the CPU)"</label>
        <button data-testid="moerge-run" on:click=run disabled=move || task.running()>"MoErge"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="moerge"/>
    }
}

/// Characters above which a domain's text is shown collapsed.
const PREVIEW_AT: usize = 4000;

#[component]
fn DomainRow(d: Domain, i: usize) -> impl IntoView {
    let on_file = move |ev: leptos::ev::Event| {
        let input = event_target::<web_sys::HtmlInputElement>(&ev);
        let files = input.files();
        leptos::task::spawn_local(async move {
            if let Ok(mut f) = crate::web::read_files(files).await {
                if let Some(f) = f.pop() {
                    if d.name.get_untracked().starts_with("domain") {
                        d.name.set(f.name.trim_end_matches(".txt").to_string());
                    }
                    d.text.set(String::from_utf8_lossy(&f.bytes).into_owned());
                }
            }
        });
    };
    // A long text (a file, the preset's) is shown as its first characters
    // until the user asks to edit it: a textarea of tens of KB takes the
    // main thread ~100 ms to lay out each time the page is shown.
    let editing = RwSignal::new(false);
    let collapsed = move || !editing.get() && d.text.with(|t| t.len() > PREVIEW_AT);
    view! {
        <div class="domain">
            <label>{format!("expert {i}: ")}<input type="text" class="short" data-testid=format!("domain-name-{i}") prop:value=move || d.name.get()
                on:input=move |ev| d.name.set(event_target_value(&ev))/></label>
            <input type="file" accept=".txt,text/plain" data-testid=format!("domain-file-{i}") on:change=on_file/>
            <span class="small">{move || match d.heldout.with(|h| h.as_ref().map(String::len)) {
                Some(h) => format!("{} characters; {h} held-out characters scored (the preset's held-out documents)", d.text.with(String::len)),
                None => format!("{} characters (the last 10% held out)", d.text.with(String::len)),
            }}</span>
            {move || collapsed().then(|| view! {
                <p class="small preview" data-testid=format!("domain-preview-{i}")>{d.text.with(|t| {
                    let head: String = t.chars().take(240).collect();
                    format!("{}…", head.replace('\n', " ⏎ "))
                })}
                    " "<button class="secondary" on:click=move |_| editing.set(true)>"show and edit the whole text"</button></p>
            })}
            <textarea rows="3" data-testid=format!("domain-text-{i}") style:display=move || if collapsed() { "none" } else { "" }
                prop:value=move || d.text.get() on:input=move |ev| d.text.set(event_target_value(&ev))></textarea>
        </div>
    }
}

#[component]
fn RouterForm() -> impl IntoView {
    let shared = crate::app::Shared::get();
    let model = RwSignal::new(None::<ModelRef>);
    let domains = RwSignal::new(vec![
        Domain::new("en", "Once upon a time there was a little dog. The dog liked to run in the park with his friends.\nThe sun was warm and the children played with a red ball all day long."),
        Domain::new("hu", "Egyszer volt egy kis kutya. A kutya szeretett a parkban futni a barátaival.\nA nap meleg volt, és a gyerekek egész nap egy piros labdával játszottak."),
    ]);
    // The teaching preset, once loaded, gives one text per expert.
    let defaults = RouteParams::default();
    let lambda = RwSignal::new(defaults.lambda.to_string());
    let top_k = RwSignal::new(defaults.top_k.to_string());
    let route_tokens = RwSignal::new(crate::compute::route::TAB_MAX_TOKENS.to_string());
    // ... and the statistics budget of the preset's own CLI run
    // (scripts/demo_preset.sh: `route --max-tokens 2000`), which keeps the
    // step within seconds.
    Effect::new(move |_| {
        if let Some(p) = shared.preset.get() {
            domains.set(
                p.splits
                    .iter()
                    .map(|t| {
                        let d = Domain::new(&t.name, &t.train);
                        d.heldout.set((!t.heldout.trim().is_empty()).then(|| t.heldout.clone()));
                        d
                    })
                    .collect(),
            );
            route_tokens.set(p.settings.route_tokens.to_string());
            top_k.set(p.settings.dume_top_k.to_string());
        }
    });
    let with_ppl = RwSignal::new(true);
    let gram_gpu = RwSignal::new(true);
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let result = RwSignal::new(None::<RouteView>);
    // The inputs as the route parameters (the rest at the tab's values).
    let params = move || -> Result<RouteParams, String> {
        let l: f64 = lambda.get().trim().parse().map_err(|_| "lambda: not a number".to_string())?;
        let k: usize = top_k.get().trim().parse().map_err(|_| "top-k: not a whole number".to_string())?;
        let mt: usize =
            route_tokens.get().trim().parse().map_err(|_| "tokens per domain: not a whole number".to_string())?;
        Ok(crate::compute::route::tab_params(l, k, mt))
    };
    // The server's route rules (shared), on every change: shown next to the
    // fields, and the button stays disabled while they refuse.
    let invalid = Memo::new(move |_| {
        let names: Vec<String> = domains.get().iter().map(|d| d.name.get()).collect();
        crate::validate::route(&names, &params()?).map_err(|e| e.message)
    });
    let run = move |_| {
        if let Err(e) = invalid.get_untracked() {
            return msg.set(Message::Error(e));
        }
        let Some(r) = model.get_untracked() else {
            return msg.set(Message::Error("choose an MoE (upcycle or MoErge first)".into()));
        };
        let params = match untrack(params) {
            Ok(p) => p,
            Err(e) => return msg.set(Message::Error(e)),
        };
        let texts: Vec<DomainText> = domains
            .get_untracked()
            .iter()
            .map(|d| DomainText {
                name: d.name.get_untracked(),
                text: d.text.get_untracked(),
                heldout: d.heldout.get_untracked(),
            })
            .collect();
        msg.set(Message::None);
        result.set(None);
        let names: Vec<String> = texts.iter().map(|t| t.name.clone()).collect();
        let engine = crate::compute::gpu::Engine::choose(&shared.gpu.get_untracked());
        let use_gpu = engine == crate::compute::gpu::Engine::WebGpu && gram_gpu.get_untracked();
        let req =
            Request::Route { model: r.clone(), domains: texts, params, with_ppl: with_ppl.get_untracked(), use_gpu };
        leptos::task::spawn_local(async move {
            match task.call(req, None).await {
                Ok((Reply::Route(routed), _)) => {
                    let r = routed;
                    msg.set(Message::Ok(format!(
                        "made {}: statistics on {} tokens (Gram on {}), in {}; mean held-out routing accuracy {}",
                        r.model.name,
                        r.tokens.iter().sum::<usize>(),
                        r.gram_on,
                        task.wall(),
                        names
                            .iter()
                            .zip(&r.accuracy)
                            .map(|(n, a)| format!("{n} {:.2}", mean(a)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                    result.set(Some(RouteView { names, accuracy: r.accuracy, tokens: r.tokens, ppl: r.ppl }));
                }
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let view_result = move || result.get().map(|r| view! { <RouteResult r=r/> });
    view! {
        <h3>"B · Ridge router"</h3>
        <p class="small">"One text per expert, in expert order. Each domain's tokens are pushed through its own expert, the router inputs are collected, and every layer's router is solved in closed form (ridge regression). The last 10% of each text is held out for the accuracy and perplexity."</p>
        <label>"MoE model " <ModelSelect value=model filter=Filter::Moe id="route-model" follow=true hold=Signal::derive(move || task.running())/></label>
        {move || domains.get().into_iter().enumerate().map(|(i, d)| view! { <DomainRow d=d i=i/> }).collect_view()}
        <div class="row">
            <button class="secondary" on:click=move |_| domains.update(|v| { let n = v.len(); v.push(Domain::new(&format!("domain{n}"), "")); })>"+ domain"</button>
            <button class="secondary" on:click=move |_| domains.update(|v| { if v.len() > 2 { v.pop(); } })>"− domain"</button>
            <label>"λ " <input type="number" step="0.001" class="short" data-testid="route-lambda" prop:value=move || lambda.get() on:input=move |ev| lambda.set(event_target_value(&ev))/></label>
            <label>"top-k " <input type="number" min="1" class="short" data-testid="route-topk" prop:value=move || top_k.get() on:input=move |ev| top_k.set(event_target_value(&ev))/></label>
            <label>"tokens per domain " <input type="number" class="short" data-testid="route-max-tokens" prop:value=move || route_tokens.get() on:input=move |ev| route_tokens.set(event_target_value(&ev))/></label>
        </div>
        {move || invalid.get().err().map(|e| view! { <p class="msg error" role="alert" data-testid="route-field-error">{e}</p> })}
        <label class="inline"><input type="checkbox" data-testid="route-ppl" prop:checked=move || with_ppl.get()
            on:change=move |ev| with_ppl.set(event_target_checked(&ev))/>"also compute the perplexity table (three more passes over the held-out text)"</label>
        <label class="inline"><input type="checkbox" data-testid="route-gram-gpu" prop:checked=move || gram_gpu.get()
            on:change=move |ev| gram_gpu.set(event_target_checked(&ev))/>"accumulate the ridge statistics (XᵀX, XᵀY) on the WebGPU kernel when available (f32 blocks summed in f64; uncheck for the CLI's f64 CPU path)"</label>
        <button data-testid="route-run" on:click=run disabled=move || task.running() || invalid.get().is_err()>"Solve the router"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="route"/>
        {view_result}
    }
}

/// The MoErge + ridge router page.
#[component]
pub fn MoergePage() -> impl IntoView {
    view! {
        <h2>"MoErge + ridge router (DUME)"</h2>
        <p class="lead">"Combine dense models trained on different domains into one MoE without training: each becomes an expert, \
            and a ridge-regression router learns from a little text which expert each token needs. An upcycled MoE with one expert per domain works too."</p>
        <crate::components::engine_note::EngineNote/>
        <MoergeForm/>
        <RouterForm/>
    }
}
