//! Signing in with a Kubernetes token pasted once, and out.

use std::sync::Arc;

use axum::Form;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;
use tracing::info;

use crate::api::ApiState;
use crate::api::session;

#[derive(Deserialize)]
pub struct SignIn {
    token: String,
}

#[derive(Deserialize)]
pub struct SignOut {
    csrf: String,
}

pub async fn form() -> Response {
    Html(sign_in_page(None).into_string()).into_response()
}

/// Checks the token with the API server, then keeps it in the browser's
/// session cookie. A sign-in posted from another site is refused, so no
/// page elsewhere can sign a browser in as someone else.
pub async fn submit(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Form(SignIn { token }): Form<SignIn>,
) -> Response {
    if !same_origin(&headers) {
        let page = sign_in_page(Some("Sign in from this dashboard's own page."));
        return (StatusCode::FORBIDDEN, Html(page.into_string())).into_response();
    }
    let token = token.trim();
    let refused = |why: &str| {
        let page = sign_in_page(Some(why));
        (StatusCode::UNAUTHORIZED, Html(page.into_string())).into_response()
    };
    let Some(cookie) = session::sign_in(token) else {
        return refused("That is not a Kubernetes token.");
    };
    match state.auth.authenticate(token).await {
        Ok(caller) => {
            info!(user = caller.name(), "signed in to the dashboard");
            let mut response = Redirect::to("/ui/").into_response();
            response.headers_mut().insert(header::SET_COOKIE, cookie);
            response
        }
        Err(error) => refused(&error.to_string()),
    }
}

/// Forgets the browser's session; only the session itself may (its CSRF
/// token), so no other page can sign a person out.
pub async fn sign_out(parts: Parts, Form(SignOut { csrf }): Form<SignOut>) -> Response {
    let ours = session::cookie_token(&parts).is_some_and(|t| session::csrf_token(t) == csrf);
    if !ours {
        return StatusCode::FORBIDDEN.into_response();
    }
    let mut response = Redirect::to("/ui/signin").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session::sign_out());
    response
}

/// Whether the request came from a page of this origin: its `Origin`, when
/// the browser sends one, names the host it was sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = origin.to_str().ok();
    let origin_host = origin.and_then(|o| o.split_once("://")).map(|(_, h)| h);
    host.is_some() && origin_host == host
}

fn sign_in_page(error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Sign in · Oxhorn" }
                link rel="stylesheet" href="/ui/assets/app.css";
            }
            body {
                div.signin {
                    form method="post" action="/ui/signin" {
                        h1 { "Oxhorn" }
                        p.muted { "Sign in with a Kubernetes token. You may do here what your RBAC lets you do with kubectl, and no more." }
                        label {
                            "Token"
                            textarea #token name="token" required autocomplete="off" spellcheck="false" {}
                        }
                        p.hint { "For example: " code { "kubectl -n oxhorn-system create token oxhorn-dashboard" } }
                        @if let Some(error) = error {
                            p.error role="alert" { (error) }
                        }
                        button.primary type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn a_sign_in_from_another_site_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9500"));
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9500"),
        );
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&headers));
    }
}
