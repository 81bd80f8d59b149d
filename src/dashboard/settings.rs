//! Settings: each with what it does, what it takes and its default, edited
//! in place; a value the managers refuse says why.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use maud::html;

use super::Viewer;
use super::layout::{self, Section};
use crate::api::ApiState;
use crate::api::auth::Access;
use crate::api::settings::all;

pub async fn page(State(state): State<Arc<ApiState>>, viewer: Viewer) -> Response {
    let list = Access::oxhorn("list", "settings", None);
    if let Err(error) = state.auth.authorize(&viewer.caller, &list).await {
        return layout::refused(&viewer, &error);
    }
    let may_change = state
        .auth
        .allows(&viewer.caller, &Access::oxhorn("update", "settings", None))
        .await;
    let settings = all(&state);
    let content = html! {
        (layout::heading("Settings", html! {}, html! {}))
        section.panel {
            div #settings .settings {
                @for setting in &settings {
                    div.setting data-setting=(setting.key) {
                        div {
                            h3 { (setting.key) }
                            p { (setting.description) }
                            p.muted { (setting.allowed) "; default " code { (setting.default) } }
                        }
                        div {
                            @if may_change {
                                form.inline data-method="PUT" data-path=(format!("/v1/settings/{}", setting.key)) data-done=(format!("{} saved", setting.key)) {
                                    input data-field="value" data-empty value=(setting.value) aria-label=(format!("Value of {}", setting.key)) autocomplete="off";
                                    button type="submit" { "Save" }
                                    p.error role="alert" {}
                                }
                            } @else {
                                code { (setting.value) }
                            }
                            p {
                                @match setting.applied {
                                    Some(true) => span.badge.healthy { "in effect" },
                                    Some(false) => { span.badge.error { "refused" } " " span.muted { (setting.message) } },
                                    None => span.muted { @if setting.set { "being checked" } @else { "the default" } },
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout::page(&viewer, Section::Settings, "Settings", content)
}
