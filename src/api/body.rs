//! Request bodies: JSON, at most [`BODY_LIMIT`](super::BODY_LIMIT) bytes,
//! read before the call is authorized but parsed only after, so a caller
//! learns nothing of what a call takes that they may not make. A body that
//! does not parse, or names a field the call does not take, is refused
//! with the API's own error (400).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;

use super::error::ApiError;

pub struct Body {
    bytes: Bytes,
    /// Sent as JSON.
    json: bool,
}

impl Body {
    /// The body as a `T`; structs the API takes deny unknown fields.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        if !self.json {
            return Err(ApiError::Invalid(
                "the request body must be JSON, sent with `Content-Type: application/json`".into(),
            ));
        }
        serde_json::from_slice(&self.bytes)
            .map_err(|e| ApiError::Invalid(format!("the request body: {e}")))
    }
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Self { bytes, json }),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::TooLarge(super::BODY_LIMIT))
            }
            Err(rejection) => Err(ApiError::Invalid(rejection.body_text())),
        }
    }
}
