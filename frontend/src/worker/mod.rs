//! The studio's Web Worker: every heavy step runs there, so the page only
//! renders and never blocks (issue 19).
//!
//! One wasm binary, two instances: the page's `main` mounts the Leptos app;
//! the same module started inside a module worker ([`client::spawn`] makes
//! its bootstrap from the page's own script URLs) finds no `window` and
//! runs [`host::start`] instead. The worker holds the models
//! ([`crate::store`]) and runs the [`crate::compute`] functions one request
//! at a time; the page holds what it shows of them
//! ([`protocol::ModelInfo`], [`crate::models`]).
//!
//! - Progress: the methods report real units of work (tensors, texts,
//!   tokens, layers) as messages ([`crate::compute::progress`]); the page
//!   shows them with its own wall clock.
//! - Cancel: a busy worker reads no messages, so Cancel terminates it and
//!   starts a new one at once (no `SharedArrayBuffer`, which needs
//!   COOP/COEP headers that a plain static server may not send). The new
//!   worker restores the models from the browser's storage
//!   ([`persist`]): the task stops at once and the models come back.
//! - Panic: the worker's panic hook sends the message before the module
//!   traps; the page shows it where the task was started, and restarts and
//!   restores the worker as for Cancel. The tab stays usable.

pub mod client;
pub mod host;
pub mod persist;
pub mod protocol;

/// Whether this code runs inside a dedicated worker (no `window`).
pub fn in_worker() -> bool {
    use wasm_bindgen::JsCast;
    js_sys::global().dyn_ref::<web_sys::DedicatedWorkerGlobalScope>().is_some()
}
