//! The frame every page shares: navigation, who is signed in, the live
//! indicator; or, for a live refresh, the page's content alone.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::Viewer;
use crate::api::ApiError;

/// The dashboard's sections, as the navigation lists them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Overview,
    Volumes,
    Nodes,
    Backups,
    Settings,
}

const SECTIONS: &[(Section, &str, &str)] = &[
    (Section::Overview, "Overview", "/ui/"),
    (Section::Volumes, "Volumes", "/ui/volumes"),
    (Section::Nodes, "Nodes", "/ui/nodes"),
    (Section::Backups, "Backups", "/ui/backups"),
    (Section::Settings, "Settings", "/ui/settings"),
];

/// `content` in the frame, titled `title`, or alone for a live refresh.
pub fn page(viewer: &Viewer, section: Section, title: &str, content: Markup) -> Response {
    if viewer.content_only {
        return Html(content.into_string()).into_response();
    }
    let frame = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="oxhorn-csrf" content=(viewer.csrf);
                title { (title) " · Oxhorn" }
                link rel="stylesheet" href="/ui/assets/app.css";
                script src="/ui/assets/app.js" defer {}
            }
            body {
                nav.side aria-label="Sections" {
                    span.brand { "Oxhorn" }
                    @for (each, name, href) in SECTIONS {
                        @if *each == section {
                            a href=(href) aria-current="page" { (name) }
                        } @else {
                            a href=(href) { (name) }
                        }
                    }
                    div.who {
                        "Signed in as " strong { (viewer.caller.name()) }
                        form method="post" action="/ui/signout" {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main data-live { (content) }
                div #toast .toast role="status" aria-live="polite" {}
            }
        }
    };
    Html(frame.into_string()).into_response()
}

/// A page's heading, with the live indicator and the page's actions.
pub fn heading(title: &str, badges: Markup, actions: Markup) -> Markup {
    html! {
        header.page {
            h1 { (title) }
            (badges)
            span #live .live { "Connecting…" }
            div.actions { (actions) }
        }
    }
}

/// A page saying why it cannot be shown: what the API would have answered.
pub fn refused(viewer: &Viewer, error: &ApiError) -> Response {
    let status = error.status();
    let content = html! {
        (heading("Not shown", html! {}, html! {}))
        section.panel role="alert" {
            h2 { (status_text(status)) }
            p { (error.to_string()) }
            p.hint { "Ask your cluster's administrator for the RBAC role this needs, or sign in with another token." }
        }
    };
    let mut response = page(viewer, Section::Overview, "Not shown", content);
    *response.status_mut() = status;
    response
}

fn status_text(status: StatusCode) -> &'static str {
    match status {
        StatusCode::FORBIDDEN => "You may not see this",
        StatusCode::NOT_FOUND => "Not found",
        StatusCode::BAD_REQUEST => "Not a page the dashboard has",
        _ => "The cluster did not answer",
    }
}

/// A robustness or state as a coloured badge.
pub fn badge(word: &str) -> Markup {
    html! { span class=(format!("badge {word}")) { (word) } }
}
