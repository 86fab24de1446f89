//! The worker's side: takes [`Request`]s one at a time, runs them on the
//! models it holds ([`crate::store`]) with the [`crate::compute`]
//! functions, and posts [`Event`]s back (progress, results, the model list).
//!
//! A message from the page is `{id, request: JSON, files?: [File]}`; a
//! message to the page is `{event: JSON, blob?: Blob}`.

use std::cell::RefCell;
use std::collections::VecDeque;

use js_sys::{Array, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use super::persist::{self, Entry, Kind};
use super::protocol::{DeltaRow, Event, LogitsReply, Reply, Request, RouteReply, StorageInfo};
use crate::compute::progress::Progress;
use crate::load::{demo_model, model_from_files_named};
use crate::store::{info, need, pick, update_store, with_store, Artifact, InputModel, ModelRef, Origin, Picked, Slot};
use crate::web::{read_blob, PickedFile};

struct Queued {
    id: u64,
    request: Request,
    files: JsValue,
}

thread_local! {
    static QUEUE: RefCell<VecDeque<Queued>> = const { RefCell::new(VecDeque::new()) };
    static BUSY: RefCell<bool> = const { RefCell::new(false) };
}

fn scope() -> web_sys::DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

/// Posts `event` (and a `Blob` beside it) to the page.
pub fn post(event: &Event, blob: Option<&web_sys::Blob>) {
    let msg = js_sys::Object::new();
    let json = serde_json::to_string(event).expect("events serialise");
    let _ = Reflect::set(&msg, &JsValue::from_str("event"), &JsValue::from_str(&json));
    if let Some(b) = blob {
        let _ = Reflect::set(&msg, &JsValue::from_str("blob"), b);
    }
    let _ = scope().post_message(&msg);
}

fn post_models() {
    post(&Event::Models(with_store(|s| s.infos())), None);
}

/// Starts the worker: a panic hook that tells the page, the message
/// handler, and `Ready`.
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        console_error_panic_hook::hook(info);
        post(&Event::Panicked(info.to_string()), None);
    }));
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(|ev: web_sys::MessageEvent| {
        let data = ev.data();
        let id = Reflect::get(&data, &JsValue::from_str("id")).ok().and_then(|v| v.as_f64()).unwrap_or(0.0) as u64;
        let json = Reflect::get(&data, &JsValue::from_str("request")).ok().and_then(|v| v.as_string());
        let files = Reflect::get(&data, &JsValue::from_str("files")).unwrap_or(JsValue::UNDEFINED);
        let request = match json.as_deref().map(serde_json::from_str::<Request>) {
            Some(Ok(r)) => r,
            other => {
                let e = format!("the worker could not read the request: {other:?}");
                return post(&Event::Done { id, result: Err(e) }, None);
            }
        };
        QUEUE.with(|q| q.borrow_mut().push_back(Queued { id, request, files }));
        if !BUSY.with(|b| *b.borrow()) {
            wasm_bindgen_futures::spawn_local(drain());
        }
    });
    scope().set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    // The session is up on the CPU at once; WebGPU may take long (a
    // software adapter on a loaded machine) or never answer, so it starts
    // beside the requests and never delays them.
    post(&Event::Ready, None);
    start_gpu(GPU_TIMEOUT_MS);
}

/// How long the worker waits for a WebGPU adapter and the kernels' device
/// before it reports the CPU fallback (a later success still upgrades it).
pub const GPU_TIMEOUT_MS: u32 = 30_000;

/// Starts WebGPU in the background: asks for an adapter and opens the
/// kernels' device ([`crate::compute::gpu::init`]), and posts
/// [`Event::Gpu`] with the outcome, or with a timeout after `timeout_ms`
/// (then again if the device comes up later). Requests run meanwhile on the
/// CPU: a method uses the kernels only once [`crate::compute::gpu::gpu`]
/// has a device.
fn start_gpu(timeout_ms: u32) {
    use std::cell::Cell;
    use std::rc::Rc;
    let answered = Rc::new(Cell::new(false));
    let a = answered.clone();
    wasm_bindgen_futures::spawn_local(async move {
        let t0 = crate::web::now_ms();
        let status = crate::web::detect_webgpu().await;
        let r = match status {
            crate::web::GpuStatus::Available(adapter) => crate::compute::gpu::init()
                .await
                .map(|_| {
                    let mib = crate::compute::gpu::gpu().map_or(0, |g| g.max_binding_bytes() >> 20);
                    format!("{adapter} · WGSL kernels ready, max binding {mib} MiB")
                })
                .map_err(|e| {
                    format!("adapter {adapter} found, but the WGSL kernels could not start in the worker: {e}")
                }),
            crate::web::GpuStatus::Missing(why) => Err(why),
            crate::web::GpuStatus::Unknown => Err("the adapter request gave no answer".into()),
        };
        let late = a.replace(true);
        // After a timeout only a success is news (it upgrades the page).
        if !late || r.is_ok() {
            let ms = crate::web::now_ms() - t0;
            web_sys::console::log_1(&JsValue::from_str(&format!("moe-studio: WebGPU answered in {ms:.0} ms: {r:?}")));
            post(&Event::Gpu(r), None);
        }
    });
    wasm_bindgen_futures::spawn_local(async move {
        gloo_timers::future::TimeoutFuture::new(timeout_ms).await;
        if !answered.replace(true) {
            post(
                &Event::Gpu(Err(format!(
                    "no WebGPU adapter and device within {} s (the studio runs on the CPU; it switches if WebGPU comes up later)",
                    timeout_ms / 1000
                ))),
                None,
            );
        }
    });
}

/// Runs the queued requests one after the other.
async fn drain() {
    BUSY.with(|b| *b.borrow_mut() = true);
    while let Some(q) = QUEUE.with(|q| q.borrow_mut().pop_front()) {
        let id = q.id;
        post(&Event::Started { id }, None);
        let progress = Progress::new(move |step| post(&Event::Progress { id, step }, None));
        let before = with_store(|s| s.infos());
        let (result, blob) = match handle(id, &progress, q.request, q.files).await {
            Ok((r, b)) => (Ok(r), b),
            Err(e) => (Err(e), None),
        };
        if with_store(|s| s.infos()) != before {
            post_models();
        }
        post(&Event::Done { id, result }, blob.as_ref());
    }
    BUSY.with(|b| *b.borrow_mut() = false);
}

type Handled = Result<(Reply, Option<web_sys::Blob>), String>;

fn reply(r: Reply) -> Handled {
    Ok((r, None))
}

/// The `File`s sent beside a request.
fn attached_files(files: &JsValue) -> Vec<web_sys::File> {
    if files.is_undefined() || files.is_null() {
        return Vec::new();
    }
    Array::from(files).iter().filter_map(|f| f.dyn_into::<web_sys::File>().ok()).collect()
}

async fn handle(id: u64, progress: &Progress, request: Request, files: JsValue) -> Handled {
    match request {
        Request::Restore => restore(progress).await,
        Request::LoadDemo => {
            progress.step("fetching the demo model", 0, 1, "models");
            let (name, model, bytes) = demo_model().await?;
            let slot = add_input(name, model, bytes, Origin::Demo);
            keep_input(progress, slot, &[]).await;
            reply(Reply::Model(model_info(&ModelRef::Input(slot))?))
        }
        Request::LoadReal => {
            progress.step("fetching the real model", 0, 1, "models");
            let (name, model, bytes) = crate::load::real_model().await?;
            let slot = add_input(name, model, bytes, Origin::Real);
            keep_input(progress, slot, &[]).await;
            reply(Reply::Model(model_info(&ModelRef::Input(slot))?))
        }
        Request::LoadFiles { name } => {
            let list = attached_files(&files);
            let mut picked = Vec::new();
            for (i, f) in list.iter().enumerate() {
                progress.step("reading the files", i as u64, list.len() as u64, "files");
                picked.push(read_blob(&f.name(), f).await?);
            }
            let names: Vec<String> = picked.iter().map(|f| f.name.clone()).collect();
            let (name, model, bytes) = model_from_files_named(picked, &name)?;
            let slot = add_input(name, model, bytes, Origin::Files(names));
            let blobs: Vec<(String, web_sys::Blob)> = list.into_iter().map(|f| (f.name(), f.into())).collect();
            keep_input(progress, slot, &blobs).await;
            reply(Reply::Model(model_info(&ModelRef::Input(slot))?))
        }
        Request::LoadUrls { name, files: urls } => {
            let mut picked = Vec::new();
            for (i, (file, url)) in urls.iter().enumerate() {
                progress.step("downloading the checkpoint", i as u64, urls.len() as u64, "files");
                picked.push(PickedFile { name: file.clone(), bytes: crate::web::fetch_bytes(url).await? });
            }
            let names: Vec<String> = picked.iter().map(|f| f.name.clone()).collect();
            let copies: Vec<(String, web_sys::Blob)> = picked
                .iter()
                .map(|f| {
                    Ok((f.name.clone(), crate::web::blob_of(&Array::of1(&js_sys::Uint8Array::from(&f.bytes[..])))?))
                })
                .collect::<Result<_, String>>()?;
            let (name, model, bytes) = model_from_files_named(picked, &name)?;
            let slot = add_input(name, model, bytes, Origin::Files(names));
            keep_input(progress, slot, &copies).await;
            reply(Reply::Model(model_info(&ModelRef::Input(slot))?))
        }
        Request::Remove(r) => {
            update_store(|s| s.remove(&r));
            if persist::available().is_ok() {
                persist::forget(&r).await?;
            }
            reply(Reply::Done)
        }
        Request::ClearStorage => {
            persist::clear().await?;
            with_store(|s| {
                for i in s.infos() {
                    s.set_kept(&i.r, false);
                }
            });
            reply(Reply::Done)
        }
        Request::Storage => reply(Reply::Storage(storage_info().await)),
        Request::Upcycle { model, form } => {
            let src = need(&model)?;
            let m = src.model();
            let (opts, _) =
                crate::compute::upcycle::plan(&form, m.source.as_ref(), &m.config, crate::compute::upcycle::no_slot)
                    .map_err(|(_, e)| e)?;
            let a = crate::compute::upcycle::run(progress, &src, &opts)?;
            add_artifact(progress, a).await
        }
        Request::Logits { dense, moe, text } => {
            let (d, m) = (need(&dense)?, need(&moe)?);
            let c = crate::compute::logits::check(progress, d.model(), m.model(), &text)?;
            reply(Reply::Logits(LogitsReply {
                tokens: c.tokens,
                vocab: d.model().config.vocab_size,
                max_abs_diff: c.max_abs_diff,
                max_abs: c.max_abs,
            }))
        }
        Request::Neurons { model, langs, top_n, range } => {
            let p = need(&model)?;
            reply(Reply::Neurons(crate::compute::neurons::run(progress, &p, &langs, top_n, range)?))
        }
        Request::Moerge { models, params, use_gpu } => {
            let picked: Vec<Picked> = models.iter().map(need).collect::<Result<_, _>>()?;
            params.check(picked.len(), false).map_err(|e| format!("{}: {}", e.field, e.message))?;
            // The tab MoErges without a base model: zeros or a random router.
            let router =
                params.plain_router().ok().flatten().ok_or("the tab's MoErge starts the router at zeros or random")?;
            let opts = params.options(router);
            let (a, s) = crate::compute::moerge::run(progress, &picked, &opts, use_gpu).await?;
            let (Reply::Model(info), _) = add_artifact(progress, a).await? else { unreachable!("a model") };
            reply(Reply::Moerge(info, (s.tensors, s.averaged_gpu, s.averaged_cpu)))
        }
        Request::Route { model, domains, params, with_ppl, use_gpu } => {
            let p = need(&model)?;
            let r = crate::compute::route::run(progress, &p, &domains, &params, with_ppl, use_gpu).await?;
            let gram_on = r.gram_on.clone();
            let (Reply::Model(info), _) = add_artifact(progress, r.artifact).await? else { unreachable!("a model") };
            reply(Reply::Route(RouteReply { model: info, accuracy: r.accuracy, tokens: r.tokens, ppl: r.ppl, gram_on }))
        }
        Request::Graft { target, base, instruct, params, use_gpu } => {
            let (t, b, i) = (need(&target)?, need(&base)?, need(&instruct)?);
            params.check().map_err(|e| format!("{}: {}", e.field, e.message))?;
            let (a, report) = crate::compute::graft::run(progress, &t, &b, &i, params.scale, use_gpu).await?;
            let rows = report
                .deltas
                .iter()
                .map(|d| DeltaRow {
                    name: d.name.clone(),
                    shape: d.shape.clone(),
                    delta_l2: d.delta_l2,
                    relative: d.relative,
                    max_abs: d.max_abs,
                    applied_to: d.applied_to,
                })
                .collect();
            let counts = (report.grafted, report.tensors, report.expert_tensors, report.routers);
            let (Reply::Model(info), _) = add_artifact(progress, a).await? else { unreachable!("a model") };
            reply(Reply::Graft(info, counts, rows))
        }
        Request::Train { model, job } => {
            let p = need(&model)?;
            let on_point = |point: &crate::compute::train::TrainPoint| {
                post(&Event::TrainPoint { id, point: point.clone() }, None);
            };
            match crate::compute::train::run(progress, &p, &job, &on_point) {
                Ok((a, summary)) => {
                    let (Reply::Model(info), _) = add_artifact(progress, a).await? else { unreachable!("a model") };
                    reply(Reply::Train(info, summary))
                }
                Err((field, why)) => reply(Reply::TrainRefused(field, why)),
            }
        }
        Request::Inspect { model, text, layer } => {
            let p = need(&model)?;
            reply(Reply::Inspect(crate::compute::inspect::inspect(progress, &p, &text, layer)?))
        }
        Request::Generate { models, prompt, max_new_tokens } => {
            let picked: Vec<Picked> = models.iter().map(need).collect::<Result<_, _>>()?;
            reply(Reply::Generate(crate::compute::generate::run(progress, &picked, &prompt, max_new_tokens)?))
        }
        Request::Perplexity { models, text } => {
            let picked: Vec<Picked> = models.iter().map(need).collect::<Result<_, _>>()?;
            reply(Reply::Perplexity(crate::compute::perplexity::run(progress, &picked, &text)?))
        }
        Request::Task { models, name, task, params } => {
            let picked: Vec<Picked> = models.iter().map(need).collect::<Result<_, _>>()?;
            let rows = crate::compute::task::run(progress, &picked, &name, &task, &params)?;
            reply(Reply::Task(rows))
        }
        Request::Download { model, file } => {
            let Picked::Artifact(a) = need(&model)? else {
                return Err("only checkpoints made in the studio can be downloaded".into());
            };
            let (_, bytes) = a
                .files()
                .into_iter()
                .find(|(n, _)| *n == file)
                .ok_or_else(|| format!("{} has no file {file}", a.name))?;
            let blob = blob_of_slice(bytes)?;
            Ok((Reply::File(format!("{}.{file}", a.name)), Some(blob)))
        }
        Request::Archive { model } => {
            let Picked::Artifact(a) = need(&model)? else {
                return Err("only checkpoints made in the studio can be downloaded".into());
            };
            progress.step("writing the .zip", 0, 1, "archives");
            let files = a.files();
            let blob = crate::zip::stored_zip_blob(&a.name, &files)?;
            Ok((Reply::File(format!("{}.zip", a.name)), Some(blob)))
        }
        Request::Panic => panic!("a panic injected by the page (the crash-path test)"),
    }
}

/// A `Blob` of `bytes`, copied straight out of wasm memory (no second copy
/// inside it: wasm32 memory ends at 4 GiB).
pub fn blob_of_slice(bytes: &[u8]) -> Result<web_sys::Blob, String> {
    // SAFETY: the view is read by the Blob constructor before any
    // allocation can move wasm memory (nothing runs in between).
    let view = unsafe { js_sys::Uint8Array::view(bytes) };
    crate::web::blob_of(&Array::of1(&view))
}

fn model_info(r: &ModelRef) -> Result<super::protocol::ModelInfo, String> {
    let p = need(r)?;
    Ok(info(r.clone(), &p))
}

fn add_input(name: String, model: moe_shared::checkpoint::LoadedModel, file_bytes: u64, origin: Origin) -> usize {
    update_store(|s| s.add_input(InputModel { name, model, file_bytes, origin, kept: std::cell::Cell::new(false) }))
}

/// Keeps a loaded model's files (`blobs`; none for the demo) and its
/// manifest entry in the browser's storage; a failure only leaves it
/// un-kept (the page shows it).
async fn keep_input(progress: &Progress, slot: usize, blobs: &[(String, web_sys::Blob)]) {
    if persist::available().is_err() {
        return;
    }
    let r = ModelRef::Input(slot);
    let Some(Picked::Input(m)) = pick(&r) else { return };
    let result: Result<(), String> = async {
        for (i, (name, blob)) in blobs.iter().enumerate() {
            progress.step("keeping a copy in this browser", i as u64, blobs.len() as u64, "files");
            persist::put_blob(&format!("{}{name}", persist::slot_dir(&r)), blob).await?;
        }
        persist::record(Entry {
            r: r.clone(),
            name: m.name.clone(),
            kind: Kind::Input { origin: m.origin.clone(), file_bytes: m.file_bytes },
        })
        .await
    }
    .await;
    match result {
        Ok(()) => m.kept.set(true),
        Err(e) => web_sys::console::warn_1(&JsValue::from_str(&format!("not kept: {e}"))),
    }
}

/// Adds a produced checkpoint to the store, keeps it in the browser's
/// storage, and answers with its info.
async fn add_artifact(progress: &Progress, a: Artifact) -> Handled {
    let slot = update_store(|s| s.add_artifact(a));
    let r = ModelRef::Artifact(slot);
    if persist::available().is_ok() {
        if let Some(Picked::Artifact(a)) = pick(&r) {
            let files = a.files();
            let result: Result<(), String> = async {
                for (i, (name, bytes)) in files.iter().enumerate() {
                    progress.step("keeping a copy in this browser", i as u64, files.len() as u64, "files");
                    persist::put_bytes(&format!("{}{name}", persist::slot_dir(&r)), bytes).await?;
                }
                persist::record(Entry {
                    r: r.clone(),
                    name: a.name.clone(),
                    kind: Kind::Artifact {
                        method: a.method.clone(),
                        files: files.iter().map(|(n, _)| n.to_string()).collect(),
                        millis: a.millis,
                    },
                })
                .await
            }
            .await;
            match result {
                Ok(()) => a.kept.set(true),
                Err(e) => web_sys::console::warn_1(&JsValue::from_str(&format!("not kept: {e}"))),
            }
        }
    }
    reply(Reply::Model(model_info(&r)?))
}

async fn storage_info() -> StorageInfo {
    let kept = with_store(|s| s.infos().iter().filter(|i| i.kept).count());
    let memory = crate::memory::summary();
    match (persist::available(), persist::estimate().await) {
        (Ok(()), Ok((usage, quota))) => StorageInfo { usage, quota, kept, unavailable: None, memory },
        (Err(e), _) | (_, Err(e)) => StorageInfo { usage: 0, quota: 0, kept, unavailable: Some(e), memory },
    }
}

/// Reloads every model the manifest names into its slot.
async fn restore(progress: &Progress) -> Handled {
    let manifest = persist::manifest().await;
    let total = manifest.entries.len() as u64;
    let (mut back, mut failed) = (0, Vec::new());
    for (k, e) in manifest.entries.iter().enumerate() {
        progress.step(&format!("restoring {}", e.name), k as u64, total, "models");
        match restore_one(e).await {
            Ok(slot) => {
                update_store(|s| s.put(&e.r, slot));
                back += 1;
            }
            Err(err) => failed.push(format!("{}: {err}", e.name)),
        }
    }
    reply(Reply::Restored { models: back, failed })
}

async fn restore_one(e: &Entry) -> Result<Slot, String> {
    let dir = persist::slot_dir(&e.r);
    let read = |name: String| {
        let path = format!("{dir}{name}");
        async move {
            persist::get_bytes(&path).await?.ok_or_else(|| format!("{path} is missing from the browser's storage"))
        }
    };
    match &e.kind {
        Kind::Input { origin, file_bytes } => {
            let model = match origin {
                Origin::Demo => demo_model().await?.1,
                Origin::Real => crate::load::real_model().await?.1,
                Origin::Files(names) => {
                    let mut files = Vec::new();
                    for n in names {
                        files.push(PickedFile { name: n.clone(), bytes: read(n.clone()).await? });
                    }
                    model_from_files_named(files, &e.name)?.1
                }
            };
            Ok(Slot::Input(InputModel {
                name: e.name.clone(),
                model,
                file_bytes: *file_bytes,
                origin: origin.clone(),
                kept: std::cell::Cell::new(true),
            }))
        }
        Kind::Artifact { method, files, millis } => {
            let mut out = crate::compute::artifact::Output {
                name: e.name.clone(),
                method: "",
                safetensors: Vec::new(),
                config_json: Vec::new(),
                tokenizer: None,
                tokenizer_json: None,
                extra: Vec::new(),
                millis: *millis,
            };
            for f in files {
                let bytes = read(f.clone()).await?;
                match f.as_str() {
                    "model.safetensors" => out.safetensors = bytes,
                    "config.json" => out.config_json = bytes,
                    "tokenizer.json" => out.tokenizer_json = Some(bytes),
                    _ => out.extra.push((f.clone(), bytes)),
                }
            }
            out.tokenizer = match &out.tokenizer_json {
                Some(t) => Some(
                    moe_shared::tokenizer::Tokenizer::from_hf_json(t, "tokenizer.json").map_err(|e| e.to_string())?,
                ),
                None => None,
            };
            let mut a = crate::compute::artifact::into_artifact(out)?;
            a.method = method.clone();
            a.kept.set(true);
            Ok(Slot::Artifact(a))
        }
    }
}
