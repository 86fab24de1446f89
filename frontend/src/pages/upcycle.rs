//! Upcycle: dense -> MoE (DeltaMoE phase 1 / NeuronMoE counts), parameter
//! counts, and the logits check on a sample text.

use leptos::prelude::*;
use moe_shared::methods::UpcyclePlan;

use crate::app::Shared;
use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::compute::logits::TOLERANCE;
use crate::compute::upcycle::{num, plan, Field, MAX_EXPERTS};
use crate::models::{InfoSource, Models};
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request, UpcycleForm};
use moe_shared::ops::upcycle::{RouterInitArg, SharedInitArg, UpcycleParams};

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
    shared: RwSignal<String>,
    shared_gate: RwSignal<bool>,
    shared_init: RwSignal<String>,
    drop_ratio: RwSignal<String>,
    granularity: RwSignal<String>,
}

impl Form {
    /// The request the form describes (tracked: a change re-plans), or the
    /// first value that does not parse and its field. Every field is read
    /// before any is parsed, so that the page tracks them all.
    fn values(&self) -> Result<UpcycleForm, (Field, String)> {
        let (top_k, frozen, router, seed) = (self.top_k.get(), self.frozen.get(), self.router.get(), self.seed.get());
        let (shared, gate, init) = (self.shared.get(), self.shared_gate.get(), self.shared_init.get());
        let (drop_ratio, granularity) = (self.drop_ratio.get(), self.granularity.get());
        let form = UpcycleForm {
            allocation: self.mode_alloc.get().then(|| self.allocation.get()),
            experts: self.experts.get(),
            dtype: self.dtype.get(),
            params: UpcycleParams::default(),
        };
        let at = |f: Field| move |e: String| (f, e);
        let shared: usize = num(&shared, "shared experts").map_err(at(Field::Shared))?;
        let params = UpcycleParams {
            top_k: num(&top_k, "top-k").map_err(at(Field::TopK))?,
            frozen: frozen
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| num::<usize>(s, "frozen experts"))
                .collect::<Result<Vec<_>, _>>()
                .map_err(at(Field::Frozen))?,
            router_init: if router == "random" { RouterInitArg::Random } else { RouterInitArg::Zeros },
            seed: num(&seed, "seed").map_err(at(Field::Seed))?,
            shared_experts: shared,
            // The gate and the init only mean something with shared experts
            // (their inputs are disabled at 0).
            shared_gate: shared > 0 && gate,
            shared_init: if shared > 0 && init == "copy" { SharedInitArg::Copy } else { SharedInitArg::Zero },
            drop_ratio: num(&drop_ratio, "drop ratio").map_err(at(Field::DropRatio))?,
            granularity: num(&granularity, "granularity").map_err(at(Field::Granularity))?,
            ..UpcycleParams::default()
        };
        Ok(UpcycleForm { params, ..form })
    }
}

/// The input next to which the page shows an error about the upcycle
/// parameter `key` (the operation's form key, `UpcycleParams::form_fields`,
/// as the shared rules name it): the router's init, std and temperature
/// share the router input; the noise, which the tab does not offer, goes
/// with the model; `None` (a key this page has no input for) with the
/// expert counts.
pub(crate) fn slot_of(key: &str) -> Option<Field> {
    Some(match key {
        "experts" => Field::Experts,
        "experts_per_layer" => Field::Allocation,
        "top_k" => Field::TopK,
        "frozen" => Field::Frozen,
        "router_init" | "router_std" | "temperature" => Field::Router,
        "drop_ratio" => Field::DropRatio,
        "granularity" => Field::Granularity,
        "shared_experts" => Field::Shared,
        "seed" => Field::Seed,
        "noise" | "noise_kind" => Field::Model,
        _ => return None,
    })
}

/// What the plan's statistics show.
#[derive(Clone, Debug, PartialEq)]
struct PlanStats {
    dense: u64,
    moe: u64,
    active: u64,
    per: Vec<String>,
    k_active: usize,
    shared: usize,
    expert_width: String,
    layout: String,
    bytes: u64,
}

impl PlanStats {
    fn of(c: &moe_shared::config::ModelConfig, plan: &UpcyclePlan) -> Self {
        PlanStats {
            dense: crate::load::params_u64(c, None),
            moe: crate::load::params_u64(c, Some(&plan.moe)),
            active: crate::load::active_params_u64(c, Some(&plan.moe)),
            per: plan
                .moe
                .layers
                .iter()
                .map(|s| s.as_ref().map_or("dense".into(), |s| s.num_experts.to_string()))
                .collect(),
            k_active: plan.moe.layers.iter().flatten().map(|s| s.top_k).max().unwrap_or(1),
            shared: plan.moe.layers.iter().flatten().map(|s| s.shared_experts).max().unwrap_or(0),
            expert_width: {
                let w = plan.moe.layers.iter().flatten().map(|s| s.expert_width(c)).max().unwrap_or(0);
                format!("{w} of {}", c.intermediate_size)
            },
            layout: format!("{:?}", plan.choice.layout),
            bytes: plan.planned.iter().map(|p| p.byte_len() as u64).sum(),
        }
    }
}

/// The Upcycle page.
#[component]
pub fn UpcyclePage() -> impl IntoView {
    let models = Models::get();
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
        dtype: RwSignal::new("auto".into()),
        shared: RwSignal::new("0".into()),
        shared_gate: RwSignal::new(false),
        shared_init: RwSignal::new("zero".into()),
        drop_ratio: RwSignal::new("0".into()),
        granularity: RwSignal::new("1".into()),
    };
    // The teaching preset upcycles its base model.
    Effect::new(move |_| {
        if let Some(p) = shared.preset.get() {
            model.set(Some(p.base));
        }
    });
    Effect::new(move |_| {
        if let Some(a) = shared.allocation.get() {
            f.allocation.set(a);
            f.mode_alloc.set(true);
        }
    });
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let made = RwSignal::new(None::<ModelRef>);
    let sample =
        RwSignal::new("Once upon a time, there was a little girl named Lily. She loved to play outside.".to_string());
    let check_msg = RwSignal::new(Message::None);
    let check_task = Task::new();

    // The plan for the chosen model (its tensor list only, cheap, on the
    // page): its parameter counts, or the error and the field it is about.
    let planned = Memo::new(move |_| {
        let m = models.find(&model.get()?)?;
        let stats = f.values().and_then(|form| plan(&form, &InfoSource::of(&m), &m.config, slot_of));
        Some(stats.map(|(_, p)| PlanStats::of(&m.config, &p)))
    });
    // A result or an error is about the inputs it came from: clear it when
    // they change.
    Effect::new(move |_| {
        let _ = (model.get(), f.values());
        msg.set(Message::None);
    });
    Effect::new(move |_| {
        let _ = (model.get(), made.get(), sample.get());
        check_msg.set(Message::None);
    });
    let field_error = move |field: Field| {
        move || {
            planned.with(|p| match p {
                Some(Err((f, e))) if *f == field => Some(view! {
                    <span class="msg error small field-error" role="alert" data-testid=format!("upcycle-error-{}", field.id())>{e.clone()}</span>
                }),
                _ => None,
            })
        }
    };
    let counts = move || {
        planned.get().map(|r| match r {
            Ok(s) => view! {
                <div class="stats" data-testid="param-counts">
                    <div><span>"dense parameters"</span><b>{crate::format_params(s.dense)}</b></div>
                    <div><span>"MoE parameters"</span><b>{crate::format_params(s.moe)}</b></div>
                    <div><span>"active per token"</span><b>{crate::format_params(s.active)}</b></div>
                    <div><span>"growth"</span><b>{format!("×{:.2}", s.moe as f64 / s.dense as f64)}</b></div>
                    <div><span>"experts per layer"</span><b>{s.per.join(" · ")}</b></div>
                    <div><span>"experts used per token"</span><b>{s.k_active}</b></div>
                    <div><span>"shared experts"</span><b>{s.shared}</b></div>
                    <div><span>"expert width"</span><b>{s.expert_width}</b></div>
                    <div><span>"layout"</span><b>{s.layout}</b></div>
                    <div><span>"model.safetensors"</span><b>{crate::format_bytes(s.bytes)}</b></div>
                </div>
            }
            .into_any(),
            // Errors about one field are shown next to it.
            Err((Field::Model, e)) => {
                view! { <p class="msg error" data-testid="upcycle-plan-error">{e}</p> }.into_any()
            }
            Err(_) => ().into_any(),
        })
    };

    let run = move |_| {
        let Some(r) = model.get_untracked() else {
            msg.set(Message::Error("load a dense model first (Load page)".into()));
            return;
        };
        if let Some(Err((_, e))) = planned.get_untracked() {
            msg.set(Message::Error(e));
            return;
        }
        let form = match f.values() {
            Ok(form) => form,
            Err((_, e)) => return msg.set(Message::Error(e)),
        };
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            match task.call(Request::Upcycle { model: r, form }, None).await {
                Ok((Reply::Model(a), _)) => {
                    msg.set(Message::Ok(format!(
                        "made {}: {} tensors, {} in {}",
                        a.name,
                        a.tensors.len(),
                        crate::format_bytes(a.bytes),
                        task.wall()
                    )));
                    made.set(Some(a.r));
                }
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };

    let run_check = move |_| {
        let (Some(d), Some(moe)) = (model.get_untracked(), made.get_untracked()) else {
            check_msg.set(Message::Error("upcycle first".into()));
            return;
        };
        let text = sample.get_untracked();
        leptos::task::spawn_local(async move {
            match check_task.call(Request::Logits { dense: d, moe, text }, None).await {
                Ok((Reply::Logits(c), _)) => {
                    let pass = c.max_abs_diff < TOLERANCE;
                    let line = format!(
                        "{} max |dense − MoE| = {:.3e} over {} tokens × {} logits (largest logit {:.2}; tolerance {:.0e}; {})",
                        if pass { "PASS:" } else { "FAIL:" },
                        c.max_abs_diff,
                        c.tokens,
                        c.vocab,
                        c.max_abs,
                        TOLERANCE,
                        check_task.wall()
                    );
                    check_msg.set(if pass { Message::Ok(line) } else { Message::Error(line) });
                }
                Ok(_) => {}
                Err(e) => check_msg.set(Message::Error(e)),
            }
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
                    <input type="number" min="1" max=MAX_EXPERTS class="short" data-testid="upcycle-experts" prop:value=move || f.experts.get()
                        on:input=move |ev| f.experts.set(event_target_value(&ev))/></label>
                    {field_error(Field::Experts)}
                <label class="inline"><input type="radio" name="mode" data-testid="upcycle-mode-alloc" prop:checked=move || f.mode_alloc.get() on:change=move |_| f.mode_alloc.set(true)/>
                    "from an allocation (JSON, e.g. from the Neurons page)"</label>
                <textarea rows="2" data-testid="upcycle-allocation" prop:value=move || f.allocation.get() on:input=move |ev| f.allocation.set(event_target_value(&ev))
                    disabled=move || !f.mode_alloc.get()></textarea>
                {field_error(Field::Allocation)}
            </fieldset>
            <div class="row">
                <label>"top-k" <input type="number" min="1" class="short" data-testid="upcycle-topk" prop:value=move || f.top_k.get() on:input=move |ev| f.top_k.set(event_target_value(&ev))/></label>
                {field_error(Field::TopK)}
                <label title="indices of the experts training leaves frozen, comma-separated (0 = the original FFN, DeltaMoE; empty = none), as the CLI's --frozen">"frozen experts (indices)" <input type="text" class="short" data-testid="upcycle-frozen" prop:value=move || f.frozen.get() on:input=move |ev| f.frozen.set(event_target_value(&ev))/></label>
                {field_error(Field::Frozen)}
                <label>"router init" <select on:change=move |ev| f.router.set(event_target_value(&ev))>
                    <option value="zeros">"zeros"</option><option value="random">"random (std 0.02)"</option></select></label>
                {field_error(Field::Router)}
                <label>"seed" <input type="number" class="short" prop:value=move || f.seed.get() on:input=move |ev| f.seed.set(event_target_value(&ev))/></label>
                {field_error(Field::Seed)}
                <label>"dtype" <select on:change=move |ev| f.dtype.set(event_target_value(&ev))>
                    <option value="auto">"auto (as the source; bf16 for a quantized one)"</option><option value="source">"as the source (f32 for a quantized one, as the CLI)"</option><option value="f32">"f32"</option><option value="bf16">"bf16"</option><option value="f16">"f16"</option></select></label>
                {field_error(Field::Dtype)}
            </div>
            <fieldset>
                <legend>"Variants"</legend>
                <div class="row">
                    <label title="always-active experts beside the routed ones (DeepSeekMoE, Qwen1.5/2-MoE)">"shared experts"
                        <input type="number" min="0" class="short" data-testid="upcycle-shared" prop:value=move || f.shared.get() on:input=move |ev| f.shared.set(event_target_value(&ev))/></label>
                    <label class="inline" title="scale each shared expert by sigmoid(w·x), as Qwen2-MoE"><input type="checkbox" data-testid="upcycle-shared-gate" prop:checked=move || f.shared_gate.get()
                        on:change=move |ev| f.shared_gate.set(event_target_checked(&ev)) disabled=move || f.shared.get().trim() == "0"/>"sigmoid gate"</label>
                    <label title="zero: the shared experts output 0 at first (the MoE equals the dense model); copy: scaled copies of the FFN">"shared init"
                        <select data-testid="upcycle-shared-init" on:change=move |ev| f.shared_init.set(event_target_value(&ev)) disabled=move || f.shared.get().trim() == "0">
                        <option value="zero">"zero"</option><option value="copy">"copy (scaled)"</option></select></label>
                    {field_error(Field::Shared)}
                    <label title="Drop-Upcycling: the fraction of each non-frozen copy's FFN units re-initialised (paper: 0.5)">"drop ratio"
                        <input type="number" min="0" max="1" step="0.05" class="short" data-testid="upcycle-drop" prop:value=move || f.drop_ratio.get() on:input=move |ev| f.drop_ratio.set(event_target_value(&ev))/></label>
                    {field_error(Field::DropRatio)}
                    <label title="granular upcycling: each copy becomes G experts of f/G units, routed top-(k·G)">"granularity G"
                        <input type="number" min="1" class="short" data-testid="upcycle-granularity" prop:value=move || f.granularity.get() on:input=move |ev| f.granularity.set(event_target_value(&ev))/></label>
                    {field_error(Field::Granularity)}
                </div>
            </fieldset>
        </div>
        {counts}
        <crate::components::engine_note::EngineNote/>
        <button data-testid="upcycle-run" on:click=run
            disabled=move || task.running() || model.get().is_none() || matches!(planned.get(), Some(Err(_)))>"Upcycle"</button>
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::upcycle::plan_error;
    use moe_shared::methods::{plan_upcycle, SharedExperts, UpcycleOptions};

    /// The variants' refusals come from shared's upcycle plan and land next
    /// to their own field, before any work.
    #[test]
    fn variant_errors_land_next_to_their_field() {
        let (base, src) = crate::compute::upcycle::tiny_dense(moe_shared::tensor_io::DType::F32);
        let field_of = |o: UpcycleOptions| plan_error(&plan_upcycle(&src, &base, &o).unwrap_err(), Field::Experts);
        let (f, m) = field_of(UpcycleOptions { drop_ratio: 2.0, ..Default::default() });
        assert_eq!(f, Field::DropRatio);
        assert!(m.starts_with("drop ratio: "), "{m}");
        let (f, m) = field_of(UpcycleOptions { granularity: 5, ..Default::default() });
        assert_eq!(f, Field::Granularity);
        assert!(m.contains("divisors of 12: 2, 3, 4, 6, 12"), "{m}");
        // A valid plan counts the shared experts and the narrower experts.
        let o = UpcycleOptions {
            granularity: 2,
            shared: SharedExperts { count: 1, gate: true, ..Default::default() },
            ..Default::default()
        };
        let p = plan_upcycle(&src, &base, &o).unwrap();
        let s = PlanStats::of(&base, &p);
        assert_eq!((s.shared, s.expert_width.as_str(), s.k_active), (1, "6 of 12", 4));
        let d = 8u64;
        // 8 experts of 3·8·6, the router [8, 8], one shared FFN 3·8·12 and its gate [1, 8].
        assert_eq!(s.moe - s.dense, 8 * 3 * d * 6 + 8 * d + 3 * d * 12 + d - 3 * d * 12);
        assert_eq!(s.moe - s.active, 4 * 3 * d * 6);
    }
}
