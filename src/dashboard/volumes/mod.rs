//! The volumes: a table to sort and filter, and a volume to make.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

use super::Viewer;
use super::format::bytes;
use super::layout::{self, Section, badge};
use super::overview::health;
use crate::api::ApiState;
use crate::api::auth::Access;
use crate::api::volumes::view;

/// The filters a person set.
#[derive(Debug, Default, Deserialize)]
pub struct Filters {
    #[serde(default)]
    name: String,
    #[serde(default)]
    health: String,
}

const HEALTHS: [&str; 6] = [
    "healthy",
    "degraded",
    "rebuilding",
    "faulted",
    "detached",
    "unknown",
];

pub async fn page(
    State(state): State<Arc<ApiState>>,
    viewer: Viewer,
    Query(filters): Query<Filters>,
) -> Response {
    let list = Access::oxhorn("list", "volumes", None);
    if let Err(error) = state.auth.authorize(&viewer.caller, &list).await {
        return layout::refused(&viewer, &error);
    }
    let may_create = state
        .auth
        .allows(&viewer.caller, &Access::oxhorn("create", "volumes", None))
        .await;
    let mut rows: Vec<_> = state
        .ds
        .volumes
        .store
        .state()
        .iter()
        .map(|v| {
            let volume = view(&state, v);
            let health = health(&state, &volume);
            (volume, health)
        })
        .filter(|(v, h)| {
            v.name.contains(filters.name.as_str())
                && (filters.health.is_empty() || filters.health == h.word())
        })
        .collect();
    rows.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let actions = html! {
        @if may_create {
            button.primary type="button" data-open="create-volume" { "Create volume" }
        }
    };
    let content = html! {
        (layout::heading("Volumes", html! {}, actions))
        section.panel {
            form.filters method="get" action="/ui/volumes" role="search" {
                label { "Name contains" input type="search" name="name" value=(filters.name); }
                label {
                    "Health"
                    select name="health" {
                        option value="" { "any" }
                        @for word in HEALTHS {
                            option value=(word) selected[filters.health == word] { (word) }
                        }
                    }
                }
                button type="submit" { "Filter" }
            }
            @if rows.is_empty() {
                p.empty { "No volumes" @if !filters.name.is_empty() || !filters.health.is_empty() { " match these filters" } "." }
            } @else {
                div.scroll { table #volumes {
                    thead { tr {
                        th data-sort { "Name" }
                        th data-sort { "Claim" }
                        th.num data-sort { "Size" }
                        th.num data-sort { "Used" }
                        th.num data-sort { "Replicas" }
                        th data-sort { "Node" }
                        th data-sort { "Frontend" }
                        th data-sort { "State" }
                        th data-sort { "Health" }
                    } }
                    tbody {
                        @for (volume, health) in &rows {
                            tr data-volume=(volume.name) {
                                td { a href=(format!("/ui/volumes/{}", volume.name)) { (volume.name) } }
                                td { (volume.pvc.clone().unwrap_or_default()) }
                                td.num data-value=(volume.size) { (bytes(volume.size)) }
                                td.num data-value=(volume.actual_size) { (bytes(volume.actual_size)) }
                                td.num data-value=(volume.replicas_healthy) { (volume.replicas_healthy) " / " (volume.replicas_wanted) }
                                td { (volume.node) }
                                td { (volume.frontend) }
                                td { (volume.state) }
                                td { (badge(health.word())) }
                            }
                        }
                    }
                } }
            }
        }
        @if may_create { (create_dialog()) }
    };
    layout::page(&viewer, Section::Volumes, "Volumes", content)
}

/// The form that makes a volume, through `POST /v1/volumes`.
fn create_dialog() -> Markup {
    html! {
        dialog #create-volume aria-labelledby="create-volume-title" {
            form data-path="/v1/volumes" data-then="/ui/volumes/{name}" {
                h2 #create-volume-title { "Create volume" }
                label { "Name" input data-field="name" required pattern="[a-z0-9]([-a-z0-9.]*[a-z0-9])?" maxlength="253" autocomplete="off"; }
                div.row {
                    label { "Size" input data-field="size" data-kind="bytes" type="number" min="1" step="any" required value="1"; }
                    label {
                        "Unit"
                        select data-unit-for="size" {
                            option value="1048576" { "MiB" }
                            option value="1073741824" selected { "GiB" }
                        }
                    }
                }
                label { "Replicas" input data-field="numberOfReplicas" data-kind="int" type="number" min="1" max="20" placeholder="the default"; }
                label {
                    "Frontend"
                    select data-field="frontend" {
                        option value="" { "auto" }
                        option value="fuse" { "fuse" }
                        option value="iscsi" { "iscsi" }
                    }
                }
                p.error role="alert" {}
                div.buttons {
                    button type="button" data-close { "Cancel" }
                    button.primary type="submit" { "Create" }
                }
            }
        }
    }
}
