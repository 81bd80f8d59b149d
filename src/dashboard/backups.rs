//! Backups: the targets with whether they answer, the volumes they hold
//! backups of, and every backup, to restore into a new volume or delete.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use maud::{Markup, html};

use super::Viewer;
use super::format::{ago, bytes};
use super::layout::{self, Section, badge};
use crate::api::ApiState;
use crate::api::auth::Access;
use crate::api::backups::{BackupView, newest_first};

pub async fn page(State(state): State<Arc<ApiState>>, viewer: Viewer) -> Response {
    let list = Access::oxhorn("list", "backups", None);
    if let Err(error) = state.auth.authorize(&viewer.caller, &list).await {
        return layout::refused(&viewer, &error);
    }
    let may = |verb, resource| {
        let access = Access::oxhorn(verb, resource, None);
        let state = &state;
        let caller = &viewer.caller;
        async move { state.auth.allows(caller, &access).await }
    };
    let see_targets = may("list", "backuptargets").await;
    let see_volumes = may("list", "backupvolumes").await;
    let sync = may("patch", "backuptargets").await;
    let delete = may("delete", "backups").await;
    let restore = may("create", "volumes").await;
    let backups = newest_first(&state, None);
    let content = html! {
        (layout::heading("Backups", html! {}, html! {}))
        @if see_targets { (targets(&state, sync)) }
        @if see_volumes { (backup_volumes(&state)) }
        section.panel aria-labelledby="backups-heading" {
            h2 #backups-heading { "Backups" }
            @if backups.is_empty() { p.empty { "None." } } @else {
                div.scroll { table #all-backups {
                    thead { tr {
                        th data-sort { "Name" } th data-sort { "Volume" } th data-sort { "State" }
                        th.num data-sort { "Size" } th data-sort { "Target" } th data-sort { "Completed" } th {}
                    } }
                    tbody { @for backup in &backups { (backup_row(backup, restore, delete)) } }
                } }
                @if restore {
                    @for backup in backups.iter().filter(|b| b.state == "completed") {
                        (super::volume::restore_dialog(backup))
                    }
                }
            }
        }
    };
    layout::page(&viewer, Section::Backups, "Backups", content)
}

fn targets(state: &ApiState, sync: bool) -> Markup {
    let mut targets: Vec<_> = state.ds.backup_targets.store.state();
    targets.sort_by_key(|t| kube::ResourceExt::name_any(&**t));
    html! {
        section.panel aria-labelledby="targets-heading" {
            h2 #targets-heading { "Targets" }
            @if targets.is_empty() {
                p.empty { "None: set the " code { "backup-target" } " setting, or make a BackupTarget." }
            } @else {
                div.scroll { table #targets {
                    thead { tr { th { "Name" } th { "URL" } th { "Store" } th { "Last synced" } th {} } }
                    tbody {
                        @for target in &targets {
                            @let name = kube::ResourceExt::name_any(&**target);
                            @let status = target.status.clone().unwrap_or_default();
                            tr data-target=(name) {
                                td { (name) }
                                td { code { (target.spec.backup_target_url) } }
                                td {
                                    @if status.available { (badge("healthy")) } @else {
                                        span.badge.error { "unavailable" } " "
                                        span.muted { (status.conditions.iter().map(|c| c.message.as_str()).find(|m| !m.is_empty()).unwrap_or_default()) }
                                    }
                                }
                                td { (status.last_synced_at.map(|t| ago(&t.0.to_string()) + " ago").unwrap_or_default()) }
                                td {
                                    @if sync {
                                        form data-path=(format!("/v1/backup-targets/{name}/sync")) data-done="Syncing" {
                                            button type="submit" { "Sync now" }
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

fn backup_volumes(state: &ApiState) -> Markup {
    let mut volumes: Vec<_> = state.ds.backup_volumes.store.state();
    volumes.sort_by(|a, b| a.spec.volume_name.cmp(&b.spec.volume_name));
    html! {
        section.panel aria-labelledby="backup-volumes-heading" {
            h2 #backup-volumes-heading { "Volumes backed up" }
            @if volumes.is_empty() { p.empty { "None." } } @else {
                div.scroll { table #backup-volumes {
                    thead { tr { th data-sort { "Volume" } th data-sort { "Target" } th.num data-sort { "Size" } th data-sort { "Last backup" } th { "When" } } }
                    tbody {
                        @for volume in &volumes {
                            @let status = volume.status.clone().unwrap_or_default();
                            tr {
                                td { (volume.spec.volume_name) }
                                td { (volume.spec.backup_target_name) }
                                td.num data-value=(status.size) { (bytes(status.size)) }
                                td { (status.last_backup_name) }
                                td { (status.last_backup_at.map(|t| ago(&t.0.to_string()) + " ago").unwrap_or_default()) }
                            }
                        }
                    }
                } }
            }
        }
    }
}

fn backup_row(backup: &BackupView, restore: bool, delete: bool) -> Markup {
    html! {
        tr data-backup=(backup.name) data-state=(backup.state) {
            td { (backup.name) }
            td { a href=(format!("/ui/volumes/{}", backup.volume)) { (backup.volume) } }
            td {
                (backup.state)
                @if backup.state == "inProgress" { " " progress value=(backup.progress) max="100" aria-label=(format!("backup {}", backup.name)) {} }
                @if !backup.error.is_empty() { " " span.muted { (backup.error) } }
            }
            td.num data-value=(backup.size) { (bytes(backup.size)) }
            td { (backup.target) }
            td { (backup.created.as_deref().map(ago).map(|a| a + " ago").unwrap_or_default()) }
            td {
                @if restore && backup.state == "completed" {
                    button type="button" data-open=(format!("restore-{}", backup.name)) { "Restore" }
                }
                @if delete && !backup.deleting {
                    form data-method="DELETE" data-path=(format!("/v1/backups/{}", backup.name)) data-done="Backup deleted" data-ask=(format!("Delete backup {} from its store? It cannot be undone.", backup.name)) {
                        button.quiet.danger type="submit" aria-label=(format!("Delete backup {}", backup.name)) { "Delete" }
                    }
                }
            }
        }
    }
}
