//! Models kept across a reload (and across a cancelled or crashed task,
//! which restarts the worker): every loaded model's files and every
//! produced checkpoint's files go into the browser's Cache Storage (as
//! transformers.js and WebLLM keep their weights), with a manifest that
//! says which slot each model had.
//!
//! Layout in the cache `moe-studio-models-v1`, at URLs under the page's
//! own origin (never fetched from the network):
//! `__moe_studio__/manifest.json` and `__moe_studio__/models/{slot}/{file}`
//! (`slot` = `i0`, `a3`, ...). Files are written before the manifest names
//! them and the manifest forgets a model before its files are deleted, so a
//! manifest never names a file that is not there. The demo model is not
//! copied: restoring fetches it again from the build.
//!
//! Cache Storage needs a secure context (https, or http on localhost /
//! 127.0.0.1 as `moe-studio serve` and the tests use); elsewhere nothing is
//! kept and the Load page says so.

use js_sys::{Array, Reflect, Uint8Array};
use serde::{Deserialize, Serialize};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::store::{ModelRef, Origin};
use crate::web::js_err;

/// The cache's name (bump the version when the layout changes).
pub const CACHE: &str = "moe-studio-models-v1";
/// Path prefix of every key.
pub const PREFIX: &str = "__moe_studio__/";

/// What one kept model is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Kind {
    /// A loaded model.
    Input {
        /// Where it came from.
        origin: Origin,
        /// Bytes of its files.
        file_bytes: u64,
    },
    /// A produced checkpoint.
    Artifact {
        /// The method that made it.
        method: String,
        /// Its files (`model.safetensors`, `config.json`, ...).
        files: Vec<String>,
        /// Milliseconds it took.
        millis: f64,
    },
}

/// One kept model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Its slot.
    pub r: ModelRef,
    /// Its name.
    pub name: String,
    /// What it is.
    pub kind: Kind,
}

/// `__moe_studio__/manifest.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version (1).
    pub version: u32,
    /// The kept models, in slot order.
    pub entries: Vec<Entry>,
}

fn global() -> JsValue {
    js_sys::global().into()
}

/// The origin's Cache Storage.
///
/// # Errors
/// Why there is none (not a secure context, or the browser disabled it).
fn caches() -> Result<web_sys::CacheStorage, String> {
    let c = Reflect::get(&global(), &JsValue::from_str("caches")).unwrap_or(JsValue::UNDEFINED);
    if c.is_undefined() || c.is_null() {
        return Err("this browser offers no Cache Storage here (it needs https or localhost)".into());
    }
    Ok(c.unchecked_into())
}

async fn cache() -> Result<web_sys::Cache, String> {
    let p = caches()?.open(CACHE);
    let c = JsFuture::from(p).await.map_err(|e| js_err("opening the browser's cache", e))?;
    Ok(c.unchecked_into())
}

/// The absolute URL of `path` under [`PREFIX`] (at the page's address).
fn url(path: &str) -> Result<String, String> {
    let u = crate::web::absolute(&format!("{PREFIX}{path}"));
    if u.starts_with("http") {
        Ok(u)
    } else {
        Err(format!("cannot make a storage address for {path} (the page's address is unknown)"))
    }
}

/// The key prefix of a slot's files.
pub fn slot_dir(r: &ModelRef) -> String {
    format!("models/{}/", r.key())
}

/// Whether storage works here (`Err`: why not).
pub fn available() -> Result<(), String> {
    caches().map(|_| ())
}

/// Stores `bytes` at `path` (copied into the response body).
///
/// # Errors
/// The browser's refusal (quota exceeded, storage disabled).
pub async fn put_bytes(path: &str, bytes: &[u8]) -> Result<(), String> {
    let arr = Uint8Array::from(bytes);
    let resp = web_sys::Response::new_with_opt_buffer_source(Some(&arr)).map_err(|e| js_err("response", e))?;
    put(path, resp).await
}

/// Stores a `Blob` (a picked `File`) at `path` without copying it through
/// wasm memory.
///
/// # Errors
/// As [`put_bytes`].
pub async fn put_blob(path: &str, blob: &web_sys::Blob) -> Result<(), String> {
    let resp = web_sys::Response::new_with_opt_blob(Some(blob)).map_err(|e| js_err("response", e))?;
    put(path, resp).await
}

async fn put(path: &str, resp: web_sys::Response) -> Result<(), String> {
    let c = cache().await?;
    JsFuture::from(c.put_with_str(&url(path)?, &resp))
        .await
        .map_err(|e| js_err(&format!("keeping {path} in the browser's storage"), e))?;
    Ok(())
}

/// The bytes stored at `path`, if any.
///
/// # Errors
/// Storage errors.
pub async fn get_bytes(path: &str) -> Result<Option<Vec<u8>>, String> {
    let c = cache().await?;
    let r = JsFuture::from(c.match_with_str(&url(path)?)).await.map_err(|e| js_err("reading the cache", e))?;
    if r.is_undefined() || r.is_null() {
        return Ok(None);
    }
    let r: web_sys::Response = r.unchecked_into();
    let buf = JsFuture::from(r.array_buffer().map_err(|e| js_err(path, e))?)
        .await
        .map_err(|e| js_err(&format!("reading {path} from the browser's storage"), e))?;
    Ok(Some(Uint8Array::new(&buf).to_vec()))
}

/// Deletes every key under `prefix`.
///
/// # Errors
/// Storage errors.
pub async fn delete_under(prefix: &str) -> Result<(), String> {
    let c = cache().await?;
    let start = url(prefix)?;
    let keys = JsFuture::from(c.keys()).await.map_err(|e| js_err("listing the cache", e))?;
    for k in Array::from(&keys).iter() {
        let req: web_sys::Request = k.unchecked_into();
        if req.url().starts_with(&start) {
            JsFuture::from(c.delete_with_request(&req)).await.map_err(|e| js_err("deleting from the cache", e))?;
        }
    }
    Ok(())
}

/// Deletes the whole cache.
///
/// # Errors
/// Storage errors.
pub async fn clear() -> Result<(), String> {
    JsFuture::from(caches()?.delete(CACHE)).await.map_err(|e| js_err("clearing the browser's storage", e))?;
    Ok(())
}

/// The manifest (empty when nothing is kept or storage is unavailable).
pub async fn manifest() -> Manifest {
    if available().is_err() {
        return Manifest::default();
    }
    match get_bytes("manifest.json").await {
        Ok(Some(b)) => serde_json::from_slice(&b).unwrap_or_default(),
        _ => Manifest::default(),
    }
}

/// Writes the manifest.
///
/// # Errors
/// As [`put_bytes`].
pub async fn write_manifest(m: &Manifest) -> Result<(), String> {
    put_bytes("manifest.json", &serde_json::to_vec(m).expect("manifest JSON")).await
}

/// Adds (or replaces) an entry in the manifest.
///
/// # Errors
/// As [`put_bytes`].
pub async fn record(e: Entry) -> Result<(), String> {
    let mut m = manifest().await;
    m.version = 1;
    m.entries.retain(|x| x.r != e.r);
    m.entries.push(e);
    write_manifest(&m).await
}

/// Forgets a slot: the manifest first, then its files.
///
/// # Errors
/// Storage errors.
pub async fn forget(r: &ModelRef) -> Result<(), String> {
    available()?;
    let mut m = manifest().await;
    if m.entries.iter().any(|e| &e.r == r) {
        m.entries.retain(|e| &e.r != r);
        write_manifest(&m).await?;
    }
    delete_under(&slot_dir(r)).await
}

/// `navigator.storage.estimate()`: `(usage, quota)` in bytes.
///
/// # Errors
/// When the browser has no storage manager here.
pub async fn estimate() -> Result<(u64, u64), String> {
    let nav = Reflect::get(&global(), &JsValue::from_str("navigator")).map_err(|e| js_err("navigator", e))?;
    let storage = Reflect::get(&nav, &JsValue::from_str("storage")).unwrap_or(JsValue::UNDEFINED);
    if storage.is_undefined() {
        return Err("this browser has no storage manager here".into());
    }
    let f: js_sys::Function = Reflect::get(&storage, &JsValue::from_str("estimate"))
        .map_err(|e| js_err("estimate", e))?
        .dyn_into()
        .map_err(|_| "navigator.storage.estimate is not a function".to_string())?;
    let p: js_sys::Promise = f.call0(&storage).map_err(|e| js_err("estimate", e))?.unchecked_into();
    let est = JsFuture::from(p).await.map_err(|e| js_err("estimating the storage", e))?;
    let num = |k: &str| Reflect::get(&est, &JsValue::from_str(k)).ok().and_then(|v| v.as_f64()).unwrap_or(0.0) as u64;
    Ok((num("usage"), num("quota")))
}
