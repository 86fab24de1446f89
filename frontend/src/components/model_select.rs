//! A `<select>` over the studio's models (inputs and produced checkpoints).

use leptos::prelude::*;

use crate::models::Models;
use crate::store::ModelRef;

/// Which models a select offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Every model.
    Any,
    /// Dense models only.
    Dense,
    /// MoE models only.
    Moe,
}

/// A model picker bound to `value` (`None` until a model exists). When the
/// current value is empty, the newest matching model is chosen.
#[component]
pub fn ModelSelect(
    value: RwSignal<Option<ModelRef>>,
    filter: Filter,
    #[prop(into)] id: String,
    #[prop(optional)] prefer_first: bool,
) -> impl IntoView {
    let models = Models::get();
    let choices = move || {
        models
            .choices()
            .into_iter()
            .filter(|(_, _, moe)| match filter {
                Filter::Any => true,
                Filter::Dense => !moe,
                Filter::Moe => *moe,
            })
            .collect::<Vec<_>>()
    };
    Effect::new(move |_| {
        let c = choices();
        let current = value.get_untracked();
        let valid = current.as_ref().is_some_and(|v| c.iter().any(|(r, _, _)| r == v));
        if !valid {
            let pick = if prefer_first { c.first() } else { c.last() };
            value.set(pick.map(|(r, _, _)| r.clone()));
        }
    });
    view! {
        <select data-testid=id on:change=move |ev| value.set(ModelRef::parse(&event_target_value(&ev)))>
            {move || {
                let c = choices();
                if c.is_empty() {
                    return view! { <option value="">"(no model loaded yet — see Load)"</option> }.into_any();
                }
                let cur = value.get();
                c.into_iter()
                    .map(|(r, label, _)| {
                        let selected = cur.as_ref() == Some(&r);
                        view! { <option value=r.key() selected=selected>{label}</option> }
                    })
                    .collect_view()
                    .into_any()
            }}
        </select>
    }
}
