//! The overview: volumes by robustness, storage, nodes, and the latest
//! warnings.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use maud::{Markup, html};

use super::format::{ago, bytes};
use super::layout::{self, Section};
use super::{Viewer, recent_events};
use crate::api::ApiState;
use crate::api::auth::Access;
use crate::api::events::last_happened;
use crate::api::volumes::{VolumeView, view};
use crate::types::{Condition, ReplicaMode, engine_name};

/// How many warnings the overview lists.
const WARNINGS: usize = 8;

/// What a volume is, as the overview counts them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Health {
    Healthy,
    Degraded,
    Rebuilding,
    Faulted,
    Detached,
    /// Not known yet (being made).
    Unknown,
}

impl Health {
    pub fn word(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Rebuilding => "rebuilding",
            Self::Faulted => "faulted",
            Self::Detached => "detached",
            Self::Unknown => "unknown",
        }
    }
}

/// A volume's health, from what the caches hold of it.
pub fn health(state: &ApiState, volume: &VolumeView) -> Health {
    let engine = state.ds.engines.get(&engine_name(&volume.name));
    let status = engine.as_ref().and_then(|e| e.status.as_ref());
    let rebuilding = status.is_some_and(|s| {
        s.replica_mode_map
            .values()
            .any(|m| *m == ReplicaMode::WriteOnly)
    });
    health_of(&volume.robustness, &volume.state, rebuilding)
}

/// Faulted whatever else; detached; rebuilding while a replica is being
/// rebuilt; else its robustness.
fn health_of(robustness: &str, state: &str, rebuilding: bool) -> Health {
    match (robustness, state) {
        ("faulted", _) => Health::Faulted,
        (_, "detached") => Health::Detached,
        _ if rebuilding => Health::Rebuilding,
        ("healthy", _) => Health::Healthy,
        ("degraded", _) => Health::Degraded,
        _ => Health::Unknown,
    }
}

pub async fn page(State(state): State<Arc<ApiState>>, viewer: Viewer) -> Response {
    let list_volumes = Access::oxhorn("list", "volumes", None);
    if let Err(error) = state.auth.authorize(&viewer.caller, &list_volumes).await {
        return layout::refused(&viewer, &error);
    }
    let nodes_visible = state
        .auth
        .allows(&viewer.caller, &Access::oxhorn("list", "nodes", None))
        .await;
    let events = Access::core("list", "events", crate::api::auth::Scope::Oxhorn, None);
    let warnings = if state.auth.allows(&viewer.caller, &events).await {
        Some(warnings(&state).await)
    } else {
        None
    };
    let content = html! {
        (layout::heading("Overview", html! {}, html! {}))
        (volume_cards(&state))
        @if nodes_visible {
            (storage_and_nodes(&state))
        }
        @if let Some(warnings) = warnings {
            (warnings)
        }
    };
    layout::page(&viewer, Section::Overview, "Overview", content)
}

fn volume_cards(state: &ApiState) -> Markup {
    let volumes = state.ds.volumes.store.state();
    let mut counts = [0usize; 6];
    for volume in &volumes {
        counts[health(state, &view(state, volume)) as usize] += 1;
    }
    let kinds = [
        Health::Healthy,
        Health::Degraded,
        Health::Rebuilding,
        Health::Faulted,
        Health::Detached,
        Health::Unknown,
    ];
    html! {
        section.panel aria-labelledby="volumes-heading" {
            h2 #volumes-heading { "Volumes " span.muted { (volumes.len()) " in all" } }
            div.cards {
                @for kind in kinds {
                    a.card href=(format!("/ui/volumes?health={}", kind.word())) {
                        div.what { (kind.word()) }
                        div.n data-health=(kind.word()) { (counts[kind as usize]) }
                    }
                }
            }
        }
    }
}

fn storage_and_nodes(state: &ApiState) -> Markup {
    let nodes = state.ds.nodes.store.state();
    let (mut maximum, mut available, mut scheduled, mut reserved) = (0i64, 0i64, 0i64, 0i64);
    let (mut ready, mut unschedulable, mut down) = (0, 0, 0);
    for node in &nodes {
        let status = node.status.clone().unwrap_or_default();
        for (name, disk) in &node.spec.disks {
            let measured = status.disk_status.get(name).cloned().unwrap_or_default();
            maximum += measured.storage_maximum;
            available += measured.storage_available;
            scheduled += measured.storage_scheduled;
            reserved += disk.storage_reserved;
        }
        if !Condition::is_true(&status.conditions, "Ready") {
            down += 1;
        } else if !node.spec.allow_scheduling
            || !Condition::is_true(&status.conditions, "Schedulable")
        {
            unschedulable += 1;
        } else {
            ready += 1;
        }
    }
    html! {
        section.panel aria-labelledby="storage-heading" {
            h2 #storage-heading { "Storage" }
            dl.facts {
                div { dt { "Size of the disks" } dd { (bytes(maximum)) } }
                div { dt { "Free" } dd { (bytes(available)) } }
                div { dt { "Promised to replicas" } dd { (bytes(scheduled)) } }
                div { dt { "Reserved" } dd { (bytes(reserved)) } }
            }
        }
        section.panel aria-labelledby="nodes-heading" {
            h2 #nodes-heading { "Nodes" }
            dl.facts {
                div { dt { "Ready" } dd { (ready) } }
                div { dt { "Not schedulable" } dd { (unschedulable) } }
                div { dt { "Down" } dd { (down) } }
            }
        }
    }
}

/// The latest warning Events in oxhorn's namespace.
async fn warnings(state: &ApiState) -> Markup {
    let events = recent_events(state, "type=Warning", WARNINGS).await;
    let when = last_happened;
    html! {
        section.panel aria-labelledby="warnings-heading" {
            h2 #warnings-heading { "Recent warnings" }
            @if events.is_empty() {
                p.empty { "None." }
            } @else {
                div.scroll { table {
                    thead { tr { th { "When" } th { "Object" } th { "Reason" } th { "Message" } } }
                    tbody {
                        @for event in &events {
                            tr {
                                td { (when(event).map(|t| ago(&t.to_string())).unwrap_or_default()) }
                                td { (event.involved_object.kind.clone().unwrap_or_default()) " " (event.involved_object.name.clone().unwrap_or_default()) }
                                td { (event.reason.clone().unwrap_or_default()) }
                                td.wrap { (event.message.clone().unwrap_or_default()) }
                            }
                        }
                    }
                } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_reads_as_its_worst_news() {
        assert_eq!(health_of("faulted", "detached", false), Health::Faulted);
        assert_eq!(health_of("healthy", "detached", false), Health::Detached);
        assert_eq!(health_of("degraded", "attached", true), Health::Rebuilding);
        assert_eq!(health_of("degraded", "attached", false), Health::Degraded);
        assert_eq!(health_of("healthy", "attached", false), Health::Healthy);
        assert_eq!(health_of("unknown", "creating", false), Health::Unknown);
    }
}
