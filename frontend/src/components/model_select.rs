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
/// current value is empty, the newest matching model is chosen. With
/// `follow`, a matching model that appears later (made by a step on another
/// page, or loaded) is chosen too: each step's output is the next step's
/// input (the teaching flow Upcycle -> MoErge -> router -> Graft ->
/// Inspect), and the user can still pick another one. While `hold` is
/// true (the page's own task runs), new models are not followed: a step's
/// output is not that step's next input.
#[component]
pub fn ModelSelect(
    value: RwSignal<Option<ModelRef>>,
    filter: Filter,
    #[prop(into)] id: String,
    #[prop(optional)] prefer_first: bool,
    #[prop(optional)] follow: bool,
    #[prop(optional, into)] hold: Option<Signal<bool>>,
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
    // The matching models seen so far (to tell a new one from a re-render).
    let seen = StoredValue::new(Vec::<ModelRef>::new());
    Effect::new(move |_| {
        let c = choices();
        let current = value.get_untracked();
        let valid = current.as_ref().is_some_and(|v| c.iter().any(|(r, _, _)| r == v));
        let newest_is_new = c.last().is_some_and(|(r, _, _)| !seen.with_value(|s| s.contains(r)));
        seen.set_value(c.iter().map(|(r, _, _)| r.clone()).collect());
        let held = hold.is_some_and(|h| h.get_untracked());
        if !valid || (follow && newest_is_new && !held) {
            let pick = if prefer_first && !follow { c.first() } else { c.last() };
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
