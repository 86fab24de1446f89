//! Neurons (NeuronMoE, small models): language-specific neurons by Average
//! Precision on texts the user pastes, a per-layer chart, and the expert
//! allocation with E_min / E_max.

use leptos::prelude::*;

use crate::app::Shared;
use crate::components::chart::{BarChart, Marked, Series};
use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::compute::neurons::{texts, LanguageTexts, NeuronOutcome};
use crate::pages::Page;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request};
use moe_shared::methods::neurons::WarningKind;

// Ten texts per language: with fewer, neurons unrelated to the language
// separate it perfectly by chance (the few-texts warning, shared's
// `min_texts_per_language`: 10 for two languages on SmolLM2's 155,520
// neurons at top-N 100).
const EN: &str = "The cat sat on the mat.\nTom likes to play with his red ball.\nThe sun is big and warm today.\nMom made a cake for the party.\nThe bird sang a happy song.\nLily found a shiny stone in the garden.\nThe dog ran to the park with Ben.\nWe ate apples under the old tree.\nThe little boat floated on the lake.\nGrandpa read a story before bed.";
const HU: &str = "A macska a szőnyegen ült.\nTomi szeret a piros labdájával játszani.\nA nap ma nagy és meleg.\nAnya tortát sütött a bulira.\nA madár vidám dalt énekelt.\nLili egy fényes követ talált a kertben.\nA kutya Benivel a parkba futott.\nAlmát ettünk az öreg fa alatt.\nA kis csónak a tavon úszott.\nNagypapa esti mesét olvasott.";

/// An analysis' warnings, its top-N cut-offs, the specific neurons per
/// layer and the allocation (charts and the allocation line).
#[component]
pub fn NeuronResult(o: NeuronOutcome) -> impl IntoView {
    let layers: Vec<String> = (0..o.union.len()).map(|l| l.to_string()).collect();
    let mut series: Vec<Series> = o
        .codes
        .iter()
        .zip(&o.per_lang)
        .map(|(c, v)| Series { label: format!("{c}-specific"), values: v.iter().map(|&x| Some(x)).collect() })
        .collect();
    series.push(Series {
        label: "union of new languages (S_l)".into(),
        values: o.union.iter().map(|&x| Some(x)).collect(),
    });
    let marked = Marked {
        series: series.len() - 1,
        parts: o.union_tied.clone(),
        label: "tie-weighted: neurons tied at the top-N cut-off, each counting places / tied".into(),
    };
    let alloc =
        Series { label: "new experts E_l".into(), values: o.allocation.iter().map(|&x| Some(x as f64)).collect() };
    let warnings = o.warnings.iter().map(|w| view! {
        <p class="notice" data-testid=format!("neurons-warning-{}", match w.kind { WarningKind::Tie => "tie", WarningKind::FewTexts => "few-texts" })>
            {if w.affects_allocation { "⚠ " } else { "" }}{w.message.clone()}</p>
    }).collect_view();
    let cut_rows = o.cuts.iter().map(|c| view! {
        <tr><td>{c.code.clone()}</td><td class="num">{c.texts}</td><td class="num">{format!("{:.4}", c.cut_ap)}</td>
            <td class="num">{if c.tied > 0 { format!("{} for {} places", c.tied, c.places) } else { "none".into() }}</td></tr>
    }).collect_view();
    view! {
        {warnings}
        <table class="grid cuts" data-testid="neurons-cuts">
            <tr><th>"language"</th><th class="num">"texts"</th><th class="num">{format!("AP at the top-{} cut-off", o.top_n)}</th>
                <th class="num">"neurons tied at the cut-off"</th></tr>
            {cut_rows}
        </table>
        <BarChart title=format!("Language-specific neurons per layer (top-{} by Average Precision, of {} neurons)", o.top_n, o.neurons)
            x_label="layer" groups=layers.clone() series=series marked=marked/>
        <BarChart title="NeuronMoE allocation: new experts per layer (more specific neurons → more experts)"
            x_label="layer" groups=layers series=vec![alloc]/>
        <p data-testid="allocation">{format!("allocation (total per layer = 1 + new): {:?}", o.allocation)}</p>
    }
}

/// The Neurons page.
#[component]
pub fn NeuronsPage() -> impl IntoView {
    let shared = Shared::get();
    let model = RwSignal::new(None::<ModelRef>);
    let langs = RwSignal::new(vec![
        (RwSignal::new("en".to_string()), RwSignal::new(EN.to_string())),
        (RwSignal::new("hu".to_string()), RwSignal::new(HU.to_string())),
    ]);
    let top_n = RwSignal::new("100".to_string());
    let e_min = RwSignal::new("1".to_string());
    let e_max = RwSignal::new("6".to_string());
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let out = RwSignal::new(None::<NeuronOutcome>);
    // The teaching preset analyses its base model.
    Effect::new(move |_| {
        if let Some(p) = shared.preset.get() {
            model.set(Some(p.base));
        }
    });
    // A message is about the inputs it came from.
    Effect::new(move |_| {
        let _ = (model.get(), top_n.get(), e_min.get(), e_max.get());
        msg.set(Message::None);
    });
    let run = move |_| {
        let Some(r) = model.get_untracked() else {
            return msg.set(Message::Error("load a dense model first".into()));
        };
        let parse = |s: RwSignal<String>, what: &str| {
            s.get_untracked().trim().parse::<usize>().map_err(|_| format!("{what} must be a whole number"))
        };
        let nums = (|| Ok::<_, String>((parse(top_n, "top-N")?, parse(e_min, "E_min")?, parse(e_max, "E_max")?)))();
        let (n, lo, hi) = match nums {
            Ok(x) => x,
            Err(e) => return msg.set(Message::Error(e)),
        };
        let codes: Vec<String> = langs.get_untracked().iter().map(|(c, _)| c.get_untracked()).collect();
        if let Err(e) = crate::validate::neurons(&codes, n) {
            return msg.set(Message::Error(e.message));
        }
        if lo > hi {
            // The page's words, not the CLI's `--min <= --max`.
            return msg.set(Message::Error(format!("E_min ({lo}) is greater than E_max ({hi}): make E_min <= E_max")));
        }
        let texts: Vec<LanguageTexts> = langs
            .get_untracked()
            .iter()
            // The page's texts hold one paragraph per line (the preset's
            // texts); each paragraph is one text (the CLI's `--docs line`).
            .map(|(c, t)| LanguageTexts {
                code: c.get_untracked(),
                lines: texts(&t.get_untracked(), moe_shared::corpus::DocSplit::Line, 1000),
            })
            .collect();
        msg.set(Message::None);
        out.set(None);
        leptos::task::spawn_local(async move {
            let req = Request::Neurons { model: r, langs: texts, top_n: n, range: (lo, hi) };
            match task.call(req, None).await {
                Ok((Reply::Neurons(r), _)) => {
                    msg.set(Message::Ok(format!(
                        "analysed {} neurons on {} texts in {}; new experts per layer: {:?}",
                        r.neurons,
                        r.texts,
                        task.wall(),
                        r.allocation
                    )));
                    out.set(Some(r));
                }
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let charts = move || {
        out.get().map(|o| {
            let json = serde_json::json!({ "new_experts_per_layer": o.allocation }).to_string();
            let use_it = move |_| {
                shared.allocation.set(Some(json.clone()));
                shared.go(Page::Upcycle);
            };
            view! {
                <NeuronResult o=o/>
                <button data-testid="use-allocation" on:click=use_it>"Use this allocation in Upcycle →"</button>
            }
        })
    };
    view! {
        <h2>"Language-specific neurons → experts per layer (NeuronMoE)"</h2>
        <p class="lead">"Paste a few sentences per language (one per line; the first language is the original one). \
            Each neuron is scored by how well its activation picks out a language (Average Precision). \
            Layers with many specific neurons for the new languages get more experts. \
            When more neurons than N share the N-th AP (common with few texts: they all separate the language perfectly), \
            they share the places left — each counts places / tied (hatched in the chart) — instead of the lowest layers winning by their index."</p>
        <label>"Dense model " <ModelSelect value=model filter=Filter::Dense id="neurons-model"/></label>
        <div class="langs">
            {move || langs.get().into_iter().enumerate().map(|(i, (c, t))| view! {
                <div class="domain">
                    <label>{if i == 0 { "original language " } else { "new language " }}
                        <input type="text" class="short" prop:value=move || c.get() on:input=move |ev| c.set(event_target_value(&ev))/></label>
                    <textarea rows="6" data-testid=format!("neurons-text-{i}") prop:value=move || t.get() on:input=move |ev| t.set(event_target_value(&ev))></textarea>
                </div>
            }).collect_view()}
        </div>
        <div class="row">
            <button class="secondary" on:click=move |_| langs.update(|v| v.push((RwSignal::new(format!("lang{}", v.len())), RwSignal::new(String::new()))))>"+ language"</button>
            <label>"top-N " <input type="number" class="short" prop:value=move || top_n.get() on:input=move |ev| top_n.set(event_target_value(&ev))/></label>
            <label>"E_min " <input type="number" class="short" data-testid="neurons-emin" prop:value=move || e_min.get() on:input=move |ev| e_min.set(event_target_value(&ev))/></label>
            <label>"E_max " <input type="number" class="short" data-testid="neurons-emax" prop:value=move || e_max.get() on:input=move |ev| e_max.set(event_target_value(&ev))/></label>
        </div>
        <button data-testid="neurons-run" on:click=run disabled=move || task.running()>"Analyse"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="neurons"/>
        {charts}
    }
}
