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

use std::sync::Arc;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;

use crate::api::ApiState;
use crate::api::auth::Caller;
use crate::api::session;

/// Events are listed this many at a time, and at most [`EVENT_PAGES`]
/// pages: the API server lists them by name, not by time.
const EVENT_PAGE: u32 = 250;
const EVENT_PAGES: usize = 4;

/// The Events of oxhorn's namespace that `fields` selects, newest first, at
/// most `keep`.
async fn recent_events(state: &ApiState, fields: &str, keep: usize) -> Vec<Event> {
    let events = state.api::<Event>();
    let mut all = Vec::new();
    let mut params = ListParams::default().fields(fields).limit(EVENT_PAGE);
    for _ in 0..EVENT_PAGES {
        let Ok(page) = events.list(&params).await else {
            break;
        };
        all.extend(page.items);
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => params = params.continue_token(&next),
            _ => break,
        }
    }
    all.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
    all.truncate(keep);
    all
}

/// When an Event last happened.
fn event_time(event: &Event) -> Option<jiff::Timestamp> {
    let last = event.last_timestamp.as_ref().map(|t| t.0);
    last.or(event.event_time.as_ref().map(|t| t.0))
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
