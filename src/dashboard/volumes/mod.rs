//! The volumes: a table to filter, sort and page through (`listing.rs`),
//! actions on the volumes selected in it (`bulk.rs`), and a volume to
//! make.

mod bulk;
mod listing;

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use maud::{Markup, html};

use super::Viewer;
use super::format::bytes;
use super::layout::{self, Section, badge};
use super::overview::{Health, health};
use crate::api::auth::Access;
use crate::api::query::Query;
use crate::api::volumes::{VolumeView, view};
use crate::api::{ApiError, ApiState};
use listing::{COLUMNS, Listing, Paged, paged};

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
    query: Result<Query<Listing>, ApiError>,
) -> Response {
    let listing = match query {
        Ok(Query(listing)) => listing,
        Err(invalid) => return layout::refused(&viewer, &invalid),
    };
    let list = Access::oxhorn("list", "volumes", None);
    if let Err(error) = state.auth.authorize(&viewer.caller, &list).await {
        return layout::refused(&viewer, &error);
    }
    let may_create = state
        .auth
        .allows(&viewer.caller, &Access::oxhorn("create", "volumes", None))
        .await;
    let bulk = bulk::Allowed::for_viewer(&state, &viewer.caller).await;
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
            v.name.contains(listing.name.as_str())
                && (listing.health.is_empty() || listing.health == h.word())
        })
        .collect();
    listing.sort(&mut rows);
    let shown = paged(rows, listing.page.unwrap_or(1), listing.rows());
    let actions = html! {
        @if may_create {
            button.primary type="button" data-open="create-volume" { "Create volume" }
        }
    };
    let content = html! {
        (layout::heading("Volumes", html! {}, actions))
        section.panel {
            (filters(&listing))
            @if shown.rows.is_empty() {
                p.empty { "No volumes" @if listing.filtered() { " match these filters" } "." }
            } @else {
                @if bulk.any() { (bulk::toolbar(&bulk)) }
                (table(&listing, &shown.rows, bulk.any()))
                (pager(&listing, &shown))
            }
        }
        @if may_create { (create_dialog()) }
        (bulk::dialogs(&bulk))
    };
    layout::page(&viewer, Section::Volumes, "Volumes", content)
}

/// The filters, sent as a new query that keeps the sort and page size.
fn filters(listing: &Listing) -> Markup {
    html! {
        form.filters method="get" action="/ui/volumes" role="search" {
            label { "Name contains" input type="search" name="name" value=(listing.name); }
            label {
                "Health"
                select name="health" {
                    option value="" { "any" }
                    @for word in HEALTHS {
                        option value=(word) selected[listing.health == word] { (word) }
                    }
                }
            }
            @for (name, value) in listing.kept() {
                input type="hidden" name=(name) value=(value);
            }
            button type="submit" { "Filter" }
        }
    }
}

/// The page's volumes; each heading a link that sorts by it.
fn table(listing: &Listing, rows: &[(VolumeView, Health)], selectable: bool) -> Markup {
    html! {
        div.scroll { table #volumes {
            thead { tr {
                @if selectable {
                    th.select { input type="checkbox" data-select-all aria-label="Select every volume on this page"; }
                }
                @for (column, _, title, numeric) in COLUMNS {
                    @let sorted = (listing.sort == column).then_some(if listing.desc { "descending" } else { "ascending" });
                    th.num[numeric] aria-sort=[sorted] {
                        a.sort href=(listing.sorted_by(column).href()) { (title) }
                    }
                }
            } }
            tbody {
                @for (volume, health) in rows {
                    tr data-volume=(volume.name) {
                        @if selectable {
                            td.select { input type="checkbox" data-select value=(volume.name) aria-label=(format!("Select {}", volume.name)); }
                        }
                        td { a href=(format!("/ui/volumes/{}", volume.name)) { (volume.name) } }
                        td { (volume.pvc.clone().unwrap_or_default()) }
                        td.num { (bytes(volume.size)) }
                        td.num { (bytes(volume.actual_size)) }
                        td.num { (volume.replicas_healthy) " / " (volume.replicas_wanted) }
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

/// Where the page is in the list, and the pages before and after it.
fn pager<T>(listing: &Listing, shown: &Paged<T>) -> Markup {
    let last = shown.first + shown.rows.len() - 1;
    html! {
        nav.pager aria-label="Pages of volumes" {
            span #showing { "Showing " (shown.first) "–" (last) " of " (shown.total) }
            @if shown.pages > 1 {
                @if shown.page > 1 {
                    a.button rel="prev" href=(listing.at(shown.page - 1).href()) { "Previous" }
                } @else {
                    span.button aria-disabled="true" { "Previous" }
                }
                span.muted { "Page " (shown.page) " of " (shown.pages) }
                @if shown.page < shown.pages {
                    a.button rel="next" href=(listing.at(shown.page + 1).href()) { "Next" }
                } @else {
                    span.button aria-disabled="true" { "Next" }
                }
            }
        }
    }
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
