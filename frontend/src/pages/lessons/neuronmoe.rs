//! Lesson: NeuronMoE ("Neuron-Guided Mixture-of-Experts for Efficient
//! Multilingual LLM Extension", 2026; docs/methods.md §3): find the new
//! language's specific neurons per layer, allocate experts where they are,
//! and train that MoE beside a uniform one with the same number of added
//! experts.

use leptos::prelude::*;

use super::deltamoe::{before_after, upcycle_form};
use super::{LessonHeader, LessonStep, LoadStep};
use crate::app::Shared;
use crate::components::message::{Message, MessageLine};
use crate::components::progress::Progress;
use crate::compute::neurons::{texts, LanguageTexts, NeuronOutcome};
use crate::pages::neurons::NeuronResult;
use crate::pages::train::{TrainOutcome, TrainPanel};
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request};

const SLUG: &str = "learn-neuronmoe";

/// Texts per language the analysis reads (paragraphs of the preset's
/// training texts).
const TEXTS: usize = 60;

/// The uniform allocation with exactly the allocation's total of new
/// experts (`moe_shared::methods::allocate::uniform_with_total`, what
/// `moe-studio allocate` compares against: methods.md §3.5): the total
/// spread as evenly as whole experts allow, at least 1 per layer.
pub fn uniform_new(alloc: &[usize]) -> Vec<usize> {
    let total: usize = alloc.iter().sum();
    let range = moe_shared::methods::allocate::ExpertRange { min: 1, max: total.max(1) };
    moe_shared::methods::allocate::uniform_with_total(alloc.len(), total, range)
}

/// Whether the allocation gives the first and the last layer more new
/// experts than the middle layers' mean (NeuronMoE's finding).
pub fn ends_above_middle(alloc: &[usize]) -> bool {
    if alloc.len() < 3 {
        return false;
    }
    let mid = &alloc[1..alloc.len() - 1];
    let mean = mid.iter().sum::<usize>() as f64 / mid.len() as f64;
    alloc[0] as f64 > mean && alloc[alloc.len() - 1] as f64 > mean
}

/// The NeuronMoE lesson.
#[component]
pub fn NeuronMoeLesson() -> impl IntoView {
    let shared = Shared::get();
    // Step 2: the analysis.
    let a_task = Task::new();
    let a_msg = RwSignal::new(Message::None);
    let analysis = RwSignal::new(None::<NeuronOutcome>);
    let analyse = move |_| {
        let Some(p) = shared.preset.get_untracked() else {
            return a_msg.set(Message::Error("load the teaching demo first (step 1)".into()));
        };
        let langs: Vec<LanguageTexts> = ["en", "hu"]
            .iter()
            .filter_map(|c| p.splits.iter().find(|t| t.name == *c))
            .map(|t| LanguageTexts {
                code: t.name.clone(),
                lines: texts(&t.train, moe_shared::corpus::DocSplit::Line, TEXTS),
            })
            .collect();
        a_msg.set(Message::None);
        let req = Request::Neurons {
            model: p.base,
            langs,
            top_n: p.settings.neurons_top_n,
            range: (1, p.settings.neurons_max),
        };
        leptos::task::spawn_local(async move {
            match a_task.call(req, None).await {
                Ok((Reply::Neurons(o), _)) => {
                    a_msg.set(Message::Ok(format!(
                        "analysed {} neurons on {} texts in {}; new experts per layer: {:?}",
                        o.neurons,
                        o.texts,
                        a_task.wall(),
                        o.allocation
                    )));
                    analysis.set(Some(o));
                }
                Ok(_) => {}
                Err(e) => a_msg.set(Message::Error(e)),
            }
        });
    };
    let a_notice = Signal::derive(move || {
        let o = analysis.get()?;
        let a = &o.allocation;
        let l = a.len();
        let top = o.union.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).map_or(0, |(i, _)| i);
        Some(if ends_above_middle(a) {
            format!(
                "the Hungarian-specific neurons gather in the first and last layers, so the allocation ({a:?} new experts \
                 for layers 0-{}) gives both ends more experts than the middle — the paper's finding on Llama-3.2-3B \
                 (28 layers: 1 new expert in most middle layers, up to 6 near the ends).",
                l.saturating_sub(1)
            )
        } else {
            format!(
                "here the Hungarian-specific neurons gather in layer {top} (allocation {a:?}), not at both ends as in the \
                 paper. The paper's base is multilingual: its last layers produce each language, so they are language-\
                 specific too. This base learnt English stories only and spells Hungarian byte by byte, so only the layers \
                 that read the tokens tell the languages apart. The method is the paper's; the base is too small and too \
                 monolingual to show the second half of the finding."
            )
        })
    });
    let a_view = move || analysis.get().map(|o| view! { <NeuronResult o=o/> });
    // Step 3: upcycle with the allocation and with the uniform count.
    let u_task = Task::new();
    let u_msg = RwSignal::new(Message::None);
    let by_neurons = RwSignal::new(None::<ModelRef>);
    let uniform = RwSignal::new(None::<ModelRef>);
    let totals = RwSignal::new(None::<(Vec<usize>, Vec<usize>)>);
    let upcycle = move |_| {
        let (Some(p), Some(o)) = (shared.preset.get_untracked(), analysis.get_untracked()) else {
            return u_msg.set(Message::Error("analyse the neurons first (step 2)".into()));
        };
        u_msg.set(Message::None);
        let json = serde_json::json!({ "new_experts_per_layer": o.allocation }).to_string();
        let u = uniform_new(&o.allocation);
        let u_json = serde_json::json!({ "new_experts_per_layer": u }).to_string();
        leptos::task::spawn_local(async move {
            let a = match u_task
                .call(Request::Upcycle { model: p.base.clone(), form: upcycle_form(2, Some(json)) }, None)
                .await
            {
                Ok((Reply::Model(a), _)) => a,
                Ok(_) => return,
                Err(e) => return u_msg.set(Message::Error(e)),
            };
            let b = match u_task
                .call(Request::Upcycle { model: p.base, form: upcycle_form(2, Some(u_json)) }, None)
                .await
            {
                Ok((Reply::Model(b), _)) => b,
                Ok(_) => return,
                Err(e) => return u_msg.set(Message::Error(e)),
            };
            u_msg.set(Message::Ok(format!(
                "made {} ({} parameters) and {} ({} parameters), in {}",
                a.name,
                crate::format_params(a.numel()),
                b.name,
                crate::format_params(b.numel()),
                u_task.wall()
            )));
            totals.set(Some((o.allocation.clone(), u)));
            by_neurons.set(Some(a.r));
            uniform.set(Some(b.r));
        });
    };
    let u_notice = Signal::derive(move || {
        let (alloc, u) = totals.get()?;
        let n: usize = alloc.iter().sum();
        Some(format!(
            "both MoEs add new experts beside the frozen original FFN: NeuronMoE {n} in all ({alloc:?}), uniform {} ({u:?}, \
             the same total spread evenly). The same budget in different places — the next two steps train both the same way.",
            u.iter().sum::<usize>()
        ))
    });
    // Steps 4 and 5: the same short stage 1 on each.
    let t1 = RwSignal::new(None::<TrainOutcome>);
    let t2 = RwSignal::new(None::<TrainOutcome>);
    let compare = move || {
        let (a, b, (alloc, u)) = (t1.get()?, t2.get()?, totals.get()?);
        let row = |name: &str, per: String, added: usize, o: &TrainOutcome| {
            let r = before_after(o);
            let ppl =
                |l: &str| r.iter().find(|x| x.0 == l).map_or("–".to_string(), |x| format!("{:.2} → {:.2}", x.1, x.2));
            view! { <tr><td>{name.to_string()}</td><td>{per}</td><td>{added}</td><td>{ppl("hu")}</td><td>{ppl("en")}</td></tr> }
        };
        Some(view! {
            <table class="grid" data-testid=format!("{SLUG}-compare")>
                <thead><tr><th>"allocation"</th><th>"experts per layer (incl. the original)"</th><th>"experts added"</th>
                    <th>"hu held-out perplexity (before → after)"</th><th>"en held-out perplexity"</th></tr></thead>
                <tbody>
                    {row("NeuronMoE", format!("{:?}", alloc.iter().map(|a| a + 1).collect::<Vec<_>>()), alloc.iter().sum(), &a)}
                    {row("uniform", format!("{:?}", u.iter().map(|a| a + 1).collect::<Vec<_>>()), u.iter().sum(), &b)}
                </tbody>
            </table>
        })
    };
    let c_notice = Signal::derive(move || {
        let (a, b, (alloc, u)) = (t1.get()?, t2.get()?, totals.get()?);
        let hu = |o: &TrainOutcome| before_after(o).iter().find(|x| x.0 == "hu").map(|x| x.2);
        let (x, y) = (hu(&a)?, hu(&b)?);
        let (na, nb) = (alloc.iter().sum::<usize>(), u.iter().sum::<usize>());
        Some(format!(
            "after the same steps NeuronMoE's MoE reaches Hungarian perplexity {x:.2} against {y:.2} for the uniform one, \
             with {na} added experts against {nb}: the same budget, placed differently. The paper reports NeuronMoE's \
             placement matching allocations with 40-50% more experts; on a 260K model trained for seconds the difference \
             is {} — the lesson is where the experts go, which the analysis decides before any training.",
            if (x - y).abs() / y < 0.02 { "within noise" } else if x < y { "in NeuronMoE's favour" } else { "in the uniform one's favour" }
        ))
    });
    view! {
        <h2>"Lesson · NeuronMoE: give experts to the layers where the language lives"</h2>
        <LessonHeader paper="“Neuron-Guided Mixture-of-Experts for Efficient Multilingual LLM Extension” (2026) — docs/methods.md §3"
            claim="Neurons specific to a new language concentrate in the first and last layers; giving each layer experts in \
                proportion to its specific neurons matches a uniform allocation with far fewer added experts."
            scale="Here: the 260K-parameter base (5 layers) with English as the original and Hungarian as the new language; \
                the paper analyses Llama-3.2-3B (28 layers) on ~500 texts per language."/>
        <LoadStep slug=SLUG/>
        <LessonStep slug=SLUG n=2 title="Find the language-specific neurons and allocate" notice=a_notice
            does="Every neuron (q, k, v, o, gate, up, down outputs) is scored by how well its mean activation ranks Hungarian texts \
                above English ones (Average Precision); each layer's share of the top-N sets its new experts between E_min and E_max.">
            <button data-testid=format!("{SLUG}-2-run") on:click=analyse disabled=move || a_task.running() || shared.preset.get().is_none()>"Analyse and allocate"</button>
            <Progress task=a_task/>
            <MessageLine msg=a_msg id=format!("{SLUG}-2")/>
            {a_view}
        </LessonStep>
        <LessonStep slug=SLUG n=3 title="Upcycle with that allocation, and uniformly with the same total" notice=u_notice
            does="Two MoEs from the same base: one with NeuronMoE's experts per layer, one with the same number in every layer.">
            <button data-testid=format!("{SLUG}-3-run") on:click=upcycle disabled=move || u_task.running() || analysis.get().is_none()>"Upcycle both"</button>
            <Progress task=u_task/>
            <MessageLine msg=u_msg id=format!("{SLUG}-3")/>
        </LessonStep>
        <LessonStep slug=SLUG n=4 title="Train the NeuronMoE model (stage 1)" notice=Signal::derive(move || t1.get().map(|o| format!("trained in {}; now the uniform one, the same way.", o.wall)))
            does="The same short stage 1 as in the DeltaMoE lesson: new experts + routers on Hungarian, the original FFN frozen.">
            <TrainPanel prefix=format!("{SLUG}-4") fixed_stage="experts" model=by_neurons outcome=t1 pinned=true/>
        </LessonStep>
        <LessonStep slug=SLUG n=5 title="Train the uniform model the same way, and compare" notice=c_notice
            does="Same texts, steps and learning rate; then both side by side.">
            <TrainPanel prefix=format!("{SLUG}-5") fixed_stage="experts" model=uniform outcome=t2 pinned=true/>
            {compare}
        </LessonStep>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_count_and_the_ends_test() {
        assert_eq!(uniform_new(&[3, 1, 1, 1, 4]), vec![2, 2, 2, 2, 2]);
        assert_eq!(uniform_new(&[4, 1, 1, 1, 1]), vec![2, 1, 2, 1, 2]);
        assert_eq!(uniform_new(&[1, 1, 1]), vec![1, 1, 1]);
        assert!(ends_above_middle(&[3, 1, 1, 2, 4]));
        assert!(!ends_above_middle(&[3, 1, 4, 1, 1]));
        assert!(!ends_above_middle(&[2, 2]));
    }
}
