//! The page's side of the worker: starts it, sends [`Request`]s and
//! resolves each call when its `Done` arrives, routes progress to the
//! caller, keeps the page's model list ([`crate::models`]) in step, and
//! restarts the worker on Cancel or a panic (see [`super`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use js_sys::{Array, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use super::protocol::{Event, ModelInfo, Reply, Request};
use crate::compute::progress::Step;
use crate::compute::train::TrainPoint;

/// The answer of a call: the reply and the `Blob` beside it (downloads).
pub type Answer = Result<(Reply, Option<web_sys::Blob>), String>;

/// The worker's WebGPU news ([`Event::Gpu`]): the adapter, or why not.
pub type GpuAnswer = Result<String, String>;

/// The error of a call whose worker was stopped by the user.
pub const CANCELLED: &str = "cancelled: the studio stopped its worker at once and restores the kept models";

struct Pending {
    request: Request,
    resolve: js_sys::Function,
    on_progress: Rc<dyn Fn(Step)>,
    on_started: Rc<dyn Fn()>,
    on_point: Option<Rc<dyn Fn(TrainPoint)>>,
}

#[derive(Default)]
struct State {
    worker: Option<web_sys::Worker>,
    next: u64,
    pending: HashMap<u64, Pending>,
    done: HashMap<u64, Answer>,
    running: Option<u64>,
    /// Whether the current worker said [`Event::Ready`]; until then the
    /// requests wait in `outbox` (a message posted before the worker's
    /// module has set its handler would be lost).
    ready: bool,
    outbox: Vec<JsValue>,
    on_models: Option<Rc<dyn Fn(Vec<ModelInfo>)>>,
    on_restart: Option<Rc<dyn Fn(String)>>,
    on_ready: Option<Rc<dyn Fn()>>,
    on_gpu: Option<Rc<dyn Fn(GpuAnswer)>>,
    inject_panic: bool,
    generation: u64,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// The script the worker starts from: the page's own wasm-bindgen glue
/// (index.html's `modulepreload` link, made absolute) initialised with the
/// page's compiled `WebAssembly.Module`, which the page posts as the
/// worker's first message ([`spawn`]) — the worker runs the same module
/// without compiling it a second time. Without that module (a page that
/// was not started by wasm-bindgen's `init`) it compiles the wasm from the
/// `preload` link's URL.
fn bootstrap_source() -> Result<String, String> {
    let doc = web_sys::window().and_then(|w| w.document()).ok_or("no document")?;
    let href = |sel: &str| -> Option<String> {
        let el = doc.query_selector(sel).ok()??;
        let h = el.get_attribute("href")?;
        web_sys::Url::new_with_base(&h, &doc.base_uri().ok()??).ok().map(|u| u.href())
    };
    let js = href("link[rel=modulepreload][href$='.js']")
        .ok_or("the page has no module link to its script (build it with scripts/build_web.sh)")?;
    let wasm = href("link[rel=preload][href$='.wasm']")
        .ok_or("the page has no preload link to its wasm (build it with scripts/build_web.sh)")?;
    let base = doc.base_uri().ok().flatten().unwrap_or_default();
    // No top-level `await`: the module's evaluation ends at once, so the
    // worker's message port is open before the page's first message (with
    // a top-level await, messages that arrive during it find no handler
    // and are lost). The page sends nothing else before `Ready`, which the
    // wasm's `main` posts once its own handler is set.
    Ok(format!(
        "import init from {js:?};\n\
         self.__moeStudioBase = {base:?};\n\
         self.onmessage = (e) => {{\n\
           self.onmessage = null;\n\
           const m = e.data && e.data.moeStudioModule;\n\
           init({{ module_or_path: m instanceof WebAssembly.Module ? m : {wasm:?} }})\n\
             .catch((err) => setTimeout(() => {{ throw err; }}));\n\
         }};\n"
    ))
}

/// Starts the worker (once; [`restart`] makes a new one).
///
/// # Errors
/// When the page's script URLs are not found or the browser refuses a
/// module worker.
pub fn spawn() -> Result<(), String> {
    let src = bootstrap_source()?;
    let parts = Array::of1(&JsValue::from_str(&src));
    let opts = web_sys::BlobPropertyBag::new();
    opts.set_type("text/javascript");
    let blob = web_sys::Blob::new_with_str_sequence_and_options(&parts, &opts)
        .map_err(|e| crate::web::js_err("worker script", e))?;
    let url = web_sys::Url::create_object_url_with_blob(&blob).map_err(|e| crate::web::js_err("worker URL", e))?;
    let wopts = web_sys::WorkerOptions::new();
    wopts.set_type(web_sys::WorkerType::Module);
    wopts.set_name("moe-studio");
    let worker = web_sys::Worker::new_with_options(&url, &wopts)
        .map_err(|e| crate::web::js_err("starting the studio's worker", e))?;
    let generation = STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.generation += 1;
        s.ready = false;
        s.generation
    });
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
        on_message(generation, ev.data());
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_error = Closure::<dyn FnMut(web_sys::ErrorEvent)>::new(move |ev: web_sys::ErrorEvent| {
        // A worker that failed to start (or threw outside a task) is dead:
        // say so on the page's running task.
        on_crash(generation, format!("the studio's worker stopped: {}", ev.message()));
    });
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    // The page's compiled module (wasm-bindgen keeps it; a `Module` is
    // cloned to a worker of the same page, not recompiled).
    let first = js_sys::Object::new();
    let _ = Reflect::set(&first, &JsValue::from_str("moeStudioModule"), &wasm_bindgen::module());
    worker.post_message(&first).map_err(|e| crate::web::js_err("starting the studio's worker", e))?;
    STATE.with(|s| s.borrow_mut().worker = Some(worker));
    Ok(())
}

/// What the page does with the worker's news.
pub struct Handlers {
    /// The worker's model list changed.
    pub on_models: Box<dyn Fn(Vec<ModelInfo>)>,
    /// The worker was restarted (Cancel or a crash): the reason.
    pub on_restart: Box<dyn Fn(String)>,
    /// A (new) worker is up and takes requests.
    pub on_ready: Box<dyn Fn()>,
    /// The worker's background WebGPU start answered ([`Event::Gpu`]).
    pub on_gpu: Box<dyn Fn(GpuAnswer)>,
}

/// Sets the page's [`Handlers`], and whether a task may be made to panic
/// (the crash-path test: `?inject-panic` in the page's URL).
pub fn configure(h: Handlers, inject_panic: bool) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.on_models = Some(Rc::from(h.on_models));
        s.on_restart = Some(Rc::from(h.on_restart));
        s.on_ready = Some(Rc::from(h.on_ready));
        s.on_gpu = Some(Rc::from(h.on_gpu));
        s.inject_panic = inject_panic;
    });
}

/// Whether the page asked for the crash-path test and no task has
/// panicked for it yet (the flag is cleared).
pub fn take_injected_panic() -> bool {
    STATE.with(|s| std::mem::take(&mut s.borrow_mut().inject_panic))
}

fn on_message(generation: u64, data: JsValue) {
    if STATE.with(|s| s.borrow().generation) != generation {
        return; // a terminated worker's last words
    }
    let json = Reflect::get(&data, &JsValue::from_str("event")).ok().and_then(|v| v.as_string()).unwrap_or_default();
    let blob = Reflect::get(&data, &JsValue::from_str("blob")).ok().and_then(|b| b.dyn_into::<web_sys::Blob>().ok());
    let event: Event = match serde_json::from_str(&json) {
        Ok(e) => e,
        Err(e) => return web_sys::console::error_1(&JsValue::from_str(&format!("worker message: {e}"))),
    };
    match event {
        Event::Ready => {
            let (worker, outbox, cb) = STATE.with(|s| {
                let mut s = s.borrow_mut();
                s.ready = true;
                (s.worker.clone(), std::mem::take(&mut s.outbox), s.on_ready.clone())
            });
            if let Some(w) = worker {
                for msg in outbox {
                    if let Err(e) = w.post_message(&msg) {
                        web_sys::console::error_1(&JsValue::from_str(&crate::web::js_err("sending to the worker", e)));
                    }
                }
            }
            if let Some(cb) = cb {
                cb();
            }
        }
        Event::Gpu(r) => {
            let cb = STATE.with(|s| s.borrow().on_gpu.clone());
            if let Some(cb) = cb {
                cb(r);
            }
        }
        Event::Started { id } => {
            let cb = STATE.with(|s| {
                let mut s = s.borrow_mut();
                s.running = Some(id);
                s.pending.get(&id).map(|p| p.on_started.clone())
            });
            if let Some(cb) = cb {
                cb();
            }
        }
        Event::Progress { id, step } => {
            let cb = STATE.with(|s| s.borrow().pending.get(&id).map(|p| p.on_progress.clone()));
            if let Some(cb) = cb {
                cb(step);
            }
        }
        Event::TrainPoint { id, point } => {
            let cb = STATE.with(|s| s.borrow().pending.get(&id).and_then(|p| p.on_point.clone()));
            if let Some(cb) = cb {
                cb(point);
            }
        }
        Event::Done { id, result } => finish(id, result.map(|r| (r, blob))),
        Event::Models(m) => {
            let cb = STATE.with(|s| s.borrow().on_models.clone());
            if let Some(cb) = cb {
                cb(m);
            }
        }
        Event::Panicked(msg) => on_crash(generation, format!("the task crashed inside the studio's worker: {msg}")),
    }
}

fn finish(id: u64, answer: Answer) {
    let resolve = STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.running == Some(id) {
            s.running = None;
        }
        let p = s.pending.remove(&id)?;
        s.done.insert(id, answer);
        Some(p.resolve)
    });
    if let Some(r) = resolve {
        let _ = r.call0(&JsValue::NULL);
    }
}

/// The running task panicked or the worker died: fail the running task
/// with `why`, the waiting ones as cancelled, and restart.
fn on_crash(generation: u64, why: String) {
    if STATE.with(|s| s.borrow().generation) != generation {
        return;
    }
    let running = STATE.with(|s| s.borrow().running);
    restart_with(running, &why);
}

/// Stops the worker at once (Cancel): every call in flight fails with
/// [`CANCELLED`]; a new worker starts and restores the kept models.
pub fn restart() {
    restart_with(None, CANCELLED);
}

fn restart_with(running: Option<u64>, why: &str) {
    let (ids, cb) = STATE.with(|s| {
        let mut s = s.borrow_mut();
        if let Some(w) = s.worker.take() {
            w.terminate();
        }
        s.running = None;
        s.ready = false;
        s.outbox.clear();
        (s.pending.keys().copied().collect::<Vec<_>>(), s.on_restart.clone())
    });
    for id in ids {
        let msg = if Some(id) == running { why.to_string() } else { CANCELLED.to_string() };
        finish(id, Err(msg));
    }
    if let Err(e) = spawn() {
        web_sys::console::error_1(&JsValue::from_str(&e));
    }
    if let Some(cb) = cb {
        cb(why.to_string());
    }
}

/// Sends `request` (with `files` beside it) and waits for its answer;
/// `on_started` when the worker takes it up, `on_progress` for its steps.
pub async fn call_with(
    request: Request,
    files: Option<Array>,
    on_started: impl Fn() + 'static,
    on_progress: impl Fn(Step) + 'static,
) -> Answer {
    call_observed(request, files, on_started, on_progress, None).await
}

/// [`call_with`], and `on_point` for each training step the worker
/// reports ([`Event::TrainPoint`]).
pub async fn call_observed(
    request: Request,
    files: Option<Array>,
    on_started: impl Fn() + 'static,
    on_progress: impl Fn(Step) + 'static,
    on_point: Option<Rc<dyn Fn(TrainPoint)>>,
) -> Answer {
    let json = serde_json::to_string(&request).map_err(|e| e.to_string())?;
    let mut resolve: Option<js_sys::Function> = None;
    let promise = js_sys::Promise::new(&mut |res, _| resolve = Some(res));
    let id = STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.next += 1;
        let id = s.next;
        s.pending.insert(
            id,
            Pending {
                request: request.clone(),
                resolve: resolve.take().expect("the Promise executor runs at once"),
                on_progress: Rc::new(on_progress),
                on_started: Rc::new(on_started),
                on_point,
            },
        );
        id
    });
    let msg = js_sys::Object::new();
    let _ = Reflect::set(&msg, &JsValue::from_str("id"), &JsValue::from_f64(id as f64));
    let _ = Reflect::set(&msg, &JsValue::from_str("request"), &JsValue::from_str(&json));
    if let Some(f) = &files {
        let _ = Reflect::set(&msg, &JsValue::from_str("files"), f);
    }
    let sent = STATE.with(|s| {
        let mut s = s.borrow_mut();
        match &s.worker {
            Some(w) if s.ready => w.post_message(&msg).map_err(|e| crate::web::js_err("sending to the worker", e)),
            Some(_) => {
                s.outbox.push(msg.into());
                Ok(())
            }
            None => Err("the studio's worker is not running (reload the page)".to_string()),
        }
    });
    if let Err(e) = sent {
        finish(id, Err(e));
    }
    let _ = JsFuture::from(promise).await;
    STATE.with(|s| s.borrow_mut().done.remove(&id)).unwrap_or_else(|| Err("the worker gave no answer".into()))
}

/// [`call_with`] without progress.
pub async fn call(request: Request) -> Answer {
    call_with(request, None, || {}, |_| {}).await
}

/// The request the worker is running now, if any.
pub fn running() -> Option<Request> {
    STATE.with(|s| {
        let s = s.borrow();
        s.running.and_then(|id| s.pending.get(&id)).map(|p| p.request.clone())
    })
}
