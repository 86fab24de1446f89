//! HTTP calls to `moe-studio serve` (relative `api/...` URLs, so the page
//! works under whatever address the server listens on), the token and
//! other small state kept in `localStorage`.

use moe_shared::api::ApiError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// `localStorage` key of the bearer token.
pub const TOKEN_KEY: &str = "moe-studio.token";

/// Why a call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiFailure {
    /// No answer (connection refused or lost, request aborted): worth
    /// retrying / resuming.
    Network(String),
    /// The server answered with a 4xx/5xx; `error` is its JSON error
    /// ([`ApiError`]) as one line.
    Http {
        /// HTTP status.
        status: u16,
        /// `field: error` from the server.
        error: String,
        /// The server's JSON error as sent (its `field` says which input
        /// of a form is at fault), when the body was one.
        reason: Option<ApiError>,
    },
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiFailure::Network(e) => write!(f, "no answer from the server ({e})"),
            ApiFailure::Http { status: 401, error, .. } => {
                write!(f, "HTTP 401: {error} — paste the token the server printed (DATA_DIR/token) above")
            }
            ApiFailure::Http { status, error, .. } => write!(f, "HTTP {status}: {error}"),
        }
    }
}

impl From<ApiFailure> for String {
    fn from(e: ApiFailure) -> String {
        e.to_string()
    }
}

fn js_text(e: &JsValue) -> String {
    e.as_string()
        .or_else(|| js_sys::Reflect::get(e, &JsValue::from_str("message")).ok().and_then(|m| m.as_string()))
        .or_else(|| js_sys::JSON::stringify(e).ok().and_then(|s| s.as_string()))
        .unwrap_or_else(|| "unknown browser error".into())
}

/// A request body.
pub enum Body {
    /// No body.
    None,
    /// A JSON document.
    Json(String),
    /// Raw bytes (an upload chunk), passed to `fetch` without a copy.
    Bytes(js_sys::Uint8Array),
}

/// Sends one request; returns the answer's bytes on 2xx.
///
/// # Errors
/// [`ApiFailure::Network`] when `fetch` rejects, [`ApiFailure::Http`] with
/// the server's JSON error otherwise.
pub async fn request(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Body,
    headers: &[(&str, &str)],
) -> Result<Vec<u8>, ApiFailure> {
    let net = |what: &str, e: JsValue| ApiFailure::Network(format!("{what} {url}: {}", js_text(&e)));
    let window = web_sys::window().ok_or_else(|| ApiFailure::Network("no window".into()))?;
    let init = web_sys::RequestInit::new();
    init.set_method(method);
    let h = web_sys::Headers::new().map_err(|e| net("headers", e))?;
    if let Some(t) = token.map(str::trim).filter(|t| !t.is_empty()) {
        h.set("Authorization", &format!("Bearer {t}")).map_err(|e| net("headers", e))?;
    }
    for (k, v) in headers {
        h.set(k, v).map_err(|e| net("headers", e))?;
    }
    match body {
        Body::None => {}
        Body::Json(s) => {
            h.set("Content-Type", "application/json").map_err(|e| net("headers", e))?;
            init.set_body(&JsValue::from_str(&s));
        }
        Body::Bytes(b) => {
            h.set("Content-Type", "application/octet-stream").map_err(|e| net("headers", e))?;
            init.set_body(&b);
        }
    }
    init.set_headers(&h);
    let resp = JsFuture::from(window.fetch_with_str_and_init(url, &init)).await.map_err(|e| net(method, e))?;
    let resp: web_sys::Response = resp.dyn_into().map_err(|e| net("fetch", e))?;
    let status = resp.status();
    let buf =
        JsFuture::from(resp.array_buffer().map_err(|e| net("reading", e))?).await.map_err(|e| net("reading", e))?;
    let bytes = js_sys::Uint8Array::new(&buf).to_vec();
    if resp.ok() {
        return Ok(bytes);
    }
    let reason = serde_json::from_slice::<ApiError>(&bytes).ok();
    let error = match &reason {
        Some(e) => e.to_string(),
        None => {
            format!("{} {}", resp.status_text(), String::from_utf8_lossy(&bytes).chars().take(200).collect::<String>())
        }
    };
    Err(ApiFailure::Http { status, error, reason })
}

fn parse<T: DeserializeOwned>(url: &str, b: &[u8]) -> Result<T, ApiFailure> {
    serde_json::from_slice(b).map_err(|e| ApiFailure::Http {
        status: 200,
        error: format!("{url}: unexpected answer: {e}"),
        reason: None,
    })
}

/// `GET url` as JSON.
///
/// # Errors
/// See [`request`]; an answer that is not the expected JSON is an `Http` error.
pub async fn get<T: DeserializeOwned>(url: &str) -> Result<T, ApiFailure> {
    // Reads need the token too (the server's `/api/info` aside).
    let token = load(TOKEN_KEY);
    parse(url, &request("GET", url, token.as_deref(), Body::None, &[]).await?)
}

/// `POST api/session` with the token: the server answers with its read
/// cookie (`HttpOnly`, `SameSite=Strict`), which the browser then sends
/// with the requests that cannot carry a header — the job's
/// `EventSource` and the download links. Returns whether the token was
/// accepted.
pub async fn open_session(token: &str) -> bool {
    if token.trim().is_empty() {
        return false;
    }
    request("POST", "api/session", Some(token), Body::None, &[]).await.is_ok()
}

/// `method url` with a JSON body (or none) and the token; the answer as JSON.
///
/// # Errors
/// See [`request`].
pub async fn send<B: Serialize, T: DeserializeOwned>(
    method: &str,
    url: &str,
    token: &str,
    body: Option<&B>,
) -> Result<T, ApiFailure> {
    let body = match body {
        Some(b) => Body::Json(serde_json::to_string(b).map_err(|e| ApiFailure::Network(e.to_string()))?),
        None => Body::None,
    };
    parse(url, &request(method, url, Some(token), body, &[]).await?)
}

/// The page's `localStorage`, when the browser allows it.
pub fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok()?
}

/// Reads a `localStorage` value.
pub fn load(key: &str) -> Option<String> {
    storage()?.get_item(key).ok()?
}

/// Writes a `localStorage` value (silently skipped when storage is off).
pub fn save(key: &str, value: &str) {
    if let Some(s) = storage() {
        let _ = s.set_item(key, value);
    }
}

/// `api/jobs/{id}/artifacts/{path}` with each path segment escaped.
pub fn artifact_url(job: &str, path: &str) -> String {
    let segs: Vec<String> =
        path.split('/').map(|s| js_sys::encode_uri_component(s).as_string().unwrap_or_default()).collect();
    format!("api/jobs/{job}/artifacts/{}", segs.join("/"))
}
