//! The web dashboard, served by every manager beside the REST API (under
//! `/ui/`), from templates and assets built into the binary: no separate
//! pod, no CDN, no JavaScript build. Pages are rendered here (maud) from
//! the manager's caches, each as the signed-in user is allowed to see it;
//! what a person changes goes through the REST API itself (`app.js`), so
//! the dashboard can do nothing the API would not let that user do. A
//! server-sent event stream (`live.rs`) tells open pages to render again
//! when the cluster changes.
//!
//! Why this stack: a small UI that lives as long as the product, reviewed
//! as Rust and one short script, with no toolchain or dependency tree of
//! its own to keep current, and pages that are fast on first render.

mod backups;
mod format;
mod layout;
mod live;
mod nodes;
mod overview;
mod settings;
mod signin;
mod volume;
mod volumes;
mod workload;

use std::sync::Arc;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Event;

use crate::api::auth::Caller;
use crate::api::session;
use crate::api::{ApiState, events};

/// The most Events a page reads (the API server lists them by name, not
/// by time: the newest of these are shown).
const EVENTS_READ: u32 = 1000;

/// The Events of oxhorn's namespace that `fields` selects, newest first, at
/// most `keep`; none if they cannot be read.
async fn recent_events(state: &ApiState, fields: &str, keep: usize) -> Vec<Event> {
    let mut events = events::read(state, fields, EVENTS_READ)
        .await
        .unwrap_or_default();
    events::newest_first(&mut events);
    events.truncate(keep);
    events
}

/// A signed-in person looking at a page.
pub struct Viewer {
    pub caller: Caller,
    /// The session's CSRF token, for the page's script.
    pub csrf: String,
    /// Only the page's content is wanted (a live refresh), not its frame.
    pub content_only: bool,
}

impl FromRequestParts<Arc<ApiState>> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let content_only = parts.headers.contains_key("x-oxhorn-part");
        let sign_in = || Redirect::to("/ui/signin").into_response();
        let token = session::cookie_token(parts).ok_or_else(sign_in)?;
        let caller = state
            .auth
            .authenticate(token)
            .await
            .map_err(|_| sign_in())?;
        Ok(Self {
            caller,
            csrf: session::csrf_token(token),
            content_only,
        })
    }
}

/// The dashboard's routes.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(overview::page))
        .route("/ui/signin", get(signin::form).post(signin::submit))
        .route("/ui/signout", post(signin::sign_out))
        .route("/ui/volumes", get(volumes::page))
        .route("/ui/volumes/{name}", get(volume::page))
        .route("/ui/nodes", get(nodes::page))
        .route("/ui/backups", get(backups::page))
        .route("/ui/settings", get(settings::page))
        .route("/ui/live", get(live::stream))
        .route("/ui/assets/app.js", get(script))
        .route("/ui/assets/app.css", get(style))
        .layer(axum::middleware::map_response(hardened))
        .with_state(state)
}

async fn script() -> impl IntoResponse {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    )
}

async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", include_str!("assets/app.css"))
}

fn asset(kind: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// Every dashboard answer: only its own scripts and styles run, it is
/// never framed, and nothing it shows is cached by the browser.
async fn hardened(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}
