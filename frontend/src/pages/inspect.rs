//! Inspect: each token coloured by the experts the router sends it to at
//! one layer (all `top_k` choices, each as wide as its routing weight), the
//! load per expert counted from the same choices, and greedy generation by
//! the dense model and its MoE side by side (the teaching view).

use leptos::prelude::*;

use crate::components::chart::{color, BarChart, Series};
use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::compute::inspect::{Inspection, TokenRoute};
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{Continuation, Reply, Request};

/// Background and tooltip of a token span. Each token of the span gets an
/// equal share of the width (a character split into byte tokens has
/// several), and within it each chosen expert a stripe as wide as its
/// routing weight: with top-2 and a zero router every token is half expert
/// 0 and half expert 1, as the load chart counts.
pub fn token_style(routes: &[TokenRoute]) -> (String, String) {
    let stripes: Vec<(usize, f64)> = routes
        .iter()
        .flat_map(|r| r.iter().map(move |&(e, w)| (e, f64::from(w) / routes.len() as f64)))
        .filter(|&(_, w)| w > 0.0)
        .collect();
    let title = routes
        .iter()
        .map(|r| r.iter().map(|(e, w)| format!("expert {e} ({w:.2})")).collect::<Vec<_>>().join(" + "))
        .collect::<Vec<_>>()
        .join(" · ");
    let title =
        if routes.len() > 1 { format!("{title} ({} byte tokens of one character)", routes.len()) } else { title };
    match stripes.as_slice() {
        [] => (String::new(), title),
        [(e, _)] => (format!("background:{}", color(*e)), title),
        _ if stripes.iter().all(|(e, _)| *e == stripes[0].0) => (format!("background:{}", color(stripes[0].0)), title),
        _ => {
            let mut at = 0.0;
            let stops: Vec<String> = stripes
                .iter()
                .map(|&(e, w)| {
                    let s = format!("{} {:.0}% {:.0}%", color(e), 100.0 * at, 100.0 * (at + w));
                    at += w;
                    s
                })
                .collect();
            (format!("background:linear-gradient(90deg, {})", stops.join(", ")), title)
        }
    }
}

#[component]
fn Generation() -> impl IntoView {
    let dense = RwSignal::new(None::<ModelRef>);
    let moe = RwSignal::new(None::<ModelRef>);
    let prompt = RwSignal::new("Once upon a time".to_string());
    let new_tokens = RwSignal::new("40".to_string());
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let out = RwSignal::new(Vec::<Continuation>::new());
    Effect::new(move |_| {
        let _ = (dense.get(), moe.get(), prompt.get(), new_tokens.get());
        msg.set(Message::None);
    });
    let run = move |_| {
        let models: Vec<ModelRef> = [dense.get_untracked(), moe.get_untracked()].into_iter().flatten().collect();
        let Ok(n) = new_tokens.get_untracked().trim().parse::<usize>() else {
            return msg.set(Message::Error("new tokens must be a whole number".into()));
        };
        let req = Request::Generate { models, prompt: prompt.get_untracked(), max_new_tokens: n };
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            match task.call(req, None).await {
                Ok((Reply::Generate(v), _)) => {
                    msg.set(Message::Ok(format!("generated in {}", task.wall())));
                    out.set(v);
                }
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    view! {
        <h3>"Generate: dense vs MoE"</h3>
        <p class="small">"The same prompt, greedy decoding (the most likely token every step), as " <code>"moe-studio generate"</code>
            ". Right after upcycling the two agree token for token; after training, routing or grafting they part."</p>
        <div class="row">
            <label>"dense " <ModelSelect value=dense filter=Filter::Dense id="gen-dense" prefer_first=true/></label>
            <label>"MoE " <ModelSelect value=moe filter=Filter::Moe id="gen-moe" follow=true/></label>
            <label>"new tokens " <input type="number" min="1" max=crate::compute::generate::MAX_NEW_TOKENS class="short" data-testid="gen-tokens"
                prop:value=move || new_tokens.get() on:input=move |ev| new_tokens.set(event_target_value(&ev))/></label>
        </div>
        <textarea rows="2" data-testid="gen-prompt" prop:value=move || prompt.get() on:input=move |ev| prompt.set(event_target_value(&ev))></textarea>
        <button data-testid="gen-run" on:click=run disabled=move || task.running()>"Generate"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="gen"/>
        <table class="grid" data-testid="gen-table">
            <tbody>{move || out.get().into_iter().map(|c| view! {
                <tr><td><b>{c.model.clone()}</b><br/><span class="small">{format!("{} tokens, {:.1} s", c.tokens, c.millis / 1000.0)}</span></td>
                    <td class="gen-text"><span class="small">{prompt.get_untracked()}</span>{c.text.clone()}</td></tr>
            }).collect_view()}</tbody>
        </table>
    }
}

/// The last line of each domain text (held-out lines in the preset), cut
/// to at most 160 characters on a word boundary, one line per domain.
fn preset_sample(texts: &[(String, String)]) -> String {
    texts
        .iter()
        .filter_map(|(_, t)| t.lines().rev().find(|l| !l.trim().is_empty()))
        .map(|l| {
            let l = l.trim();
            if l.chars().count() <= 160 {
                return l.to_string();
            }
            let cut: String = l.chars().take(160).collect();
            match cut.rfind(' ') {
                Some(i) if i > 40 => cut[..i].to_string(),
                _ => cut,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The Inspect page.
#[component]
pub fn InspectPage() -> impl IntoView {
    let model = RwSignal::new(None::<ModelRef>);
    let layer = RwSignal::new("0".to_string());
    let text = RwSignal::new(
        "Once upon a time there was a little dog. Egyszer volt egy kis kutya, aki szeretett a parkban futni."
            .to_string(),
    );
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let result = RwSignal::new(None::<Inspection>);
    // The teaching preset: one held-out line of each domain, so that the
    // routed MoE sends each domain's tokens to its own expert.
    let shared = crate::app::Shared::get();
    Effect::new(move |_| {
        if let Some(p) = shared.preset.get() {
            text.set(preset_sample(&p.texts));
        }
    });
    let run = move |_| {
        let Some(r) = model.get_untracked() else {
            return msg.set(Message::Error("choose an MoE model".into()));
        };
        let Ok(l) = layer.get_untracked().trim().parse::<usize>() else {
            return msg.set(Message::Error("layer must be a whole number".into()));
        };
        let req = Request::Inspect { model: r, text: text.get_untracked(), layer: l };
        leptos::task::spawn_local(async move {
            match task.call(req, None).await {
                Ok((Reply::Inspect(r), _)) => {
                    msg.set(Message::None);
                    result.set(Some(r));
                }
                Ok(_) => {}
                Err(e) => {
                    msg.set(Message::Error(e));
                    result.set(None);
                }
            }
        });
    };
    let shown = move || {
        result.get().map(|r| {
            let legend = (0..r.experts)
                .map(|e| view! { <span class="legend"><i style=format!("background:{}", color(e))></i>{format!("expert {e}")}</span> })
                .collect_view();
            let toks = r
                .tokens
                .iter()
                .map(|(t, routes)| {
                    let (style, title) = token_style(routes);
                    view! { <span class="tok" style=style title=title>{t.clone()}</span> }
                })
                .collect_view();
            // One series per expert (its own colour), one bar each.
            let load: Vec<Series> = (0..r.experts)
                .map(|e| Series {
                    label: format!("expert {e}"),
                    values: (0..r.experts).map(|g| (g == e).then(|| r.load[e])).collect(),
                })
                .collect();
            let how = if r.top_k > 1 {
                format!("each token shows its {} chosen experts, each as wide as its routing weight", r.top_k)
            } else {
                "each token shows its chosen expert".to_string()
            };
            view! {
                <div class="legends">{legend}</div>
                <p class="small">{how}</p>
                <p class="tokens" data-testid="inspect-tokens">{toks}</p>
                <BarChart title="Load per expert at this layer (share of routed token slots: the same choices as the colours)" x_label="expert"
                    groups=(0..r.experts).map(|e| e.to_string()).collect() series=load max=1.0/>
                <p class="small">{format!("MoE layers: {:?}", r.moe_layers)}</p>
            }
        })
    };
    view! {
        <h2>"Inspect routing"</h2>
        <p class="lead">"Type text and see which experts the router sends each token to at one layer. \
            After the ridge router, text from different domains tends to go to different experts."</p>
        <div class="row">
            <label>"MoE model " <ModelSelect value=model filter=Filter::Moe id="inspect-model" follow=true/></label>
            <label>"layer " <input type="number" min="0" class="short" data-testid="inspect-layer" prop:value=move || layer.get() on:input=move |ev| layer.set(event_target_value(&ev))/></label>
        </div>
        <textarea rows="3" data-testid="inspect-text" prop:value=move || text.get() on:input=move |ev| text.set(event_target_value(&ev))></textarea>
        <button data-testid="inspect-run" on:click=run disabled=move || task.running()>"Route"</button>
        <Progress task=task/>
        <MessageLine msg=msg id="inspect"/>
        {shown}
        <Generation/>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_follow_every_chosen_expert_and_its_weight() {
        assert_eq!(token_style(&[vec![(1, 1.0)]]), (format!("background:{}", color(1)), "expert 1 (1.00)".into()));
        // Zero router, top-2: half and half, like the load chart's 50/50.
        let (bg, title) = token_style(&[vec![(0, 0.5), (1, 0.5)]]);
        assert_eq!(bg, format!("background:linear-gradient(90deg, {} 0% 50%, {} 50% 100%)", color(0), color(1)));
        assert_eq!(title, "expert 0 (0.50) + expert 1 (0.50)");
        // Two byte tokens of one character, both to expert 1.
        let (bg, title) = token_style(&[vec![(1, 1.0)], vec![(1, 1.0)]]);
        assert_eq!(bg, format!("background:{}", color(1)));
        assert!(title.ends_with("(2 byte tokens of one character)"), "{title}");
        // ... to different experts: one stripe each.
        let (bg, _) = token_style(&[vec![(0, 1.0)], vec![(1, 1.0)]]);
        assert_eq!(bg, format!("background:linear-gradient(90deg, {} 0% 50%, {} 50% 100%)", color(0), color(1)));
    }
}
