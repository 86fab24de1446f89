//! Browser plumbing: reading local files, fetching static assets, saving
//! downloads, timing, and detecting WebGPU and the backend API. Reading,
//! fetching and timing work on the page and in the studio's worker (they
//! use the global scope, not `window`).

use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// A JavaScript error as a sentence: `what: the error's message`.
pub fn js_err(what: &str, e: JsValue) -> String {
    let detail = e.as_string().or_else(|| js_sys::JSON::stringify(&e).ok().and_then(|s| s.as_string()));
    format!("{what}: {}", detail.unwrap_or_else(|| "unknown browser error".into()))
}

/// A local file the user picked: its name and bytes.
#[derive(Debug, Clone)]
pub struct PickedFile {
    /// File name (no directory).
    pub name: String,
    /// Contents.
    pub bytes: Vec<u8>,
}

/// Reads one file (a `File` or any `Blob`, named `name`).
///
/// # Errors
/// A readable message when the browser cannot read it.
pub async fn read_blob(name: &str, blob: &web_sys::Blob) -> Result<PickedFile, String> {
    let buf = JsFuture::from(blob.array_buffer()).await.map_err(|e| js_err(&format!("reading {name}"), e))?;
    Ok(PickedFile { name: name.to_string(), bytes: js_sys::Uint8Array::new(&buf).to_vec() })
}

/// Reads every file of a file input.
///
/// # Errors
/// A readable message when the browser cannot read a file.
pub async fn read_files(list: Option<web_sys::FileList>) -> Result<Vec<PickedFile>, String> {
    let mut out = Vec::new();
    let Some(list) = list else { return Ok(out) };
    for i in 0..list.length() {
        let Some(f) = list.get(i) else { continue };
        out.push(read_blob(&f.name(), &f).await?);
    }
    Ok(out)
}

/// `url` made absolute against the page's address (`document.baseURI`;
/// in the studio's worker, whose own address is a `blob:` URL, the page's
/// address the bootstrap left in `__moeStudioBase`).
pub fn absolute(url: &str) -> String {
    let global = js_sys::global();
    let base = js_sys::Reflect::get(&global, &JsValue::from_str("__moeStudioBase"))
        .ok()
        .and_then(|v| v.as_string())
        .or_else(|| web_sys::window().and_then(|w| w.document()).and_then(|d| d.base_uri().ok().flatten()));
    match base {
        Some(b) => web_sys::Url::new_with_base(url, &b).map(|u| u.href()).unwrap_or_else(|_| url.to_string()),
        None => url.to_string(),
    }
}

/// `fetch(url)` on the global scope (the page's window or a worker), with
/// `url` resolved by [`absolute`].
async fn global_fetch(url: &str) -> Result<JsValue, JsValue> {
    let global = js_sys::global();
    let f: js_sys::Function = js_sys::Reflect::get(&global, &JsValue::from_str("fetch"))?.dyn_into()?;
    JsFuture::from(js_sys::Promise::from(f.call1(&global, &JsValue::from_str(&absolute(url)))?)).await
}

/// Fetches a URL's bytes (static assets such as the demo model), from the
/// page or the worker.
///
/// # Errors
/// Network errors and non-2xx answers, as a readable message.
pub async fn fetch_bytes(url: &str) -> Result<Vec<u8>, String> {
    let resp = global_fetch(url).await.map_err(|e| js_err(&format!("fetching {url}"), e))?;
    let resp: web_sys::Response = resp.dyn_into().map_err(|e| js_err("fetch", e))?;
    if !resp.ok() {
        return Err(format!("fetching {url}: HTTP {} {}", resp.status(), resp.status_text()));
    }
    let buf = JsFuture::from(resp.array_buffer().map_err(|e| js_err(url, e))?)
        .await
        .map_err(|e| js_err(&format!("reading {url}"), e))?;
    Ok(js_sys::Uint8Array::new(&buf).to_vec())
}

/// A `Blob` of `parts` (each a `Uint8Array` or `Blob`) with a binary type.
///
/// # Errors
/// A readable message when the browser refuses.
pub fn blob_of(parts: &js_sys::Array) -> Result<web_sys::Blob, String> {
    let opts = web_sys::BlobPropertyBag::new();
    opts.set_type("application/octet-stream");
    web_sys::Blob::new_with_u8_array_sequence_and_options(parts, &opts).map_err(|e| js_err("blob", e))
}

/// Offers `blob` to the user as a file download named `name` (on the page).
///
/// # Errors
/// A readable message when the browser refuses.
pub fn download(name: &str, blob: &web_sys::Blob) -> Result<(), String> {
    let url = web_sys::Url::create_object_url_with_blob(blob).map_err(|e| js_err("object URL", e))?;
    let doc = web_sys::window().and_then(|w| w.document()).ok_or("no document")?;
    let a: web_sys::HtmlAnchorElement = doc
        .create_element("a")
        .map_err(|e| js_err("anchor", e))?
        .dyn_into()
        .map_err(|_| "not an anchor element".to_string())?;
    a.set_href(&url);
    a.set_download(name);
    a.click();
    // Revoke later: Chrome starts the download asynchronously.
    let u = url.clone();
    leptos::task::spawn_local(async move {
        gloo_timers::future::TimeoutFuture::new(60_000).await;
        let _ = web_sys::Url::revoke_object_url(&u);
    });
    Ok(())
}

/// Milliseconds since the page (or the worker) started
/// (`performance.now()` of the global scope).
pub fn now_ms() -> f64 {
    let perf = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("performance")).unwrap_or(JsValue::UNDEFINED);
    if perf.is_undefined() {
        return 0.0;
    }
    let now =
        js_sys::Reflect::get(&perf, &JsValue::from_str("now")).ok().and_then(|f| f.dyn_into::<js_sys::Function>().ok());
    now.and_then(|f| f.call0(&perf).ok()).and_then(|v| v.as_f64()).unwrap_or(0.0)
}

/// What WebGPU offers here.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuStatus {
    /// Not checked yet.
    Unknown,
    /// An adapter was granted; the string describes it.
    Available(String),
    /// No WebGPU (or no adapter); the string says why.
    Missing(String),
}

/// Asks `navigator.gpu.requestAdapter()` for an adapter (on the page or in
/// a worker).
pub async fn detect_webgpu() -> GpuStatus {
    let nav = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).unwrap_or(JsValue::UNDEFINED);
    if nav.is_undefined() {
        return GpuStatus::Missing("no navigator".into());
    }
    let gpu = js_sys::Reflect::get(&nav, &JsValue::from_str("gpu")).unwrap_or(JsValue::UNDEFINED);
    if gpu.is_undefined() || gpu.is_null() {
        return GpuStatus::Missing("this browser has no navigator.gpu (WebGPU disabled or unsupported)".into());
    }
    let req = match js_sys::Reflect::get(&gpu, &JsValue::from_str("requestAdapter")) {
        Ok(f) if f.is_function() => f.unchecked_into::<js_sys::Function>(),
        _ => return GpuStatus::Missing("navigator.gpu.requestAdapter is missing".into()),
    };
    let promise = match req.call0(&gpu) {
        Ok(p) => p,
        Err(e) => return GpuStatus::Missing(js_err("requestAdapter", e)),
    };
    match JsFuture::from(js_sys::Promise::from(promise)).await {
        Ok(a) if !a.is_null() && !a.is_undefined() => {
            let info = js_sys::Reflect::get(&a, &JsValue::from_str("info")).unwrap_or(JsValue::UNDEFINED);
            let field = |k: &str| {
                js_sys::Reflect::get(&info, &JsValue::from_str(k)).ok().and_then(|v| v.as_string()).unwrap_or_default()
            };
            let desc = [field("vendor"), field("architecture"), field("description")]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            GpuStatus::Available(if desc.is_empty() { "WebGPU adapter".into() } else { desc })
        }
        Ok(_) => GpuStatus::Missing("requestAdapter() returned no adapter".into()),
        Err(e) => GpuStatus::Missing(js_err("requestAdapter", e)),
    }
}

/// Whether the studio is served by `moe-studio serve` (its `GET /api/info`
/// answers with a `moe_shared::api::ServerInfo`) rather than a plain static
/// server (which answers 404, or its `index.html` fallback: not JSON).
pub async fn backend_available() -> bool {
    match fetch_bytes("api/info").await {
        Ok(b) => serde_json::from_slice::<moe_shared::api::ServerInfo>(&b).is_ok(),
        Err(_) => false,
    }
}
