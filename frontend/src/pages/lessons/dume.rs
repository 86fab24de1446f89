//! Lesson: DUME ("Training-Free Dynamic Upcycling of Expert Language
//! Models", 2026; docs/methods.md §2): MoErge the preset's domain experts,
//! solve the ridge router, compare DUME with weight averaging and the
//! oracle on every domain.

use leptos::prelude::*;

use super::{LessonHeader, LessonStep, LoadStep};
use crate::app::Shared;
use crate::components::message::{Message, MessageLine};
use crate::components::progress::Progress;
use crate::compute::route::{mean, DomainText};
use crate::pages::moerge::{RouteResult, RouteView};
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Reply, Request};
use moe_shared::ops::route::RouteParams;

const SLUG: &str = "learn-dume";

/// The DUME lesson.
#[component]
pub fn DumeLesson() -> impl IntoView {
    let shared = Shared::get();
    let merged = RwSignal::new(None::<ModelRef>);
    let merge_task = Task::new();
    let merge_msg = RwSignal::new(Message::None);
    let merge_note = RwSignal::new(None::<String>);
    let merge = move |_| {
        let Some(p) = shared.preset.get_untracked() else {
            return merge_msg.set(Message::Error("load the teaching demo first (step 1)".into()));
        };
        merge_msg.set(Message::None);
        let use_gpu =
            crate::compute::gpu::Engine::choose(&shared.gpu.get_untracked()) == crate::compute::gpu::Engine::WebGpu;
        let n = p.experts.len();
        leptos::task::spawn_local(async move {
            let params = moe_shared::ops::moerge::MoergeParams { top_k: p.settings.dume_top_k, ..Default::default() };
            let req = Request::Moerge { models: p.experts.clone(), params, use_gpu };
            match merge_task.call(req, None).await {
                Ok((Reply::Moerge(a, (tensors, gpu, cpu)), _)) => {
                    merge_msg.set(Message::Ok(format!(
                        "made {}: {tensors} tensors; {} shared tensors averaged; {} experts per layer, in {}",
                        a.name,
                        gpu + cpu,
                        n,
                        merge_task.wall()
                    )));
                    merge_note.set(Some(format!(
                        "the MoE has {} parameters against {} for one expert: the FFNs are kept side by side and nothing \
                         else grew. Because the experts were fine-tuned on their FFNs only, the averaged attention and \
                         norms equal each expert's own — the MoE with the right expert for every token is each expert exactly.",
                        crate::format_params(a.numel()),
                        crate::format_params(a.numel() - (n as u64 - 1) * ffn_params(&a.config)),
                    )));
                    merged.set(Some(a.r));
                }
                Ok(_) => {}
                Err(e) => merge_msg.set(Message::Error(e)),
            }
        });
    };
    let route_task = Task::new();
    let route_msg = RwSignal::new(Message::None);
    let routed = RwSignal::new(None::<RouteView>);
    let route = move |_| {
        let (Some(p), Some(m)) = (shared.preset.get_untracked(), merged.get_untracked()) else {
            return route_msg.set(Message::Error("MoErge the experts first (step 2)".into()));
        };
        route_msg.set(Message::None);
        let domains: Vec<DomainText> = p
            .splits
            .iter()
            .map(|t| DomainText {
                name: t.name.clone(),
                text: t.train.clone(),
                heldout: (!t.heldout.trim().is_empty()).then(|| t.heldout.clone()),
            })
            .collect();
        let names: Vec<String> = domains.iter().map(|d| d.name.clone()).collect();
        let use_gpu =
            crate::compute::gpu::Engine::choose(&shared.gpu.get_untracked()) == crate::compute::gpu::Engine::WebGpu;
        let req = Request::Route {
            model: m,
            domains,
            params: crate::compute::route::tab_params(
                RouteParams::default().lambda,
                p.settings.dume_top_k,
                p.settings.route_tokens,
            ),
            with_ppl: true,
            use_gpu,
        };
        leptos::task::spawn_local(async move {
            match route_task.call(req, None).await {
                Ok((Reply::Route(r), _)) => {
                    route_msg.set(Message::Ok(format!(
                        "made {}: router solved from {} tokens, in {}",
                        r.model.name,
                        r.tokens.iter().sum::<usize>(),
                        route_task.wall()
                    )));
                    routed.set(Some(RouteView { names, accuracy: r.accuracy, tokens: r.tokens, ppl: r.ppl }));
                }
                Ok(_) => {}
                Err(e) => route_msg.set(Message::Error(e)),
            }
        });
    };
    let models = crate::models::Models::get();
    let route_notice = Signal::derive(move || {
        let r = routed.get()?;
        let p = shared.preset.get()?;
        let k = p.settings.dume_top_k;
        let d = models.find(&p.base).map_or(0, |m| m.config.hidden_size);
        let below = r.ppl.iter().filter(|p| p.dume < p.averaging).count();
        let ret: Vec<String> =
            r.ppl.iter().map(|p| format!("{} {:.0}%", p.domain, 100.0 * p.oracle / p.dume)).collect();
        let acc: Vec<String> = r.names.iter().zip(&r.accuracy).map(|(n, a)| format!("{n} {:.2}", mean(a))).collect();
        Some(format!(
            "DUME beats averaging on {below} of {} domains and stays above the oracle, with no gradient step: one \
             forward pass and a ({}+1)² solve per layer. Its retention (oracle / DUME perplexity) is {} — the paper \
             reports up to 97.6% with 7B experts; a {}-wide hidden state tells the domains apart less cleanly \
             (held-out routing accuracy {}), so each misrouted token pays{}.",
            r.ppl.len(),
            d,
            ret.join(", "),
            d,
            acc.join(", "),
            if k > 1 { format!(" less with top-{k} (two experts mixed per token)") } else { String::new() },
        ))
    });
    let route_view = move || routed.get().map(|r| view! { <RouteResult r=r/> });
    let merged_ready = move || merged.get().is_some();
    view! {
        <h2>"Lesson · DUME: merge domain experts into an MoE without training"</h2>
        <LessonHeader paper="“Training-Free Dynamic Upcycling of Expert Language Models” (2026) — docs/methods.md §2"
            claim="Dense models fine-tuned from one base on different domains become one MoE without any training: \
                each model's FFN is an expert, the rest is averaged, and a ridge-regression router solved in closed form \
                from a little text per domain beats plain weight averaging and comes close to always picking the right expert."
            scale="Here: a 260K-parameter base and three experts (English, Python code, Hungarian) fine-tuned by the CLI; \
                the paper merges 7B models. The steps and the formulas are the paper's."/>
        <LoadStep slug=SLUG/>
        <LessonStep slug=SLUG n=2 title="MoErge the experts" notice=Signal::derive(move || merge_note.get())
            does="Each expert's FFN becomes expert i of every layer; embeddings, attention and norms are averaged (f64 sums, rounded once).">
            <button data-testid=format!("{SLUG}-2-run") on:click=merge disabled=move || merge_task.running() || shared.preset.get().is_none()>"MoErge the three experts"</button>
            <Progress task=merge_task/>
            <MessageLine msg=merge_msg id=format!("{SLUG}-2")/>
        </LessonStep>
        <LessonStep slug=SLUG n=3 title="Solve the ridge router and compare" notice=route_notice
            does="Each domain's text is pushed through its own expert; every layer collects the FFN inputs and solves W = (XᵀX + λI)⁻¹XᵀY. \
                Then each domain's held-out documents (never trained on) are scored three ways: DUME (the solved router), averaging (all experts merged into one FFN) and the oracle (every token to its domain's expert).">
            <button data-testid=format!("{SLUG}-3-run") on:click=route disabled=move || route_task.running() || !merged_ready()>"Solve the router and score"</button>
            <Progress task=route_task/>
            <MessageLine msg=route_msg id=format!("{SLUG}-3")/>
            {route_view}
        </LessonStep>
    }
}

/// The FFN parameters of one layer's dense FFN, times the layers.
fn ffn_params(c: &moe_shared::config::ModelConfig) -> u64 {
    3 * c.hidden_size as u64 * c.intermediate_size as u64 * c.num_layers as u64
}
