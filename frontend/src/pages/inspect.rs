//! Inspect: each token coloured by the expert it goes to at one layer, and
//! the load per expert (the teaching view).

use leptos::prelude::*;

use crate::components::chart::{color, BarChart, Series};
use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::compute::inspect::{inspect, Inspection};
use crate::store::{pick, ModelRef};

/// Background and tooltip of a token span: its expert's colour; a
/// character split into byte tokens routed to different experts gets one
/// stripe per byte token, and the tooltip names them.
fn token_style(experts: &[usize]) -> (String, String) {
    match experts {
        [] => (String::new(), String::new()),
        [e] => (format!("background:{}", color(*e)), format!("expert {e}")),
        [first, rest @ ..] if rest.iter().all(|e| e == first) => (
            format!("background:{}", color(*first)),
            format!("expert {first} ({} byte tokens of one character)", experts.len()),
        ),
        _ => {
            let n = experts.len() as f64;
            let stops: Vec<String> = experts
                .iter()
                .enumerate()
                .map(|(i, &e)| format!("{} {:.0}% {:.0}%", color(e), 100.0 * i as f64 / n, 100.0 * (i + 1) as f64 / n))
                .collect();
            let names: Vec<String> = experts.iter().map(usize::to_string).collect();
            (
                format!("background:linear-gradient(90deg, {})", stops.join(", ")),
                format!("experts {} (byte tokens of one character)", names.join(" · ")),
            )
        }
    }
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
    let msg = RwSignal::new(Message::None);
    let result = RwSignal::new(None::<Inspection>);
    let run = move |_| {
        let Some(p) = model.get_untracked().and_then(|r| pick(&r)) else {
            return msg.set(Message::Error("choose an MoE model".into()));
        };
        let Ok(l) = layer.get_untracked().trim().parse::<usize>() else {
            return msg.set(Message::Error("layer must be a whole number".into()));
        };
        match inspect(&p, &text.get_untracked(), l) {
            Ok(r) => {
                msg.set(Message::None);
                result.set(Some(r));
            }
            Err(e) => {
                msg.set(Message::Error(e));
                result.set(None);
            }
        }
    };
    let shown = move || {
        result.get().map(|r| {
            let legend = (0..r.experts)
                .map(|e| view! { <span class="legend"><i style=format!("background:{}", color(e))></i>{format!("expert {e}")}</span> })
                .collect_view();
            let toks = r
                .tokens
                .iter()
                .map(|(t, experts)| {
                    let (style, title) = token_style(experts);
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
            view! {
                <div class="legends">{legend}</div>
                <p class="tokens" data-testid="inspect-tokens">{toks}</p>
                <BarChart title="Load per expert at this layer (share of routed token slots)" x_label="expert"
                    groups=(0..r.experts).map(|e| e.to_string()).collect() series=load max=1.0/>
                <p class="small">{format!("MoE layers: {:?}", r.moe_layers)}</p>
            }
        })
    };
    view! {
        <h2>"Inspect routing"</h2>
        <p class="lead">"Type text and see which expert the router sends each token to at one layer (top-1 choice). \
            After the ridge router, text from different domains tends to go to different experts."</p>
        <div class="row">
            <label>"MoE model " <ModelSelect value=model filter=Filter::Moe id="inspect-model"/></label>
            <label>"layer " <input type="number" min="0" class="short" data-testid="inspect-layer" prop:value=move || layer.get() on:input=move |ev| layer.set(event_target_value(&ev))/></label>
        </div>
        <textarea rows="3" data-testid="inspect-text" prop:value=move || text.get() on:input=move |ev| text.set(event_target_value(&ev))></textarea>
        <button data-testid="inspect-run" on:click=run>"Route"</button>
        <MessageLine msg=msg id="inspect"/>
        {shown}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_character_shows_its_experts() {
        assert_eq!(token_style(&[1]), (format!("background:{}", color(1)), "expert 1".into()));
        let (bg, title) = token_style(&[1, 1]);
        assert_eq!(bg, format!("background:{}", color(1)));
        assert_eq!(title, "expert 1 (2 byte tokens of one character)");
        let (bg, title) = token_style(&[0, 1]);
        assert_eq!(bg, format!("background:linear-gradient(90deg, {} 0% 50%, {} 50% 100%)", color(0), color(1)));
        assert_eq!(title, "experts 0 · 1 (byte tokens of one character)");
    }
}
