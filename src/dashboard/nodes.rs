//! Nodes and their disks: whether replicas may go there, tags, disks
//! added, changed and removed, and their replicas evicted (moved away).

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use maud::{Markup, html};

use super::Viewer;
use super::format::bytes;
use super::layout::{self, Section};
use crate::api::ApiState;
use crate::api::auth::Access;
use crate::api::nodes::{DiskView, NodeView, all};

pub async fn page(State(state): State<Arc<ApiState>>, viewer: Viewer) -> Response {
    let list = Access::oxhorn("list", "nodes", None);
    if let Err(error) = state.auth.authorize(&viewer.caller, &list).await {
        return layout::refused(&viewer, &error);
    }
    let may_patch = state
        .auth
        .allows(&viewer.caller, &Access::oxhorn("patch", "nodes", None))
        .await;
    let nodes = all(&state);
    let content = html! {
        (layout::heading("Nodes", html! {}, html! {}))
        @if nodes.is_empty() { section.panel { p.empty { "No nodes yet." } } }
        @for node in &nodes { (node_panel(node, may_patch)) }
    };
    layout::page(&viewer, Section::Nodes, "Nodes", content)
}

fn node_panel(node: &NodeView, may_patch: bool) -> Markup {
    let path = format!("/v1/nodes/{}", node.name);
    let state = match (node.ready, node.schedulable && node.allow_scheduling) {
        (false, _) => "faulted",
        (true, false) => "degraded",
        (true, true) => "healthy",
    };
    let word = match state {
        "faulted" => "down",
        "degraded" => "not schedulable",
        _ => "ready",
    };
    let id = format!("node-{}", node.name);
    html! {
        section.panel data-node=(node.name) aria-labelledby=(format!("{id}-title")) {
            header.page {
                h2 id=(format!("{id}-title")) { (node.name) }
                span class=(format!("badge {state}")) { (word) }
                @if !node.zone.is_empty() { span.muted { "zone " (node.zone) } }
                @if !node.tags.is_empty() { span.muted { "tags: " (node.tags.join(", ")) } }
                @if node.eviction_requested || node.replicas_to_evict > 0 {
                    span.badge.degraded data-evicting=(node.replicas_to_evict) { (evicting(node)) }
                }
                div.actions {
                    @if may_patch {
                        form data-method="PATCH" data-path=(path) data-done="Scheduling changed" {
                            input type="hidden" data-field="allowScheduling" data-kind="bool" value=(!node.allow_scheduling);
                            button type="submit" { @if node.allow_scheduling { "Stop scheduling" } @else { "Allow scheduling" } }
                        }
                        (evict_form(&path, &format!("node {}", node.name), node.eviction_requested, "Evict replicas", None))
                        button type="button" data-open=(format!("{id}-tags")) { "Tags" }
                        button type="button" data-open=(format!("{id}-add-disk")) { "Add disk" }
                    }
                }
            }
            div.scroll { table id=(format!("{id}-disks")) {
                thead { tr {
                    th { "Disk" } th { "Path" } th.num { "Size" } th.num { "Free" }
                    th.num { "Promised" } th.num { "Reserved" } th.num { "Replicas" } th { "Scheduling" } th {}
                } }
                tbody {
                    @for disk in &node.disks { (disk_row(node, disk, may_patch)) }
                }
            } }
            @if may_patch { (dialogs(node, &id)) }
        }
    }
}

fn disk_row(node: &NodeView, disk: &DiskView, may_patch: bool) -> Markup {
    let path = format!("/v1/nodes/{}/disks/{}", node.name, disk.name);
    html! {
        tr data-disk=(disk.name) {
            td { (disk.name) }
            td { (disk.path) }
            td.num { (bytes(disk.storage_maximum)) }
            td.num { (bytes(disk.storage_available)) }
            td.num { (bytes(disk.storage_scheduled)) }
            td.num { (bytes(disk.storage_reserved)) }
            td.num { (disk.replicas) }
            td {
                @if disk.eviction_requested { span.badge.degraded { "evicting" } }
                @else if disk.allow_scheduling && disk.schedulable { span.badge.healthy { "on" } }
                @else { span.muted { "off" } }
            }
            td {
                @if may_patch {
                    form data-method="PATCH" data-path=(path) data-done="Disk changed" {
                        input type="hidden" data-field="allowScheduling" data-kind="bool" value=(!disk.allow_scheduling);
                        button type="submit" aria-label=(format!("Scheduling on disk {}", disk.name)) { @if disk.allow_scheduling { "Stop" } @else { "Allow" } }
                    }
                    (evict_form(&path, &format!("disk {} of node {}", disk.name, node.name), disk.eviction_requested, "Evict", Some(&disk.name)))
                    @if (!disk.allow_scheduling || disk.eviction_requested) && disk.replicas == 0 {
                        form data-method="DELETE" data-path=(path) data-done="Disk removed" {
                            button.quiet.danger type="submit" aria-label=(format!("Remove disk {}", disk.name)) { "Remove" }
                        }
                    }
                }
            }
        }
    }
}

/// E.g. "evicting: 3 replicas left", or "evicted" once none is.
fn evicting(node: &NodeView) -> String {
    match node.replicas_to_evict {
        0 => "evicted".to_owned(),
        1 => "evicting: 1 replica left".to_owned(),
        n => format!("evicting: {n} replicas left"),
    }
}

/// The switch that requests (asking first) or withdraws the eviction of
/// the replicas of `what` ("node n1", "disk d of node n1") at `path`;
/// `disk` names the disk in the button's label.
fn evict_form(path: &str, what: &str, evicting: bool, start: &str, disk: Option<&str>) -> Markup {
    let label = match (disk, evicting) {
        (Some(disk), false) => format!("Evict the replicas of disk {disk}"),
        (Some(disk), true) => format!("Stop evicting the replicas of disk {disk}"),
        (None, false) => "Evict the replicas of this node".to_owned(),
        (None, true) => "Stop evicting the replicas of this node".to_owned(),
    };
    let ask = (!evicting).then(|| {
        format!(
            "Move every replica off {what}? Each gets a replacement elsewhere and goes once \
             that one serves; nothing new is placed there meanwhile."
        )
    });
    html! {
        form data-method="PATCH" data-path=(path) data-done=(if evicting { "Eviction stopped" } else { "Eviction requested" }) data-ask=[ask] {
            input type="hidden" data-field="evictionRequested" data-kind="bool" value=(!evicting);
            button type="submit" aria-label=(label) { @if evicting { "Stop evicting" } @else { (start) } }
        }
    }
}

fn dialogs(node: &NodeView, id: &str) -> Markup {
    let path = format!("/v1/nodes/{}", node.name);
    html! {
        dialog id=(format!("{id}-tags")) aria-labelledby=(format!("{id}-tags-title")) {
            form data-method="PATCH" data-path=(path) data-done="Tags changed" {
                h2 id=(format!("{id}-tags-title")) { "Tags of " (node.name) }
                label { "Tags, separated by commas" input data-field="tags" data-kind="list" value=(node.tags.join(", ")) autocomplete="off"; }
                p.hint { "A volume's nodeSelector places its replicas only on nodes with all its tags." }
                p.error role="alert" {}
                div.buttons {
                    button type="button" data-close { "Cancel" }
                    button.primary type="submit" { "Save" }
                }
            }
        }
        dialog id=(format!("{id}-add-disk")) aria-labelledby=(format!("{id}-add-disk-title")) {
            form data-path=(format!("{path}/disks")) data-done="Disk added" {
                h2 id=(format!("{id}-add-disk-title")) { "Add a disk to " (node.name) }
                label { "Name" input data-field="name" required autocomplete="off"; }
                label { "Path on the node" input data-field="path" required placeholder="/var/lib/oxhorn-ssd" autocomplete="off"; }
                label { "Reserved bytes" input data-field="storageReserved" data-kind="int" type="number" min="0" placeholder="0"; }
                label { "Tags, separated by commas" input data-field="tags" data-kind="list" autocomplete="off"; }
                p.error role="alert" {}
                div.buttons {
                    button type="button" data-close { "Cancel" }
                    button.primary type="submit" { "Add" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(evicting: bool, left: usize) -> NodeView {
        let disk = DiskView {
            name: "d1".into(),
            path: "/mnt/d1".into(),
            allow_scheduling: true,
            storage_reserved: 0,
            tags: vec![],
            storage_maximum: 1 << 30,
            storage_available: 1 << 29,
            storage_scheduled: 0,
            fsid: "803".into(),
            ready: true,
            schedulable: true,
            conditions: vec![],
            replicas: left,
            eviction_requested: false,
        };
        NodeView {
            name: "n1".into(),
            ready: true,
            schedulable: true,
            allow_scheduling: true,
            eviction_requested: evicting,
            replicas_to_evict: left,
            tags: vec![],
            zone: String::new(),
            region: String::new(),
            frontends: vec![],
            disks: vec![disk],
            conditions: vec![],
        }
    }

    #[test]
    fn evicting_is_offered_with_a_question_only_to_who_may_patch() {
        let page = node_panel(&node(false, 2), true).into_string();
        assert!(page.contains(r#"data-field="evictionRequested" data-kind="bool" value="true""#));
        assert!(page.contains("Move every replica off node n1?"), "{page}");
        assert!(page.contains("Move every replica off disk d1 of node n1?"));
        assert!(
            !node_panel(&node(false, 2), false)
                .into_string()
                .contains("evictionRequested")
        );
    }

    #[test]
    fn an_evicting_node_counts_what_is_left_and_stops_without_asking() {
        let page = node_panel(&node(true, 3), true).into_string();
        assert!(page.contains("evicting: 3 replicas left"), "{page}");
        assert!(page.contains(r#"data-field="evictionRequested" data-kind="bool" value="false""#));
        assert!(page.contains("Stop evicting"));
        assert!(!page.contains("Move every replica off node n1?"));
        let done = node_panel(&node(true, 0), true).into_string();
        assert!(done.contains(">evicted<"), "{done}");
    }
}
