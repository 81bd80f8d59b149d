//! One volume: what it is, who uses it, its replicas with their rebuilds,
//! its snapshot chain, its backups, its events, and what may be done to
//! it. Each action is shown only to a person allowed to do it; destructive
//! ones ask for the volume's name.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Response;
use maud::{Markup, html};

use super::format::{ago, bytes};
use super::layout::{self, Section, badge};
use super::overview::health;
use super::{Viewer, recent_events, workload};
use crate::api::auth::{Access, Caller, Scope};
use crate::api::backups::{BackupView, newest_first};
use crate::api::events::last_happened;
use crate::api::replicas::{ReplicaView, of_volume};
use crate::api::snapshots::{SnapshotView, chain};
use crate::api::volumes::{VolumeView, view};
use crate::api::{ApiError, ApiState, workload::of_volume as workload_of};

/// What the viewer may do to the volume.
struct Allowed {
    patch: bool,
    delete: bool,
    snapshot: bool,
    delete_snapshot: bool,
    back_up: bool,
    delete_backup: bool,
    delete_replica: bool,
    create: bool,
}

impl Allowed {
    async fn for_viewer(state: &ApiState, caller: &Caller, name: &str) -> Self {
        let may = |verb, resource, one: Option<&str>| {
            let access = Access::oxhorn(verb, resource, one);
            async move { state.auth.allows(caller, &access).await }
        };
        Self {
            patch: may("patch", "volumes", Some(name)).await,
            delete: may("delete", "volumes", Some(name)).await,
            snapshot: may("create", "snapshots", None).await,
            delete_snapshot: may("delete", "snapshots", None).await,
            back_up: may("create", "backups", None).await,
            delete_backup: may("delete", "backups", None).await,
            delete_replica: may("delete", "replicas", None).await,
            create: may("create", "volumes", None).await,
        }
    }
}

pub async fn page(
    State(state): State<Arc<ApiState>>,
    viewer: Viewer,
    Path(name): Path<String>,
) -> Response {
    let get = Access::oxhorn("get", "volumes", Some(&name));
    if let Err(error) = state.auth.authorize(&viewer.caller, &get).await {
        return layout::refused(&viewer, &error);
    }
    let Some(volume) = state.ds.volumes.get(&name) else {
        let missing = ApiError::NotFound {
            kind: "volume",
            name,
        };
        return layout::refused(&viewer, &missing);
    };
    let volume = view(&state, &volume);
    let may = Allowed::for_viewer(&state, &viewer.caller, &name).await;
    let see = |resource| {
        let access = Access::oxhorn("list", resource, None);
        let state = &state;
        let caller = &viewer.caller;
        async move { state.auth.allows(caller, &access).await }
    };
    let replicas = see("replicas").await.then(|| of_volume(&state, &name));
    let snapshots = see("snapshots").await.then(|| chain(&state, &name));
    let backups = see("backups")
        .await
        .then(|| newest_first(&state, Some(&name)));
    let events_access = Access::core("list", "events", Scope::Oxhorn, None);
    let events = match state.auth.allows(&viewer.caller, &events_access).await {
        true => Some(events(&state, &name).await),
        false => None,
    };
    let workload = workload_of(&state, &viewer.caller, &name).await;
    let health = health(&state, &volume).word();
    let content = html! {
        (layout::heading(&name, badge(health), actions(&volume, &may)))
        (facts(&volume))
        (workload::section(&workload))
        @if let Some(replicas) = &replicas { (replica_table(replicas, &may)) }
        @if let Some(snapshots) = &snapshots { (snapshot_chain(&volume, snapshots, &may)) }
        @if let Some(backups) = &backups { (backup_table(backups, &may)) }
        @if let Some(events) = events { (events) }
        (dialogs(&volume, &may, snapshots.as_deref().unwrap_or_default()))
    };
    layout::page(&viewer, Section::Volumes, &name, content)
}

fn actions(volume: &VolumeView, may: &Allowed) -> Markup {
    let attached = !volume.node.is_empty();
    let standby = volume.standby.as_ref().map(|s| s.phase.as_str());
    if matches!(standby, Some("standby" | "activating")) {
        // It holds another volume's backup: nothing may use it yet.
        return html! {
            @if may.patch && standby == Some("standby") {
                form data-path=(format!("/v1/volumes/{}/activate", volume.name)) data-done="Activating" data-ask=(format!("Activate {}? It restores the newest backup, then becomes a normal volume and stops following backups; this cannot be undone.", volume.name)) {
                    button type="submit" { "Activate" }
                }
            }
            @if may.delete { button.danger type="button" data-open="delete-volume" { "Delete" } }
        };
    }
    html! {
        @if may.patch {
            @if attached {
                form data-path=(format!("/v1/volumes/{}/detach", volume.name)) data-done="Detaching" {
                    button type="submit" { "Detach" }
                }
            } @else {
                button type="button" data-open="attach" { "Attach" }
            }
            button type="button" data-open="expand" { "Expand" }
            button type="button" data-open="replica-count" { "Replicas" }
        }
        @if may.snapshot { button type="button" data-open="take-snapshot" { "Take snapshot" } }
        @if may.back_up { button type="button" data-open="back-up" { "Back up" } }
        @if may.create && may.snapshot { button type="button" data-open="clone" { "Clone" } }
        @if may.patch && volume.robustness == "faulted" {
            button type="button" data-open="salvage" { "Salvage" }
        }
        @if may.delete { button.danger type="button" data-open="delete-volume" { "Delete" } }
    }
}

fn facts(volume: &VolumeView) -> Markup {
    html! {
        section.panel aria-label="Volume" {
            dl.facts {
                div { dt { "State" } dd { (volume.state) } }
                div { dt { "Robustness" } dd { (volume.robustness) } }
                div { dt { "Size" } dd { (bytes(volume.size)) } }
                div { dt { "Used" } dd { (bytes(volume.actual_size)) } }
                div { dt { "Replicas healthy" } dd data-fact="replicas" { (volume.replicas_healthy) " of " (volume.replicas_wanted) } }
                div { dt { "Node" } dd { @if volume.node.is_empty() { "detached" } @else { (volume.node) } } }
                div { dt { "Frontend" } dd { (volume.frontend) } }
                div { dt { "Claim" } dd { (volume.pvc.clone().unwrap_or_else(|| "none".into())) } }
                @if let Some(standby) = &volume.standby {
                    div { dt { "Standby" } dd data-fact="standby" {
                        (standby.phase) ": follows " (standby.source_volume) " in " (standby.backup_target)
                        @if !standby.last_restored_backup.is_empty() {
                            "; holds " (standby.last_restored_backup) ", " (standby.backups_behind) " newer (" (standby.lag_seconds) " s behind)"
                        }
                        @if let Some(backup) = &standby.restoring { " " span.muted { "restoring " (backup) } }
                        @if let Some(at) = &standby.activated_at { " " span.muted { "activated " (at) } }
                    } }
                }
                @if let Some(revert) = &volume.revert {
                    div { dt { "Revert" } dd { "to " (revert.snapshot) ": " (revert.phase) @if !revert.message.is_empty() { " " span.muted { (revert.message) } } } }
                }
            }
        }
    }
}

fn replica_table(replicas: &[ReplicaView], may: &Allowed) -> Markup {
    html! {
        section.panel aria-labelledby="replicas-heading" {
            h2 #replicas-heading { "Replicas" }
            @if replicas.is_empty() { p.empty { "None yet." } } @else {
                div.scroll { table #replicas {
                    thead { tr {
                        th data-sort { "Name" } th data-sort { "Node" } th { "Disk" }
                        th data-sort { "Process" } th data-sort { "Mode" } th { "Rebuild" } th {}
                    } }
                    tbody {
                        @for replica in replicas {
                            tr data-replica=(replica.name) data-mode=(replica.mode.clone().unwrap_or_default()) {
                                td { (replica.name) }
                                td { (replica.node) }
                                td { (replica.disk_path) }
                                td { (replica.state) }
                                td { (mode_badge(replica.mode.as_deref())) }
                                td {
                                    @if let Some(progress) = replica.rebuild_progress {
                                        progress value=(progress) max="100" aria-label=(format!("rebuild of {}", replica.name)) {}
                                        " " span data-progress { (progress) "%" }
                                    }
                                }
                                td {
                                    @if may.delete_replica && !replica.deleting {
                                        form data-method="DELETE" data-path=(format!("/v1/replicas/{}", replica.name)) data-done="Replica deleted" data-ask=(format!("Delete replica {}? Another is made and rebuilt.", replica.name)) {
                                            button.quiet.danger type="submit" aria-label=(format!("Delete replica {}", replica.name)) { "Delete" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        }
    }
}

fn mode_badge(mode: Option<&str>) -> Markup {
    match mode {
        Some("RW") => badge("healthy"),
        Some("WO") => badge("rebuilding"),
        Some("ERR") => badge("error"),
        _ => html! { span.muted { "not in use" } },
    }
}

fn snapshot_chain(volume: &VolumeView, snapshots: &[SnapshotView], may: &Allowed) -> Markup {
    html! {
        section.panel aria-labelledby="snapshots-heading" {
            h2 #snapshots-heading { "Snapshots" }
            @if snapshots.is_empty() { p.empty { "None." } } @else {
                ol.chain aria-label="Snapshots, oldest first" {
                    @for snapshot in snapshots {
                        li data-snapshot=(snapshot.name) {
                            strong { (snapshot.name) }
                            @if snapshot.purpose != "user" { span.badge { (snapshot.purpose) } }
                            @if !snapshot.ready_to_use { span.badge.rebuilding { "taking" } }
                            @if !snapshot.error.is_empty() { span.badge.error title=(snapshot.error) { "error" } }
                            span.muted { (snapshot.created.as_deref().map(ago).unwrap_or_default()) " ago" }
                            span.actions {
                                @if may.patch && volume.state == "detached" && snapshot.ready_to_use && !snapshot.deleting {
                                    form data-path=(format!("/v1/volumes/{}/snapshots/{}/revert", volume.name, snapshot.name)) data-done="Reverting" data-ask=(format!("Revert {} to snapshot {}? Every write after the snapshot is discarded, and so are the snapshots taken after it. The volume attaches again once this is done.", volume.name, snapshot.name)) {
                                        button.quiet type="submit" aria-label=(format!("Revert to snapshot {}", snapshot.name)) { "Revert" }
                                    }
                                }
                                @if may.delete_snapshot && !snapshot.deleting {
                                    form data-method="DELETE" data-path=(format!("/v1/snapshots/{}", snapshot.name)) data-done="Snapshot deleted" data-ask=(format!("Delete snapshot {}? Its data merges into the next layer.", snapshot.name)) {
                                        button.quiet.danger type="submit" aria-label=(format!("Delete snapshot {}", snapshot.name)) { "Delete" }
                                    }
                                }
                            }
                        }
                    }
                    li.head { strong { "Now" } span.muted { "what " (volume.name) " holds" } }
                }
            }
        }
    }
}

fn backup_table(backups: &[BackupView], may: &Allowed) -> Markup {
    html! {
        section.panel aria-labelledby="backups-heading" {
            h2 #backups-heading { "Backups" }
            @if backups.is_empty() { p.empty { "None." } } @else {
                div.scroll { table #backups {
                    thead { tr {
                        th data-sort { "Name" } th data-sort { "State" } th { "Progress" }
                        th.num data-sort { "Size" } th data-sort { "Target" } th data-sort { "Completed" } th {}
                    } }
                    tbody {
                        @for backup in backups {
                            tr data-backup=(backup.name) data-state=(backup.state) {
                                td { (backup.name) }
                                td { (backup.state) @if !backup.error.is_empty() { " " span.muted { (backup.error) } } }
                                td { progress value=(backup.progress) max="100" aria-label=(format!("backup {}", backup.name)) {} }
                                td.num data-value=(backup.size) { (bytes(backup.size)) }
                                td { (backup.target) }
                                td { (backup.created.as_deref().map(ago).map(|a| a + " ago").unwrap_or_default()) }
                                td {
                                    @if may.create && backup.state == "completed" {
                                        button type="button" data-open=(format!("restore-{}", backup.name)) { "Restore" }
                                    }
                                    @if may.delete_backup && !backup.deleting {
                                        form data-method="DELETE" data-path=(format!("/v1/backups/{}", backup.name)) data-done="Backup deleted" data-ask=(format!("Delete backup {} from its store? It cannot be undone.", backup.name)) {
                                            button.quiet.danger type="submit" aria-label=(format!("Delete backup {}", backup.name)) { "Delete" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                } }
                @if may.create {
                    @for backup in backups.iter().filter(|b| b.state == "completed") {
                        (restore_dialog(backup))
                    }
                }
            }
        }
    }
}

pub fn restore_dialog(backup: &BackupView) -> Markup {
    let id = format!("restore-{}", backup.name);
    html! {
        dialog id=(id) aria-labelledby=(format!("{id}-title")) {
            form data-path="/v1/volumes" data-then="/ui/volumes/{name}" {
                h2 id=(format!("{id}-title")) { "Restore " (backup.name) " into a new volume" }
                input type="hidden" data-field="fromBackup" value=(backup.name);
                label { "New volume's name" input data-field="name" required autocomplete="off"; }
                p.error role="alert" {}
                div.buttons {
                    button type="button" data-close { "Cancel" }
                    button.primary type="submit" { "Restore" }
                }
            }
        }
    }
}

/// The Events of the volume and its engine and replicas, newest first.
async fn events(state: &ApiState, name: &str) -> Markup {
    let selected = format!("involvedObject.name={name}");
    let events = recent_events(state, &selected, 20).await;
    let when = last_happened;
    html! {
        section.panel aria-labelledby="events-heading" {
            h2 #events-heading { "Events" }
            @if events.is_empty() { p.empty { "None." } } @else {
                div.scroll { table {
                    thead { tr { th { "When" } th { "Type" } th { "Reason" } th { "Message" } } }
                    tbody {
                        @for event in &events {
                            tr {
                                td { (when(event).map(|t| ago(&t.to_string())).unwrap_or_default()) }
                                td { (event.type_.clone().unwrap_or_default()) }
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

/// The dialogs the actions open.
fn dialogs(volume: &VolumeView, may: &Allowed, snapshots: &[SnapshotView]) -> Markup {
    let name = &volume.name;
    let path = |action: &str| format!("/v1/volumes/{name}/{action}");
    html! {
        @if may.patch {
            (dialog("attach", "Attach", "Attach", &path("attach"), html! {
                label { "Node" input data-field="node" required autocomplete="off"; }
                p.hint { "A workload's volume is attached by Kubernetes; attach here for maintenance." }
            }))
            (dialog("expand", "Expand", "Expand", &path("expand"), html! {
                div.row {
                    label { "New size" input data-field="size" data-kind="bytes" type="number" min="1" step="any" required; }
                    label { "Unit" select data-unit-for="size" {
                        option value="1048576" { "MiB" }
                        option value="1073741824" selected { "GiB" }
                    } }
                }
                p.hint { "Now " (bytes(volume.size)) ". A volume grows, never shrinks." }
            }))
            (patch_dialog(volume))
            @if volume.robustness == "faulted" {
                (dialog("salvage", "Salvage", "Salvage", &path("salvage"), html! {
                    p { "Brings " strong { (name) } " up from the replicas that can be reached now. Writes only unreachable replicas hold are lost." }
                }))
            }
        }
        @if may.snapshot {
            (dialog("take-snapshot", "Take a snapshot", "Take", &path("snapshots"), html! {
                label { "Name" input data-field="name" placeholder="the volume's name and the time" autocomplete="off"; }
            }))
        }
        @if may.back_up {
            (dialog("back-up", "Back up", "Back up", &path("backups"), html! {
                label { "Snapshot" select data-field="snapshot" {
                    option value="" { "a new one" }
                    @for snapshot in snapshots.iter().filter(|s| s.ready_to_use) {
                        option value=(snapshot.name) { (snapshot.name) }
                    }
                } }
                label { "Target" input data-field="target" placeholder="default" autocomplete="off"; }
            }))
        }
        @if may.create && may.snapshot {
            dialog #clone aria-labelledby="clone-title" {
                form data-path=(path("clone")) data-then="/ui/volumes/{name}" {
                    h2 #clone-title { "Clone " (name) }
                    label { "The clone's name" input data-field="name" required autocomplete="off"; }
                    p.error role="alert" {}
                    div.buttons {
                        button type="button" data-close { "Cancel" }
                        button.primary type="submit" { "Clone" }
                    }
                }
            }
        }
        @if may.delete {
            dialog #delete-volume aria-labelledby="delete-volume-title" {
                form data-method="DELETE" data-path=(format!("/v1/volumes/{name}")) data-then="/ui/volumes" {
                    h2 #delete-volume-title { "Delete " (name) "?" }
                    p { "Its data, on every replica, and its snapshots are deleted. Its backups are kept." }
                    label { "Type the volume's name to delete it" input data-confirm=(name) autocomplete="off" aria-label="The volume's name"; }
                    p.error role="alert" {}
                    div.buttons {
                        button type="button" data-close { "Cancel" }
                        button.danger type="submit" disabled { "Delete" }
                    }
                }
            }
        }
    }
}

fn patch_dialog(volume: &VolumeView) -> Markup {
    html! {
        dialog #replica-count aria-labelledby="replica-count-title" {
            form data-method="PATCH" data-path=(format!("/v1/volumes/{}", volume.name)) data-done="Replica count changed" {
                h2 #replica-count-title { "Replicas" }
                label { "How many replicas" input data-field="numberOfReplicas" data-kind="int" type="number" min="1" max="20" required value=(volume.replicas_wanted); }
                p.error role="alert" {}
                div.buttons {
                    button type="button" data-close { "Cancel" }
                    button.primary type="submit" { "Change" }
                }
            }
        }
    }
}

/// A dialog `id` titled `title` whose form POSTs its `fields` to `path`.
fn dialog(id: &str, title: &str, verb: &str, path: &str, fields: Markup) -> Markup {
    html! {
        dialog id=(id) aria-labelledby=(format!("{id}-title")) {
            form data-path=(path) data-done=(format!("{title}: asked")) {
                h2 id=(format!("{id}-title")) { (title) }
                (fields)
                p.error role="alert" {}
                div.buttons {
                    button type="button" data-close { "Cancel" }
                    button.primary type="submit" { (verb) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(state: &str) -> VolumeView {
        VolumeView {
            name: "web".into(),
            size: 1 << 24,
            actual_size: 0,
            replicas_wanted: 2,
            replicas_healthy: 2,
            frontend: "auto".into(),
            node: String::new(),
            state: state.into(),
            robustness: "healthy".into(),
            pvc: None,
            created: None,
            revert: None,
            standby: None,
        }
    }

    fn snapshot(ready: bool) -> SnapshotView {
        SnapshotView {
            name: "before".into(),
            volume: "web".into(),
            parent: None,
            ready_to_use: ready,
            size: 1 << 24,
            created: None,
            purpose: "user".into(),
            r#for: None,
            error: String::new(),
            deleting: false,
        }
    }

    fn may(patch: bool) -> Allowed {
        Allowed {
            patch,
            delete: false,
            snapshot: false,
            delete_snapshot: false,
            back_up: false,
            delete_backup: false,
            delete_replica: false,
            create: false,
        }
    }

    fn offers_revert(state: &str, ready: bool, patch: bool) -> bool {
        let page = snapshot_chain(&volume(state), &[snapshot(ready)], &may(patch)).into_string();
        page.contains("/v1/volumes/web/snapshots/before/revert")
    }

    #[test]
    fn revert_is_offered_for_a_ready_snapshot_of_a_detached_volume_to_who_may_patch_it() {
        assert!(offers_revert("detached", true, true));
        assert!(!offers_revert("detached", true, false), "a reader");
        assert!(!offers_revert("attached", true, true), "attached");
        assert!(!offers_revert("detached", false, true), "not yet taken");
    }

    #[test]
    fn a_standby_offers_activation_and_nothing_that_would_use_it() {
        let mut standby = volume("detached");
        standby.standby = Some(crate::api::volumes::standby::StandbyView {
            phase: "standby".into(),
            source_volume: "src".into(),
            backup_target: "default".into(),
            last_restored_backup: "b3".into(),
            last_restored_at: None,
            newest_backup: "b3".into(),
            backups_behind: 0,
            lag_seconds: 0,
            restoring: None,
            last_step_bytes: None,
            activated_at: None,
            activation_millis: None,
        });
        let everything = Allowed {
            patch: true,
            delete: true,
            snapshot: true,
            delete_snapshot: true,
            back_up: true,
            delete_backup: true,
            delete_replica: true,
            create: true,
        };
        let offered = actions(&standby, &everything).into_string();
        assert!(offered.contains("/v1/volumes/web/activate"), "{offered}");
        for used in ["Attach", "Take snapshot", "Back up", "Clone"] {
            assert!(!offered.contains(used), "{used}: {offered}");
        }
        assert!(
            !actions(&standby, &may(false))
                .into_string()
                .contains("activate")
        );
        assert!(facts(&standby).into_string().contains("holds b3"));
        let plain = actions(&volume("detached"), &everything).into_string();
        assert!(!plain.contains("activate") && plain.contains("Attach"));
    }
}
