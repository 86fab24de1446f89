//! Errors as HTTP answers: a status and the JSON body
//! `{"error": "...", "field": "..."}` ([`ApiError`]); the extractors [`J`]
//! (JSON body) and [`P`] (path parameters) answer in the same shape.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use moe_shared::api::ApiError;
use serde::de::DeserializeOwned;

/// An error answer.
#[derive(Debug)]
pub struct AppError {
    /// HTTP status.
    pub status: StatusCode,
    /// JSON body.
    pub body: ApiError,
}

impl AppError {
    /// Any status, about `field`.
    pub fn new(status: StatusCode, field: Option<&str>, msg: impl Into<String>) -> Self {
        AppError { status, body: ApiError { error: msg.into(), field: field.map(String::from) } }
    }
    /// 400 about `field`.
    pub fn bad(field: &str, msg: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Some(field), msg)
    }
    /// 404: `what` (e.g. "upload 1234...") does not exist.
    pub fn not_found(field: &str, what: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::NOT_FOUND, Some(field), format!("{what} not found"))
    }
    /// 409 (the resource's state forbids it), about `field`.
    pub fn conflict(field: Option<&str>, msg: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, field, msg)
    }
    /// 422 (well-formed but unusable), about `field`.
    pub fn unprocessable(field: &str, msg: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, Some(field), msg)
    }
    /// 413 about `field`.
    pub fn too_large(field: &str, msg: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, Some(field), msg)
    }
    /// 500; the message is logged and returned.
    pub fn internal(msg: impl Into<String>) -> Self {
        let msg = msg.into();
        tracing::error!("{msg}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, None, msg)
    }
}

impl From<ApiError> for AppError {
    fn from(e: ApiError) -> Self {
        AppError { status: StatusCode::UNPROCESSABLE_ENTITY, body: e }
    }
}

impl From<rusqlite::Error> for AppError {
    fn from(e: rusqlite::Error) -> Self {
        AppError::internal(format!("database: {e}"))
    }
}

impl From<std::io::Error> for AppError {
    fn from(e: std::io::Error) -> Self {
        AppError::internal(format!("i/o: {e}"))
    }
}

impl From<anyhow::Error> for AppError {
    fn from(e: anyhow::Error) -> Self {
        AppError::internal(format!("{e:#}"))
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

/// Result of a handler.
pub type AppResult<T> = Result<T, AppError>;

/// A JSON body whose rejections are [`AppError`]s (400, or 413 past the
/// body limit; serde's message names the field and position).
pub struct J<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for J<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AppError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(J(v)),
            Err(e) => {
                let status = match &e {
                    JsonRejection::JsonDataError(_) => StatusCode::UNPROCESSABLE_ENTITY,
                    other => other.status(),
                };
                let status =
                    if status == StatusCode::UNSUPPORTED_MEDIA_TYPE { StatusCode::BAD_REQUEST } else { status };
                Err(AppError::new(status, Some("body"), e.body_text()))
            }
        }
    }
}

/// Path parameters whose rejections are [`AppError`]s.
pub struct P<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for P<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(P(v)),
            Err(e) => {
                let e: PathRejection = e;
                Err(AppError::bad("path", e.body_text()))
            }
        }
    }
}

/// Parses an id path parameter: only a lowercase hyphenated UUID passes
/// (`../`, encoded or not, and anything else is a 400 naming `field`).
pub fn parse_id(field: &str, s: &str) -> AppResult<String> {
    if moe_shared::api::is_valid_id(s) {
        Ok(s.to_string())
    } else {
        let shown: String = s.chars().take(80).collect();
        Err(AppError::bad(field, format!("`{shown}` is not an id (expected a lowercase hyphenated UUID)")))
    }
}
