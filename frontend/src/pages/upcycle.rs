//! Upcycle: dense -> MoE (DeltaMoE phase 1 / NeuronMoE counts), parameter
//! counts, and the logits check on a sample text.

use leptos::prelude::*;
use moe_shared::checkpoint::DType;
use moe_shared::methods::{
    plan_upcycle, AllocationFile, CopyNoise, ExpertCounts, RouterInit, SharedExperts, SharedInit, UpcycleOptions,
    UpcyclePlan,
};

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
    shared: RwSignal<String>,
    shared_gate: RwSignal<bool>,
    shared_init: RwSignal<String>,
    drop_ratio: RwSignal<String>,
    granularity: RwSignal<String>,
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("{what}: `{s}` is not a valid number"))
}

/// The most experts per layer the page offers (the input's `max`); more
/// belong to the CLI or the server's Jobs page.
pub const MAX_EXPERTS: usize = 64;

/// The form field an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Uniform experts per layer.
    Experts,
    /// The allocation JSON.
    Allocation,
    /// top-k.
    TopK,
    /// Frozen experts.
    Frozen,
    /// Router init.
    Router,
    /// Seed.
    Seed,
    /// Output dtype.
    Dtype,
    /// Shared experts (count, gate, init).
    Shared,
    /// Drop-Upcycling ratio.
    DropRatio,
    /// Granularity.
    Granularity,
    /// Not one field (the model, its size, the tab's memory).
    Model,
}

impl Field {
    /// The field's label on the page.
    pub fn label(self) -> &'static str {
        match self {
            Field::Experts => "experts per layer",
            Field::Allocation => "allocation",
            Field::TopK => "top-k",
            Field::Frozen => "frozen experts",
            Field::Router => "router init",
            Field::Seed => "seed",
            Field::Dtype => "dtype",
            Field::Shared => "shared experts",
            Field::DropRatio => "drop ratio",
            Field::Granularity => "granularity",
            Field::Model => "model",
        }
    }

    /// The `data-testid` suffix of the field's error.
    pub fn id(self) -> &'static str {
        match self {
            Field::Experts => "experts",
            Field::Allocation => "allocation",
            Field::TopK => "topk",
            Field::Frozen => "frozen",
            Field::Router => "router",
            Field::Seed => "seed",
            Field::Dtype => "dtype",
            Field::Shared => "shared",
            Field::DropRatio => "drop",
            Field::Granularity => "granularity",
            Field::Model => "model",
        }
    }
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
        }
    }
}

/// Refuses counts above [`MAX_EXPERTS`] before any plan is made.
///
/// # Errors
/// The field and a message in the page's words.
pub fn check_counts(counts: &ExpertCounts, field: Field) -> Result<(), (Field, String)> {
    let too_many = |l: Option<usize>, e: usize| {
        let at = l.map(|l| format!("layer {l} has {e} experts")).unwrap_or_else(|| format!("{e} experts"));
        (
            field,
            format!(
                "{}: {at}, the browser studio makes at most {MAX_EXPERTS} per layer \
                 (use the CLI or the server's Jobs page for more)",
                field.label()
            ),
        )
    };
    match counts {
        ExpertCounts::Uniform(e) if *e > MAX_EXPERTS => Err(too_many(None, *e)),
        ExpertCounts::PerLayer(v) => match v.iter().enumerate().find(|(_, e)| e.is_some_and(|e| e > MAX_EXPERTS)) {
            Some((l, e)) => Err(too_many(Some(l), e.unwrap_or_default())),
            None => Ok(()),
        },
        ExpertCounts::Uniform(_) => Ok(()),
    }
}

/// A shared planning error in the page's words: the field it is about,
/// named by its label instead of the CLI's flag (`--experts: layer 0:
/// top-k 3 must be ...` -> `top-k: layer 0: top-k 3 must be ...`).
pub fn plan_error(e: &moe_shared::StudioError, experts: Field) -> (Field, String) {
    match e {
        moe_shared::StudioError::Config { what, source_name } => {
            let field = if source_name == "--drop-ratio" {
                Field::DropRatio
            } else if source_name == "--granularity" {
                Field::Granularity
            } else if source_name == "--shared-experts" || what.contains("shared expert") {
                Field::Shared
            } else if what.contains("top-k") {
                Field::TopK
            } else if what.contains("frozen expert") {
                Field::Frozen
            } else if what.contains("router") {
                Field::Router
            } else {
                experts
            };
            (field, format!("{}: {what}", field.label()))
        }
        e => (Field::Model, e.to_string()),
    }
}

impl Form {
    fn options(&self) -> Result<UpcycleOptions, (Field, String)> {
        let at = |f: Field| move |e: String| (f, e);
        let (experts, experts_source) = if self.mode_alloc.get() {
            let raw = self.allocation.get();
            let a =
                AllocationFile::parse(raw.as_bytes(), "allocation").map_err(|e| (Field::Allocation, e.to_string()))?;
            (a, "allocation".to_string())
        } else {
            let e = num(&self.experts.get(), "experts per layer").map_err(at(Field::Experts))?;
            (ExpertCounts::Uniform(e), "experts per layer".to_string())
        };
        check_counts(&experts, self.experts_field())?;
        let frozen = self
            .frozen
            .get()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| num::<usize>(s, "frozen experts"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(at(Field::Frozen))?;
        let router_init = match self.router.get().as_str() {
            "random" => RouterInit::Random { std: 0.02 },
            _ => RouterInit::Zeros,
        };
        let dtype = match self.dtype.get().as_str() {
            "source" => None,
            d => Some(DType::parse_float(d).ok_or_else(|| (Field::Dtype, format!("dtype: unknown dtype {d}")))?),
        };
        let count: usize = num(&self.shared.get(), "shared experts").map_err(at(Field::Shared))?;
        let shared = SharedExperts {
            count,
            gate: count > 0 && self.shared_gate.get(),
            init: if count > 0 && self.shared_init.get() == "copy" { SharedInit::Copy } else { SharedInit::Zero },
            frozen: false,
        };
        Ok(UpcycleOptions {
            experts,
            experts_source,
            top_k: num(&self.top_k.get(), "top-k").map_err(at(Field::TopK))?,
            frozen,
            router_init,
            noise: CopyNoise::NONE,
            seed: num(&self.seed.get(), "seed").map_err(at(Field::Seed))?,
            temperature: 1.0,
            dtype,
            router_aux_loss_coef: 0.01,
            shared,
            drop_ratio: num(&self.drop_ratio.get(), "drop ratio").map_err(at(Field::DropRatio))?,
            granularity: num(&self.granularity.get(), "granularity").map_err(at(Field::Granularity))?,
            norm_topk_prob: true,
            layout: moe_shared::layout::LayoutRequest::Auto,
        })
    }

    fn experts_field(&self) -> Field {
        if self.mode_alloc.get_untracked() {
            Field::Allocation
        } else {
            Field::Experts
        }
    }

    /// The options and the plan for `m`, refused (in the page's words,
    /// with the field they are about) when they are invalid, or before any
    /// work when the MoE would not fit the tab.
    fn plan(&self, m: &moe_shared::checkpoint::LoadedModel) -> Result<(UpcycleOptions, UpcyclePlan), (Field, String)> {
        let o = self.options()?;
        let plan = plan_upcycle(m.source.as_ref(), &m.config, &o).map_err(|e| plan_error(&e, self.experts_field()))?;
        let model = |e: String| (Field::Model, e);
        crate::load::check_fits("the upcycled model", &m.config, Some(&plan.moe)).map_err(model)?;
        let need = crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64));
        crate::memory::ensure("the upcycle", need).map_err(model)?;
        Ok((o, plan))
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
        shared: RwSignal::new("0".into()),
        shared_gate: RwSignal::new(false),
        shared_init: RwSignal::new("zero".into()),
        drop_ratio: RwSignal::new("0".into()),
        granularity: RwSignal::new("1".into()),
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

    // The plan for the chosen model (headers only, cheap): its parameter
    // counts, or the error and the field it is about.
    let planned = Memo::new(move |_| {
        rev.track();
        let p = pick(&model.get()?)?;
        let m = p.model();
        Some(f.plan(m).map(|(_, plan)| PlanStats::of(&m.config, &plan)))
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
        let Some(p) = model.get_untracked().and_then(|r| pick(&r)) else {
            msg.set(Message::Error("load a dense model first (Load page)".into()));
            return;
        };
        let opts = match f.plan(p.model()) {
            Ok((o, _)) => o,
            Err((_, e)) => {
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
                <label>"frozen experts" <input type="text" class="short" data-testid="upcycle-frozen" prop:value=move || f.frozen.get() on:input=move |ev| f.frozen.set(event_target_value(&ev))/></label>
                {field_error(Field::Frozen)}
                <label>"router init" <select on:change=move |ev| f.router.set(event_target_value(&ev))>
                    <option value="zeros">"zeros"</option><option value="random">"random (std 0.02)"</option></select></label>
                {field_error(Field::Router)}
                <label>"seed" <input type="number" class="short" prop:value=move || f.seed.get() on:input=move |ev| f.seed.set(event_target_value(&ev))/></label>
                {field_error(Field::Seed)}
                <label>"dtype" <select on:change=move |ev| f.dtype.set(event_target_value(&ev))>
                    <option value="source">"as the source"</option><option value="f32">"f32"</option><option value="bf16">"bf16"</option><option value="f16">"f16"</option></select></label>
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_experts_than_the_page_offers_are_refused() {
        assert!(check_counts(&ExpertCounts::Uniform(64), Field::Experts).is_ok());
        for e in [65, 100_000] {
            let (f, m) = check_counts(&ExpertCounts::Uniform(e), Field::Experts).unwrap_err();
            assert_eq!(f, Field::Experts);
            assert!(
                m.starts_with(&format!("experts per layer: {e} experts, the browser studio makes at most 64")),
                "{m}"
            );
        }
        let (f, m) =
            check_counts(&ExpertCounts::PerLayer(vec![Some(2), None, Some(65)]), Field::Allocation).unwrap_err();
        assert_eq!(f, Field::Allocation);
        assert!(m.starts_with("allocation: layer 2 has 65 experts"), "{m}");
    }

    #[test]
    fn shared_errors_name_the_form_field_not_the_cli_flag() {
        use moe_shared::config::{MoeConfig, MoeLayerSpec};
        let cfg = br#"{"model_type":"llama","vocab_size":32,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":2}"#;
        let base = moe_shared::config::HfConfig::from_json(cfg, "c").unwrap().to_model_config("c").unwrap();
        let spec =
            |k: usize, frozen: Vec<usize>| MoeLayerSpec { num_experts: 2, top_k: k, frozen, ..Default::default() };
        let check = |s: MoeLayerSpec| {
            let e = MoeConfig::uniform(2, s).validate(&base, "experts per layer").unwrap_err();
            plan_error(&e, Field::Experts)
        };
        let (f, m) = check(spec(3, vec![0]));
        assert_eq!(f, Field::TopK);
        assert!(m.starts_with("top-k: layer 0: top-k 3 must be between 1 and the expert count 2"), "{m}");
        let (f, m) = check(spec(1, vec![5]));
        assert_eq!(
            (f, m.as_str()),
            (Field::Frozen, "frozen experts: layer 0: frozen expert 5 does not exist (2 experts)")
        );
        let (f, m) = check(MoeLayerSpec { num_experts: 0, ..spec(1, vec![]) });
        assert_eq!(f, Field::Experts);
        assert!(!m.contains("--"), "{m}");
    }

    /// The variants' refusals come from shared's upcycle plan and land next
    /// to their own field, before any work.
    #[test]
    fn variant_errors_land_next_to_their_field() {
        use moe_shared::checkpoint::{DType, PlannedTensor};
        use moe_shared::methods::sink::MemorySink;
        let cfg = br#"{"model_type":"llama","vocab_size":32,"hidden_size":8,"intermediate_size":12,
            "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":2,"tie_word_embeddings":true}"#;
        let base = moe_shared::config::HfConfig::from_json(cfg, "c").unwrap().to_model_config("c").unwrap();
        let plan: Vec<PlannedTensor> = moe_shared::checkpoint::export::dense_tensor_plan(&base)
            .into_iter()
            .map(|(name, shape)| PlannedTensor { name, dtype: DType::F32, shape })
            .collect();
        let mut sink = MemorySink::new(plan.clone());
        for p in &plan {
            let n: usize = p.shape.iter().product();
            moe_shared::methods::sink::write_values(&mut sink, &p.name, DType::F32, &vec![0.5; n]).unwrap();
        }
        let bytes = sink.into_safetensors().unwrap();
        let src = moe_shared::checkpoint::safetensors_io::SafetensorsFile::parse(
            moe_shared::checkpoint::Bytes::from_vec(bytes),
            "tiny",
        )
        .unwrap();
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
