//! Upcycle: dense -> MoE (DeltaMoE phase 1 / NeuronMoE counts), parameter
//! counts, and the logits check on a sample text.

use leptos::prelude::*;
use moe_shared::checkpoint::DType;
use moe_shared::methods::{plan_upcycle, AllocationFile, CopyNoise, ExpertCounts, RouterInit, UpcycleOptions};

use crate::app::Shared;
use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::compute::logits::{check, TOLERANCE};
use crate::store::{pick, update_store, ModelRef, Revision};
use crate::task::Task;

/// The form's values.
#[derive(Clone, Copy)]
struct Form {
    mode_alloc: RwSignal<bool>,
    experts: RwSignal<String>,
    allocation: RwSignal<String>,
    top_k: RwSignal<String>,
    frozen: RwSignal<String>,
    router: RwSignal<String>,
    seed: RwSignal<String>,
    dtype: RwSignal<String>,
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("{what}: `{s}` is not a valid number"))
}

impl Form {
    fn options(&self) -> Result<UpcycleOptions, String> {
        let (experts, experts_source) = if self.mode_alloc.get() {
            let raw = self.allocation.get();
            (AllocationFile::parse(raw.as_bytes(), "allocation").map_err(|e| e.to_string())?, "allocation".to_string())
        } else {
            (ExpertCounts::Uniform(num(&self.experts.get(), "experts per layer")?), "--experts".to_string())
        };
        let frozen = self
            .frozen
            .get()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| num::<usize>(s, "frozen experts"))
            .collect::<Result<Vec<_>, _>>()?;
        let router_init = match self.router.get().as_str() {
            "random" => RouterInit::Random { std: 0.02 },
            _ => RouterInit::Zeros,
        };
        let dtype = match self.dtype.get().as_str() {
            "source" => None,
            d => Some(DType::parse_float(d).ok_or_else(|| format!("unknown dtype {d}"))?),
        };
        Ok(UpcycleOptions {
            experts,
            experts_source,
            top_k: num(&self.top_k.get(), "top-k")?,
            frozen,
            router_init,
            noise: CopyNoise::NONE,
            seed: num(&self.seed.get(), "seed")?,
            temperature: 1.0,
            dtype,
            router_aux_loss_coef: 0.01,
        })
    }
}

/// The Upcycle page.
#[component]
pub fn UpcyclePage() -> impl IntoView {
    let rev = Revision::get();
    let shared = Shared::get();
    let model = RwSignal::new(None::<ModelRef>);
    let f = Form {
        mode_alloc: RwSignal::new(false),
        experts: RwSignal::new("4".into()),
        allocation: RwSignal::new(r#"{"experts_per_layer": [2, 4, 2, 4, 2]}"#.into()),
        top_k: RwSignal::new("2".into()),
        frozen: RwSignal::new("0".into()),
        router: RwSignal::new("zeros".into()),
        seed: RwSignal::new("0".into()),
        dtype: RwSignal::new("source".into()),
    };
    Effect::new(move |_| {
        if let Some(a) = shared.allocation.get() {
            f.allocation.set(a);
            f.mode_alloc.set(true);
        }
    });
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let made = RwSignal::new(None::<usize>);
    let sample =
        RwSignal::new("Once upon a time, there was a little girl named Lily. She loved to play outside.".to_string());
    let check_msg = RwSignal::new(Message::None);
    let check_task = Task::new();

    // Parameter counts from the plan (headers only, cheap).
    let counts = move || {
        rev.track();
        let r = model.get()?;
        let p = pick(&r)?;
        let m = p.model();
        let dense = crate::load::params_u64(&m.config, None);
        Some(
            match f.options().and_then(|o| plan_upcycle(m.source.as_ref(), &m.config, &o).map_err(|e| e.to_string())) {
                Ok(plan) => {
                    let moe = crate::load::params_u64(&m.config, Some(&plan.moe));
                    let k_active: usize = plan.moe.layers.iter().flatten().map(|s| s.top_k).max().unwrap_or(1);
                    let per: Vec<String> = plan
                        .moe
                        .layers
                        .iter()
                        .map(|s| s.as_ref().map_or("dense".into(), |s| s.num_experts.to_string()))
                        .collect();
                    view! {
                        <div class="stats" data-testid="param-counts">
                            <div><span>"dense parameters"</span><b>{crate::format_params(dense)}</b></div>
                            <div><span>"MoE parameters"</span><b>{crate::format_params(moe)}</b></div>
                            <div><span>"growth"</span><b>{format!("×{:.2}", moe as f64 / dense as f64)}</b></div>
                            <div><span>"experts per layer"</span><b>{per.join(" · ")}</b></div>
                            <div><span>"experts used per token"</span><b>{k_active}</b></div>
                            <div><span>"layout"</span><b>{format!("{:?}", plan.choice.layout)}</b></div>
                        </div>
                    }
                    .into_any()
                }
                Err(e) => view! { <p class="msg error" data-testid="upcycle-plan-error">{e}</p> }.into_any(),
            },
        )
    };

    let run = move |_| {
        let Some(p) = model.get_untracked().and_then(|r| pick(&r)) else {
            msg.set(Message::Error("load a dense model first (Load page)".into()));
            return;
        };
        let opts = match f.options() {
            Ok(o) => o,
            Err(e) => {
                msg.set(Message::Error(e));
                return;
            }
        };
        msg.set(Message::None);
        check_msg.set(Message::None);
        task.start("upcycling");
        leptos::task::spawn_local(async move {
            match crate::compute::upcycle::run(&task, &p, &opts).await {
                Ok(a) => {
                    let line = format!(
                        "made {}: {} tensors, {} in {:.0} ms",
                        a.name,
                        a.model.source.tensors().len(),
                        crate::format_bytes(a.safetensors.len() as u64),
                        a.millis
                    );
                    let mut idx = 0;
                    update_store(rev, |s| {
                        idx = s.add_artifact(a);
                    });
                    made.set(Some(idx));
                    msg.set(Message::Ok(line));
                }
                Err(e) => msg.set(Message::Error(e)),
            }
            task.finish();
        });
    };

    let run_check = move |_| {
        let (Some(d), Some(i)) = (model.get_untracked().and_then(|r| pick(&r)), made.get_untracked()) else {
            check_msg.set(Message::Error("upcycle first".into()));
            return;
        };
        let Some(moe) = pick(&ModelRef::Artifact(i)) else { return };
        check_task.start("logits check");
        let text = sample.get_untracked();
        leptos::task::spawn_local(async move {
            match check(&check_task, d.model(), moe.model(), &text).await {
                Ok(c) => {
                    let pass = c.max_abs_diff < TOLERANCE;
                    let line = format!(
                        "{} max |dense − MoE| = {:.3e} over {} tokens × {} logits (largest logit {:.2}; tolerance {:.0e}; {:.0} ms)",
                        if pass { "PASS:" } else { "FAIL:" },
                        c.max_abs_diff,
                        c.tokens,
                        d.model().config.vocab_size,
                        c.max_abs,
                        TOLERANCE,
                        c.millis
                    );
                    check_msg.set(if pass { Message::Ok(line) } else { Message::Error(line) });
                }
                Err(e) => check_msg.set(Message::Error(e)),
            }
            check_task.finish();
        });
    };

    view! {
        <h2>"Upcycle a dense model into an MoE"</h2>
        <p class="lead">"Every FFN becomes " <i>"E"</i> " experts, each an exact copy of the original, plus a new router. \
            Expert 0 stays frozen (DeltaMoE). Right after upcycling the MoE computes exactly the dense function — the check below proves it."</p>
        <div class="form">
            <label>"Dense model" <ModelSelect value=model filter=Filter::Dense id="upcycle-model"/></label>
            <fieldset>
                <legend>"Experts per layer"</legend>
                <label class="inline"><input type="radio" name="mode" prop:checked=move || !f.mode_alloc.get() on:change=move |_| f.mode_alloc.set(false)/>"uniform: "
                    <input type="number" min="1" max="64" class="short" data-testid="upcycle-experts" prop:value=move || f.experts.get()
                        on:input=move |ev| f.experts.set(event_target_value(&ev))/></label>
                <label class="inline"><input type="radio" name="mode" data-testid="upcycle-mode-alloc" prop:checked=move || f.mode_alloc.get() on:change=move |_| f.mode_alloc.set(true)/>
                    "from an allocation (JSON, e.g. from the Neurons page)"</label>
                <textarea rows="2" data-testid="upcycle-allocation" prop:value=move || f.allocation.get() on:input=move |ev| f.allocation.set(event_target_value(&ev))
                    disabled=move || !f.mode_alloc.get()></textarea>
            </fieldset>
            <div class="row">
                <label>"top-k" <input type="number" min="1" class="short" data-testid="upcycle-topk" prop:value=move || f.top_k.get() on:input=move |ev| f.top_k.set(event_target_value(&ev))/></label>
                <label>"frozen experts" <input type="text" class="short" data-testid="upcycle-frozen" prop:value=move || f.frozen.get() on:input=move |ev| f.frozen.set(event_target_value(&ev))/></label>
                <label>"router init" <select on:change=move |ev| f.router.set(event_target_value(&ev))>
                    <option value="zeros">"zeros"</option><option value="random">"random (std 0.02)"</option></select></label>
                <label>"seed" <input type="number" class="short" prop:value=move || f.seed.get() on:input=move |ev| f.seed.set(event_target_value(&ev))/></label>
                <label>"dtype" <select on:change=move |ev| f.dtype.set(event_target_value(&ev))>
                    <option value="source">"as the source"</option><option value="f32">"f32"</option><option value="bf16">"bf16"</option><option value="f16">"f16"</option></select></label>
            </div>
        </div>
        {counts}
        <crate::components::engine_note::EngineNote/>
        <button data-testid="upcycle-run" on:click=run disabled=move || task.running()>"Upcycle"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="upcycle"/>
        <h3>"Logits check"</h3>
        <p>"Runs the dense model and the new MoE on this text and compares every logit."</p>
        <textarea rows="2" data-testid="logits-text" prop:value=move || sample.get() on:input=move |ev| sample.set(event_target_value(&ev))></textarea>
        <button data-testid="logits-run" on:click=run_check disabled=move || made.get().is_none() || check_task.running()>"Check logits"</button>
        <Progress task=check_task/>
        <MessageLine msg=check_msg id="logits"/>
    }
}
