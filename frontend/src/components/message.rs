//! A line of feedback under an action: an error (red) or a result (green).

use leptos::prelude::*;

/// What the last action said.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Nothing to say.
    None,
    /// It worked.
    Ok(String),
    /// It failed; the message says why and what to do.
    Error(String),
}

/// Shows a [`Message`] (with `data-testid` for the end-to-end tests).
#[component]
pub fn MessageLine(msg: RwSignal<Message>, #[prop(into)] id: String) -> impl IntoView {
    move || match msg.get() {
        Message::None => ().into_any(),
        Message::Ok(s) => view! { <p class="msg ok" data-testid=format!("{id}-ok")>{s}</p> }.into_any(),
        Message::Error(s) => {
            view! { <p class="msg error" role="alert" data-testid=format!("{id}-error")>{s}</p> }.into_any()
        }
    }
}
