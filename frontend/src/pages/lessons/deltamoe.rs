//! Lesson: DeltaMoE ("A Data-Efficient Path to Multilingual LLMs: Language
//! Expansion via Post-training PARAM-Delta Integration into Upcycled MoE",
//! 2026; docs/methods.md §1): upcycle the base, train new experts on a new
//! language with the original FFN frozen, tune the routers with a replay
//! and the language prior, then graft an instruct model's delta.

use leptos::prelude::*;

use super::{fall, pct, LessonHeader, LessonStep, LoadStep};
use crate::app::Shared;
use crate::components::message::{Message, MessageLine};
use crate::components::progress::Progress;
use crate::pages::train::{TrainOutcome, TrainPanel};
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request, UpcycleForm};

const SLUG: &str = "learn-deltamoe";

/// The Upcycle page's form with `experts` uniform experts (or an
/// allocation JSON), top-2, expert 0 frozen, zero routers: DeltaMoE's
/// setting (methods.md §1.1).
pub fn upcycle_form(experts: usize, allocation: Option<String>) -> UpcycleForm {
    UpcycleForm {
        allocation,
        experts: experts.to_string(),
        dtype: "auto".into(),
        params: moe_shared::ops::upcycle::UpcycleParams::default(),
    }
}

/// The first and last evaluation of a stage: `(language, ppl before,
/// ppl after, new-expert share before, after)`.
pub fn before_after(o: &TrainOutcome) -> Vec<(String, f64, f64, f64, f64)> {
    let evals: Vec<_> = o.summary.points.iter().filter_map(|p| p.eval.as_ref()).collect();
    let (Some(a), Some(b)) = (evals.first(), evals.last()) else { return Vec::new() };
    a.iter().zip(b.iter()).map(|(x, y)| (x.name.clone(), x.ppl, y.ppl, x.new_share, y.new_share)).collect()
}

/// Perplexity of `texts` on `before` and `after` (one worker request per
/// text): `(name, before, after)`.
///
/// # Errors
/// The first request that failed.
pub async fn score_pairs(
    task: Task,
    before: ModelRef,
    after: ModelRef,
    texts: Vec<(String, String)>,
) -> Result<Vec<(String, f64, f64)>, String> {
    let mut out = Vec::new();
    for (name, text) in texts {
        let req = Request::Perplexity { models: vec![before.clone(), after.clone()], text };
        match task.call(req, None).await? {
            (Reply::Perplexity(v), _) if v.len() == 2 => out.push((name, v[0], v[1])),
            _ => return Err(format!("no perplexity came back for {name}")),
        }
    }
    Ok(out)
}

/// The DeltaMoE lesson.
#[component]
pub fn DeltaMoeLesson() -> impl IntoView {
    let shared = Shared::get();
    // Step 2: upcycle.
    let up_task = Task::new();
    let up_msg = RwSignal::new(Message::None);
    let upcycled = RwSignal::new(None::<ModelRef>);
    let up_note = RwSignal::new(None::<String>);
    let upcycle = move |_| {
        let Some(p) = shared.preset.get_untracked() else {
            return up_msg.set(Message::Error("load the teaching demo first (step 1)".into()));
        };
        up_msg.set(Message::None);
        leptos::task::spawn_local(async move {
            match up_task.call(Request::Upcycle { model: p.base, form: upcycle_form(4, None) }, None).await {
                Ok((Reply::Model(a), _)) => {
                    up_msg.set(Message::Ok(format!(
                        "made {}: {} parameters, in {}",
                        a.name,
                        crate::format_params(a.numel()),
                        up_task.wall()
                    )));
                    up_note.set(Some(
                        "every layer now has 4 experts: expert 0 is the original FFN and stays frozen, experts 1-3 are exact \
                         copies that will learn the new language. With the routers at zero the MoE still computes the dense \
                         model exactly (the Upcycle page's logits check shows |dense − MoE| below 1e-4)."
                            .into(),
                    ));
                    upcycled.set(Some(a.r));
                }
                Ok(_) => {}
                Err(e) => up_msg.set(Message::Error(e)),
            }
        });
    };
    // Step 3: stage 1 on the upcycled model.
    let s1_model = RwSignal::new(None::<ModelRef>);
    let s1 = RwSignal::new(None::<TrainOutcome>);
    Effect::new(move |_| {
        if let Some(r) = upcycled.get() {
            s1_model.set(Some(r));
        }
    });
    let s1_notice = Signal::derive(move || {
        let o = s1.get()?;
        let rows = before_after(&o);
        let (new, orig) = (rows.first()?, rows.get(1)?);
        let worse = orig.2 > 1.05 * orig.1;
        let orig_line = if worse {
            format!(
                "{o} got {} worse: the routers now send {o} tokens to the new experts too (share {:.2} → {:.2}) — stage 1 \
                 sees only the new language, so nothing keeps {o} on expert 0; stage 2 is there to fix that",
                pct(orig.1, orig.2),
                orig.3,
                orig.4,
                o = orig.0
            )
        } else {
            format!("{} changed by {} — expert 0 still holds the original FFN", orig.0, pct(orig.1, orig.2))
        };
        Some(format!(
            "{n} perplexity fell {} ({:.1} → {:.1}) and the share of {n} tokens sent to the new experts went from {:.2} to \
             {:.2}, while {orig_line}. The paper trains on billions of tokens at lr 5e-5; this stage is {} steps of a 260K \
             model ({}), so the new language is only started, not learnt.",
            fall(new.1, new.2),
            new.1,
            new.2,
            new.3,
            new.4,
            o.summary.points.len().saturating_sub(1),
            o.wall,
            n = new.0,
        ))
    });
    // Step 4: stage 2 on stage 1's output.
    let s2_model = RwSignal::new(None::<ModelRef>);
    let s2 = RwSignal::new(None::<TrainOutcome>);
    Effect::new(move |_| {
        if let Some(o) = s1.get() {
            s2_model.set(Some(o.model.r));
        }
    });
    let s2_notice = Signal::derive(move || {
        let o = s2.get()?;
        let rows = before_after(&o);
        let (new, orig) = (rows.first()?, rows.get(1)?);
        Some(format!(
            "only the routers moved: the language prior pulled {o} towards expert 0 (share to the new experts {:.2} → {:.2}; \
             perplexity {}), while {n}'s share to the new experts went {:.2} → {:.2} (perplexity {}). That is MoE-LPR's \
             recipe for keeping the original language while adding a new one; the paper's replay is ~0.15B tokens, here \
             a few thousand, so the trade between the two languages is coarser.",
            orig.3,
            orig.4,
            pct(orig.1, orig.2),
            new.3,
            new.4,
            pct(new.1, new.2),
            n = new.0,
            o = orig.0,
        ))
    });
    // Step 5: graft the instruct delta onto the stage-2 model.
    let g_task = Task::new();
    let g_msg = RwSignal::new(Message::None);
    let g_rows = RwSignal::new(Vec::<(String, f64, f64)>::new());
    let graft = move |_| {
        let (Some(p), Some(o)) = (shared.preset.get_untracked(), s2.get_untracked()) else {
            return g_msg.set(Message::Error("run stage 2 first (step 4)".into()));
        };
        g_msg.set(Message::None);
        g_rows.set(Vec::new());
        let use_gpu =
            crate::compute::gpu::Engine::choose(&shared.gpu.get_untracked()) == crate::compute::gpu::Engine::WebGpu;
        let target = o.model.r.clone();
        leptos::task::spawn_local(async move {
            let req = Request::Graft {
                target: target.clone(),
                base: p.base,
                instruct: p.instruct,
                params: Default::default(),
                use_gpu,
            };
            let grafted = match g_task.call(req, None).await {
                Ok((Reply::Graft(a, (grafted, tensors, _, _), _), _)) => {
                    g_msg.set(Message::Ok(format!(
                        "made {}: grafted {grafted} of {tensors} tensors, in {}",
                        a.name,
                        g_task.wall()
                    )));
                    a.r
                }
                Ok(_) => return,
                Err(e) => return g_msg.set(Message::Error(e)),
            };
            let mut texts = vec![(p.ability.0.clone(), p.ability.1.clone())];
            for l in ["hu", "en"] {
                if let Some(t) = p.splits.iter().find(|t| t.name == l) {
                    texts.push((t.name.clone(), t.heldout.clone()));
                }
            }
            match score_pairs(g_task, target, grafted, texts).await {
                Ok(rows) => g_rows.set(rows),
                Err(e) => g_msg.set(Message::Error(e)),
            }
        });
    };
    let g_table = move || {
        let rows = g_rows.get();
        (!rows.is_empty()).then(|| view! {
            <table class="grid" data-testid=format!("{SLUG}-5-table")>
                <thead><tr><th>"held-out text"</th><th>"before the graft"</th><th>"with it"</th><th>"change"</th></tr></thead>
                <tbody>{rows.into_iter().map(|(n, b, a)| view! {
                    <tr><td>{n}</td><td>{format!("{b:.3}")}</td><td>{format!("{a:.3}")}</td><td>{pct(b, a)}</td></tr>
                }).collect_view()}</tbody>
            </table>
        })
    };
    let g_notice = Signal::derive(move || {
        let rows = g_rows.get();
        let (ability, rest) = rows.split_first()?;
        Some(format!(
            "the {} text's perplexity fell {} with no training at all — the instruct model's delta, added to every expert, \
             carries what its post-training taught — while {}. The paper grafts a real SFT/RL delta and measures \
             benchmark accuracy; here the \"ability\" is a text genre the instruct model was fine-tuned on.",
            ability.0,
            fall(ability.1, ability.2),
            rest.iter().map(|(n, b, a)| format!("{n} changed by {}", pct(*b, *a))).collect::<Vec<_>>().join(" and "),
        ))
    });
    view! {
        <h2>"Lesson · DeltaMoE: add a language to a model, then graft its alignment back"</h2>
        <LessonHeader paper="“A Data-Efficient Path to Multilingual LLMs: Language Expansion via Post-training PARAM-Delta Integration into Upcycled MoE” (2026) — docs/methods.md §1"
            claim="Upcycle a dense model into an MoE whose expert 0 is the frozen original FFN, train the new experts on a new \
                language, tune the routers so the original language goes back to expert 0, then add the instruct model's \
                delta to every expert: the MoE learns the language without forgetting and keeps the post-training ability."
            scale="Here: the 260K-parameter base learns Hungarian for a few dozen steps in this tab (the CLI's own trainer, \
                compiled to WebAssembly); the paper trains Qwen2.5-7B / Llama-3.1-8B on billions of tokens."/>
        <LoadStep slug=SLUG/>
        <LessonStep slug=SLUG n=2 title="Upcycle the base" notice=Signal::derive(move || up_note.get())
            does="Every FFN becomes 4 experts (expert 0 = the original, frozen), top-2 routing, routers at zero.">
            <button data-testid=format!("{SLUG}-2-run") on:click=upcycle disabled=move || up_task.running() || shared.preset.get().is_none()>"Upcycle to 4 experts"</button>
            <Progress task=up_task/>
            <MessageLine msg=up_msg id=format!("{SLUG}-2")/>
        </LessonStep>
        <LessonStep slug=SLUG n=3 title="Stage 1: train the new experts on the new language" notice=s1_notice
            does="Next-token loss + 0.01 × load balancing on Hungarian text; expert 0, attention, embeddings and norms frozen. \
                The held-out Hungarian and English texts are scored every 5 steps.">
            <TrainPanel prefix=format!("{SLUG}-3") fixed_stage="experts" model=s1_model outcome=s1 pinned=true/>
        </LessonStep>
        <LessonStep slug=SLUG n=4 title="Stage 2: tune the routers with a replay and the language prior" notice=s2_notice
            does="Only the routers train, on Hungarian mixed 1:1 with English; the language prior (β = 0.1) pushes English tokens to expert 0.">
            <TrainPanel prefix=format!("{SLUG}-4") fixed_stage="router" model=s2_model outcome=s2 pinned=true/>
        </LessonStep>
        <LessonStep slug=SLUG n=5 title="Graft the instruct delta" notice=g_notice
            does="θ += instruct − base: shared tensors get their delta, every expert gets its layer's FFN delta, routers none. \
                Then the ability text and both languages are scored before and after.">
            <button data-testid=format!("{SLUG}-5-run") on:click=graft disabled=move || g_task.running() || s2.get().is_none()>"Graft and score"</button>
            <Progress task=g_task/>
            <MessageLine msg=g_msg id=format!("{SLUG}-5")/>
            {g_table}
        </LessonStep>
    }
}
