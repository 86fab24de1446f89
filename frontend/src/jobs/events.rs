//! Following a job live: `GET /api/jobs/{id}/events` through the browser's
//! `EventSource` (events `state`, `progress`, `log`, `memory`; `data:` is a
//! [`JobEvent`] as JSON).

use moe_shared::api::JobEvent;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsCast;

/// An open event stream; dropping it closes the stream.
pub struct Follow {
    /// The job followed.
    pub job: String,
    source: web_sys::EventSource,
    _on_message: Closure<dyn FnMut(web_sys::MessageEvent)>,
    _on_error: Closure<dyn FnMut(web_sys::Event)>,
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.source.close();
    }
}

/// Opens the event stream of `job`. `on_event` gets every event;
/// `on_error` a readable line when the stream breaks (the browser
/// reconnects by itself unless the stream was closed for good, which the
/// line says).
///
/// # Errors
/// The browser refused to open an `EventSource`.
pub fn follow(
    job: &str,
    on_event: impl Fn(JobEvent) + 'static,
    on_error: impl Fn(String) + 'static,
) -> Result<Follow, String> {
    let source = web_sys::EventSource::new(&format!("api/jobs/{job}/events"))
        .map_err(|e| format!("cannot open the event stream: {}", e.as_string().unwrap_or_default()))?;
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
        let Some(text) = ev.data().as_string() else { return };
        match serde_json::from_str::<JobEvent>(&text) {
            Ok(e) => on_event(e),
            Err(e) => web_sys::console::warn_1(&format!("job event not understood ({e}): {text}").into()),
        }
    });
    for name in ["state", "progress", "log", "memory"] {
        source
            .add_event_listener_with_callback(name, on_message.as_ref().unchecked_ref())
            .map_err(|_| format!("cannot listen to `{name}` events"))?;
    }
    let s2 = source.clone();
    let on_error_cb = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
        if s2.ready_state() == web_sys::EventSource::CLOSED {
            on_error("the event stream was closed by the server; reload the job to reconnect".into());
        } else {
            on_error("the event stream was interrupted; reconnecting…".into());
        }
    });
    source.set_onerror(Some(on_error_cb.as_ref().unchecked_ref()));
    Ok(Follow { job: job.to_string(), source, _on_message: on_message, _on_error: on_error_cb })
}
