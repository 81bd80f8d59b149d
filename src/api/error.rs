//! The API's errors: one enum, each with a stable code and the HTTP status
//! it answers with, written as `{"code": …, "message": …}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{user} may not {verb} {resource}{}{}", name.as_ref().map(|n| format!(" {n}")).unwrap_or_default(), namespace.as_ref().map(|n| format!(" in namespace {n}")).unwrap_or_default())]
    Forbidden {
        user: String,
        verb: String,
        resource: String,
        name: Option<String>,
        namespace: Option<String>,
    },
    #[error("the request lacks the dashboard session's CSRF token; reload the page")]
    Csrf,
    #[error("{kind} {name} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("{0}")]
    Invalid(String),
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("this path takes other methods (see /v1/openapi.json)")]
    MethodNotAllowed,
    /// What the API itself refuses to do in the object's present state.
    #[error("{0}")]
    Conflict(String),
    #[error("the Kubernetes API server refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Unavailable(String),
}

/// What every failed request answers.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable, for programs: `unauthenticated`, `forbidden`, `not_found`,
    /// `invalid`, `too_large`, `method_not_allowed`, `conflict`,
    /// `unavailable`.
    pub code: &'static str,
    /// For people.
    pub message: String,
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated(_) => "unauthenticated",
            Self::Forbidden { .. } | Self::Csrf => "forbidden",
            Self::NotFound { .. } => "not_found",
            Self::Invalid(_) => "invalid",
            Self::TooLarge(_) => "too_large",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::Conflict(_) | Self::Refused(_) => "conflict",
            Self::Unavailable(_) => "unavailable",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } | Self::Csrf => StatusCode::FORBIDDEN,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::Invalid(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict(_) | Self::Refused(_) => StatusCode::CONFLICT,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<kube::Error> for ApiError {
    /// What the API server answered a change the API made for its caller.
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => match status.code {
                404 => Self::NotFound {
                    kind: "object",
                    name: status.details.map(|d| d.name).unwrap_or_default(),
                },
                400 | 422 => Self::Invalid(status.message),
                409 => Self::Refused(status.message),
                // The manager's own rights, or the server's trouble: not
                // the caller's doing, nor theirs to see.
                code => {
                    tracing::warn!(
                        code,
                        message = status.message,
                        "the API server refused a change"
                    );
                    Self::Unavailable(format!("the API server answered {code}"))
                }
            },
            other => {
                tracing::warn!(error = %other, "the API server did not answer");
                Self::Unavailable("the API server did not answer".into())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code(),
            message: self.to_string(),
        };
        let mut response = (self.status(), Json(body)).into_response();
        if matches!(self, Self::Unauthenticated(_)) {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
